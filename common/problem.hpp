// The problem description every chapter shares, and the tensor layout.
//
// Layout (PyTorch SDPA's): Q, O, dO, dQ are [batch, heads, q_len, head_dim]; K, V, dK, dV are
// [batch, kv_heads, kv_len, head_dim]; LSE is [batch, heads, q_len]. Row-major and contiguous.
// Semantics:
//   GQA/MQA   query head h reads kv head h / (heads / kv_heads)   (PyTorch's enable_gqa)
//   causal    bottom-right aligned: query i sees key j iff j <= i + kv_len - q_len
//             (FlashAttention >= 2.1; equal to PyTorch's is_causal when q_len == kv_len)
//   empty row a query that sees no key (causal, q_len > kv_len) has O = 0 and LSE = -inf
//   dropout   applied to P after the softmax, kept entries scaled by 1/(1-p); the keep-mask is
//             common/philox.hpp's dropout_keep(seed, offset, b, h, i, j), so every kernel and the
//             CPU reference draw the same mask (Problem::dropout_scale).
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "hd.hpp"
#include "philox.hpp"

namespace fa {

// Input the user can fix (bad size, unsupported head_dim, unknown flag): programs exit with 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// The problem, on the host and in every kernel: chapters pass it by value to their kernels, so the
// geometry, the causal mask and the dropout factor below are defined once for all of them (and for the
// plain C++ models). The names are the papers' (docs/notation.md).
struct Problem {
  int batch = 1;
  int heads = 1;
  int kv_heads = 1;
  int q_len = 1;
  int kv_len = 1;
  int head_dim = 64;
  bool causal = false;
  float scale = 0.f;  // 0 means the default 1/sqrt(head_dim): read it through softmax_scale()
  float dropout_p = 0.f;
  uint64_t seed = 0;    // dropout RNG key
  uint64_t offset = 0;  // dropout RNG offset (a second call with the same seed draws a new mask)

  FA_HD float softmax_scale() const { return scale != 0.f ? scale : 1.f / sqrtf(float(head_dim)); }
  FA_HD int group() const { return heads / kv_heads; }  // query heads per kv head
  FA_HD int kv_head_of(int h) const { return h / group(); }

  // ---- the causal mask (bottom-right aligned), the one definition every kernel and model uses ----
  // Query i sees key j iff j <= i + causal_shift(); with q_len == kv_len the shift is 0.
  FA_HD int causal_shift() const { return kv_len - q_len; }
  // Does query i see key j? (false past the end of the keys, so tail columns of a tile are masked too)
  FA_HD bool visible(int i, int j) const { return j < kv_len && (!causal || j <= i + causal_shift()); }
  // Number of keys query row i sees: keys 0 .. visible_keys(i) - 1 (0 for an empty causal row).
  FA_HD int visible_keys(int i) const {
    if (!causal) return kv_len;
    const int n = i + causal_shift() + 1;
    return n < 0 ? 0 : n > kv_len ? kv_len : n;
  }
  // The first query row that sees key j (the backward skips the Q blocks before it).
  FA_HD int first_query_seeing(int j) const {
    if (!causal) return 0;
    const int i = j - causal_shift();
    return i < 0 ? 0 : i;
  }

  // ---- dropout: the factor Z_ij / (1 - p) applied to P_ij, the same draw in every chapter ----
  FA_HD uint32_t dropout_threshold() const { return fa::dropout_threshold(dropout_p); }
  FA_HD float dropout_scale(int b, int h, int i, int j) const {
    if (dropout_p == 0.f) return 1.f;
    return dropout_keep(seed, offset, b, h, i, j, dropout_threshold()) ? 1.f / (1.f - dropout_p) : 0.f;
  }

  size_t q_elems() const { return size_t(batch) * heads * q_len * head_dim; }
  size_t kv_elems() const { return size_t(batch) * kv_heads * kv_len * head_dim; }
  size_t lse_elems() const { return size_t(batch) * heads * q_len; }
  size_t s_elems() const { return size_t(batch) * heads * q_len * kv_len; }  // one N x N matrix per head

  // Offsets of the first element of a head's matrix.
  FA_HD size_t q_offset(int b, int h) const { return (size_t(b) * heads + h) * q_len * head_dim; }
  FA_HD size_t kv_offset(int b, int hk) const { return (size_t(b) * kv_heads + hk) * kv_len * head_dim; }
  FA_HD size_t lse_offset(int b, int h) const { return (size_t(b) * heads + h) * q_len; }

  // Throws UsageError naming the bad value and the values that work.
  void validate() const {
    auto need = [](bool ok, const std::string& msg) {
      if (!ok) throw UsageError(msg);
    };
    need(batch >= 1, "batch must be >= 1 (got " + std::to_string(batch) + ")");
    need(heads >= 1, "heads must be >= 1 (got " + std::to_string(heads) + ")");
    need(kv_heads >= 1 && heads % kv_heads == 0,
         "kv_heads must divide heads (got heads=" + std::to_string(heads) +
             ", kv_heads=" + std::to_string(kv_heads) + ")");
    need(q_len >= 1, "q_len must be >= 1 (got " + std::to_string(q_len) + ")");
    need(kv_len >= 1, "kv_len must be >= 1 (got " + std::to_string(kv_len) + ")");
    need(head_dim >= 1, "head_dim must be >= 1 (got " + std::to_string(head_dim) + ")");
    need(std::isfinite(scale), "scale must be finite");
    need(dropout_p >= 0.f && dropout_p < 1.f,
         "dropout must be in [0, 1) (got " + std::to_string(dropout_p) + ")");
  }
};

// "B=1 H=8 Hkv=8 Nq=1024 Nk=1024 d=64 causal=0 scale=0.125 dropout=0 seed=0"
inline std::string describe(const Problem& p) {
  char b[256];
  std::snprintf(b, sizeof b, "B=%d H=%d Hkv=%d Nq=%d Nk=%d d=%d causal=%d scale=%.4g dropout=%g seed=%llu",
                p.batch, p.heads, p.kv_heads, p.q_len, p.kv_len, p.head_dim, int(p.causal), p.softmax_scale(),
                p.dropout_p, (unsigned long long)p.seed);
  return b;
}

}  // namespace fa
