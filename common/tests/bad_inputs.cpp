// bad_inputs PROGRAM READS_DO HEAD_DIM DTYPES [ARGS...]: runs a chapter program on crafted bad --in folders and bad
// output paths and expects each to be refused with exit code 2 and a message that names the problem,
// before any device work - so it runs (and must pass) on a machine without a GPU. READS_DO is 1 when
// the program with ARGS reads do.npy (a backward run); HEAD_DIM is a head_dim the program supports; DTYPES the
// dtypes it computes in (scripts/chapters.tsv): fp32, or 16-bit ones, whose range a finite fp32 value can exceed.
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <vector>

#include "npy.hpp"

namespace {

std::string g_program, g_args, g_tmp;
int g_failed = 0;
int g_d = 16;  // head_dim of the good folder: one the program supports
std::string D() { return std::to_string(g_d); }

// A .npy file with a hand-written header dictionary and `data` after it.
void write_raw(const std::string& path, const std::string& dict, const std::string& data) {
  std::string h = dict;
  h.resize(128 - 10 - 1, ' ');
  std::ofstream f(path, std::ios::binary);
  f << "\x93NUMPY" << char(1) << char(0) << char(h.size() + 1) << char(0) << h << "\n" << data;
}
std::string f4_header(const std::string& shape) {
  return "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape + ", }";
}

// A good input folder: q, do [1, 2, 5, d]; k, v [1, 1, 7, d] (GQA 2:1, q_len != kv_len), d = HEAD_DIM.
void write_good(const std::string& dir) {
  std::system(("rm -rf '" + dir + "' && mkdir -p '" + dir + "'").c_str());
  const std::vector<float> q(1 * 2 * 5 * g_d, 0.25f), kv(1 * 1 * 7 * g_d, -0.5f);
  fa::npy_write(dir + "/q.npy", {1, 2, 5, size_t(g_d)}, q.data());
  fa::npy_write(dir + "/do.npy", {1, 2, 5, size_t(g_d)}, q.data());
  fa::npy_write(dir + "/k.npy", {1, 1, 7, size_t(g_d)}, kv.data());
  fa::npy_write(dir + "/v.npy", {1, 1, 7, size_t(g_d)}, kv.data());
}

// Runs the program with `extra` arguments; expects exit 2 and `expect` in its stderr.
void expect_refused(const std::string& name, const std::string& extra, const std::string& expect) {
  const std::string err = g_tmp + "/stderr.txt";
  const std::string cmd = "'" + g_program + "' " + g_args + " " + extra + " >/dev/null 2>'" + err + "'";
  const int status = std::system(cmd.c_str());
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream f(err);
  const std::string msg((std::istreambuf_iterator<char>(f)), {});
  const bool ok = rc == 2 && msg.find(expect) != std::string::npos;
  std::printf("%s %-28s exit %d: %s", ok ? "ok  " : "FAIL", name.c_str(), rc, msg.empty() ? "(no message)\n" : msg.c_str());
  if (!ok) std::printf("     expected exit 2 and a message containing \"%s\"\n", expect.c_str()), ++g_failed;
}

// A case: break the good folder with `damage`, then expect the refusal.
void case_in(const std::string& name, const std::function<void(const std::string&)>& damage, const std::string& expect,
             const std::string& extra = "") {
  const std::string dir = g_tmp + "/in";
  write_good(dir);
  damage(dir);
  expect_refused(name, "--in '" + dir + "' " + extra, expect);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5 || std::atoi(argv[3]) < 1) {
    std::fprintf(stderr, "usage: bad_inputs PROGRAM READS_DO HEAD_DIM DTYPES [ARGS...]\n");
    return 2;
  }
  g_program = argv[1];
  const bool reads_do = std::string(argv[2]) == "1";
  g_d = std::atoi(argv[3]);
  const bool sixteen_bit = std::string(argv[4]) != "fp32";  // the program rounds its inputs to fp16 by default
  for (int a = 5; a < argc; ++a) g_args += std::string(" '") + argv[a] + "'";
  char tmpl[] = "/tmp/fa_bad_inputs_XXXXXX";
  if (!mkdtemp(tmpl)) return std::perror("mkdtemp"), 1;
  g_tmp = tmpl;

  expect_refused("--in: no such folder", "--in '" + g_tmp + "/nowhere'", "no such folder");
  case_in("q.npy missing", [](const std::string& d) { std::remove((d + "/q.npy").c_str()); }, "cannot open");
  case_in("not a .npy file", [](const std::string& d) { std::ofstream(d + "/k.npy") << "hello"; }, "not a .npy file");
  case_in("dtype float64", [](const std::string& d) {
    write_raw(d + "/q.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 2, 5, " + D() + "), }", std::string(2 * 5 * g_d * 8, '\0'));
  }, "dtype must be float32");
  case_in("Fortran order", [](const std::string& d) {
    write_raw(d + "/q.npy", "{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2, 5, " + D() + "), }", std::string(2 * 5 * g_d * 4, '\0'));
  }, "Fortran-order");
  case_in("rank 3", [](const std::string& d) { write_raw(d + "/q.npy", f4_header("(2, 5, " + D() + ")"), std::string(2 * 5 * g_d * 4, '\0')); },
          "must be [B, H, Nq, d]");
  case_in("negative dimension", [](const std::string& d) { write_raw(d + "/q.npy", f4_header("(-1, 2, 5, " + D() + ")"), ""); },
          "'-1' is not a non-negative integer");
  case_in("dimension 1e11", [](const std::string& d) { write_raw(d + "/q.npy", f4_header("(1, 2, 1e11, " + D() + ")"), ""); },
          "'1e11' is not a non-negative integer");
  case_in("batch 2^62 + 1", [](const std::string& d) {
    write_raw(d + "/q.npy", f4_header("(4611686018427387905, 2, 5, " + D() + ")"), std::string(2 * 5 * g_d * 4, '\0'));
  }, "larger than 2^31 - 1");
  case_in("shape larger than the file", [](const std::string& d) {
    write_raw(d + "/k.npy", f4_header("(1, 1, 100000000, " + D() + ")"), "");  // gigabytes promised, none there
  }, "needs " + std::to_string(100000000LL * g_d * 4) + " bytes of data, the file holds 0");
  case_in("file shorter than shape", [](const std::string& d) {
    write_raw(d + "/v.npy", f4_header("(1, 1, 7, " + D() + ")"), std::string(7 * g_d * 4 - 48, '\0'));
  }, "the file holds " + std::to_string(7 * g_d * 4 - 48));
  case_in("k, v batch != q batch", [](const std::string& d) {
    const std::vector<float> kv(2 * 7 * g_d, 0.f);
    fa::npy_write(d + "/k.npy", {2, 1, 7, size_t(g_d)}, kv.data());
    fa::npy_write(d + "/v.npy", {2, 1, 7, size_t(g_d)}, kv.data());
  }, "does not match q.npy");
  case_in("k shape != v shape", [](const std::string& d) {
    const std::vector<float> kv(8 * g_d, 0.f);
    fa::npy_write(d + "/v.npy", {1, 1, 8, size_t(g_d)}, kv.data());
  }, "k.npy, v.npy [B, Hkv, Nk, d]");
  case_in("heads not a multiple of kv heads", [](const std::string& d) {
    const std::vector<float> q(3 * 5 * g_d, 0.f);
    fa::npy_write(d + "/q.npy", {1, 3, 5, size_t(g_d)}, q.data());
    fa::npy_write(d + "/do.npy", {1, 3, 5, size_t(g_d)}, q.data());
    const std::vector<float> kv(2 * 7 * g_d, 0.f);
    fa::npy_write(d + "/k.npy", {1, 2, 7, size_t(g_d)}, kv.data());
    fa::npy_write(d + "/v.npy", {1, 2, 7, size_t(g_d)}, kv.data());
  }, "kv_heads must divide heads");
  case_in("head_dim 300", [](const std::string& d) {
    const std::vector<float> q(2 * 5 * 300, 0.f), kv(7 * 300, 0.f);
    fa::npy_write(d + "/q.npy", {1, 2, 5, 300}, q.data());
    fa::npy_write(d + "/do.npy", {1, 2, 5, 300}, q.data());
    fa::npy_write(d + "/k.npy", {1, 1, 7, 300}, kv.data());
    fa::npy_write(d + "/v.npy", {1, 1, 7, 300}, kv.data());
  }, "head_dim");
  case_in("a flag contradicts the files", [](const std::string&) {}, "--q-len 6 contradicts q.npy (5)", "--q-len 6");
  case_in("NaN in q", [](const std::string& d) {
    std::vector<float> q(2 * 5 * g_d, 0.25f);
    q[(1 * 5 + 2) * g_d + 3] = NAN;  // [0, 1, 2, 3]
    fa::npy_write(d + "/q.npy", {1, 2, 5, size_t(g_d)}, q.data());
  }, "q.npy holds nan at [0, 1, 2, 3]");
  case_in("Inf in v", [](const std::string& d) {
    std::vector<float> v(7 * g_d, 0.5f);
    v[6 * g_d + g_d - 1] = -INFINITY;  // [0, 0, 6, d - 1]
    fa::npy_write(d + "/v.npy", {1, 1, 7, size_t(g_d)}, v.data());
  }, "v.npy holds -inf at [0, 0, 6, " + std::to_string(g_d - 1) + "]");
  if (reads_do) {
    case_in("do.npy missing", [](const std::string& d) { std::remove((d + "/do.npy").c_str()); }, "do.npy");
    case_in("do.npy shape != q.npy shape", [](const std::string& d) {
      const std::vector<float> x(2 * 4 * g_d, 0.f);
      fa::npy_write(d + "/do.npy", {1, 2, 4, size_t(g_d)}, x.data());
    }, "do.npy [1, 2, 4, " + D() + "] must have q.npy's shape");
    case_in("NaN in do", [](const std::string& d) {
      std::vector<float> x(2 * 5 * g_d, 0.f);
      x[0] = NAN;
      fa::npy_write(d + "/do.npy", {1, 2, 5, size_t(g_d)}, x.data());
    }, "do.npy holds nan at [0, 0, 0, 0]");
  }
  if (sixteen_bit) {  // finite in fp32, inf in fp16 (largest 65504): refused when rounded, before the GPU
    case_in("q beyond fp16", [](const std::string& d) {
      std::vector<float> x(2 * 5 * g_d, 0.25f);
      x[3] = 1e6f;
      fa::npy_write(d + "/q.npy", {1, 2, 5, size_t(g_d)}, x.data());
    }, "q.npy element 3 is beyond the range of fp16");
    if (reads_do)
      case_in("do beyond fp16", [](const std::string& d) {
        std::vector<float> x(2 * 5 * g_d, 0.25f);
        x[7] = -1e6f;
        fa::npy_write(d + "/do.npy", {1, 2, 5, size_t(g_d)}, x.data());
      }, "do.npy element 7 is beyond the range of fp16");
  }
  // Output paths are checked before the run.
  std::ofstream(g_tmp + "/a_file") << "x";
  case_in("--out is a file", [](const std::string&) {}, "--out", "--out '" + g_tmp + "/a_file'");
  case_in("--out parent missing", [](const std::string&) {}, "is missing or not writable",
          "--out '" + g_tmp + "/no/such/dir'");
  // A folder no file can be created in although access(W_OK) says yes to root (/proc): tried, so refused here too.
  case_in("--out under /proc", [](const std::string&) {}, "is missing or not writable", "--out /proc/fa_out");
  case_in("--csv folder missing", [](const std::string&) {}, "--csv", "--csv '" + g_tmp + "/nowhere/rows.csv'");
  case_in("--csv is a folder", [](const std::string&) {}, "--csv", "--csv '" + g_tmp + "'");

  std::system(("rm -rf '" + g_tmp + "'").c_str());
  std::printf("%s: %s\n", g_program.c_str(), g_failed ? "FAILED" : "every bad input refused with exit 2");
  return g_failed ? 1 : 0;
}
