// Backward step 13 (Hopper, sm_90a only): Br = 128 queries per tile at d = 64, FlashAttention-3's tile there. At
// d = 64 step 12's tile is small: S^T = K_j Q_i^T is 4 k16 steps of one m64n64 wgmma a warpgroup, and every tile pays
// the same fixed costs whatever its size (the full/empty mbarrier waits, the DsFree/DsReady barriers between the
// MMA warpgroups, the dQ hand-over with the writer, the wgmma waits, L_i and D_i, the mask test). With Br = 128 each
// tile does twice the products for those costs, and a K/V block walks half as many tiles. Per MMA warpgroup (its 64
// keys of Bc = 128, as in step 12):
//   S^T, dP^T           64 keys x 128 queries   wgmma m64n128k16 (step 12: m64n64k16), k = d = 64: 4 steps
//   dV_j, dK_j          += P^T dO_i, dS^T Q_i   wgmma m64n64k16, A from registers, k = 128 queries: 8 steps (4)
//   dQ_i                its 64 queries (rows 64 w .. 64 w + 63 of the Q block) x 64 columns, k = all 128 keys: 8
//                       steps of m64n64k16 with A = dS from both warpgroups' dS^T in shared memory. Step 12 split
//                       dQ by KEYS at d = 64 (each warpgroup its own 64 keys' share of all 64 rows, both shares
//                       added to the same region); splitting by QUERY ROWS gives each warpgroup a 16 KiB region of
//                       its own: dQ_i goes to global memory once (one 16 KiB bulk reduce-add per warpgroup, 32 KiB
//                       for 128 rows), half the bytes step 12 adds for the same rows (2 x 16 KiB per 64 rows).
// The dQ tile stays step 12's fragment order, region by region: warpgroup w's region holds rows i0 + 64 w .. + 63,
// float4 (n-tile n, thread x) at float 4 (128 n + x), and in global memory those rows are one contiguous 16 KiB run
// of dq. So a 64-row region is the unit, as in step 12: a region that lies wholly before q_len is sent by one bulk
// reduce-add and turned into rows afterwards by the same postprocess as step 12's at d = 64 (one block per 64 rows);
// the last region of a head, when q_len is not a multiple of 64, is added from registers by float2 atomics, in rows.
// (A Q block of 128 rows may thus be half bulk, half atomics: its region 0 whole, region 1 partial or past q_len.)
// Two waits move, because the registers allow it at d = 64 and a longer tile makes them worth more:
//   * dQ's wgmma is issued right behind dV_j, dK_j's, in its own commit group, without waiting for them first (step
//     12 waited: at d = 128 the registers of P^T, dS^T had to be free first). wait_group 1 then means "dV_j, dK_j have
//     landed" (release the Q_i/dO_i buffer), wait_group 0 "dQ too";
//   * S^T and dP^T are two commit groups: wait_group 1 gives S^T, and P^T's 64 exponentials run while dP^T's wgmma
//     still does; wait_group 0, then dS^T.
// At d = 128 a tile of 128 queries does not fit: S^T and dP^T (64 + 64 registers) next to dK_j, dV_j (64 + 64) are
// more than setmaxnreg's 240, and K_j, V_j (64 KiB), the ring of Q_i, dO_i (128 KiB) and dS^T (32 KiB) alone fill the
// shared memory. There this step is step 12 (its host function is called).
//
// BACKWARD.md, Algorithm B, with the block's lines (d = 64):
//   line 1   producer: TMA K_j, V_j once (full_kv); dK_j = dV_j = 0   (MMA registers)
//   line 2-3 for each query head of the kv head's group, for each Q block i (128 rows) from the first that sees j0
//   line 4     producer: wait empty[s]; L_i (base 2), D_i by 32 lanes, 4 rows each; TMA Q_i, dO_i; arrive on full[s]
//   line 5     MMA: wait full[s]; S^T, dP^T              (wgmma m64n128k16, both from shared memory; a group each)
//   line 6     wait 1: P^T = 2^(tau log2(e) S^T - L_i); wait 0: dS^T = P^T o (dP^T - D_i)  (masked only in tiles
//              that need it)
//   line 9a    dS^T -> shared memory (DsFree before, DsReady after: dQ reads both warpgroups' keys)
//   line 7-8   dV_j += P^T dO_i, dK_j += dS^T Q_i                        (wgmma m64n64k16, A from registers; a group)
//   line 9b    dQ rows 64 w .. = dS K_j (wgmma m64n64k16, both from shared memory; the next group); wait 1: arrive
//              empty[s]; wait 0; wait dq_free[x]; tau dQ -> region w of dQ tile x in fragment order (x = tile % 2;
//              a partial or empty region: float2 atomics in rows, or nothing); arrive dq_full[x]. Writer: wait
//              dq_full[x]; one 16 KiB bulk reduce-add per whole region; wait .read of all but this group; arrive
//              dq_free of the other tile
//   after    postprocess kernel: each whole 64-row region, fragment order -> rows (in place)
//   line 10  dK_j *= tau; write dK_j, dV_j (fp32)
// Thread mapping: step 12's (warps 0-7 the two MMA warpgroups, keys 64 w .. 64 w + 63 of the block each; warp 8 the
// producer, warp 9 the dQ writer, lane 0 issuing the copies; warps 10-11 exit). MMA thread registers (setmaxnreg 240,
// the producer's warpgroup 24; at 232 ptxas serialises the wgmma, C7512): S^T, dP^T 64 + 64, dK_j, dV_j 32 + 32;
// P^T, dS^T packed 32 + 32 and dQ's share 32 while the three products of lines 7-9 run.
// Shared memory (d = 64): K_j, V_j 2 x 16 KiB; the ring of Q_i, dO_i 2 x 2 x 16 KiB; dS^T 128 keys x 128 queries
// (two 64-query panels) 32 KiB; two dQ tiles of two 16 KiB regions 64 KiB; L_i, D_i 2 x 2 x 512 bytes; the mbarriers;
// 1 KiB alignment slack: 195 KiB.
#include "backward/bwd_steps.hpp"
#include "forward/tc.cuh"
#include "hopper/bwd_sm90.cuh"
#include "hopper/tma_host.cuh"
#include "hopper/wgmma.cuh"

namespace wsq {
namespace {

using namespace sm90;

constexpr int D = 64;             // this kernel's head_dim (d = 128: step 12)
constexpr int Br = 128, Bc = 128;  // Br: the N of S^T (one m64n128 wgmma per k16 step); Bc: 64 keys per warpgroup
constexpr int kMma = 2;            // MMA warpgroups
constexpr int kMmaThreads = 128 * kMma;
constexpr int kThreads = kMmaThreads + 128;  // + warpgroup 2 (the producer warp, the dQ writer warp)
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
constexpr int kProducerRegs = 24, kMmaRegs = 240;
static_assert(128 * kProducerRegs + kMmaThreads * kMmaRegs <= kThreads * kLaunchRegs,
              "setmaxnreg only moves registers the block already holds");
static_assert(Bc == 64 * kMma && Br == 64 * kMma, "a wgmma has M = 64: 64 keys, and 64 rows of dQ_i, a warpgroup");
constexpr int kStages = 2;  // Q_i/dO_i/L_i/D_i buffers: the tile being computed and the one being loaded
constexpr int kBarDsFree = 1, kBarDsReady = 2;  // named barriers of the two MMA warpgroups around dS^T
constexpr int kDqTiles = 2;                      // dQ tiles, used in turn
constexpr int kBarDqFree = 3, kBarDqFull = 5;    // + x: named barriers of dQ tile x (MMA warpgroups and writer)
constexpr int kDqHandover = kMmaThreads + 32;    // threads at those: the MMA warpgroups and the writer warp
constexpr int kRegionRows = 64;                  // a dQ region: 64 rows x 64 columns in fragment order (16 KiB)
constexpr int kRegionFloats = kRegionRows * D;
constexpr float kLog2e = 1.4426950408889634f;

// Shared memory, in order: K_j, V_j, the Q_i and dO_i buffers, dS^T (each a multiple of 1024 bytes), the dQ tiles,
// L_i and D_i, the mbarriers.
struct Layout {
  static constexpr uint32_t kv_bytes = Bc * D * 2, q_bytes = Br * D * 2, ds_bytes = Bc * Br * 2;
  static constexpr size_t dq_bytes = kDqTiles * kMma * kRegionFloats * sizeof(float);
  static constexpr size_t bytes = 2 * kv_bytes + 2 * kStages * q_bytes + ds_bytes + dq_bytes +
                                  2 * kStages * Br * sizeof(float) + (1 + 2 * kStages) * sizeof(uint64_t);
  static constexpr size_t alloc = bytes + kAtomBytes;
};
static_assert(Layout::alloc <= 227 * 1024, "an H100 block has at most 227 KiB of shared memory");

template <class T>
__device__ __forceinline__ const unsigned char* bytes_of(const T* p) {
  return reinterpret_cast<const unsigned char*>(p);
}

template <class T, bool kDq>
__global__ void __launch_bounds__(kThreads, 1)
    kv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do, fa::Problem p,
              const float* __restrict__ lse, const float* __restrict__ Dv, float* __restrict__ dq,
              float* __restrict__ dk, float* __restrict__ dv) {
  constexpr int kStepsD = D / 16;   // k-steps of S^T, dP^T (over head_dim)
  constexpr int kStepsQ = Br / 16;  // k-steps of dV, dK (over queries)
  constexpr int kTilesQ = Br / 8;   // n-tiles (8 queries) of S^T, dP^T
  constexpr int kTilesD = D / 8;    // n-tiles (8 columns) of dK, dV and of a warpgroup's dQ rows
  constexpr int kStepsDq = Bc / 16;  // k-steps of dQ (over all the block's keys)

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kAtomBytes - 1) / kAtomBytes * kAtomBytes);
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + Bc * D;
  T* Qs = Vs + Bc * D;                // kStages buffers of Br x D
  T* dOs = Qs + kStages * Br * D;     // kStages buffers of Br x D
  T* dSt = dOs + kStages * Br * D;    // dS^T: Bc keys x Br queries, two panels of 64 queries
  float* dQs = reinterpret_cast<float*>(dSt + Bc * Br);  // kDqTiles x kMma regions in fragment order
  float* Ls = dQs + kDqTiles * kMma * kRegionFloats;      // kStages x Br, L_i log2(e)
  float* Ds = Ls + kStages * Br;                         // kStages x Br
  uint64_t* full_kv = reinterpret_cast<uint64_t*>(Ds + kStages * Br);
  uint64_t* full = full_kv + 1;       // [kStages]: Q_i, dO_i, L_i, D_i of buffer s are there
  uint64_t* empty = full + kStages;   // [kStages]: every MMA thread is done with buffer s

  const int j0 = blockIdx.x * Bc, hk = blockIdx.y, b = blockIdx.z;
  const int i_first = p.first_query_seeing(j0) / Br * Br;  // causal: the Q blocks before it see no key of the block
  const int q_tiles = i_first < p.q_len ? (p.q_len - i_first + Br - 1) / Br : 0;
  const int n_tiles = p.group() * q_tiles;  // (query head, Q block) pairs, head-major
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);  // warp-uniform for ptxas (forward step 9)
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    mbar_init(full_kv, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full[s], 32);            // the producer warp's 32 lanes (lane 0 with the copies' bytes)
      mbar_init(&empty[s], kMmaThreads);  // every MMA thread once per use
    }
    fence_barrier_init();
  }
  __syncthreads();

  if (wg == kMma) {  // warpgroup 2: warp 8 is the producer, warp 9 the dQ writer
    setmaxnreg_dec<kProducerRegs>();
    // A block without a tile (impossible with the bottom-right mask: the last query sees every key) loads nothing:
    // no copy may still be landing when the block exits.
    if (warp % 4 > 1 || n_tiles == 0) return;
    if (warp % 4 == 1) {  // the writer (line 9): lane 0 adds each whole region with one bulk copy
      if constexpr (kDq) {
        for (int x = 0; x < kDqTiles && x < n_tiles; ++x) named_bar_arrive(kBarDqFree + x, kDqHandover);  // both free
        for (int tile = 0; tile < n_tiles; ++tile) {
          const int h = hk * p.group() + tile / q_tiles, i0 = i_first + tile % q_tiles * Br, x = tile % kDqTiles;
          named_bar_sync(kBarDqFull + x, kDqHandover);
          if (lane == 0)
            for (int w = 0; w < kMma; ++w)
              if (i0 + kRegionRows * (w + 1) <= p.q_len)  // a whole region: its rows of dq, in fragment order
                bulk_reduce_add(dq + p.q_offset(b, h) + size_t(i0 + kRegionRows * w) * D,
                                dQs + (x * kMma + w) * kRegionFloats, kRegionFloats * sizeof(float));
          bulk_commit();
          bulk_wait_read<1>();  // every group but this one has read its tile: tile - 1's may be rewritten ...
          if (tile >= 1 && tile + 1 < n_tiles) named_bar_arrive(kBarDqFree + (tile + 1) % kDqTiles, kDqHandover);
        }  // ... by tile + 1, which uses it
        bulk_wait<0>();  // the additions themselves are done before the block ends
      }
      return;
    }
    const int plane_kv = b * p.kv_heads + hk;
    if (lane == 0) {  // line 1
      mbar_arrive_expect_tx(full_kv, 2 * Layout::kv_bytes);
      tma_load_3d(Ks, &tm_k, full_kv, 0, j0, plane_kv);
      tma_load_3d(Vs, &tm_v, full_kv, 0, j0, plane_kv);
    }
    for (int tile = 0; tile < n_tiles; ++tile) {  // line 4
      const int s = tile % kStages, h = hk * p.group() + tile / q_tiles, i0 = i_first + tile % q_tiles * Br;
      mbar_wait(&empty[s], ((tile / kStages) & 1) ^ 1);  // round r reuses buffer s after the MMA's release r - 1
      // L_i, D_i: 128 rows at an offset that need not be 16-byte aligned (any q_len), so not a bulk copy. L_i is
      // stored times log2(e) (line 6 in base 2); rows past q_len get 0: line 6's mask zeroes them.
      for (int r = lane; r < Br; r += 32) {
        const bool in = i0 + r < p.q_len;
        Ls[s * Br + r] = in ? lse[p.lse_offset(b, h) + i0 + r] * kLog2e : 0.f;
        Ds[s * Br + r] = in ? Dv[p.lse_offset(b, h) + i0 + r] : 0.f;
      }
      if (lane == 0) {  // after its own stores: an arrive releases what the thread wrote before it
        mbar_arrive_expect_tx(&full[s], 2 * Layout::q_bytes);
        tma_load_3d(Qs + s * Br * D, &tm_q, &full[s], 0, i0, b * p.heads + h);
        tma_load_3d(dOs + s * Br * D, &tm_do, &full[s], 0, i0, b * p.heads + h);
      } else {
        mbar_arrive(&full[s]);
      }
    }
    return;
  }

  // MMA warpgroups. This thread holds keys kr and kr + 8 of the block (rows of dK_j, dV_j, S^T, dP^T), and rows
  // 64 wg + 16 (warp % 4) + g, + 8 of dQ_i.
  setmaxnreg_inc<kMmaRegs>();
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int kr = 64 * wg + 16 * (warp % 4) + g;
  const unsigned char* Ks_wg = bytes_of(Ks) + 64 * wg * kRowBytes;  // its 64 keys of K_j
  const unsigned char* Vs_wg = bytes_of(Vs) + 64 * wg * kRowBytes;
  const unsigned char* dSt_wg = bytes_of(dSt) + wg * panel_bytes(Bc);  // dS^T's panel of its 64 queries (dQ rows)
  const int dq_row0 = kRegionRows * wg;                                // its rows of dQ_i
  const float tau = p.softmax_scale(), tau_log2 = tau * kLog2e;
  float dK[D / 2] = {}, dV[D / 2] = {};
  if (n_tiles > 0) mbar_wait(full_kv, 0);

  for (int tile = 0; tile < n_tiles; ++tile) {  // lines 2-3
    const int s = tile % kStages, parity = (tile / kStages) & 1, i0 = i_first + tile % q_tiles * Br;
    const unsigned char* Qs_i = bytes_of(Qs + s * Br * D);
    const unsigned char* dOs_i = bytes_of(dOs + s * Br * D);
    const float* Ls_i = Ls + s * Br;
    const float* Ds_i = Ds + s * Br;

    mbar_wait(&full[s], parity);
    float st[Br / 2], dpt[Br / 2];  // line 5: S^T and dP^T, 64 keys x 128 queries per warpgroup
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      wgmma_ss_n128<T>(st, desc_k_major(Ks_wg + k_major_step(kk, Bc)), desc_k_major(Qs_i + k_major_step(kk, Br)),
                       kk > 0);
    wgmma_commit();
    #pragma unroll
    for (int kk = 0; kk < kStepsD; ++kk)
      wgmma_ss_n128<T>(dpt, desc_k_major(Vs_wg + k_major_step(kk, Bc)), desc_k_major(dOs_i + k_major_step(kk, Br)),
                       kk > 0);
    wgmma_commit();

    // line 6. C fragment: n-tile n, element e -> key kr + 8 (e / 2), query i0 + 8n + 2t + e % 2. The two queries of
    // a thread's n-tile are neighbours: L_i, D_i of both in one float2 load each (32 loads instead of 64, which also
    // keeps ptxas from spilling in the deterministic mode's kernel). P^T's exponentials run while dP^T's wgmma does.
    wgmma_wait<1>();  // S^T's group has landed
    fence_operands(st);
    #pragma unroll
    for (int n = 0; n < kTilesQ; ++n) {
      const float2 L = *reinterpret_cast<const float2*>(Ls_i + 8 * n + 2 * t);
      #pragma unroll
      for (int e = 0; e < 4; ++e) st[4 * n + e] = exp2f(fmaf(st[4 * n + e], tau_log2, -(e % 2 ? L.y : L.x)));
    }
    wgmma_wait<0>();  // dP^T's too
    fence_operands(dpt);
    #pragma unroll
    for (int n = 0; n < kTilesQ; ++n) {
      const float2 Di = *reinterpret_cast<const float2*>(Ds_i + 8 * n + 2 * t);
      #pragma unroll
      for (int e = 0; e < 4; ++e) dpt[4 * n + e] = st[4 * n + e] * (dpt[4 * n + e] - (e % 2 ? Di.y : Di.x));
    }
    const bool need_mask = i0 + Br > p.q_len || j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
    if (need_mask) {  // what it zeroes may be inf or NaN above (L = -inf of a row that sees no key)
      #pragma unroll
      for (int n = 0; n < kTilesQ; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = i0 + 8 * n + 2 * t + e % 2;
          if (!(i < p.q_len && p.visible(i, j0 + kr + 8 * (e / 2)))) st[4 * n + e] = dpt[4 * n + e] = 0.f;
        }
    }

    if constexpr (kDq) {  // line 9, first half: dS^T into shared memory, where dQ's wgmma reads it as dS
      named_bar_sync(kBarDsFree, kMmaThreads);  // both warpgroups' dQ wgmma of the last tile have read dS^T
      #pragma unroll
      for (int n = 0; n < kTilesQ; ++n)
        #pragma unroll
        for (int e = 0; e < 4; e += 2)
          *reinterpret_cast<uint32_t*>(reinterpret_cast<unsigned char*>(dSt) +
                                       tile_byte(kr + 8 * (e / 2), 8 * n + 2 * t, Bc)) =
              pack2<T>(dpt[4 * n + e], dpt[4 * n + e + 1]);
      fence_view_async_shared();  // these stores, before the wgmma (async proxy) reads them
      named_bar_sync(kBarDsReady, kMmaThreads);
    }

    // lines 7-8: P^T, dS^T for queries 16 kk .. 16 kk + 15 = their n-tiles 2 kk, 2 kk + 1 (forward step 9's P)
    uint32_t pa[kStepsQ][4], dsa[kStepsQ][4];
    #pragma unroll
    for (int kk = 0; kk < kStepsQ; ++kk)
      #pragma unroll
      for (int x = 0; x < 4; ++x) {
        pa[kk][x] = pack2<T>(st[8 * kk + 2 * x], st[8 * kk + 2 * x + 1]);
        dsa[kk][x] = pack2<T>(dpt[8 * kk + 2 * x], dpt[8 * kk + 2 * x + 1]);
      }
    wgmma_fence();
    #pragma unroll
    for (int kk = 0; kk < kStepsQ; ++kk)  // B = dO_i rows (queries) 16 kk .. 16 kk + 15, all 64 columns
      wgmma_rs<T, D>(dV, pa[kk], desc_mn_major(dOs_i + mn_major_step(kk), panel_bytes(Br)));
    #pragma unroll
    for (int kk = 0; kk < kStepsQ; ++kk)
      wgmma_rs<T, D>(dK, dsa[kk], desc_mn_major(Qs_i + mn_major_step(kk), panel_bytes(Br)));
    wgmma_commit();

    if constexpr (kDq) {  // line 9: A = dS (its 64 queries x keys) read from dS^T, B = K_j; no branch (ptxas: C7519).
      // Issued behind dK, dV's wgmma, without waiting: at d = 64 P^T, dS^T (32 + 32 registers) and dQ's share (32)
      // fit next to dK_j, dV_j (32 + 32).
      float dQ[kTilesD * 4];  // rows 64 wg .. 64 wg + 63 of dQ_i, 64 columns
      #pragma unroll
      for (int kk = 0; kk < kStepsDq; ++kk)
        wgmma_ss_n64_mn<T>(dQ, desc_mn_major(dSt_wg + 16 * kk * kRowBytes, panel_bytes(Bc)),
                           desc_mn_major(bytes_of(Ks) + 16 * kk * kRowBytes, panel_bytes(Bc)), kk > 0);
      wgmma_commit();
      wgmma_wait<1>();  // dK, dV's group has landed (dQ's may still run)
      fence_operands(dV), fence_operands(dK);
      mbar_arrive(&empty[s]);  // Q_i, dO_i, L_i, D_i of buffer s are no longer read by this thread
      wgmma_wait<0>();
      fence_operands(dQ);
      // tau dQ -> this warpgroup's region of dQ tile x in fragment order, once the writer has read it
      const int x = tile % kDqTiles;
      float* dQ_frag = dQs + (x * kMma + wg) * kRegionFloats + 4 * (threadIdx.x % 128);  // float4 (n, thread)
      named_bar_sync(kBarDqFree + x, kDqHandover);
      if (i0 + dq_row0 + kRegionRows <= p.q_len) {
        #pragma unroll
        for (int n = 0; n < kTilesD; ++n)
          *reinterpret_cast<float4*>(dQ_frag + 4 * 128 * n) =
              make_float4(tau * dQ[4 * n], tau * dQ[4 * n + 1], tau * dQ[4 * n + 2], tau * dQ[4 * n + 3]);
        fence_view_async_shared();  // these stores, before the bulk copy (async proxy) reads them
      } else {  // the last region of the head, partial (or past q_len): step 9's atomics, in rows (r: g or g + 8)
        const int h = hk * p.group() + tile / q_tiles;
        #pragma unroll
        for (int n = 0; n < kTilesD; ++n)
          #pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int i = i0 + dq_row0 + 16 * (warp % 4) + g + 8 * r;
            if (i < p.q_len)
              atomicAdd(reinterpret_cast<float2*>(dq + p.q_offset(b, h) + size_t(i) * D + 8 * n + 2 * t),
                        make_float2(tau * dQ[4 * n + 2 * r], tau * dQ[4 * n + 2 * r + 1]));
          }
      }
      named_bar_arrive(kBarDqFull + x, kDqHandover);
    } else {
      wgmma_wait<0>();
      fence_operands(dV), fence_operands(dK);
      mbar_arrive(&empty[s]);
    }
  }

  #pragma unroll
  for (int n = 0; n < kTilesD; ++n)  // line 10
    #pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int j = j0 + kr + 8 * r;
      if (j >= p.kv_len) continue;
      const size_t at = p.kv_offset(b, hk) + size_t(j) * D + 8 * n + 2 * t;
      *reinterpret_cast<float2*>(dk + at) = make_float2(tau * dK[4 * n + 2 * r], tau * dK[4 * n + 2 * r + 1]);
      *reinterpret_cast<float2*>(dv + at) = make_float2(dV[4 * n + 2 * r], dV[4 * n + 2 * r + 1]);
    }
}

// The postprocess: whole region blockIdx.x (rows 64 blockIdx.x .. + 63) of head (blockIdx.z, blockIdx.y), from
// fragment order to rows. Thread x reads the 8 float4 that MMA thread x of the warpgroup that owned the region stored
// (n-tile n, C-fragment element e: row 16 (x / 32) + g + 8 (e / 2), column 8 n + 2 t + e % 2), and after the block's
// barrier (the range is rewritten in place) writes them as float2 into their rows. Step 12's at d = 64.
__global__ void __launch_bounds__(128) dq_rows_kernel(fa::Problem p, float* __restrict__ dq) {
  const int x = threadIdx.x, lane = x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  float* region = dq + p.q_offset(blockIdx.z, blockIdx.y) + size_t(blockIdx.x) * kRegionFloats;
  float4 f[D / 8];
  #pragma unroll
  for (int n = 0; n < D / 8; ++n) f[n] = *reinterpret_cast<const float4*>(region + 4 * (128 * n + x));
  __syncthreads();
  float* row = region + size_t(16 * (x / 32) + g) * D + 2 * t;
  #pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    *reinterpret_cast<float2*>(row + 8 * n) = make_float2(f[n].x, f[n].y);
    *reinterpret_cast<float2*>(row + 8 * D + 8 * n) = make_float2(f[n].z, f[n].w);
  }
}

template <class T>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout, const float* Dv,
         float* dq, float* dk, float* dv, bool with_dq) {
  using Tc = typename fa::CudaType<T>::type;
  const CUtensorMap tm_q = tensor_map(q, D, p.q_len, p.batch * p.heads, Br);
  const CUtensorMap tm_do = tensor_map(dout, D, p.q_len, p.batch * p.heads, Br);
  const CUtensorMap tm_k = tensor_map(k, D, p.kv_len, p.batch * p.kv_heads, Bc);
  const CUtensorMap tm_v = tensor_map(v, D, p.kv_len, p.batch * p.kv_heads, Bc);
  const dim3 grid((p.kv_len + Bc - 1) / Bc, p.kv_heads, p.batch);
  launch_sm90(with_dq ? kv_kernel<Tc, true> : kv_kernel<Tc, false>, grid, kThreads, Layout::alloc, tm_q, tm_k, tm_v,
              tm_do, p, lse, Dv, dq, dk, dv);
  if (with_dq && p.q_len >= kRegionRows)  // the whole regions back into rows
    launch_sm90(dq_rows_kernel, dim3(p.q_len / kRegionRows, p.heads, p.batch), 128, 0, p, dq);
}

}  // namespace

template <class T>
void backward_v13_br128(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                        const float* Dv, float* dq, float* dk, float* dv, bool with_dq) {
  if (p.head_dim == 64) run<T>(p, q, k, v, lse, dout, Dv, dq, dk, dv, with_dq);
  else backward_v12_dq_tile_reduce<T>(p, q, k, v, lse, dout, Dv, dq, dk, dv, with_dq);  // d = 128: step 12
}
WSQ_BWD_KV_INSTANTIATE(backward_v13_br128)

}  // namespace wsq
