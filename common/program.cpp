#include "program.hpp"

#include <cerrno>
#include <cstdio>
#include <sys/stat.h>

#include "npy.hpp"
#include "random.hpp"
#include "reference.hpp"

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

void make_dir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("cannot create folder " + dir);
}

// Sets *field from a file dimension, refusing a flag that says otherwise.
void take_dim(const Options& opts, const char* flag, int* field, size_t file_value, const std::string& file) {
  if (opts.given.count(flag) && size_t(*field) != file_value)
    throw UsageError(std::string(flag) + " " + std::to_string(*field) + " contradicts " + file + " (" +
                     std::to_string(file_value) + "); leave the flag out with --in");
  *field = int(file_value);
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

std::string describe(const Problem& p) {
  char b[256];
  std::snprintf(b, sizeof b, "B=%d H=%d Hkv=%d Nq=%d Nk=%d d=%d causal=%d scale=%.4g dropout=%g seed=%llu",
                p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, int(p.causal), p.softmax_scale(),
                p.dropout_p, (unsigned long long)p.seed);
  return b;
}

HostTensors random_inputs(const Problem& p, bool backward) {
  HostTensors t;
  t.q = random_normal<float>(p.q_elems(), p.seed * 4 + 1);
  t.k = random_normal<float>(p.kv_elems(), p.seed * 4 + 2);
  t.v = random_normal<float>(p.kv_elems(), p.seed * 4 + 3);
  if (backward) t.dout = random_normal<float>(p.q_elems(), p.seed * 4 + 4, 0.0, 1.0);
  return t;
}

HostTensors load_inputs(Options& opts, bool backward) {
  Problem& p = opts.problem;
  if (opts.in_dir.empty()) return random_inputs(p, backward);
  const std::string dir = opts.in_dir + "/";
  NpyArray q = npy_read(dir + "q.npy"), k = npy_read(dir + "k.npy"), v = npy_read(dir + "v.npy");
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
  p.validate();
  for (const auto& check : opts.checks) check(p);
  HostTensors t{std::move(q.data), std::move(k.data), std::move(v.data), {}};
  if (backward) {
    NpyArray d = npy_read(dir + "do.npy");
    if (d.shape != q_shape(p)) throw UsageError("do.npy " + shape_str(d.shape) + " must have q.npy's shape " + shape_str(q_shape(p)));
    t.dout = std::move(d.data);
  }
  std::printf("inputs:  %s (%s)\n", opts.in_dir.c_str(), describe(p).c_str());
  return t;
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
                          const std::vector<float>& lse, Tolerance tol, std::string* what_checked) {
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
    reference_forward_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), ro.data(), rl.data());
    total += compare(o.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * d, ro.data(), ro.size(), tol);
    total += compare(lse.data() + p.lse_offset(c.b, c.h) + c.i0, rl.data(), rl.size(), tol);
  }
  return total;
}

ErrorReport check_backward(const Problem& p, const HostTensors& in, const std::vector<float>& dq,
                           const std::vector<float>& dk, const std::vector<float>& dv, Tolerance tol,
                           std::string* what_checked) {
  const double per_group = double(p.q_len) * p.kv_len * p.head_dim * 4 * p.group();
  std::vector<std::pair<int, int>> groups = {{0, 0}};
  if (p.batch * p.kv_heads > 1) groups.push_back({p.batch - 1, p.kv_heads - 1});
  if (per_group * groups.size() > kCheckBudget) {
    // Too large for whole groups: a row of dQ needs only its own rows of P and dP, so check a sample.
    const std::vector<Piece> pieces = sampled_rows(p);
    ErrorReport total;
    for (const Piece& c : pieces) {
      std::vector<double> rq(size_t(c.i1 - c.i0) * p.head_dim);
      reference_dq_rows(p, c.b, c.h, c.i0, c.i1, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), rq.data());
      total += compare(dq.data() + p.q_offset(c.b, c.h) + size_t(c.i0) * p.head_dim, rq.data(), rq.size(), tol);
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
                             rv.data());
    total += compare(dq.data() + p.q_offset(b, hk * p.group()), rq.data(), dq_n, tol);
    total += compare(dk.data() + p.kv_offset(b, hk), rk.data(), kv_n, tol);
    total += compare(dv.data() + p.kv_offset(b, hk), rv.data(), kv_n, tol);
  }
  return total;
}

void report_rows(const Options& opts, const std::vector<ResultRow>& rows) {
  std::printf("\n%s", format_table(rows).c_str());
  if (!opts.csv.empty()) {
    append_rows(opts.csv, rows);
    std::printf("appended %zu row(s) to %s\n", rows.size(), opts.csv.c_str());
  }
}

}  // namespace fa
