#include "program.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <exception>
#include <stdexcept>

#include "npy.hpp"
#include "reference.hpp"
#include "testing.hpp"

namespace fa {
namespace {

// The fp64 reference costs about this many multiply-adds per second on one core; a program checks
// everything below kCheckBudget of them and samples beyond.
constexpr double kCheckBudget = 4e9;

std::vector<size_t> q_shape(const Problem& p) {
  return {size_t(p.batch), size_t(p.heads), size_t(p.q_len), size_t(p.head_dim)};
}
std::vector<size_t> kv_shape(const Problem& p) {
  return {size_t(p.batch), size_t(p.kv_heads), size_t(p.kv_len), size_t(p.head_dim)};
}

// A folder this process can create files in. Tried, not asked of access(): root passes access(W_OK) everywhere,
// also on folders no file can be created in (/proc, a read-only mount).
bool writable_dir(const std::string& dir) {
  struct stat st{};
  if (stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) return false;
  std::string probe = dir + "/.fa_write_probe_XXXXXX";
  const int fd = mkstemp(probe.data());
  if (fd < 0) return false;
  close(fd);
  unlink(probe.c_str());
  return true;
}

// The folder a path lies in ("." for a bare name).
std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

void make_dir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST)
    throw std::runtime_error("cannot create folder " + dir + " (" + std::strerror(errno) + ")");
}

// The fp32 chapters' error rule (testing.hpp) on n elements of one output: `plain` is the plain fp32 attention's
// value of each, and a kernel's element passes when |got - ref| <= 2 max|plain - ref| + tol.atol + tol.rtol |ref|.
ErrorReport compare_by_rule(const float* got, const double* ref, const float* plain, size_t n, Tolerance tol) {
  double plain_err = 0;
  for (size_t e = 0; e < n; ++e)
    if (std::isfinite(ref[e])) plain_err = std::max(plain_err, std::fabs(double(plain[e]) - ref[e]));
  ErrorReport r = compare(got, ref, n, Tolerance{tol.atol + 2 * plain_err, tol.rtol});
  r.plain_max_abs = plain_err;
  return r;
}

// Rows [i0, i1) of head (b, h).
struct Piece {
  int b, h, i0, i1;
};
// 3 bands of up to 16 rows (start, middle, end) in the first and the last head.
std::vector<Piece> sampled_rows(const Problem& p) {
  const int band = std::min(16, p.q_len);
  std::vector<Piece> pieces;
  for (auto bh : {std::pair<int, int>{0, 0}, {p.batch - 1, p.heads - 1}})
    for (int start : {0, (p.q_len - band) / 2, p.q_len - band}) pieces.push_back({bh.first, bh.second, start, start + band});
  return pieces;
}
std::string describe_sample(const std::vector<Piece>& pieces) {
  return std::to_string(pieces.size() * (pieces[0].i1 - pieces[0].i0)) +
         " sampled rows (first/middle/last of the first and last head)";
}

}  // namespace

void check_outputs_writable(const Options& opts) {
  struct stat st{};
  if (!opts.out_dir.empty()) {  // an existing folder we can write to, or one we can create at the end
    const bool exists = stat(opts.out_dir.c_str(), &st) == 0;
    if (exists && !writable_dir(opts.out_dir)) throw UsageError("--out " + opts.out_dir + ": not a folder this user can write to");
    if (!exists && !writable_dir(parent_of(opts.out_dir)))
      throw UsageError("--out " + opts.out_dir + ": cannot create the folder (" + parent_of(opts.out_dir) +
                       " is missing or not writable)");
  }
  if (!opts.csv.empty()) {
    if (stat(opts.csv.c_str(), &st) == 0 && (S_ISDIR(st.st_mode) || access(opts.csv.c_str(), W_OK) != 0))
      throw UsageError("--csv " + opts.csv + ": not a file this user can write to");
    if (!writable_dir(parent_of(opts.csv)))  // the rows are written to a temporary file there and renamed
      throw UsageError("--csv " + opts.csv + ": cannot create files in " + parent_of(opts.csv));
  }
}

void write_forward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& o,
                           const std::vector<float>& lse) {
  make_dir(dir);
  npy_write(dir + "/o.npy", q_shape(p), o.data());
  npy_write(dir + "/lse.npy", {size_t(p.batch), size_t(p.heads), size_t(p.q_len)}, lse.data());
  std::printf("wrote:   %s/o.npy, %s/lse.npy\n", dir.c_str(), dir.c_str());
}

void write_backward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& dq,
                            const std::vector<float>& dk, const std::vector<float>& dv) {
  make_dir(dir);
  npy_write(dir + "/dq.npy", q_shape(p), dq.data());
  npy_write(dir + "/dk.npy", kv_shape(p), dk.data());
  npy_write(dir + "/dv.npy", kv_shape(p), dv.data());
  std::printf("wrote:   %s/dq.npy, dk.npy, dv.npy\n", dir.c_str());
}

ErrorReport check_forward(const Problem& p, const HostTensors& in, const std::vector<float>& o,
                          const std::vector<float>& lse, Tolerance tol, std::string* what_checked,
                          const BlockMask* mask) {
  const double per_row = double(p.kv_len) * p.head_dim * 2;
  const double all = per_row * p.q_len * p.batch * p.heads;
  std::vector<Piece> pieces;
  if (all <= kCheckBudget) {
    for (int b = 0; b < p.batch; ++b)
      for (int h = 0; h < p.heads; ++h) pieces.push_back({b, h, 0, p.q_len});
    *what_checked = "all " + std::to_string(p.lse_elems()) + " rows";
  } else {
    pieces = sampled_rows(p);
    *what_checked = describe_sample(pieces);
  }
  ErrorReport total;
  const int d = p.head_dim;
  for (const Piece& c : pieces) {
    const int rows = c.i1 - c.i0;
    std::vector<double> ro(size_t(rows) * d), rl(rows);
    reference_forward_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), ro.data(), rl.data(), nullptr,
                           mask);
    std::vector<float> po(ro.size()), pl(rows);
    plain_fp32_forward_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), po.data(), pl.data(), mask);
    total += compare_by_rule(o.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * d, ro.data(), po.data(), ro.size(), tol);
    total += compare_by_rule(lse.data() + p.lse_offset(c.b, c.h) + c.i0, rl.data(), pl.data(), rl.size(), kTolLse);
  }
  return total;
}

ErrorReport check_backward(const Problem& p, const HostTensors& in, const std::vector<float>& dq,
                           const std::vector<float>& dk, const std::vector<float>& dv, Tolerance tol,
                           std::string* what_checked, const BlockMask* mask, const PlainBackward* plain) {
  if (plain && mask) throw std::invalid_argument("check_backward: a plain backward of its own takes no block mask");
  const double per_group = double(p.q_len) * p.kv_len * p.head_dim * 4 * p.group();
  std::vector<std::pair<int, int>> groups = {{0, 0}};
  if (p.batch * p.kv_heads > 1) groups.push_back({p.batch - 1, p.kv_heads - 1});
  if (per_group * groups.size() > kCheckBudget) {
    // Too large for whole groups: a row of dQ needs only its own rows of P and dP, so check a sample.
    const std::vector<Piece> pieces = sampled_rows(p);
    ErrorReport total;
    for (const Piece& c : pieces) {
      std::vector<double> rq(size_t(c.i1 - c.i0) * p.head_dim);
      reference_dq_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq.data(), mask);
      std::vector<float> pq(rq.size());
      if (plain)
        plain->dq_rows(c.b, c.h, c.i0, c.i1, pq.data());
      else
        plain_fp32_dq_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), pq.data(),
                           mask);
      total += compare_by_rule(dq.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * p.head_dim, rq.data(), pq.data(),
                               rq.size(), tol);
    }
    *what_checked = "dQ of " + describe_sample(pieces) +
                    "; dK, dV not checked at this size (each needs every query row: the GPU tests cover them)";
    return total;
  }
  *what_checked = "dQ, dK, dV of " + std::to_string(groups.size()) + " kv group(s)";
  const size_t dq_n = size_t(p.group()) * p.q_len * p.head_dim, kv_n = size_t(p.kv_len) * p.head_dim;
  ErrorReport total;
  for (auto [b, hk] : groups) {
    std::vector<double> rq(dq_n), rk(kv_n), rv(kv_n);
    reference_backward_group(p, b, hk, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq.data(), rk.data(),
                             rv.data(), mask);
    std::vector<float> pq(dq_n), pk(kv_n), pv(kv_n);
    if (plain)
      plain->group(b, hk, pq.data(), pk.data(), pv.data());
    else
      plain_fp32_backward_group(p, b, hk, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), pq.data(),
                                pk.data(), pv.data(), mask);
    total += compare_by_rule(dq.data() + p.q_offset(b, hk * p.group()), rq.data(), pq.data(), dq_n, tol);
    total += compare_by_rule(dk.data() + p.kv_offset(b, hk), rk.data(), pk.data(), kv_n, tol);
    total += compare_by_rule(dv.data() + p.kv_offset(b, hk), rv.data(), pv.data(), kv_n, tol);
  }
  return total;
}

void report_rows(const Options& opts, const std::vector<ResultRow>& rows) {
  if (rows.empty()) return;
  std::printf("\n%s", format_table(rows).c_str());
  if (!opts.csv.empty()) {
    append_rows(opts.csv, rows);
    std::printf("appended %zu row(s) to %s\n", rows.size(), opts.csv.c_str());
  }
}

void print_speedup(const ResultRow& row, const ResultRow& baseline) {
  if (row.ms <= 0 || baseline.ms <= 0) return;
  std::printf("speedup: %s %s (%s) is %.2fx %s %s\n", row.chapter.c_str(), row.kernel.c_str(), row.pass.c_str(),
              baseline.ms / row.ms, baseline.chapter.c_str(), baseline.kernel.c_str());
}

int verdict(bool ok) {
  std::printf("%s\n", ok ? "PASSED" : "FAILED");
  std::fflush(stdout);
  return ok ? 0 : 1;
}

int exit_code_of_current_exception() {
  std::fflush(stdout);
  try {
    throw;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "error: unknown exception\n");
    return 1;
  }
}

}  // namespace fa
