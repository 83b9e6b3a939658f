// Chapter 02: the FlashAttention-1 forward pass (Algorithm 2 of FA1: scale, MASK, dropout), fp32.
//
// Compared with 00, S and P never reach HBM: a K_j, V_j block is loaded into shared memory once
// (outer loop), and every Q_i block visits it (inner loop), merging its block softmax into the
// running (O_i, l_i, m_i) with 01's recurrence. As the algorithm says, O, l and m live in HBM and
// make a round trip at every (i, j) step - the Tc passes over O that chapter 04 removes.
#include "fa1_forward.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "cuda_check.cuh"
#include "model.hpp"

namespace fa1 {
namespace {

// A 16 x 16 grid of threads covers every tile: thread (ty, tx) owns kRows = Br / 16 consecutive
// rows, and columns tx, tx + 16, ... (strided, so the 16 lanes of a half-warp read 16 banks).
constexpr int kTx = 16, kTy = 16, kThreads = kTx * kTy;
constexpr int kBcMax = 64;  // the kernel's Bc capacity: 4 columns of S_ij per thread
constexpr int kPad = 1;     // odd row strides for the tiles read down a column (no bank conflicts)
// Br capacity: FA1's Br <= d (Algorithm 2 line 2), at most 64 rows (4 per thread).
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

// ---- fa1_forward_kernel ------------------------------------------------------------------------
// Algorithm 2 for one head: lines 3-16 (README §3). Grid (heads, batch): one block per (b, h), as
// in FA1, so only B*H SMs work (see README §3). Block 256 threads, a 16 x 16 grid. Runtime tile sizes
// Br <= kBr, Bc <= kBcMax come from block_sizes(); a smaller one leaves threads idle (masked).
// Per (i, j): thread (ty, tx) computes kRows x 4 entries of S_ij (line 10) with the masks (line 11),
// the row max/sum by half-warp shuffles (line 12: the 16 lanes of a row hold the whole row), the
// merge (13) and dropout (14), writes P~_ij to shared memory, then kRows x d/16 entries of the O_i
// update (15) straight between registers and HBM, and tx = 0 writes l_i, m_i (16).
// Shared memory: Tiles<d>::kSmemBytes = 13.4 / 28.5 / 64.8 / 112.8 KiB for d = 16 / 32 / 64 / 128.
// Q_i, K_j, V_j arrive from HBM as float4s. Instantiated for D = 16, 32, 64, 128 (forward() below).
template <int D>
__global__ void __launch_bounds__(kThreads)
    fa1_forward_kernel(fa::Problem p, int Br, int Bc, const float* __restrict__ q, const float* __restrict__ k,
                       const float* __restrict__ v, float* o, float* l, float* m, float* lse) {
  using T = Tiles<D>;
  extern __shared__ float smem[];
  float* Qs = smem + T::kQOff;
  float* Ks = smem + T::kKOff;
  float* Vs = smem + T::kVOff;
  float* Ps = smem + T::kPOff;

  constexpr int kVec = D / 4;  // float4s per row of Q_i, K_j, V_j
  const float4 kZero4 = make_float4(0.f, 0.f, 0.f, 0.f);
  const int h = blockIdx.x, b = blockIdx.y;
  const int Nq = p.q_len, Nk = p.kv_len;
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
  l += p.lse_offset(b, h);  // l, m, lse: this head's rows
  m += p.lse_offset(b, h);
  lse += p.lse_offset(b, h);

  // line 3: O = 0, l = 0, m = -inf in HBM (this head's part); the barrier makes the writes visible
  // to the threads that read them at line 9.
  for (size_t e = tid; e < size_t(Nq) * D; e += kThreads) O[e] = 0.f;
  for (int r = tid; r < Nq; r += kThreads) l[r] = 0.f, m[r] = -INFINITY;
  __syncthreads();

  const int Tr = (Nq + Br - 1) / Br, Tc = (Nk + Bc - 1) / Bc;
  for (int j = 0; j < Tc; ++j) {  // line 6
    const int j0 = j * Bc, cols = min(Bc, Nk - j0);
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
    for (int i = 0; i < Tr; ++i) {  // line 8
      const int i0 = i * Br, rows = min(Br, Nq - i0);
      // A block entirely above the causal diagonal changes nothing (line 13 with m~ = -inf): skip it
      // (its last row sees no key of K_j). The condition is the same for every thread, so the
      // barriers below are never divergent.
      if (p.visible_keys(i0 + rows - 1) <= j0) continue;
      // line 9 (Q_i): to shared memory by float4, rows past the block zero.
      for (int e = tid; e < T::kBr * kVec; e += kThreads) {
        const int r = e / kVec, x = (e % kVec) * 4;
        const float4 qv = r < rows ? *reinterpret_cast<const float4*>(Q + size_t(i0 + r) * D + x) : kZero4;
        float* qd = Qs + r * T::kQStride + x;
        qd[0] = qv.x, qd[1] = qv.y, qd[2] = qv.z, qd[3] = qv.w;
      }
      __syncthreads();  // Q_i (and K_j, V_j on the first i) complete

      // line 9 (O_i, l_i, m_i): each thread reads its own rows and columns from HBM into registers.
      float Oi[T::kRows][T::kOCols], li[T::kRows], mi[T::kRows], old_factor[T::kRows];
#pragma unroll
      for (int a = 0; a < T::kRows; ++a) {
        const int r = ty * T::kRows + a;
        const bool valid = r < rows;
        li[a] = valid ? l[i0 + r] : 0.f;
        mi[a] = valid ? m[i0 + r] : -INFINITY;
#pragma unroll
        for (int c = 0; c < T::kOCols; ++c) Oi[a][c] = valid ? O[size_t(i0 + r) * D + tx + c * kTx] : 0.f;
      }

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
        // line 11: MASK. Outside the block (ragged tails, runtime Br/Bc below capacity) or not
        // visible (Problem::visible: past the keys or above the bottom-right-aligned diagonal) -> -inf.
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
        // Keep what lines 15-16 need per row: m_new, l_new and the factor on the old O_i.
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
        const int r = ty * T::kRows + a;
        if (r >= rows) continue;
        // l_new = 0 only for a row that has seen no key yet: its O_i stays 0 (and 0/0 is avoided).
        const float inv_l = li[a] > 0.f ? 1.f / li[a] : 0.f;
#pragma unroll
        for (int c = 0; c < T::kOCols; ++c)
          O[size_t(i0 + r) * D + tx + c * kTx] = (old_factor[a] * Oi[a][c] + PV[a][c]) * inv_l;
        // line 16: l_i, m_i to HBM (one lane per row)
        if (tx == 0) l[i0 + r] = li[a], m[i0 + r] = mi[a];
      }
      __syncthreads();  // Q_i and P_ij are overwritten by the next block; l_i, m_i visible
    }
    __syncthreads();  // K_j, V_j are overwritten by the next outer step (also when every i was skipped)
  }
  // After line 18: LSE L_i = m_i + log l_i for the later chapters; -inf for an empty row.
  for (int r = tid; r < Nq; r += kThreads) lse[r] = l[r] > 0.f ? m[r] + logf(l[r]) : -INFINITY;
}

template <int D>
void launch(const fa::Problem& p, BlockSizes bs, const float* q, const float* k, const float* v, float* o, float* l,
            float* m, float* lse) {
  using T = Tiles<D>;
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (T::kSmemBytes > size_t(optin)) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "fa1: head_dim %d needs %.1f KiB of shared memory per block, this GPU allows %.1f KiB",
                  D, T::kSmemBytes / 1024.0, optin / 1024.0);
    throw fa::UsageError(msg);
  }
  // Above 48 KiB a block must opt in to the larger dynamic shared memory.
  CUDA_CHECK(cudaFuncSetAttribute(fa1_forward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  int(T::kSmemBytes)));
  const dim3 grid(p.heads, p.batch);
  fa1_forward_kernel<D><<<grid, kThreads, T::kSmemBytes>>>(p, bs.Br, bs.Bc, q, k, v, o, l, m, lse);
  CHECK_LAUNCH();
}

void require_head_dim(int d) {
  if (d != 16 && d != 32 && d != 64 && d != 128)
    throw fa::UsageError("fa1: head_dim must be 16, 32, 64 or 128 (got " + std::to_string(d) + ")");
}

}  // namespace

int max_br(int head_dim) {
  require_head_dim(head_dim);
  return br_max(head_dim);
}
int max_bc() { return kBcMax; }

BlockSizes block_sizes(int head_dim, size_t smem_bytes) {
  require_head_dim(head_dim);
  // Line 2 with M in fp32 elements, then the kernel's capacity (its register tiles are fixed).
  const fa1_model::PaperBlockSizes s = fa1_model::paper_block_sizes(head_dim, smem_bytes / sizeof(float));
  return {std::max(1, std::min(s.Br, br_max(head_dim))), std::max(1, std::min(s.Bc, kBcMax))};
}

void check_supported(const fa::Problem& p) {
  p.validate();
  require_head_dim(p.head_dim);
  if (p.batch > 65535 || p.heads > 65535)
    throw fa::UsageError("fa1: batch and heads must be < 65536 (grid and dropout counter limits)");
}

double forward_hbm_bytes(const fa::Problem& p, BlockSizes bs) {
  return 4.0 * p.batch * p.heads * fa1_model::hbm_elements_per_head(p, bs.Br, bs.Bc);
}

size_t device_sram_bytes() {
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  return size_t(optin);
}

RngState forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* l, float* m,
                 float* lse, BlockSizes bs) {
  check_supported(p);
  for (const float* ptr : {q, k, v})  // float4 loads need 16-byte aligned tensors (cudaMalloc's are)
    if (reinterpret_cast<uintptr_t>(ptr) % alignof(float4) != 0)
      throw std::invalid_argument("fa1::forward: q, k and v must be 16-byte aligned");
  if (bs.Br < 1 || bs.Br > br_max(p.head_dim) || bs.Bc < 1 || bs.Bc > kBcMax)
    throw fa::UsageError("fa1: block sizes must be 1 <= Br <= " + std::to_string(br_max(p.head_dim)) +
                         " and 1 <= Bc <= " + std::to_string(kBcMax) + " (got Br=" + std::to_string(bs.Br) +
                         ", Bc=" + std::to_string(bs.Bc) + ")");
  switch (p.head_dim) {
    case 16: launch<16>(p, bs, q, k, v, o, l, m, lse); break;
    case 32: launch<32>(p, bs, q, k, v, o, l, m, lse); break;
    case 64: launch<64>(p, bs, q, k, v, o, l, m, lse); break;
    default: launch<128>(p, bs, q, k, v, o, l, m, lse); break;
  }
  return {p.seed, p.offset};  // line 1: the RNG state R the backward regenerates the mask from
}

RngState forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* l, float* m,
                 float* lse) {
  require_head_dim(p.head_dim);
  return forward(p, q, k, v, o, l, m, lse, block_sizes(p.head_dim, device_sram_bytes()));
}

}  // namespace fa1
