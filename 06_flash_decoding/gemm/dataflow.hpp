// FlashDecoding++'s heuristic dataflow (README.md §8): per GPU and per linear-layer shape, which implementation to
// run for a given M, read off a small table of inflection points measured on that GPU (decode_gemm --tune). The
// same table holds the attention kernels' switch of chapter 06: CUDA cores (split_kv_fused) up to some packed row
// count (group x q_len), tensor cores beyond (flat_gemm up to 8 rows, split_kv_mma above). Plain C++: the CPU tests
// run it.
//
// The file (dataflow.tsv is the committed one): lines starting with # are comments, blank lines are skipped; the
// first other line is the header, exactly
//   gpu<TAB>op<TAB>n<TAB>k<TAB>cuda_core_max<TAB>flat_max
// then one row per line, six tab-separated fields:
//   gpu            the device name as CUDA reports it ("NVIDIA H100 80GB HBM3"), or "default"
//   op             gemm | attention
//   n, k           the GEMM's N and K (a positive integer, or * for any); attention: * and *
//   cuda_core_max  gemm: the largest M for which gemv wins; attention: the largest packed row count for which
//                  split_kv_fused wins (0: never)
//   flat_max       gemm: the largest M for which flat wins (>= cuda_core_max; tile beyond); attention: -
// Lookup: the rows of this GPU, else those of "default", else the built-in kBuiltin* below; among them the row whose
// n and k match most exactly (both equal, then one of them, then * *). A malformed file is a fa::UsageError that
// names the file and the line.
#pragma once
#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "plan.hpp"     // kFlatRows
#include "problem.hpp"  // fa::UsageError

namespace fdec::gemm {

// The built-in default, used when no row matches: a cautious guess, not a measurement (decode_gemm --tune replaces
// it): the GEMV up to M = 4, the flat GEMM up to M = 64, the CUDA-core attention up to 4 packed rows.
constexpr int kBuiltinCudaCoreMax = 4;
constexpr int kBuiltinFlatMax = 64;
constexpr int kBuiltinAttentionMax = 4;
constexpr int kAny = -1;  // n or k given as *

enum class Op { gemm, attention };
enum class Path { gemv, flat, tile };             // a GEMM's implementation (gemm.cuh's Choice, same order)
enum class AttentionPath { cuda_cores, tensor_cores };  // split_kv_fused, split_kv_mma

struct Row {
  std::string gpu;
  Op op = Op::gemm;
  int n = kAny, k = kAny;
  int cuda_core_max = 0, flat_max = 0;  // flat_max: gemm rows only
};
struct Table {
  std::vector<Row> rows;
};

inline const char* kHeader = "gpu\top\tn\tk\tcuda_core_max\tflat_max";

namespace detail {
inline std::vector<std::string> split_tabs(const std::string& line) {
  std::vector<std::string> f;
  size_t start = 0;
  for (size_t tab; (tab = line.find('\t', start)) != std::string::npos; start = tab + 1)
    f.push_back(line.substr(start, tab - start));
  f.push_back(line.substr(start));
  return f;
}
// A non-negative integer (min 0) or a positive one (min 1); `star_ok`: * gives kAny.
inline int parse_int(const std::string& s, int min, bool star_ok, const std::string& where, const char* what) {
  if (star_ok && s == "*") return kAny;
  char* end = nullptr;
  errno = 0;
  const long v = s.empty() ? -1 : std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || errno || v < min || v > 1 << 30)
    throw fa::UsageError(where + ": " + what + " '" + s + "' is not " + (min ? "a positive" : "a non-negative") +
                         " integer" + (star_ok ? " or *" : ""));
  return int(v);
}
inline std::string to_field(int v) { return v == kAny ? "*" : std::to_string(v); }
}  // namespace detail

// Parses the text of a table file; `file` names it in the errors ("FILE:LINE: what is wrong").
inline Table parse_table(const std::string& text, const std::string& file) {
  Table t;
  std::istringstream in(text);
  std::string line;
  bool header = false;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    const std::string where = file + ":" + std::to_string(number);
    if (!header) {
      if (line != kHeader)
        throw fa::UsageError(where + ": the header must be the six tab-separated names gpu, op, n, k, cuda_core_max, "
                                     "flat_max (got '" + line + "')");
      header = true;
      continue;
    }
    const std::vector<std::string> f = detail::split_tabs(line);
    if (f.size() != 6)
      throw fa::UsageError(where + ": " + std::to_string(f.size()) + " tab-separated fields, expected 6");
    Row r;
    r.gpu = f[0];
    if (r.gpu.empty()) throw fa::UsageError(where + ": empty gpu name");
    if (f[1] == "gemm") r.op = Op::gemm;
    else if (f[1] == "attention") r.op = Op::attention;
    else throw fa::UsageError(where + ": op '" + f[1] + "' is neither gemm nor attention");
    r.n = detail::parse_int(f[2], 1, true, where, "n");
    r.k = detail::parse_int(f[3], 1, true, where, "k");
    r.cuda_core_max = detail::parse_int(f[4], 0, false, where, "cuda_core_max");
    if (r.op == Op::gemm) {
      r.flat_max = detail::parse_int(f[5], 0, false, where, "flat_max");
      if (r.flat_max < r.cuda_core_max)
        throw fa::UsageError(where + ": flat_max " + f[5] + " is below cuda_core_max " + f[4]);
    } else if (r.n != kAny || r.k != kAny || f[5] != "-") {
      throw fa::UsageError(where + ": an attention row has n and k * and flat_max -");
    }
    for (const Row& o : t.rows)
      if (o.gpu == r.gpu && o.op == r.op && o.n == r.n && o.k == r.k)
        throw fa::UsageError(where + ": a second row for gpu '" + r.gpu + "', op " + f[1] + ", n " + f[2] + ", k " +
                             f[3]);
    t.rows.push_back(r);
  }
  if (!header) throw fa::UsageError(file + ": no header line (gpu, op, n, k, cuda_core_max, flat_max, tab-separated)");
  return t;
}
inline Table read_table(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw fa::UsageError(path + ": cannot read the dataflow table");
  std::ostringstream text;
  text << f.rdbuf();
  return parse_table(text.str(), path);
}
// The rows as a file's text: the header and one line per row (comments are the caller's).
inline std::string format_rows(const std::vector<Row>& rows) {
  std::string s = std::string(kHeader) + "\n";
  for (const Row& r : rows)
    s += r.gpu + "\t" + (r.op == Op::gemm ? "gemm" : "attention") + "\t" + detail::to_field(r.n) + "\t" +
         detail::to_field(r.k) + "\t" + std::to_string(r.cuda_core_max) + "\t" +
         (r.op == Op::gemm ? std::to_string(r.flat_max) : std::string("-")) + "\n";
  return s;
}

// The row that applies to (gpu, op, n, k), or nullptr: this GPU's rows first, then "default"'s; the most exact match.
inline const Row* find_row(const Table& t, const std::string& gpu, Op op, int n, int k) {
  for (const std::string& name : {gpu, std::string("default")}) {
    const Row* best = nullptr;
    int best_score = -1;
    for (const Row& r : t.rows) {
      if (r.gpu != name || r.op != op) continue;
      if ((r.n != kAny && r.n != n) || (r.k != kAny && r.k != k)) continue;
      const int score = (r.n != kAny) + (r.k != kAny);
      if (score > best_score) best = &r, best_score = score;
    }
    if (best) return best;
  }
  return nullptr;
}

// The GEMM Y[M, N] = X[M, K] W^T: gemv up to cuda_core_max, flat up to flat_max, tile beyond.
inline Path choose_gemm(const Table& t, const std::string& gpu, int m, int n, int k) {
  const Row* r = find_row(t, gpu, Op::gemm, n, k);
  const int cuda_core_max = r ? r->cuda_core_max : kBuiltinCudaCoreMax, flat_max = r ? r->flat_max : kBuiltinFlatMax;
  return m <= cuda_core_max ? Path::gemv : m <= flat_max ? Path::flat : Path::tile;
}
// Decode attention with `packed_rows` = group x q_len rows per kv head: CUDA cores up to cuda_core_max.
inline AttentionPath choose_attention(const Table& t, const std::string& gpu, int packed_rows) {
  const Row* r = find_row(t, gpu, Op::attention, kAny, kAny);
  const int max_rows = r ? r->cuda_core_max : kBuiltinAttentionMax;
  return packed_rows <= max_rows ? AttentionPath::cuda_cores : AttentionPath::tensor_cores;
}

// The chapter's decode kernel (its registry name) for a path and a packed row count: the tensor-core path takes the
// flat form up to its 8 rows, the 16-row tile above.
inline const char* attention_kernel(AttentionPath path, int packed_rows) {
  if (path == AttentionPath::cuda_cores) return "split_kv_fused";
  return packed_rows <= kFlatRows ? "flat_gemm" : "split_kv_mma";
}
// --tune's attention sweep (packed rows ascending, the CUDA-core and the tensor-core kernel's times) -> the row:
// cuda_core_max is the last row count of the first run where split_kv_fused is at least as fast (0 if none).
struct AttentionPoint {
  int rows;
  double cuda_core_ms, tensor_core_ms;
};
inline Row attention_row(const std::string& gpu, const std::vector<AttentionPoint>& sweep) {
  Row r;
  r.gpu = gpu, r.op = Op::attention;
  for (size_t i = 0; i < sweep.size() && sweep[i].cuda_core_ms <= sweep[i].tensor_core_ms; ++i)
    r.cuda_core_max = sweep[i].rows;
  return r;
}

// --tune: one shape's sweep (M ascending, the three kernels' times) -> its row. cuda_core_max is the last M of the
// first run of M where gemv is the fastest of the three (0 if it is not at the smallest M); flat_max the last M of
// the run after it where flat is at least as fast as tile (cuda_core_max if none).
struct SweepPoint {
  int m;
  double gemv_ms, flat_ms, tile_ms;
};
inline Row inflection_row(const std::string& gpu, int n, int k, const std::vector<SweepPoint>& sweep) {
  Row r;
  r.gpu = gpu, r.op = Op::gemm, r.n = n, r.k = k;
  size_t i = 0;
  for (; i < sweep.size() && sweep[i].gemv_ms <= std::min(sweep[i].flat_ms, sweep[i].tile_ms); ++i)
    r.cuda_core_max = sweep[i].m;
  r.flat_max = r.cuda_core_max;
  for (; i < sweep.size() && sweep[i].flat_ms <= sweep[i].tile_ms; ++i) r.flat_max = sweep[i].m;
  return r;
}

}  // namespace fdec::gemm
