// Chapter 03: the FlashAttention-1 backward pass with recomputation (FA1's Algorithm 4), fp32.
//
// fa1_backward_kernel computes dQ, dK, dV from Q, K, V, O, dO and the forward's row statistics
// (m_i, l_i); P is recomputed tile by tile, never stored. Grid: one block per (batch, kv head) -
// the block walks the K/V blocks j in order (outer loop, lines 6-25) and, for each, every Q block i
// of every query head of its GQA group (inner loop, lines 9-23). dQ_i is accumulated in HBM
// (line 21): because a single block owns all of a head's dQ, those read-modify-writes never race.
// (Running the outer loop in parallel - one block per j - would have several blocks add into the
// same dQ_i at once; chapter 04 removes that conflict.) dK_j, dV_j live in registers; summing over
// the group inside one block keeps GQA deterministic.
// Block: kThreads = 256. Shared memory per block (floats): K_j, V_j Bc x (d+1); Q_i, dO_i Br x d;
// P^drop_ij Br x Bc; dS_ij Br x (Bc+1); D_i, m_i, 1/l_i Br each. With Br = 32, Bc = 64:
// d = 16: 29.0 KiB, 32: 41.0 KiB, 64: 65.0 KiB, 128: 113.0 KiB (above 48 KiB: opted in with
// cudaFuncSetAttribute). Instantiated for d in {16, 32, 64, 128} (fa1::backward dispatches).
#include "fa1_backward.cuh"

#include <cmath>
#include <cstdio>
#include <string>

#include "cuda_check.cuh"
#include "model.hpp"  // the HBM counts

namespace fa1 {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBr = 32;  // query rows per tile (inner loop)
constexpr int kBc = 64;  // key rows per tile (outer loop)
static_assert(kThreads % kBc == 0, "phase B maps threads to (row group, key column)");
static_assert(kBr % (kThreads / kBc) == 0, "phase B: every thread gets the same number of rows");
static_assert(kBr % kWarps == 0, "phase A: every warp loads the same number of rows");

// p.seed, p.offset are the forward's RNG state (RngState), so the dropout mask is regenerated exactly.
// __launch_bounds__(.., 1): the grid has B * Hkv blocks, one per SM at most at the sizes this chapter runs;
// saying so lets ptxas use the registers it needs instead of squeezing to 128 and spilling.
template <int D>
__global__ void __launch_bounds__(kThreads, 1)
    fa1_backward_kernel(fa::Problem p, const float* q, const float* k, const float* v, const float* o,
                        const float* l, const float* m, const float* dout, float* dq, float* dk, float* dv) {
  static_assert(kThreads % D == 0 && kBr % (kThreads / D) == 0, "phase D: d must divide the threads evenly");
  static_assert((kBc * D) % kThreads == 0, "dK_j, dV_j must split evenly over the threads");
  constexpr int kKvStride = D + 1;    // K_s, V_s are read along the key index: +1 avoids bank conflicts
  constexpr int kDsStride = kBc + 1;  // dS_s is read by two rows per warp when d = 16
  constexpr int kRowsB = kBr / (kThreads / kBc);   // rows per thread in phase B
  constexpr int kColsC = kBc * D / kThreads;       // dK, dV columns per thread
  constexpr int kRowsD = kBr / (kThreads / D);     // dQ rows per thread in phase D

  extern __shared__ float smem[];
  float* K_s = smem;
  float* V_s = K_s + kBc * kKvStride;
  float* Q_s = V_s + kBc * kKvStride;
  float* dO_s = Q_s + kBr * D;
  float* Pd_s = dO_s + kBr * D;  // P^drop_ij = P_ij o Z_ij / (1 - p)
  float* dS_s = Pd_s + kBr * kBc;
  float* D_s = dS_s + kBr * kDsStride;
  float* m_s = D_s + kBr;
  float* inv_l_s = m_s + kBr;

  const int b = blockIdx.x / p.kv_heads, hk = blockIdx.x % p.kv_heads;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const float scale = p.softmax_scale();
  // Problem::dropout_scale(b, h, i, j) with its loop invariants (the keep threshold and 1/(1-p), an IEEE
  // division) computed once: nvcc does not hoist them out of the unrolled tile loops.
  const uint32_t keep_threshold = p.dropout_threshold();
  const float keep_scale = 1.f / (1.f - p.dropout_p);
  const float* K = k + p.kv_offset(b, hk);
  const float* V = v + p.kv_offset(b, hk);
  float* dK = dk + p.kv_offset(b, hk);
  float* dV = dv + p.kv_offset(b, hk);
  // phase B / C thread mapping: key column cc of the tile
  const int cc = tid % kBc, row_group = tid / kBc;

  for (int j0 = 0; j0 < p.kv_len; j0 += kBc) {  // line 6: for 1 <= j <= Tc
    // line 7: load K_j, V_j to SRAM (zero rows beyond kv_len); line 8: dK_j = dV_j = 0 on chip
    for (int e = tid; e < kBc * D; e += kThreads) {
      const int r = e / D, c = e % D;
      const bool in = j0 + r < p.kv_len;
      K_s[r * kKvStride + c] = in ? K[size_t(j0 + r) * D + c] : 0.f;
      V_s[r * kKvStride + c] = in ? V[size_t(j0 + r) * D + c] : 0.f;
    }
    float dK_acc[kColsC] = {}, dV_acc[kColsC] = {};
    __syncthreads();

    // Causal: query rows before the first one that sees key j0 see none of these keys, so their
    // P_ij = 0 and whole Q blocks before that row contribute nothing: start the inner loop after them.
    const int first_row = p.first_query_seeing(j0);
    for (int g = 0; g < p.group(); ++g) {  // GQA: every query head of this kv head
      const int h = hk * p.group() + g;
      const float* Q = q + p.q_offset(b, h);
      const float* O = o + p.q_offset(b, h);
      const float* dO = dout + p.q_offset(b, h);
      float* dQ = dq + p.q_offset(b, h);
      const float* l_h = l + p.lse_offset(b, h);  // this head's l_i, m_i
      const float* m_h = m + p.lse_offset(b, h);
      for (int i0 = first_row / kBr * kBr; i0 < p.q_len; i0 += kBr) {  // line 9: for 1 <= i <= Tr
        // ---- phase A, lines 10 and 19: load Q_i, dO_i, m_i, l_i; D_i = rowsum(dO_i o O_i). A warp per row.
        for (int r = warp; r < kBr; r += kWarps) {
          const int i = i0 + r;
          float dot = 0.f;
          for (int c = lane; c < D; c += 32) {
            const float q_ic = i < p.q_len ? Q[size_t(i) * D + c] : 0.f;
            const float do_ic = i < p.q_len ? dO[size_t(i) * D + c] : 0.f;
            Q_s[r * D + c] = q_ic;
            dO_s[r * D + c] = do_ic;
            if (i < p.q_len) dot += do_ic * O[size_t(i) * D + c];
          }
          for (int off = 16; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
          if (lane == 0) {
            D_s[r] = dot;
            const float l_i = i < p.q_len ? l_h[i] : 0.f;
            // An empty causal row has l = 0, m = -inf: it is masked below and never reads these.
            m_s[r] = i < p.q_len ? m_h[i] : 0.f;
            inv_l_s[r] = l_i > 0.f ? 1.f / l_i : 0.f;
          }
        }
        __syncthreads();

        // ---- phase B, lines 11-15, 17, 18, 20: S_ij = scale Q_i K_j^T, P_ij = exp(S_ij - m_i) / l_i (masked: 0),
        // P^drop_ij = P_ij Z_ij / (1-p), dP_ij = (dO_i V_j^T) Z_ij / (1-p), dS_ij = P_ij (dP_ij - D_i).
        // Thread: key column cc, rows row_group + k * (kThreads / kBc).
        {
          float s[kRowsB] = {}, dp[kRowsB] = {};
#pragma unroll 8
          for (int c = 0; c < D; ++c) {
            const float kc = K_s[cc * kKvStride + c], vc = V_s[cc * kKvStride + c];
#pragma unroll
            for (int k = 0; k < kRowsB; ++k) {
              const int r = row_group + k * (kThreads / kBc);
              s[k] += Q_s[r * D + c] * kc;
              dp[k] += dO_s[r * D + c] * vc;
            }
          }
          const int j = j0 + cc;
#pragma unroll
          for (int k = 0; k < kRowsB; ++k) {
            const int r = row_group + k * (kThreads / kBc), i = i0 + r;
            const bool seen = i < p.q_len && p.visible(i, j);  // mask, tails, empty rows
            const float P = seen ? expf(scale * s[k] - m_s[r]) * inv_l_s[r] : 0.f;
            float z = 1.f;  // Z_ij / (1 - p), regenerated from the forward's RNG state (line 14)
            if (p.dropout_p > 0.f && seen)
              z = fa::dropout_keep(p.seed, p.offset, b, h, i, j, keep_threshold) ? keep_scale : 0.f;
            Pd_s[r * kBc + cc] = P * z;
            dS_s[r * kDsStride + cc] = P * (dp[k] * z - D_s[r]);
          }
        }
        __syncthreads();

        // ---- phase C, lines 16 and 22: dV_j += P^drop_ij^T dO_i, dK_j += scale dS_ij^T Q_i (registers;
        // scale applied once, when dK_j is written). Thread: key cc, columns row_group + k * (kThreads / kBc).
        for (int r = 0; r < kBr; ++r) {
          const float pd = Pd_s[r * kBc + cc], ds = dS_s[r * kDsStride + cc];
#pragma unroll
          for (int k = 0; k < kColsC; ++k) {
            const int c = row_group + k * (kThreads / kBc);
            dV_acc[k] += pd * dO_s[r * D + c];
            dK_acc[k] += ds * Q_s[r * D + c];
          }
        }
        // ---- phase D, line 21: dQ_i += scale dS_ij K_j, read-modify-write in HBM (this block is the
        // only writer of head h's dQ). Thread: column c = tid % D, rows tid / D + k * (kThreads / D).
        {
          const int c = tid % D;
          float acc[kRowsD] = {};
          for (int jj = 0; jj < kBc; ++jj) {
            const float kc = K_s[jj * kKvStride + c];
#pragma unroll
            for (int k = 0; k < kRowsD; ++k) acc[k] += dS_s[(tid / D + k * (kThreads / D)) * kDsStride + jj] * kc;
          }
#pragma unroll
          for (int k = 0; k < kRowsD; ++k) {
            const int i = i0 + tid / D + k * (kThreads / D);
            if (i < p.q_len) dQ[size_t(i) * D + c] += scale * acc[k];
          }
        }
        __syncthreads();  // Q_s, dO_s, P^drop_s, dS_s are overwritten by the next Q block
      }
    }
    // line 24: write dK_j, dV_j to HBM
#pragma unroll
    for (int k = 0; k < kColsC; ++k) {
      const int c = row_group + k * (kThreads / kBc);
      if (j0 + cc < p.kv_len) {
        dK[size_t(j0 + cc) * D + c] = scale * dK_acc[k];
        dV[size_t(j0 + cc) * D + c] = dV_acc[k];
      }
    }
    __syncthreads();  // K_s, V_s are overwritten by the next K/V block
  }
}

template <int D>
constexpr size_t smem_bytes() {
  return sizeof(float) * (2 * kBc * (D + 1) + 2 * kBr * D + kBr * kBc + kBr * (kBc + 1) + 3 * kBr);
}

template <int D>
void launch(const fa::Problem& p, const float* q, const float* k, const float* v, const float* o, const float* l,
            const float* m, const float* dout, float* dq, float* dk, float* dv) {
  constexpr size_t bytes = smem_bytes<D>();
  int dev = 0, optin = 0;
  CUDA_CHECK(cudaGetDevice(&dev));
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  if (bytes > size_t(optin)) {
    char msg[160];
    std::snprintf(msg, sizeof msg, "fa1::backward: head_dim %d needs %.1f KiB of shared memory per block, this GPU "
                  "allows %.1f KiB", D, bytes / 1024.0, optin / 1024.0);
    throw fa::UsageError(msg);
  }
  // Above 48 KiB a block must opt in to the larger dynamic shared memory.
  CUDA_CHECK(cudaFuncSetAttribute(fa1_backward_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
  fa1_backward_kernel<D><<<p.batch * p.kv_heads, kThreads, bytes>>>(p, q, k, v, o, l, m, dout, dq, dk, dv);
  CHECK_LAUNCH();
}

}  // namespace

void backward(const fa::Problem& p, RngState rng, const float* q, const float* k, const float* v, const float* o,
              const float* l, const float* m, const float* dout, float* dq, float* dk, float* dv) {
  check_supported(p);  // head_dim 16/32/64/128, grid limits
  if (static_cast<long long>(p.batch) * p.kv_heads > 0x7FFFFFFFLL)
    throw fa::UsageError("fa1::backward: batch * kv_heads must be < 2^31 (one block each)");
  // line 5: dQ is accumulated in HBM over the K/V blocks (line 21), so it starts at zero. dK and dV
  // need no zeroing: every row of them is written once, at line 24.
  CUDA_CHECK(cudaMemsetAsync(dq, 0, p.q_elems() * sizeof(float)));
  fa::Problem pr = p;  // the mask the forward drew: its RNG state
  pr.seed = rng.seed, pr.offset = rng.offset;
  switch (p.head_dim) {
    case 16: return launch<16>(pr, q, k, v, o, l, m, dout, dq, dk, dv);
    case 32: return launch<32>(pr, q, k, v, o, l, m, dout, dq, dk, dv);
    case 64: return launch<64>(pr, q, k, v, o, l, m, dout, dq, dk, dv);
    default: return launch<128>(pr, q, k, v, o, l, m, dout, dq, dk, dv);
  }
}

double backward_paper_formula_bytes(const fa::Problem& p) { return fa1_bwd_model::paper_formula_bytes(p, kBc); }
double backward_hbm_bytes(const fa::Problem& p) { return fa1_bwd_model::hbm_bytes(p, kBr, kBc); }

}  // namespace fa1
