// Chapter 04: the FlashAttention-2 backward pass (FA2 Algorithm 2, README §4), fp32 on CUDA cores.
//
// What changes against chapter 03: the loop over K/V blocks is the grid (K/V block, kv head, batch), so
// dK_j, dV_j accumulate in registers and are written once; P_ij = exp(S_ij - L_i) is recomputed from
// the forward's L alone; D_i = rowsum(dO_i o O_i) is computed once by its own kernel (D_rows, not per
// tile); dQ is summed by atomicAdd or by a deterministic second kernel over Q blocks (DqMode).
// Thread mapping and tile helpers: fa2_tiles.cuh (the 4 x 4 micro-tiles of forward step 4).
// Instantiations: head_dim 16, 32, 64, 128 for every kernel.
#include "fa2_internal.cuh"
#include "fa2_tiles.cuh"

namespace fa2 {
namespace {

using namespace tile;

// ---- backward: D = rowsum(dO o O) -----------------------------------------------------------------------
// Backward line 1. One warp per row of [B*H*Nq, d]; 8 rows per 256-thread block; no shared memory.
constexpr int kWarpsPerBlock = kThreads / 32;
__global__ void __launch_bounds__(kThreads)
    rowsum_do_o_kernel(const float* __restrict__ o, const float* __restrict__ dout, float* __restrict__ D_rows,
                       size_t rows, int d) {
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave; there is no barrier below
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc = fmaf(dout[row * d + c], o[row * d + c], acc);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) D_rows[row] = acc;
}

// Loads L_i and D_i of a Q block into shared memory. An empty row (L = -inf) and a row past q_len are stored
// as L = +inf, so that P = exp(S - L) = 0 there without a branch in the inner loops.
__device__ void load_stats(float* Ls, float* Ds, const float* lse_h, const float* D_h, int i0, int rows, int len) {
  for (int t = threadIdx.x; t < rows; t += kThreads) {
    const int i = i0 + t;
    const float L = i < len ? lse_h[i] : -INFINITY;
    Ls[t] = L == -INFINITY ? INFINITY : L;
    Ds[t] = i < len ? D_h[i] : 0.f;
  }
}

// ---- backward: the K/V-block kernel -------------------------------------------------------------------
// dK_j, dV_j for one K/V block of kv head hk (README Algorithm 2, lines 2-12), summed over the query heads of
// the GQA group (looped inside the block, so the sum is deterministic); with kAtomicDq also dQ_i += scale dS_ij K_j
// by atomicAdd (line 11). Grid (ceil(Nk/Bc), Hkv, B), 256 threads. kSparse: the Q blocks the block mask masks are
// skipped (the dense kernel, kSparse = false, is compiled without the test).
// Thread (ty, tx) owns key rows j = ty*4..ty*4+3 of S_ij^T (query columns tx + 16c, c < Br/16) and of dK_j, dV_j
// (columns OutCols<D>::col(tx, .)); for dQ_i it owns query rows ty*2, ty*2+1.
// Shared memory (floats): K_j, V_j [Bc][D+4]; Q_i, dO_i [Br][D+4]; P^drop_ij, dS_ij [Br][Bc+4]; L_i, D_i [Br]
//   = 69.9 KB at d = 64, 119.0 KB at d = 128 (1 KB = 1000 bytes).
// __launch_bounds__(.., 1): at d = 128 the shared memory allows one block per SM anyway; saying so lets ptxas use
// the registers it needs (168) instead of squeezing to 128 and spilling.
template <int D, bool kAtomicDq, bool kSparse>
__global__ void __launch_bounds__(kThreads, 1)
    backward_kv_kernel(fa::Problem p, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ D_rows,
                       float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv,
                       const uint8_t* __restrict__ block_mask) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdS = kBwdBc + kPad;
  constexpr int kI = kBwdBr / kTx;        // query columns of S^T per thread
  constexpr int kQRows = kBwdBr / kTy;    // dQ rows per thread
  static_assert(kQRows * kTy == kBwdBr, "dQ_i rows are split evenly over the 16 thread rows");
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);
  float* Vs = Ks + kBwdBc * kLd;
  float* Qs = Vs + kBwdBc * kLd;
  float* dOs = Qs + kBwdBr * kLd;
  float* Ps = dOs + kBwdBr * kLd;   // P^drop_ij  [query][key]
  float* dSs = Ps + kBwdBr * kLdS;  // dS_ij  [query][key]
  float* Ls = dSs + kBwdBr * kLdS;
  float* Ds = Ls + kBwdBr;

  const int j0 = blockIdx.x * kBwdBc, hk = blockIdx.y, b = blockIdx.z;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const float scale = p.softmax_scale();
  // Problem::dropout_scale(b, h, i, j) with its loop invariants (the keep threshold and 1/(1-p), an IEEE
  // division) computed once: nvcc does not hoist them out of the unrolled tile loops (ptxas -v: +40 registers).
  const uint32_t keep_threshold = p.dropout_threshold();
  const float keep_scale = 1.f / (1.f - p.dropout_p);
  const size_t kv_base = p.kv_offset(b, hk);
  load_rows<D>(Ks, kLd, k + kv_base, j0, kBwdBc, p.kv_len);  // line 3
  load_rows<D>(Vs, kLd, v + kv_base, j0, kBwdBc, p.kv_len);
  float dK[kMicro][Cols::kN] = {}, dV[kMicro][Cols::kN] = {};

  // Causal: Q blocks wholly before the first query that sees key j0 are skipped.
  const int i_first = p.first_query_seeing(j0);
  for (int g = 0; g < p.group(); ++g) {  // line 4: the query heads of this kv head's group
    const int h = hk * p.group() + g;
    auto dropout_scale = [&](int i, int j) {
      if (p.dropout_p == 0.f) return 1.f;
      return fa::dropout_keep(p.seed, p.offset, b, h, i, j, keep_threshold) ? keep_scale : 0.f;
    };
    const size_t q_base = p.lse_offset(b, h);  // row index of (b, h, 0)
    for (int i0 = i_first / kBwdBr * kBwdBr; i0 < p.q_len; i0 += kBwdBr) {
      if (kSparse && !fa::block_visible(block_mask, fa::mask_cols_of(p.kv_len), i0, j0)) continue;  // block-uniform: no divergence
      __syncthreads();  // the previous iteration has finished reading Q_i, dO_i, P^drop, dS (and K_j, V_j are loaded)
      load_rows<D>(Qs, kLd, q + q_base * D, i0, kBwdBr, p.q_len);  // line 5
      load_rows<D>(dOs, kLd, dout + q_base * D, i0, kBwdBr, p.q_len);
      load_stats(Ls, Ds, lse + q_base, D_rows + q_base, i0, kBwdBr, p.q_len);
      __syncthreads();

      float St[kMicro][kI] = {}, dPt[kMicro][kI] = {};  // S_ij^T = K_j Q_i^T, dP^drop_ij^T = V_j dO_i^T
#pragma unroll 4
      for (int c4 = 0; c4 < D; c4 += 4) {
        float4 kv[kMicro], vv[kMicro], qv[kI], dov[kI];
#pragma unroll
        for (int r = 0; r < kMicro; ++r) {
          kv[r] = lds4(Ks + (ty * kMicro + r) * kLd + c4);
          vv[r] = lds4(Vs + (ty * kMicro + r) * kLd + c4);
        }
#pragma unroll
        for (int c = 0; c < kI; ++c) {
          qv[c] = lds4(Qs + (tx + kTx * c) * kLd + c4);
          dov[c] = lds4(dOs + (tx + kTx * c) * kLd + c4);
        }
#pragma unroll
        for (int r = 0; r < kMicro; ++r)
#pragma unroll
          for (int c = 0; c < kI; ++c) {
            St[r][c] = dot4(kv[r], qv[c], St[r][c]);
            dPt[r][c] = dot4(vv[r], dov[c], dPt[r][c]);
          }
      }
      const bool mask = needs_mask(p, i0, j0, kBwdBc);
#pragma unroll
      for (int c = 0; c < kI; ++c) {  // lines 6, 8, 9 element-wise; P^drop and dS go to shared memory
        const int il = tx + kTx * c, i = i0 + il;
        float Pd[kMicro], dS[kMicro];
#pragma unroll
        for (int r = 0; r < kMicro; ++r) {
          const int j = j0 + ty * kMicro + r;
          const bool off = mask && !p.visible(i, j);
          const float P = off ? 0.f : expf(scale * St[r][c] - Ls[il]);  // line 6: P from L, no m or l needed
          const float z = off ? 0.f : dropout_scale(i, j);          // the forward's mask, regenerated
          Pd[r] = P * z;
          dS[r] = P * (dPt[r][c] * z - Ds[il]);  // lines 8-9
        }
        *reinterpret_cast<float4*>(Ps + il * kLdS + ty * kMicro) = make_float4(Pd[0], Pd[1], Pd[2], Pd[3]);
        *reinterpret_cast<float4*>(dSs + il * kLdS + ty * kMicro) = make_float4(dS[0], dS[1], dS[2], dS[3]);
      }
      __syncthreads();

#pragma unroll 2
      for (int ii = 0; ii < kBwdBr; ++ii) {  // line 7: dV_j += P^drop^T dO_i;  line 10: dK_j += dS^T Q_i (scale at the end)
        const float4 p4 = lds4(Ps + ii * kLdS + ty * kMicro), ds4 = lds4(dSs + ii * kLdS + ty * kMicro);
        float dov[Cols::kN], qv[Cols::kN];
        Cols::load(dOs + ii * kLd, tx, dov);
        Cols::load(Qs + ii * kLd, tx, qv);
#pragma unroll
        for (int r = 0; r < kMicro; ++r)
#pragma unroll
          for (int e = 0; e < Cols::kN; ++e) {
            dV[r][e] = fmaf(at(p4, r), dov[e], dV[r][e]);
            dK[r][e] = fmaf(at(ds4, r), qv[e], dK[r][e]);
          }
      }

      if constexpr (kAtomicDq) {  // line 11: dQ_i += scale dS_ij K_j, added into HBM by every K/V block
        float acc[kQRows][Cols::kN] = {};
#pragma unroll 2
        for (int jj = 0; jj < kBwdBc; jj += 4) {
          float4 ds[kQRows];
#pragma unroll
          for (int r = 0; r < kQRows; ++r) ds[r] = lds4(dSs + (ty * kQRows + r) * kLdS + jj);
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            float kc[Cols::kN];
            Cols::load(Ks + (jj + t) * kLd, tx, kc);
#pragma unroll
            for (int r = 0; r < kQRows; ++r)
#pragma unroll
              for (int e = 0; e < Cols::kN; ++e) acc[r][e] = fmaf(at(ds[r], t), kc[e], acc[r][e]);
          }
        }
#pragma unroll
        for (int r = 0; r < kQRows; ++r) {
          const int i = i0 + ty * kQRows + r;
          if (i >= p.q_len) continue;
          float* dQrow = dq + (q_base + i) * D;
#pragma unroll
          for (int e = 0; e < Cols::kN; ++e) atomicAdd(dQrow + Cols::col(tx, e), scale * acc[r][e]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kMicro; ++r) {  // line 12
    const int j = j0 + ty * kMicro + r;
    if (j >= p.kv_len) continue;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) {
      dk[kv_base + size_t(j) * D + Cols::col(tx, e)] = scale * dK[r][e];
      dv[kv_base + size_t(j) * D + Cols::col(tx, e)] = dV[r][e];
    }
  }
}

// ---- backward: deterministic dQ -------------------------------------------------------------------------
// dQ_i for one Q block of head h (README Algorithm 2, lines 13-16): the forward's loop shape, recomputing S_ij,
// P_ij, dP_ij and dS_ij per K/V block and summing scale dS_ij K_j on chip in a fixed order. Grid (ceil(Nq/Br), H, B),
// 256 threads; thread (ty, tx) owns rows ty*4.. of S_ij (columns tx + 16c) and of dQ_i (columns OutCols<D>).
// kSparse: the K/V blocks the block mask masks are skipped, as in the forward.
// Shared memory (floats): Q_i, dO_i [Br][D+4]; K_j, V_j [Bc][D+4]; dS_ij^T [Bc][Br+4]; L_i, D_i [Br]
//   = 87.6 KB at d = 64, 153.1 KB at d = 128 (fits the A100 limit of 163 KiB).
// __launch_bounds__(.., kSparse ? 1 : 0): the block-sparse kernel at d = 64 spills 12 bytes on sm_80 when ptxas
// aims at 128 registers; "at least 1 block per SM" lets it take 168 (the shared memory allows one block per SM on
// an A100 anyway). 0 = no minimum: the dense kernel's bounds as they were.
template <int D, bool kSparse>
__global__ void __launch_bounds__(kThreads, kSparse ? 1 : 0)
    backward_dq_kernel(fa::Problem p, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ D_rows,
                       float* __restrict__ dq, const uint8_t* __restrict__ block_mask) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdP = kFwdBr + kPad;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* dOs = Qs + kFwdBr * kLd;
  float* Ks = dOs + kFwdBr * kLd;
  float* Vs = Ks + kFwdBc * kLd;
  float* dSts = Vs + kFwdBc * kLd;  // dS_ij transposed: [key][query]
  float* Ls = dSts + kFwdBc * kLdP;
  float* Ds = Ls + kFwdBr;

  const int i0 = blockIdx.x * kFwdBr, h = blockIdx.y, b = blockIdx.z;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const float scale = p.softmax_scale();
  // Problem::dropout_scale(b, h, i, j) with its loop invariants (the keep threshold and 1/(1-p), an IEEE
  // division) computed once: nvcc does not hoist them out of the unrolled tile loops (ptxas -v: +40 registers).
  const uint32_t keep_threshold = p.dropout_threshold();
  const float keep_scale = 1.f / (1.f - p.dropout_p);
  auto dropout_scale = [&](int i, int j) {
    if (p.dropout_p == 0.f) return 1.f;
    return fa::dropout_keep(p.seed, p.offset, b, h, i, j, keep_threshold) ? keep_scale : 0.f;
  };
  const size_t q_base = p.lse_offset(b, h);  // row index of (b, h, 0)
  const size_t kv_base = p.kv_offset(b, p.kv_head_of(h));
  load_rows<D>(Qs, kLd, q + q_base * D, i0, kFwdBr, p.q_len);  // line 14
  load_rows<D>(dOs, kLd, dout + q_base * D, i0, kFwdBr, p.q_len);
  load_stats(Ls, Ds, lse + q_base, D_rows + q_base, i0, kFwdBr, p.q_len);
  float acc[kMicro][Cols::kN] = {};

  const int kv_stop = kv_end(p, i0, kFwdBr);
  for (int j0 = 0; j0 < kv_stop; j0 += kFwdBc) {  // line 15
    if (kSparse && !fa::block_visible(block_mask, fa::mask_cols_of(p.kv_len), i0, j0)) continue;
    __syncthreads();
    load_rows<D>(Ks, kLd, k + kv_base, j0, kFwdBc, p.kv_len);
    load_rows<D>(Vs, kLd, v + kv_base, j0, kFwdBc, p.kv_len);
    __syncthreads();

    float S[kMicro][kMicro] = {}, dP[kMicro][kMicro] = {};
#pragma unroll 4
    for (int c4 = 0; c4 < D; c4 += 4) {
      float4 qv[kMicro], dov[kMicro], kv[kMicro], vv[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) {
        qv[r] = lds4(Qs + (ty * kMicro + r) * kLd + c4);
        dov[r] = lds4(dOs + (ty * kMicro + r) * kLd + c4);
      }
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        kv[c] = lds4(Ks + (tx + kTx * c) * kLd + c4);
        vv[c] = lds4(Vs + (tx + kTx * c) * kLd + c4);
      }
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) {
          S[r][c] = dot4(qv[r], kv[c], S[r][c]);
          dP[r][c] = dot4(dov[r], vv[c], dP[r][c]);
        }
    }
    const bool mask = needs_mask(p, i0, j0, kFwdBc);
#pragma unroll
    for (int c = 0; c < kMicro; ++c) {
      const int j = j0 + tx + kTx * c;
      float dS[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) {
        const int il = ty * kMicro + r, i = i0 + il;
        const bool off = mask && !p.visible(i, j);
        const float P = off ? 0.f : expf(scale * S[r][c] - Ls[il]);
        const float z = off ? 0.f : dropout_scale(i, j);
        dS[r] = P * (dP[r][c] * z - Ds[il]);
      }
      *reinterpret_cast<float4*>(dSts + (tx + kTx * c) * kLdP + ty * kMicro) = make_float4(dS[0], dS[1], dS[2], dS[3]);
    }
    __syncthreads();

#pragma unroll 4
    for (int jj = 0; jj < kFwdBc; ++jj) {  // dQ_i += dS_ij K_j (scale at the end)
      const float4 ds = lds4(dSts + jj * kLdP + ty * kMicro);
      float kc[Cols::kN];
      Cols::load(Ks + jj * kLd, tx, kc);
#pragma unroll
      for (int e = 0; e < Cols::kN; ++e) {
        acc[0][e] = fmaf(ds.x, kc[e], acc[0][e]);
        acc[1][e] = fmaf(ds.y, kc[e], acc[1][e]);
        acc[2][e] = fmaf(ds.z, kc[e], acc[2][e]);
        acc[3][e] = fmaf(ds.w, kc[e], acc[3][e]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kMicro; ++r) {  // line 16
    const int i = i0 + ty * kMicro + r;
    if (i >= p.q_len) continue;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) dq[(q_base + i) * D + Cols::col(tx, e)] = scale * acc[r][e];
  }
}

// ---- host side ------------------------------------------------------------------------------------------
template <int D, bool kSparse>
void backward_d(const fa::Problem& p, const float* q, const float* k, const float* v, const float* lse,
                const float* dout, const float* D_rows, float* dq, float* dk, float* dv, DqMode mode,
                const uint8_t* block_mask) {
  constexpr size_t kSmemKv =
      sizeof(float) * (2 * (kBwdBc + kBwdBr) * (D + kPad) + 2 * kBwdBr * (kBwdBc + kPad) + 2 * kBwdBr);
  const dim3 grid_kv((p.kv_len + kBwdBc - 1) / kBwdBc, p.kv_heads, p.batch);
  if (mode == DqMode::Atomic) {
    detail::allow_smem(backward_kv_kernel<D, true, kSparse>, kSmemKv, D);
    CUDA_CHECK(cudaMemsetAsync(dq, 0, p.q_elems() * sizeof(float)));
    backward_kv_kernel<D, true, kSparse><<<grid_kv, kThreads, kSmemKv>>>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, block_mask);
    CHECK_LAUNCH();
    return;
  }
  constexpr size_t kSmemQ =
      sizeof(float) * (2 * (kFwdBr + kFwdBc) * (D + kPad) + kFwdBc * (kFwdBr + kPad) + 2 * kFwdBr);
  detail::allow_smem(backward_kv_kernel<D, false, kSparse>, kSmemKv, D);
  detail::allow_smem(backward_dq_kernel<D, kSparse>, kSmemQ, D);
  backward_kv_kernel<D, false, kSparse><<<grid_kv, kThreads, kSmemKv>>>(p, q, k, v, lse, dout, D_rows, dq, dk, dv,
                                                                         block_mask);
  CHECK_LAUNCH();
  const dim3 grid_q((p.q_len + kFwdBr - 1) / kFwdBr, p.heads, p.batch);
  backward_dq_kernel<D, kSparse><<<grid_q, kThreads, kSmemQ>>>(p, q, k, v, lse, dout, D_rows, dq, block_mask);
  CHECK_LAUNCH();
}
template <int D>
void backward_d(const fa::Problem& p, const float* q, const float* k, const float* v, const float* lse,
                const float* dout, const float* D_rows, float* dq, float* dk, float* dv, DqMode mode,
                const uint8_t* block_mask) {
  if (block_mask) backward_d<D, true>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, block_mask);
  else backward_d<D, false>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, nullptr);
}

}  // namespace

size_t backward_workspace_bytes(const fa::Problem& p) { return p.lse_elems() * sizeof(float); }

void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace,
              const uint8_t* block_mask) {
  detail::check_args(p, {q, k, v, o, dout, dq, dk, dv});
  float* D_rows = static_cast<float*>(workspace);  // D_i for every row: [B, H, Nq]
  const size_t rows = p.lse_elems();
  rowsum_do_o_kernel<<<unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads>>>(o, dout, D_rows, rows,
                                                                                          p.head_dim);
  CHECK_LAUNCH();
  switch (p.head_dim) {
    case 16: return backward_d<16>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, block_mask);
    case 32: return backward_d<32>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, block_mask);
    case 64: return backward_d<64>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, block_mask);
    default: return backward_d<128>(p, q, k, v, lse, dout, D_rows, dq, dk, dv, mode, block_mask);
  }
}

}  // namespace fa2
