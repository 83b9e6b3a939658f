#include "inputs.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include "bytes.hpp"
#include "npy.hpp"
#include "random.hpp"

namespace fa {
namespace {

// Sets *field from a file dimension, refusing a flag that says otherwise.
void take_dim(const Options& opts, const char* flag, int* field, size_t file_value, const std::string& file) {
  if (opts.given.count(flag) && size_t(*field) != file_value)
    throw UsageError(std::string(flag) + " " + std::to_string(*field) + " contradicts " + file + " (" +
                     std::to_string(file_value) + "); leave the flag out with --in");
  *field = int(file_value);
}

// Memory the OS can still hand out (MemAvailable), or the physical memory where /proc is missing.
double host_available_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (f >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    f.ignore(256, '\n');
  }
  return double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE));
}

// "q.npy holds nan at [0, 3, 17, 5] (element 1234)"; nothing if every value is finite.
void check_finite(const std::vector<float>& x, const Problem& p, bool kv, const std::string& name) {
  for (size_t n = 0; n < x.size(); ++n) {
    if (std::isfinite(x[n])) continue;
    const size_t d = size_t(p.head_dim), len = size_t(kv ? p.kv_len : p.q_len), heads = size_t(kv ? p.kv_heads : p.heads);
    const size_t c = n % d, i = n / d % len, h = n / d / len % heads, b = n / d / len / heads;
    throw UsageError(name + " holds " + (std::isnan(x[n]) ? "nan" : x[n] > 0 ? "+inf" : "-inf") + " at [" +
                     std::to_string(b) + ", " + std::to_string(h) + ", " + std::to_string(i) + ", " +
                     std::to_string(c) + "] (element " + std::to_string(n) +
                     "): the kernels compute on finite inputs only");
  }
}

}  // namespace

HostTensors random_inputs(const Problem& p, bool backward) {
  HostTensors t;
  t.q = random_normal<float>(p.q_elems(), p.seed * 4 + 1);
  t.k = random_normal<float>(p.kv_elems(), p.seed * 4 + 2);
  t.v = random_normal<float>(p.kv_elems(), p.seed * 4 + 3);
  if (backward) t.dout = random_normal<float>(p.q_elems(), p.seed * 4 + 4, 0.0, 1.0);
  return t;
}

HostTensors large_logit_inputs(const Problem& p, bool backward) {
  constexpr int kMax = 32;  // 64 products of at most 32 * 32 sum to < 2^16: exact in fp32 up to d = 16384
  HostTensors t = random_inputs(p, backward);
  Rng rng(p.seed * 4 + 5);
  for (std::vector<float>* x : {&t.q, &t.k})
    for (float& e : *x) e = float(int(rng.uniform() * (2 * kMax + 1)) - kMax);
  return t;
}

HostTensors wide_logit_inputs(const Problem& p, bool backward) {
  HostTensors t = random_inputs(p, backward);
  t.q = random_normal<float>(p.q_elems(), p.seed * 4 + 6, 0.0, 40.0);
  t.k = random_normal<float>(p.kv_elems(), p.seed * 4 + 7, 0.0, 40.0);
  return t;
}

HostTensors outlier_inputs(const Problem& p, bool backward) {
  constexpr size_t kEvery = 1000;  // one outlier per this many elements
  constexpr float kFactor = 100.f;
  HostTensors t = random_inputs(p, backward);
  Rng rng(p.seed * 4 + 8);
  for (std::vector<float>* x : {&t.q, &t.k, &t.v})
    for (size_t n = 0; n < std::max<size_t>(1, x->size() / kEvery); ++n)
      (*x)[size_t(rng.uniform() * double(x->size())) % x->size()] *= kFactor;
  return t;
}

Problem input_problem(const Options& opts, bool backward) {
  Problem p = opts.problem;
  if (opts.in_dir.empty()) return p;
  struct stat st{};
  if (stat(opts.in_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw UsageError("--in " + opts.in_dir + ": no such folder");
  const std::string dir = opts.in_dir + "/";
  const NpyHeader q = npy_read_header(dir + "q.npy"), k = npy_read_header(dir + "k.npy"),
                  v = npy_read_header(dir + "v.npy");
  if (q.shape.size() != 4 || k.shape.size() != 4 || k.shape != v.shape)
    throw UsageError("q.npy must be [B, H, Nq, d] and k.npy, v.npy [B, Hkv, Nk, d] (got " + shape_str(q.shape) +
                     ", " + shape_str(k.shape) + ", " + shape_str(v.shape) + ")");
  if (k.shape[0] != q.shape[0] || k.shape[3] != q.shape[3])
    throw UsageError("k.npy " + shape_str(k.shape) + " does not match q.npy " + shape_str(q.shape) +
                     " in batch or head_dim");
  take_dim(opts, "--batch", &p.batch, q.shape[0], "q.npy");
  take_dim(opts, "--heads", &p.heads, q.shape[1], "q.npy");
  take_dim(opts, "--q-len", &p.q_len, q.shape[2], "q.npy");
  take_dim(opts, "--head-dim", &p.head_dim, q.shape[3], "q.npy");
  take_dim(opts, "--kv-heads", &p.kv_heads, k.shape[1], "k.npy");
  take_dim(opts, "--kv-len", &p.kv_len, k.shape[2], "k.npy");
  if (backward) {
    const NpyHeader d = npy_read_header(dir + "do.npy");
    if (d.shape != q.shape)
      throw UsageError("do.npy " + shape_str(d.shape) + " must have q.npy's shape " + shape_str(q.shape));
  }
  p.validate();
  return p;
}

double host_bytes_needed(const Problem& p, bool backward) {
  const double q = double(p.batch) * p.heads * p.q_len * p.head_dim;  // in double: no overflow
  const double kv = double(p.batch) * p.kv_heads * p.kv_len * p.head_dim;
  const double lse = double(p.batch) * p.heads * p.q_len;
  const double inputs = q + 2 * kv + (backward ? q : 0);
  const double outputs = q + lse + (backward ? q + 2 * kv : 0);
  return 4.0 * (inputs + 2 * outputs);
}

HostTensors load_inputs(const Options& opts, const Problem& p, bool backward) {
  const double need = host_bytes_needed(p, backward), have = host_available_bytes();
  if (need > have)
    throw UsageError("this problem needs " + human_bytes(need) + " of host memory for its tensors (" + describe(p) +
                     "); this machine has " + human_bytes(have) + " available: use a smaller batch, heads or length");
  if (opts.in_dir.empty()) return random_inputs(p, backward);
  const std::string dir = opts.in_dir + "/";
  HostTensors t{npy_read(dir + "q.npy").data, npy_read(dir + "k.npy").data, npy_read(dir + "v.npy").data, {}};
  if (backward) t.dout = npy_read(dir + "do.npy").data;
  check_finite(t.q, p, false, "q.npy");
  check_finite(t.k, p, true, "k.npy");
  check_finite(t.v, p, true, "v.npy");
  if (backward) check_finite(t.dout, p, false, "do.npy");
  std::printf("inputs:  %s\n", opts.in_dir.c_str());
  return t;
}

}  // namespace fa
