// Backward step 7: at d = 128, Br = 64 query rows per tile instead of 32 (d = 64 had 64 already: there this step is
// step 6). Everything else is step 6's. Per tile a warp now computes S^T and dP^T for 16 keys x 64 queries, so the
// A fragments of K_j and V_j it loads for lines 5 (one ldmatrix per k-step each) serve twice the mma, and the Q loop
// has half the tiles: half the barriers, half the L_i, D_i handoffs and tile bookkeeping per FLOP. The price is
// registers: S^T and dP^T grow from 32 to 64 fp32 per lane on top of dK_j and dV_j's 128, which leaves the kernel at
// ptxas's 255-register ceiling with 12 bytes of spill on sm_90 (BACKWARD.md §10).
//
// One block per K/V block j (grid Tc x Hkv x B, Tc = ceil(kv_len / 128)), BACKWARD.md Algorithm B:
//   line 1   load K_j, V_j; dK_j = dV_j = 0                       (warp w: keys 16w..16w+15, in registers)
//   line 2   for each query head h of the kv head's group (GQA: summed here, in a fixed order)
//   line 3     for each Q block i from the first that sees key j0 (causal: earlier blocks skipped)
//   line 4       load Q_i, dO_i, L_i, D_i
//   line 5       S^T = K_j Q_i^T, dP^T = V_j dO_i^T                 (16 keys x 64 queries per warp)
//   line 6       P^T = exp(tau S^T - L), dS^T = P^T o (dP^T - D)    (masked: 0)
//   line 4       (Q_i, dO_i of the next tile start loading here: cp.async into the other buffer)
//   line 7       dV_j += P^T dO_i                                   (P^T rounded to the dtype, from registers)
//   line 8       dK_j += dS^T Q_i                                   (dS^T rounded to the dtype, from registers)
//   line 9       dQ_i += tau dS K_j  (atomic mode: dS^T via shared memory; fp32 atomicAdd, float2 on sm_90;
//                                     the 64 x d piece split over the 8 warps, 16 rows x d/2 columns each)
//   line 10  dK_j *= tau; write dK_j, dV_j (fp32)
// Shared memory, 16-bit values, rows padded by 8: K_j, V_j [Bc][d+8], Q_i, dO_i 2 x [Br][d+8], dS^T [Bc][Br+8],
// plus L_i, D_i 2 x [Br] fp32 = 91 KiB (d = 64), 155 KiB (d = 128).
#include "bwd_common.cuh"
#include "bwd_steps.hpp"

namespace wsq {
namespace {

using bwd_frag::Operand;

constexpr int kStages = 2;  // Q_i/dO_i buffers: the tile being computed and the one being loaded
constexpr int kBc = 128;    // keys per block: 8 warps of 16
constexpr int kBr = 64;     // query rows per tile, at both head dims

template <class T, int D, bool kAtomicDq>
__global__ void __launch_bounds__(bwd::KvTile<D, kBc, kBr>::kThreads)
    kv_kernel(fa::Problem p, const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              const float* __restrict__ lse, const T* __restrict__ dout, const float* __restrict__ Dv,
              float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv) {
  using Tile = bwd::KvTile<D, kBc, kBr>;
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
  static_assert(Br <= kThreads, "one thread per row carries the next tile's L_i, D_i");

  extern __shared__ __align__(16) unsigned char smem[];
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + Bc * kLd;
  T* Qs2 = Vs + Bc * kLd;               // kStages buffers of Q_i [Br][d+8]
  T* dOs2 = Qs2 + kStages * Br * kLd;   // kStages buffers of dO_i
  T* dSts = dOs2 + kStages * Br * kLd;  // dS^T [key][query], for dQ
  float* Ls2 = reinterpret_cast<float*>(dSts + Bc * kLdS);  // kStages buffers of L_i [Br]
  float* Ds2 = Ls2 + kStages * Br;                          // kStages buffers of D_i [Br]

  const int j0 = blockIdx.x * Bc, hk = blockIdx.y, b = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int kw = 16 * warp;  // the warp's first key in the block
  const float tau = p.softmax_scale();
  const float tau_log2 = tau * bwd::kLog2e;  // S^T in base-2 units

  const int i_first = p.first_query_seeing(j0) / Br * Br;
  bwd::load_tile_async<T, Bc, D, kThreads>(Ks, k + p.kv_offset(b, hk), j0, p.kv_len);  // line 1, and tile 0's line 4
  bwd::load_tile_async<T, Bc, D, kThreads>(Vs, v + p.kv_offset(b, hk), j0, p.kv_len);
  bwd::load_tile_async<T, Br, D, kThreads>(Qs2, q + p.q_offset(b, hk * p.group()), i_first, p.q_len);
  bwd::load_tile_async<T, Br, D, kThreads>(dOs2, dout + p.q_offset(b, hk * p.group()), i_first, p.q_len);
  cp_async_commit();
  bwd::load_stats<Br, kThreads>(Ls2, Ds2, lse + p.lse_offset(b, hk * p.group()), Dv + p.lse_offset(b, hk * p.group()),
                                i_first, p.q_len);
  float dK[kTilesD][4] = {}, dV[kTilesD][4] = {};

  int tile = 0;  // tiles done so far; tile % kStages is the current buffer
  for (int hg = 0; hg < p.group(); ++hg) {  // line 2
    const int h = hk * p.group() + hg;
    for (int i0 = i_first; i0 < p.q_len; i0 += Br, ++tile) {  // line 3
      // line 4 of the next tile (the next Q block of this head, else the first of the next head): other buffer
      const int h_next = i0 + Br < p.q_len ? h : h + 1, i_next = i0 + Br < p.q_len ? i0 + Br : i_first;
      const bool has_next = h_next < (hk + 1) * p.group();
      const int next = (tile + 1) % kStages;
      float L_next = 0.f, D_next = 0.f;  // thread r < Br carries row r's L_i, D_i of the next tile
      if (has_next) {
        bwd::load_tile_async<T, Br, D, kThreads>(Qs2 + next * Br * kLd, q + p.q_offset(b, h_next), i_next, p.q_len);
        bwd::load_tile_async<T, Br, D, kThreads>(dOs2 + next * Br * kLd, dout + p.q_offset(b, h_next), i_next, p.q_len);
        const int r = threadIdx.x;
        if (r < Br && i_next + r < p.q_len)
          L_next = lse[p.lse_offset(b, h_next) + i_next + r], D_next = Dv[p.lse_offset(b, h_next) + i_next + r];
      }
      cp_async_commit();   // possibly an empty group, so that the wait below always means "all but the newest"
      cp_async_wait<1>();  // this thread's copies of the current tile (and at first of K_j, V_j) have landed ...
      __syncthreads();     // ... and every other thread's too
      const T* Qs = Qs2 + (tile % kStages) * Br * kLd;
      const T* dOs = dOs2 + (tile % kStages) * Br * kLd;
      const float* Ls = Ls2 + (tile % kStages) * Br;
      const float* Ds = Ds2 + (tile % kStages) * Br;

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

#pragma unroll
      for (int n = 0; n < kTilesQ; ++n)  // line 6: P from L (no m, l needed), in base 2
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int il = 8 * n + frag::c_elem(lane, e).col;  // C fragment: row = key kw + c.row, column = query il
          const float P = exp2f(fmaf(st[n][e], tau_log2, -Ls[il] * bwd::kLog2e));
          st[n][e] = P;
          dpt[n][e] = P * (dpt[n][e] - Ds[il]);
        }
      if (bwd::needs_mask(p, i0, Br, j0, Bc)) {  // line 6's mask, per tile; what it zeroes may be inf or NaN above
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const frag::RowCol c = frag::c_elem(lane, e);
            const int il = 8 * n + c.col;
            if (!(i0 + il < p.q_len && p.visible(i0 + il, j0 + kw + c.row))) st[n][e] = dpt[n][e] = 0.f;
          }
      }
      if constexpr (kAtomicDq) {
#pragma unroll
        for (int n = 0; n < kTilesQ; ++n)  // dS^T to shared memory in the dtype, for line 9
#pragma unroll
          for (int e = 0; e < 4; e += 2) {
            const frag::RowCol c = frag::c_elem(lane, e);
            *reinterpret_cast<uint32_t*>(dSts + (kw + c.row) * kLdS + 8 * n + c.col) =
                pack2<T>(dpt[n][e], dpt[n][e + 1]);
          }
      }

#pragma unroll
      for (int kk = 0; kk < kStepsQ; ++kk) {  // lines 7-8
        uint32_t pa[4], dsa[4];  // queries 16kk.. = the C fragments of n-tiles 2kk, 2kk+1, packed
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int n = 2 * kk + frag::p_from_s_ntile(r), e = frag::p_from_s_celem(r);
          pa[r] = pack2<T>(st[n][e], st[n][e + 1]);
          dsa[r] = pack2<T>(dpt[n][e], dpt[n][e + 1]);
        }
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
        __syncthreads();  // dQ reads every warp's dS^T rows
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
          for (int e = 0; e < 4; e += 2) {
            const frag::RowCol c = frag::c_elem(lane, e);
            const int i = i0 + 16 * rt + c.row;
            float* at = dq + p.q_offset(b, h) + size_t(i) * D + c0 + 8 * n + c.col;
            if (i < p.q_len) {
#if __CUDA_ARCH__ >= 900
              atomicAdd(reinterpret_cast<float2*>(at), make_float2(tau * acc[n][e], tau * acc[n][e + 1]));
#else
              atomicAdd(at, tau * acc[n][e]), atomicAdd(at + 1, tau * acc[n][e + 1]);
#endif
            }
          }
      }
      if (has_next && threadIdx.x < Br)
        Ls2[next * Br + threadIdx.x] = L_next, Ds2[next * Br + threadIdx.x] = D_next;
      __syncthreads();  // every warp is done with this tile's buffers and dS^T before they are refilled
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
  using Tile = bwd::KvTile<D, kBc, kBr>;
  constexpr size_t smem = sizeof(Tc) * (2 * (Tile::Bc + kStages * Tile::Br) * (D + bwd::kPad) +
                                        Tile::Bc * (Tile::Br + bwd::kPad)) +
                          sizeof(float) * 2 * kStages * Tile::Br;
  return {kv_kernel<Tc, D, true>, kv_kernel<Tc, D, false>, Tile::Bc, Tile::kThreads, smem};
}

}  // namespace

template <class T>
void backward_v7_br64(const fa::Problem& p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                      const T* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace) {
  using Tc = typename fa::CudaType<T>::type;
  bwd::run_backward<T>(p, p.head_dim == 64 ? kernels<Tc, 64>() : kernels<Tc, 128>(), q, k, v, o, lse, dout, dq, dk,
                       dv, mode, workspace);
}
WSQ_BWD_INSTANTIATE(backward_v7_br64)

}  // namespace wsq
