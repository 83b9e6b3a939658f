// The deterministic dQ kernel: dQ_i for one Q block, summed on chip over the K/V blocks in a fixed order, so dQ is
// bit-identical run to run (BACKWARD.md Algorithm B, lines 11-16). Every step uses it in DqMode::Deterministic.
//
// It has the forward's shape (split-Q): grid (Tr, H, B), warp w owns query rows 16w .. 16w+15 of the block, and
// every (S, dP, dS) element it makes stays in its registers:
//   line 11  load Q_i, dO_i; L, D of the warp's rows into registers; dQ_i = 0
//   line 12  for each K/V block j up to the last key the block's last row sees (causal: the rest skipped)
//   line 13    load K_j, V_j                    (started one block ahead: cp.async into the other buffer)
//   line 14    S = Q_i K_j^T, dP = dO_i V_j^T       (B operands K_j, V_j stored [key][d] = [n][k]: ldmatrix)
//   line 15    P = exp(tau S - L) = 2^(tau log2(e) S - log2(e) L), dS = P o (dP - D), masked: 0 (tested per tile)
//   line 16    dQ_i += dS K_j                       (dS: C fragments packed into A fragments, no shared memory;
//                                                    K_j stored [key][d] = [k][n]: ldmatrix .trans)
//   then dQ_i *= tau, written in fp32.
// Line 13 is pipelined as step 3 pipelines the K/V-block kernel's line 4: K_j, V_j have two shared buffers, and at
// the top of each iteration every thread starts the cp.async copies of K_{j+1}, V_{j+1} into the other buffer, then
// waits only for the current block's. The products are the same, in the same order: dQ is bit for bit what it is
// when every K/V block is loaded with the whole block waiting.
// Shared memory, 16-bit values, rows padded by 8: Q_i, dO_i [64][d+8], 2 x K_j, V_j [64][d+8] = 54 KiB (d = 64),
// 102 KiB (d = 128); the second K_j, V_j buffer costs 18 / 34 KiB. Blocks of 128 threads per SM (registers from
// ptxas, BACKWARD.md section 10; 1 KiB of shared memory reserved per block):
//   sm_90, 228 KiB per SM: d = 64: 3 (registers, 158 each), d = 128: 2 (shared memory; 168 registers allow 3);
//   sm_80, 164 KiB per SM: d = 64: 2 (shared memory; 3 with one buffer), d = 128: 1 (shared memory: 2 x 103 KiB
//   do not fit; 2 with one buffer). On an A100 the overlap is paid for with occupancy.
#include "bwd_common.cuh"

namespace wsq {
namespace bwd {
namespace {

using bwd_frag::Operand;

template <class T, int D>
__global__ void __launch_bounds__(DqTile::kThreads)
    dq_kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              const float* __restrict__ lse, const T* __restrict__ dout, const float* __restrict__ Dv,
              float* __restrict__ dq) {
  constexpr int Br = DqTile::Br, Bc = DqTile::Bc, kThreads = DqTile::kThreads, kStages = DqTile::kStages;
  constexpr int kLd = D + kPad;
  constexpr int kStepsD = D / 16;   // k-steps of S, dP (over head_dim)
  constexpr int kTilesK = Bc / 8;   // n-tiles of S, dP (8 keys each)
  constexpr int kStepsK = Bc / 16;  // k-steps of dQ (over keys)
  constexpr int kTilesD = D / 8;    // n-tiles of dQ (8 columns each)
  static_assert(kStages == 2, "one K/V block in flight while one computes: cp_async_wait<1> below");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Qs = reinterpret_cast<T*>(smem);
  T* dOs = Qs + Br * kLd;
  T* Ks2 = dOs + Br * kLd;            // kStages buffers of K_j [Bc][d+8]
  T* Vs2 = Ks2 + kStages * Bc * kLd;  // kStages buffers of V_j

  const int i0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z, hk = p.kv_head_of(h);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = 16 * warp;  // the warp's first row in the block
  const float tau = p.softmax_scale();
  const float tau_log2 = tau * kLog2e;
  const T* K = k + p.kv_offset(b, hk);
  const T* V = v + p.kv_offset(b, hk);

  load_tile_async<T, Br, D, kThreads>(Qs, q + p.q_offset(b, h), i0, p.q_len);  // line 11, and block 0's line 13
  load_tile_async<T, Br, D, kThreads>(dOs, dout + p.q_offset(b, h), i0, p.q_len);
  load_tile_async<T, Bc, D, kThreads>(Ks2, K, 0, p.kv_len);
  load_tile_async<T, Bc, D, kThreads>(Vs2, V, 0, p.kv_len);
  cp_async_commit();
  float L2[2], Di[2];  // rows g and g + 8 of the warp's C fragments; L2 = L log2(e)
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = i0 + wr + frag::group(lane) + 8 * r;
    L2[r] = i < p.q_len ? lse[p.lse_offset(b, h) + i] * kLog2e : 0.f;
    Di[r] = i < p.q_len ? Dv[p.lse_offset(b, h) + i] : 0.f;
  }
  float acc[kTilesD][4] = {};

  const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);
  for (int j0 = 0, tile = 0; j0 < kv_end; j0 += Bc, ++tile) {  // line 12; tile % kStages is the current buffer
    if (j0 + Bc < kv_end) {  // line 13 of the next K/V block, into the other buffer
      const int next = (tile + 1) % kStages;
      load_tile_async<T, Bc, D, kThreads>(Ks2 + next * Bc * kLd, K, j0 + Bc, p.kv_len);
      load_tile_async<T, Bc, D, kThreads>(Vs2 + next * Bc * kLd, V, j0 + Bc, p.kv_len);
    }
    cp_async_commit();   // possibly an empty group, so that the wait below always means "all but the newest"
    cp_async_wait<1>();  // this thread's copies of K_j, V_j (and at first of Q_i, dO_i) have landed ...
    __syncthreads();     // ... and every other thread's too
    const T* Ks = Ks2 + (tile % kStages) * Bc * kLd;
    const T* Vs = Vs2 + (tile % kStages) * Bc * kLd;

    float s[kTilesK][4] = {}, dp[kTilesK][4] = {};  // line 14
#pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk) {
      uint32_t qa[4], doa[4];
      ldm<Operand::A_mk>(qa, Qs + wr * kLd + 16 * kk, kLd, lane);
      ldm<Operand::A_mk>(doa, dOs + wr * kLd + 16 * kk, kLd, lane);
#pragma unroll
      for (int np = 0; np < kTilesK / 2; ++np) {
        uint32_t kb[4], vb[4];
        ldm<Operand::B_nk>(kb, Ks + 16 * np * kLd + 16 * kk, kLd, lane);
        ldm<Operand::B_nk>(vb, Vs + 16 * np * kLd + 16 * kk, kLd, lane);
        mma_16816<T>(s[2 * np], qa, kb), mma_16816<T>(s[2 * np + 1], qa, kb + 2);
        mma_16816<T>(dp[2 * np], doa, vb), mma_16816<T>(dp[2 * np + 1], doa, vb + 2);
      }
    }

#pragma unroll
    for (int n = 0; n < kTilesK; ++n)  // line 15 in base 2, as the K/V kernel of step 4; dS overwrites s
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] = exp2f(fmaf(s[n][e], tau_log2, -L2[e >> 1])) * (dp[n][e] - Di[e >> 1]);
    if (needs_mask(p, i0, Br, j0, Bc)) {  // the mask, once per tile; what it zeroes may be inf or NaN above
#pragma unroll
      for (int n = 0; n < kTilesK; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol c = frag::c_elem(lane, e);
          const int i = i0 + wr + c.row;
          if (!(i < p.q_len && p.visible(i, j0 + 8 * n + c.col))) s[n][e] = 0.f;
        }
    }

#pragma unroll
    for (int kk = 0; kk < kStepsK; ++kk) {  // line 16: the C fragments of dS for keys 16kk.. are its A fragment
      uint32_t dsa[4];
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const float* c = s[2 * kk + frag::p_from_s_ntile(r)] + frag::p_from_s_celem(r);
        dsa[r] = pack2<T>(c[0], c[1]);
      }
#pragma unroll
      for (int np = 0; np < kTilesD / 2; ++np) {
        uint32_t kb[4];
        ldm<Operand::B_kn>(kb, Ks + 16 * kk * kLd + 16 * np, kLd, lane);
        mma_16816<T>(acc[2 * np], dsa, kb), mma_16816<T>(acc[2 * np + 1], dsa, kb + 2);
      }
    }
    __syncthreads();  // every warp is done with this K_j, V_j before the next iteration refills its buffer
  }
  cp_async_wait<0>();  // no copy outlives the block (one whose rows see no key never entered the loop)

#pragma unroll
  for (int n = 0; n < kTilesD; ++n)
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const frag::RowCol c = frag::c_elem(lane, e);
      const int i = i0 + wr + c.row;
      if (i >= p.q_len) continue;
      *reinterpret_cast<float2*>(dq + p.q_offset(b, h) + size_t(i) * D + 8 * n + c.col) =
          make_float2(tau * acc[n][e], tau * acc[n][e + 1]);
    }
}

template <class T, int D>
void launch_dq(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout,
               const float* Dv, float* dq) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr size_t smem = sizeof(Tc) * 2 * (DqTile::Br + DqTile::kStages * DqTile::Bc) * (D + kPad);
  const dim3 grid((p.q_len + DqTile::Br - 1) / DqTile::Br, p.heads, p.batch);
  launch(dq_kernel<Tc, D>, grid, DqTile::kThreads, smem, p, fa::cuda_ptr(q), fa::cuda_ptr(k), fa::cuda_ptr(v), lse,
         fa::cuda_ptr(dout), Dv, dq);
}

}  // namespace

template <class T>
void run_dq(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout, const float* Dv,
            float* dq) {
  if (p.head_dim == 64) launch_dq<T, 64>(p, q, k, v, lse, dout, Dv, dq);
  else launch_dq<T, 128>(p, q, k, v, lse, dout, Dv, dq);
}
template void run_dq<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*, const fa::half_t*,
                                 const float*, const fa::half_t*, const float*, float*);
template void run_dq<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*, const fa::bfloat16_t*,
                                     const fa::bfloat16_t*, const float*, const fa::bfloat16_t*, const float*, float*);

}  // namespace bwd
}  // namespace wsq
