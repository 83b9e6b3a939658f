// Chapter 04, forward step 1 of 4: chapter 02's kernel with its two loops swapped.
//
// 02 streams Q_i past a resident K_j, V_j (outer loop j, inner loop i), so O_i, l_i, m_i make an HBM
// round trip at every (i, j) step. Here the outer loop is over Q blocks and the inner loop over K/V
// blocks: Q_i is loaded once, and O_i, l_i, m_i live in registers for the whole row block. They are
// written once, at the end: O, and L = m + log l (the only statistic the backward needs). Everything
// else - the 16 x 16 thread grid, the tiles, the block softmax and the merge of line 13, the
// normalisation of O_i at every step - is 02's, line for line, so `diff` shows the loop swap alone.
#include <cstdint>

#include "fa2_internal.cuh"

namespace fa2 {
namespace {

// A 16 x 16 grid of threads covers every tile: thread (ty, tx) owns kRows = Br / 16 consecutive
// rows, and columns tx, tx + 16, ... (strided, so the 16 lanes of a half-warp read 16 banks).
constexpr int kTx = 16, kTy = 16, kThreads = kTx * kTy;
constexpr int kBcMax = 64;  // Bc: 4 columns of S_ij per thread
constexpr int kPad = 1;     // odd row strides for the tiles read down a column (no bank conflicts)
// Br: FA1's Br <= d (Algorithm 2 line 2), at most 64 rows (4 per thread).
constexpr int br_max(int d) { return d < 64 ? d : 64; }

template <int D>
struct Tiles {
  static constexpr int kBr = br_max(D);
  static constexpr int kRows = kBr / kTy;      // rows of S_ij and O_i per thread
  static constexpr int kCols = kBcMax / kTx;   // columns of S_ij per thread
  static constexpr int kOCols = D / kTx;       // columns of O_i per thread
  static constexpr int kQStride = D + kPad, kKStride = D + kPad, kPStride = kBcMax + kPad;
  // Shared memory (floats): Q_i [kBr][d+1], K_j [kBc][d+1], V_j [kBc][d], P_ij [kBr][kBc+1].
  static constexpr int kQOff = 0, kKOff = kBr * kQStride, kVOff = kKOff + kBcMax * kKStride,
                       kPOff = kVOff + kBcMax * D, kFloats = kPOff + kBr * kPStride;
  static constexpr size_t kSmemBytes = size_t(kFloats) * sizeof(float);
  static_assert(kBr % kTy == 0, "every thread row owns the same number of rows of Q_i");
  static_assert(kBcMax % kTx == 0, "every thread column owns the same number of columns of S_ij");
  static_assert(D % kTx == 0, "every thread column owns the same number of columns of O_i (d >= 16)");
  static_assert(D % 4 == 0, "rows of Q, K, V are loaded as float4");
  static_assert(kVOff % 4 == 0, "V_j is stored by float4: its tile must start 16-byte aligned");
};

// ---- forward_kernel -----------------------------------------------------------------------------
// FA1's Algorithm 2 with the loops of lines 6 and 8 swapped, for one head. Grid (heads, batch): one
// block per (b, h), as in 02. Block 256 threads, a 16 x 16 grid; Br = min(d, 64), Bc = 64.
// Per (i, j): thread (ty, tx) computes kRows x 4 entries of S_ij (line 10) with the masks (line 11),
// the row max/sum by half-warp shuffles (line 12), the merge (13) and dropout (14), writes P~_ij to
// shared memory, then updates its kRows x d/16 entries of O_i in registers (15).
// Shared memory: Tiles<d>::kSmemBytes = 13.4 / 28.5 / 64.8 / 112.8 KiB for d = 16 / 32 / 64 / 128.
template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(fa::Problem p, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, float* o, float* lse) {
  using T = Tiles<D>;
  extern __shared__ float smem[];
  float* Qs = smem + T::kQOff;
  float* Ks = smem + T::kKOff;
  float* Vs = smem + T::kVOff;
  float* Ps = smem + T::kPOff;

  constexpr int kVec = D / 4;  // float4s per row of Q_i, K_j, V_j
  const float4 kZero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  const int h = blockIdx.x, b = blockIdx.y;
  const int Nq = p.q_len, Nk = p.kv_len, Br = T::kBr, Bc = kBcMax;
  const float scale = p.softmax_scale();
  // Problem::dropout_scale(b, h, i, j) with its loop invariants (the keep threshold and 1/(1-p), an IEEE
  // division) computed once: nvcc does not hoist them out of the unrolled tile loops (ptxas -v: +40 registers).
  const uint32_t keep_threshold = p.dropout_threshold();
  const float keep_scale = 1.f / (1.f - p.dropout_p);
  auto dropout_scale = [&](int i, int j) {
    if (p.dropout_p == 0.f) return 1.f;
    return fa::dropout_keep(p.seed, p.offset, b, h, i, j, keep_threshold) ? keep_scale : 0.f;
  };
  const int tid = threadIdx.x, tx = tid % kTx, ty = tid / kTx;
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));  // GQA: the kv head of query head h
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  float* O = o + p.q_offset(b, h);
  lse += p.lse_offset(b, h);

  const int Tr = (Nq + Br - 1) / Br, Tc = (Nk + Bc - 1) / Bc;
  for (int i = 0; i < Tr; ++i) {  // line 8, now the outer loop
    const int i0 = i * Br, rows = min(Br, Nq - i0);
    // line 9 (Q_i): to shared memory by float4, rows past the block zero; once per row block.
    for (int e = tid; e < T::kBr * kVec; e += kThreads) {
      const int r = e / kVec, x = (e % kVec) * 4;
      const float4 qv = r < rows ? *reinterpret_cast<const float4*>(Q + size_t(i0 + r) * D + x) : kZero4;
      float* qd = Qs + r * T::kQStride + x;
      qd[0] = qv.x, qd[1] = qv.y, qd[2] = qv.z, qd[3] = qv.w;
    }
    // line 3 (O = 0, l = 0, m = -inf), now in registers: O_i, l_i, m_i never go to HBM inside the loop.
    float Oi[T::kRows][T::kOCols] = {}, li[T::kRows], mi[T::kRows], old_factor[T::kRows];
#pragma unroll
    for (int a = 0; a < T::kRows; ++a) li[a] = 0.f, mi[a] = -INFINITY;

    for (int j = 0; j < Tc; ++j) {  // line 6, now the inner loop
      const int j0 = j * Bc, cols = min(Bc, Nk - j0);
      // Blocks from here on lie entirely above the causal diagonal (the block's last row sees no key
      // of K_j) and change nothing (line 13 with m~ = -inf): stop. The same for every thread.
      if (p.visible_keys(i0 + rows - 1) <= j0) break;
      // line 7: K_j, V_j to shared memory, one float4 (4 consecutive columns) per thread and step;
      // rows past the block are zero (0 * garbage could be NaN). K_j's padded rows are not 16-byte
      // aligned, so its float4 is stored as 4 floats; V_j's unpadded rows take the float4 whole.
      for (int e = tid; e < kBcMax * kVec; e += kThreads) {
        const int c = e / kVec, x = (e % kVec) * 4;
        const bool in = c < cols;
        const float4 kv = in ? *reinterpret_cast<const float4*>(K + size_t(j0 + c) * D + x) : kZero4;
        const float4 vv = in ? *reinterpret_cast<const float4*>(V + size_t(j0 + c) * D + x) : kZero4;
        float* kd = Ks + c * T::kKStride + x;
        kd[0] = kv.x, kd[1] = kv.y, kd[2] = kv.z, kd[3] = kv.w;
        *reinterpret_cast<float4*>(Vs + c * D + x) = vv;
      }
      __syncthreads();  // K_j, V_j (and Q_i on the first j) complete

      // line 10: S_ij = scale Q_i K_j^T, a kRows x 4 register tile per thread.
      float S[T::kRows][T::kCols] = {};
#pragma unroll 8
      for (int x = 0; x < D; ++x) {
        float qa[T::kRows], kc[T::kCols];
#pragma unroll
        for (int a = 0; a < T::kRows; ++a) qa[a] = Qs[(ty * T::kRows + a) * T::kQStride + x];
#pragma unroll
        for (int c = 0; c < T::kCols; ++c) kc[c] = Ks[(tx + c * kTx) * T::kKStride + x];
#pragma unroll
        for (int a = 0; a < T::kRows; ++a)
#pragma unroll
          for (int c = 0; c < T::kCols; ++c) S[a][c] += qa[a] * kc[c];
      }

#pragma unroll
      for (int a = 0; a < T::kRows; ++a) {
        const int r = ty * T::kRows + a, row = i0 + r;
        // line 11: MASK. Outside the block (ragged tails) or not visible (Problem::visible: past the
        // keys or above the bottom-right-aligned diagonal) -> -inf.
        float m_tilde = -INFINITY;
#pragma unroll
        for (int c = 0; c < T::kCols; ++c) {
          const int cc = tx + c * kTx;
          S[a][c] = (r < rows && cc < cols && p.visible(row, j0 + cc)) ? scale * S[a][c] : -INFINITY;
          m_tilde = fmaxf(m_tilde, S[a][c]);
        }
        // line 12: row max and row sum over the 16 lanes that hold the row (xor stays in the half-warp).
        // All 32 lanes reach these shuffles: no lane has left the loop, so the full mask is correct.
#pragma unroll
        for (int off = kTx / 2; off > 0; off /= 2)
          m_tilde = fmaxf(m_tilde, __shfl_xor_sync(0xffffffffu, m_tilde, off));
        // exp(-inf - (-inf)) is NaN: a masked entry's P~ is 0 by definition, not by arithmetic. (With
        // m~ finite, exp(-inf - m~) = 0 would do; the test also covers rows with m~ = -inf.)
        float l_tilde = 0.f;
#pragma unroll
        for (int c = 0; c < T::kCols; ++c) {
          S[a][c] = S[a][c] == -INFINITY ? 0.f : expf(S[a][c] - m_tilde);  // S now holds P~_ij
          l_tilde += S[a][c];
        }
#pragma unroll
        for (int off = kTx / 2; off > 0; off /= 2) l_tilde += __shfl_xor_sync(0xffffffffu, l_tilde, off);

        // line 13: the merge. A factor whose m is -inf is 0 (nothing seen yet / nothing visible here).
        const float m_new = fmaxf(mi[a], m_tilde);
        const float alpha = mi[a] == -INFINITY ? 0.f : expf(mi[a] - m_new);
        const float beta = m_tilde == -INFINITY ? 0.f : expf(m_tilde - m_new);
        const float l_new = alpha * li[a] + beta * l_tilde;

        // line 14: dropout on P~_ij after l~ is taken (the softmax normalises over every key), the
        // same Philox mask as the reference: element (b, h, row, col).
#pragma unroll
        for (int c = 0; c < T::kCols; ++c) {
          const int cc = tx + c * kTx;
          float pd = S[a][c];
          if (p.dropout_p > 0.f && pd != 0.f) pd *= dropout_scale(row, j0 + cc);
          Ps[r * T::kPStride + cc] = beta * pd;  // e^(m~ - m_new) P~_ij (dropped), ready for line 15
        }
        // Keep what line 15 needs per row: m_new, l_new and the factor on the old O_i.
        mi[a] = m_new;
        old_factor[a] = alpha * li[a];  // diag(l_i) e^(m_i - m_new)
        li[a] = l_new;
      }
      __syncthreads();  // P~_ij complete

      // line 15: O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~_ij V_j)
      float PV[T::kRows][T::kOCols] = {};
      for (int jj = 0; jj < kBcMax; ++jj) {
        float pa[T::kRows], vc[T::kOCols];
#pragma unroll
        for (int a = 0; a < T::kRows; ++a) pa[a] = Ps[(ty * T::kRows + a) * T::kPStride + jj];
#pragma unroll
        for (int c = 0; c < T::kOCols; ++c) vc[c] = Vs[jj * D + tx + c * kTx];
#pragma unroll
        for (int a = 0; a < T::kRows; ++a)
#pragma unroll
          for (int c = 0; c < T::kOCols; ++c) PV[a][c] += pa[a] * vc[c];
      }
#pragma unroll
      for (int a = 0; a < T::kRows; ++a) {
        // l_new = 0 only for a row that has seen no key yet: its O_i stays 0 (and 0/0 is avoided).
        const float inv_l = li[a] > 0.f ? 1.f / li[a] : 0.f;
#pragma unroll
        for (int c = 0; c < T::kOCols; ++c) Oi[a][c] = (old_factor[a] * Oi[a][c] + PV[a][c]) * inv_l;
      }
      __syncthreads();  // K_j, V_j and P_ij are overwritten by the next block
    }
    // After the inner loop: O_i and L_i = m_i + log l_i to HBM, once (-inf for an empty row).
#pragma unroll
    for (int a = 0; a < T::kRows; ++a) {
      const int r = ty * T::kRows + a;
      if (r >= rows) continue;
#pragma unroll
      for (int c = 0; c < T::kOCols; ++c) O[size_t(i0 + r) * D + tx + c * kTx] = Oi[a][c];
      if (tx == 0) lse[i0 + r] = li[a] > 0.f ? mi[a] + logf(li[a]) : -INFINITY;
    }
    __syncthreads();  // Q_i is overwritten by the next row block
  }
}

template <int D>
void launch(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse) {
  using T = Tiles<D>;
  detail::allow_smem(forward_kernel<D>, T::kSmemBytes, D);
  const dim3 grid(p.heads, p.batch);
  forward_kernel<D><<<grid, kThreads, T::kSmemBytes>>>(p, q, k, v, o, lse);
  CHECK_LAUNCH();
}

}  // namespace

void forward_v1_loop_swap(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse) {
  detail::check_args(p, {q, k, v, o});
  switch (p.head_dim) {
    case 16: return launch<16>(p, q, k, v, o, lse);
    case 32: return launch<32>(p, q, k, v, o, lse);
    case 64: return launch<64>(p, q, k, v, o, lse);
    default: return launch<128>(p, q, k, v, o, lse);
  }
}

}  // namespace fa2
