// Backward step 1: the FA2 backward's five GEMMs on tensor cores, each operand fetched by ldmatrix from shared
// memory (with .trans where the stored tile has k as its row index, BACKWARD.md's table), and P^T, dS^T passed
// between GEMMs through shared memory.
//
// One block per K/V block j (grid Tc x Hkv x B), BACKWARD.md Algorithm B:
//   line 1   load K_j, V_j; dK_j = dV_j = 0                       (warp w: keys 16w..16w+15, in registers)
//   line 2   for each query head h of the kv head's group (GQA: summed here, in a fixed order)
//   line 3     for each Q block i from the first that sees key j0 (causal: earlier blocks skipped)
//   line 4       load Q_i, dO_i, L_i, D_i
//   line 5       S^T = K_j Q_i^T, dP^T = V_j dO_i^T                 (16 keys x Br queries per warp)
//   line 6       P^T = exp(tau S^T - L), dS^T = P^T o (dP^T - D)    (masked: 0)
//   line 7       dV_j += P^T dO_i                                   (P^T rounded to the dtype)
//   line 8       dK_j += dS^T Q_i                                   (dS^T rounded to the dtype)
//   line 9       dQ_i += tau dS K_j  (atomic mode: fp32 atomicAdd; warp w: a 16-row x d/cg slice)
//   line 10  dK_j *= tau; write dK_j, dV_j (fp32)
// Shared memory, 16-bit values, rows padded by 8: K_j, V_j [Bc][d+8], Q_i, dO_i [Br][d+8], P^T, dS^T [Bc][Br+8],
// plus L_i, D_i [Br] fp32 = 54.5 KiB (d = 64, Br = 64), 61.3 KiB (d = 128, Br = 32).
#include "bwd_common.cuh"
#include "bwd_steps.hpp"

namespace wsq {
namespace {

using bwd_frag::Operand;

template <class T, int D, bool kAtomicDq>
__global__ void __launch_bounds__(bwd::KvTile<D>::kThreads)
    kv_kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              const float* __restrict__ lse, const T* __restrict__ dout, const float* __restrict__ Dv,
              float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv) {
  using Tile = bwd::KvTile<D>;
  constexpr int Br = Tile::Br, Bc = Tile::Bc, kThreads = Tile::kThreads;
  constexpr int kLd = D + bwd::kPad, kLdS = Br + bwd::kPad;
  constexpr int kStepsD = D / 16;   // k-steps of S^T, dP^T (over head_dim)
  constexpr int kTilesQ = Br / 8;   // n-tiles of S^T, dP^T (8 queries each)
  constexpr int kStepsQ = Br / 16;  // k-steps of dV, dK (over queries)
  constexpr int kTilesD = D / 8;    // n-tiles of dV, dK, dQ (8 columns each)
  constexpr int kStepsK = Bc / 16;  // k-steps of dQ (over keys)
  // dQ_i (Br x d) is split over the warps: kRowTiles row tiles of 16, kColGroups column slices.
  constexpr int kRowTiles = Br / 16, kColGroups = Tile::kWarps / kRowTiles, kTilesDq = kTilesD / kColGroups;
  static_assert(Tile::kWarps % kRowTiles == 0 && kTilesD % (2 * kColGroups) == 0,
                "dQ_i must split into whole 16-row x 16-column pieces, one set per warp");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + Bc * kLd;
  T* Qs = Vs + Bc * kLd;
  T* dOs = Qs + Br * kLd;
  T* Pts = dOs + Br * kLd;    // P^T  [key][query]
  T* dSts = Pts + Bc * kLdS;  // dS^T [key][query]
  float* Ls = reinterpret_cast<float*>(dSts + Bc * kLdS);
  float* Ds = Ls + Br;

  const int j0 = blockIdx.x * Bc, hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kw = 16 * warp;  // the warp's first key in the block
  const float tau = p.softmax_scale();

  bwd::load_tile<T, Bc, D, kThreads>(Ks, k + p.kv_offset(b, hk), j0, p.kv_len);  // line 1
  bwd::load_tile<T, Bc, D, kThreads>(Vs, v + p.kv_offset(b, hk), j0, p.kv_len);
  float dK[kTilesD][4] = {}, dV[kTilesD][4] = {};

  const int i_first = p.first_query_seeing(j0) / Br * Br;
  for (int hg = 0; hg < p.group(); ++hg) {  // line 2
    const int h = hk * p.group() + hg;
    const T* Q = q + p.q_offset(b, h);
    const T* dO = dout + p.q_offset(b, h);
    for (int i0 = i_first; i0 < p.q_len; i0 += Br) {  // line 3
      __syncthreads();  // every warp is done with the previous Q_i, dO_i, P^T, dS^T (K_j, V_j are loaded)
      bwd::load_tile<T, Br, D, kThreads>(Qs, Q, i0, p.q_len);  // line 4
      bwd::load_tile<T, Br, D, kThreads>(dOs, dO, i0, p.q_len);
      bwd::load_stats<Br, kThreads>(Ls, Ds, lse + p.lse_offset(b, h), Dv + p.lse_offset(b, h), i0, p.q_len);
      __syncthreads();

      float st[kTilesQ][4] = {}, dpt[kTilesQ][4] = {};  // line 5
#pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk) {
        uint32_t ka[4], va[4];
        bwd::ldm<Operand::A_mk>(ka, Ks + kw * kLd + 16 * kk, kLd, lane);
        bwd::ldm<Operand::A_mk>(va, Vs + kw * kLd + 16 * kk, kLd, lane);
#pragma unroll
        for (int np = 0; np < kTilesQ / 2; ++np) {
          uint32_t qb[4], dob[4];
          bwd::ldm<Operand::B_nk>(qb, Qs + 16 * np * kLd + 16 * kk, kLd, lane);
          bwd::ldm<Operand::B_nk>(dob, dOs + 16 * np * kLd + 16 * kk, kLd, lane);
          mma_16816<T>(st[2 * np], ka, qb), mma_16816<T>(st[2 * np + 1], ka, qb + 2);
          mma_16816<T>(dpt[2 * np], va, dob), mma_16816<T>(dpt[2 * np + 1], va, dob + 2);
        }
      }

      const bool need_mask = bwd::needs_mask(p, i0, Br, j0, Bc);  // line 6
#pragma unroll
      for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const frag::RowCol c = frag::c_elem(lane, e);  // row: key kw + c.row, column: query 8n + c.col
          const int il = 8 * n + c.col;
          const bool keep = !need_mask || (i0 + il < p.q_len && p.visible(i0 + il, j0 + kw + c.row));
          const float P = keep ? expf(tau * st[n][e] - Ls[il]) : 0.f;  // P from L: no m, l needed
          st[n][e] = P;
          dpt[n][e] = P * (dpt[n][e] - Ds[il]);
        }
#pragma unroll
      for (int n = 0; n < kTilesQ; ++n)  // P^T, dS^T to shared memory in the dtype, pairs of queries per store
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const frag::RowCol c = frag::c_elem(lane, e);
          const int at = (kw + c.row) * kLdS + 8 * n + c.col;
          *reinterpret_cast<uint32_t*>(Pts + at) = pack2<T>(st[n][e], st[n][e + 1]);
          *reinterpret_cast<uint32_t*>(dSts + at) = pack2<T>(dpt[n][e], dpt[n][e + 1]);
        }
      __syncthreads();  // dQ reads every warp's dS^T rows (dV, dK read only the warp's own)

#pragma unroll
      for (int kk = 0; kk < kStepsQ; ++kk) {  // lines 7-8
        uint32_t pa[4], dsa[4];
        bwd::ldm<Operand::A_mk>(pa, Pts + kw * kLdS + 16 * kk, kLdS, lane);
        bwd::ldm<Operand::A_mk>(dsa, dSts + kw * kLdS + 16 * kk, kLdS, lane);
#pragma unroll
        for (int np = 0; np < kTilesD / 2; ++np) {
          uint32_t dob[4], qb[4];
          bwd::ldm<Operand::B_kn>(dob, dOs + 16 * kk * kLd + 16 * np, kLd, lane);
          bwd::ldm<Operand::B_kn>(qb, Qs + 16 * kk * kLd + 16 * np, kLd, lane);
          mma_16816<T>(dV[2 * np], pa, dob), mma_16816<T>(dV[2 * np + 1], pa, dob + 2);
          mma_16816<T>(dK[2 * np], dsa, qb), mma_16816<T>(dK[2 * np + 1], dsa, qb + 2);
        }
      }

      if constexpr (kAtomicDq) {  // line 9
        const int rt = warp % kRowTiles, c0 = (warp / kRowTiles) * 8 * kTilesDq;  // rows 16 rt.., columns c0..
        float acc[kTilesDq][4] = {};
#pragma unroll
        for (int kk = 0; kk < kStepsK; ++kk) {
          uint32_t dsa[4];  // dS (queries x keys) from dS^T stored [key][query]: ldmatrix .trans
          bwd::ldm<Operand::A_km>(dsa, dSts + 16 * kk * kLdS + 16 * rt, kLdS, lane);
#pragma unroll
          for (int np = 0; np < kTilesDq / 2; ++np) {
            uint32_t kb[4];
            bwd::ldm<Operand::B_kn>(kb, Ks + 16 * kk * kLd + c0 + 16 * np, kLd, lane);
            mma_16816<T>(acc[2 * np], dsa, kb), mma_16816<T>(acc[2 * np + 1], dsa, kb + 2);
          }
        }
#pragma unroll
        for (int n = 0; n < kTilesDq; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const frag::RowCol c = frag::c_elem(lane, e);
            const int i = i0 + 16 * rt + c.row;
            if (i < p.q_len) atomicAdd(dq + p.q_offset(b, h) + size_t(i) * D + c0 + 8 * n + c.col, tau * acc[n][e]);
          }
      }
    }
  }

#pragma unroll
  for (int n = 0; n < kTilesD; ++n)  // line 10
#pragma unroll
    for (int e = 0; e < 4; e += 2) {
      const frag::RowCol c = frag::c_elem(lane, e);
      const int j = j0 + kw + c.row;
      if (j >= p.kv_len) continue;
      const size_t at = p.kv_offset(b, hk) + size_t(j) * D + 8 * n + c.col;
      *reinterpret_cast<float2*>(dk + at) = make_float2(tau * dK[n][e], tau * dK[n][e + 1]);
      *reinterpret_cast<float2*>(dv + at) = make_float2(dV[n][e], dV[n][e + 1]);
    }
}

template <class Tc, int D>
bwd::KvKernels<Tc> kernels() {
  using Tile = bwd::KvTile<D>;
  constexpr size_t smem = sizeof(Tc) * (2 * (Tile::Bc + Tile::Br) * (D + bwd::kPad) +
                                        2 * Tile::Bc * (Tile::Br + bwd::kPad)) +
                          sizeof(float) * 2 * Tile::Br;
  return {kv_kernel<Tc, D, true>, kv_kernel<Tc, D, false>, Tile::Bc, Tile::kThreads, smem};
}

}  // namespace

template <class T>
void backward_v1_mma(const fa::Problem& p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                     const T* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace) {
  using Tc = typename fa::CudaType<T>::type;
  bwd::run_backward<T>(p, p.head_dim == 64 ? kernels<Tc, 64>() : kernels<Tc, 128>(), q, k, v, o, lse, dout, dq, dk,
                       dv, mode, workspace);
}
WSQ_BWD_INSTANTIATE(backward_v1_mma)

}  // namespace wsq
