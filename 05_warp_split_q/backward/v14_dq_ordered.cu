// Backward step 14 (Hopper, sm_90a only): step 13 with an ordered, deterministic dQ, at both head dims. Step 13's
// deterministic mode leaves dQ to a second kernel (bwd_dq.cu) that recomputes S_ij and P_ij for every Q block: most
// of a second pass. The atomic mode's dQ is not deterministic only because the K/V blocks' reduce-adds into a dQ
// tile happen in whatever order the blocks get there, and fp32 addition is not associative. FlashAttention-3 fixes
// that order instead: the K/V blocks add their shares of each dQ tile in a fixed order of j, so every run performs
// the same additions in the same order and dQ is bit-identical run to run, at the price of some waiting.
// The tile is step 13's: at d = 64 Br = 128 with dQ split by QUERY ROWS (warpgroup w makes rows 64 w .. 64 w + 63
// of the Q block, all 64 columns), at d = 128 step 12's Br = 64 with dQ split by COLUMN PANELS (warpgroup w makes
// columns 64 w .. 64 w + 63, all 64 rows). Either way the two warpgroups' 16 KiB regions of a dQ tile are DISJOINT
// ranges of dq, which is what the order needs: each region is added by its own reduce-adds, and a tile's adds from
// one block touch every dQ element once. (Step 12's d = 64 split by keys, both warpgroups adding a share to the same
// elements, is not: two reduce-adds to the same addresses need not add in the order they were issued.)
//   counters:  one int per (batch, query head, Q block of Br rows) in the workspace (dq_order_ints), zeroed by the
//              launch: how many K/V blocks have added their share of that tile. The K/V blocks that add to Q block i
//              are a prefix j = 0 .. adders - 1 of the kv head's blocks (causal: block j starts at the first Q block
//              that sees key j0, which grows with j; adders = the blocks holding a key that the tile's last row
//              sees). GQA: each query head of the group has its own dQ rows, so its own counters.
//   the order: descending j: block j's turn at tile i comes when the counter reads adders - 1 - j. Causal, block
//              j + 1 starts Bc / Br Q blocks later than block j, so it reaches every tile they share sooner: in
//              this order the turns come about when the blocks get there (ascending j, every block would wait for
//              block 0, which has the most tiles before each one).
//   writer:    lane 0 waits for the turn (dq_order_wait: acquire loads in a loop, then a proxy fence so its bulk
//              copies come after what it saw), issues the tile's reduce-adds, waits for them to COMPLETE
//              (bulk_wait<0>: .read would only say the source was read, not that the additions are in global memory),
//              then moves the counter on (dq_order_release: a proxy fence, then a release add). Each tile is then
//              free at once: its buffer goes back to the MMA warpgroups right after the wait. Only the writer warp
//              waits for turns; the MMA warpgroups wait only when both dQ tiles are still with the writer.
//   partial:   a region that lies partly past q_len (the last of a head) has no whole range of its own. Ordered, its
//              share goes through the shared tile in ROWS: the tile taken as Br x d floats row-major, so the rows
//              before q_len are laid out as dq's own rows, and the writer adds them with one more reduce-add, in turn
//              like the whole regions. Step 13's float2 atomics from the MMA threads could not wait for a turn. (At
//              d = 64 a Q block may be half whole, half partial: its region 0 in fragment order, region 1 in rows.)
//   no deadlock: the grid runs j downwards (blockIdx.x = number of K/V blocks - 1 - j), so block j waits only for
//              blocks of the same (kv head, batch) with lower linear block indices, launched before it; the lowest
//              unfinished block has no one left to wait for.
// The atomic mode is step 13's (no counters, the partial region by float2 atomics).
//
// BACKWARD.md, Algorithm B, with the block's lines:
//   line 1   producer: TMA K_j, V_j once (full_kv); dK_j = dV_j = 0   (MMA registers)
//   line 2-3 for each query head of the kv head's group, for each Q block i (Br rows) from the first that sees key j0
//   line 4     producer: wait empty[s]; L_i (base 2), D_i by 32 lanes; TMA Q_i, dO_i; arrive on full[s]
//   line 5     MMA: wait full[s]; S^T, dP^T              (wgmma m64n{Br}k16, both from shared memory; d = 64: a
//              commit group each)
//   line 6     P^T = 2^(tau log2(e) S^T - L_i), dS^T = P^T o (dP^T - D_i)  (masked only in tiles that need it; d = 64:
//              P^T while dP^T's wgmma runs)
//   line 9a    dS^T -> shared memory (DsFree before, DsReady after: dQ reads both warpgroups' keys)
//   line 7-8   dV_j += P^T dO_i, dK_j += dS^T Q_i                        (wgmma m64n{d}k16, A from registers)
//   line 9b    dQ region w = dS K_j (wgmma m64n64k16 over all 128 keys; d = 64 issued behind line 7-8's, d = 128
//              after them); arrive empty[s]; wait dq_free[x]; tau dQ -> region w of dQ tile x (x = tile % 2): a whole
//              region in fragment order; a partial one ordered in rows, atomic by float2 atomics; arrive dq_full[x].
//              Writer: wait dq_full[x]; ordered: wait for the turn, the reduce-adds, wait for them, release, arrive
//              dq_free[x]; atomic: step 13's (wait .read of all but this group, free the other tile)
//   after    postprocess kernel: each whole 64-row region, fragment order -> rows (in place)
//   line 10  dK_j *= tau; write dK_j, dV_j (fp32)
// Thread mapping: step 13's (warps 0-7 the two MMA warpgroups, keys 64 w .. 64 w + 63 of the block each; warp 8 the
// producer, warp 9 the dQ writer, lane 0 issuing the copies and taking the turns; warps 10-11 exit). setmaxnreg:
// d = 64 step 13's 240 (MMA) / 24 (producer warpgroup), d = 128 step 12's 232 / 40. Postprocess: 128 threads per
// 64-row region (256 at d = 128, one region per column panel), thread x of region w takes what MMA thread x of
// warpgroup w held.
// Shared memory: step 13's, 195 KiB at d = 64 (K_j, V_j 32 KiB; the ring of Q_i, dO_i 64 KiB; dS^T 32 KiB; two dQ
// tiles of two 16 KiB regions 64 KiB; L_i, D_i, mbarriers; 1 KiB alignment slack); step 12's at d = 128, 208 KiB
// + 1 KiB (L_i, D_i, mbarriers) + 1 KiB slack.
#include "backward/bwd_steps.hpp"
#include "forward/tc.cuh"
#include "hopper/bwd_sm90.cuh"
#include "hopper/tma_host.cuh"
#include "hopper/wgmma.cuh"

namespace wsq {
namespace {

using namespace sm90;

constexpr int Bc = 128;   // keys per block: 64 per MMA warpgroup
constexpr int kMma = 2;   // MMA warpgroups
constexpr int kMmaThreads = 128 * kMma;
constexpr int kThreads = kMmaThreads + 128;  // + warpgroup 2 (the producer warp, the dQ writer warp)
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
static_assert(Bc == 64 * kMma, "a wgmma has M = 64: one MMA warpgroup per 64 keys");
constexpr int kStages = 2;  // Q_i/dO_i/L_i/D_i buffers: the tile being computed and the one being loaded
constexpr int kBarDsFree = 1, kBarDsReady = 2;  // named barriers of the two MMA warpgroups around dS^T
constexpr int kDqTiles = 2;                      // dQ tiles, used in turn
constexpr int kBarDqFree = 3, kBarDqFull = 5;    // + x: named barriers of dQ tile x (MMA warpgroups and writer)
constexpr int kDqHandover = kMmaThreads + 32;    // threads at those: the MMA warpgroups and the writer warp
constexpr int kRegionRows = 64;                  // a dQ region: 64 rows x 64 columns in fragment order (16 KiB)
constexpr int kRegionFloats = kRegionRows * kPanelCols;
constexpr float kLog2e = 1.4426950408889634f;

// Step 13's tile at each head dim, and the shared memory it takes, in order: K_j, V_j, the Q_i and dO_i buffers, dS^T
// (each a multiple of 1024 bytes), the dQ tiles, L_i and D_i, the mbarriers.
template <int D>
struct Tile {
  // d = 64: Br = 128 queries, dQ split by rows; d = 128: Br = 64 (128 does not fit: step 13's header), by panels.
  static constexpr bool kRowSplit = D == 64;
  static constexpr int Br = kRowSplit ? 128 : 64;  // the N of S^T (one m64n{Br} wgmma per k16 step)
  // setmaxnreg: step 13's at d = 64 (at 232 ptxas serialises the wgmma there), step 12's at d = 128
  static constexpr int kProducerRegs = kRowSplit ? 24 : 40, kMmaRegs = kRowSplit ? 240 : 232;
  static constexpr int kPanels = D / kPanelCols;  // 64-column panels of K_j, V_j, Q_i, dO_i
  // Region w of a dQ tile: rows row0(w) .. + 63 and columns col0(w) .. + 63 of the Q block. In global memory it is
  // the floats kRegionFloats w .. of the Q block's range (rows i0 .. i0 + Br - 1: Br x D contiguous floats) either
  // way: at d = 64 rows 64 w .. 64 w + 63 follow each other, at d = 128 the range holds the two panels in turn.
  static constexpr int row0(int w) { return kRowSplit ? kRegionRows * w : 0; }
  static constexpr int col0(int w) { return kRowSplit ? 0 : kPanelCols * w; }
  static_assert(kRowSplit ? Br == kRegionRows * kMma : kPanels == kMma, "one region per MMA warpgroup");

  static constexpr uint32_t kv_bytes = Bc * D * 2, q_bytes = Br * D * 2, ds_bytes = Bc * Br * 2;
  static constexpr size_t dq_bytes = kDqTiles * kMma * kRegionFloats * sizeof(float);
  static constexpr size_t bytes = 2 * kv_bytes + 2 * kStages * q_bytes + ds_bytes + dq_bytes +
                                  2 * kStages * Br * sizeof(float) + (1 + 2 * kStages) * sizeof(uint64_t);
  static constexpr size_t alloc = bytes + kAtomBytes;
  static_assert(128 * kProducerRegs + kMmaThreads * kMmaRegs <= kThreads * kLaunchRegs,
                "setmaxnreg only moves registers the block already holds");
  static_assert(alloc <= 227 * 1024, "an H100 block has at most 227 KiB of shared memory");
  static_assert(Br == dq_order_rows(D), "the counters (bwd_steps.hpp) count Q blocks of Br rows");
};

template <class T>
__device__ __forceinline__ const unsigned char* bytes_of(const T* p) {
  return reinterpret_cast<const unsigned char*>(p);
}

// kOrdered: the deterministic mode (dq_order: the counters, zeroed); otherwise step 13's atomic mode.
template <class T, int D, bool kOrdered>
__global__ void __launch_bounds__(kThreads, 1)
    kv_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
              const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do, fa::Problem p,
              const float* __restrict__ lse, const float* __restrict__ Dv, float* __restrict__ dq,
              float* __restrict__ dk, float* __restrict__ dv, int* __restrict__ dq_order) {
  using Tl = Tile<D>;
  constexpr int Br = Tl::Br, kPanels = Tl::kPanels;
  constexpr int kStepsD = D / 16;   // k-steps of S^T, dP^T (over head_dim)
  constexpr int kStepsQ = Br / 16;  // k-steps of dV, dK (over queries)
  constexpr int kTilesQ = Br / 8;   // n-tiles (8 queries) of S^T, dP^T
  constexpr int kTilesD = D / 8;    // n-tiles (8 columns) of dK, dV
  constexpr int kTilesDq = kPanelCols / 8;  // n-tiles of a warpgroup's dQ region
  constexpr int kStepsDq = Bc / 16;         // k-steps of dQ (over all the block's keys)

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kAtomBytes - 1) / kAtomBytes * kAtomBytes);
  T* Ks = reinterpret_cast<T*>(smem);
  T* Vs = Ks + Bc * D;
  T* Qs = Vs + Bc * D;                // kStages buffers of Br x D
  T* dOs = Qs + kStages * Br * D;     // kStages buffers of Br x D
  T* dSt = dOs + kStages * Br * D;    // dS^T: Bc keys x Br queries, Br / 64 panels of 64 queries
  float* dQs = reinterpret_cast<float*>(dSt + Bc * Br);  // kDqTiles x kMma regions
  float* Ls = dQs + kDqTiles * kMma * kRegionFloats;      // kStages x Br, L_i log2(e)
  float* Ds = Ls + kStages * Br;                         // kStages x Br
  uint64_t* full_kv = reinterpret_cast<uint64_t*>(Ds + kStages * Br);
  uint64_t* full = full_kv + 1;       // [kStages]: Q_i, dO_i, L_i, D_i of buffer s are there
  uint64_t* empty = full + kStages;   // [kStages]: every MMA thread is done with buffer s

  // Ordered: the blocks of a (kv head, batch) are launched in descending j, the order they add dQ in (below).
  const int kv_blocks = (p.kv_len + Bc - 1) / Bc;
  const int jb = kOrdered ? kv_blocks - 1 - int(blockIdx.x) : int(blockIdx.x);
  const int j0 = jb * Bc, hk = blockIdx.y, b = blockIdx.z;
  const int i_first = p.first_query_seeing(j0) / Br * Br;  // causal: the Q blocks before it see no key of the block
  const int q_tiles = i_first < p.q_len ? (p.q_len - i_first + Br - 1) / Br : 0;
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
    setmaxnreg_dec<Tl::kProducerRegs>();
    // (query head, Q block) pairs, head-major. Computed on each side of setmaxnreg, not before it: at d = 64 the
    // ordered writer leaves no room in the producer warpgroup's 24 registers, and a value live across the split
    // was spilled (ptxas -v).
    const int n_tiles = p.group() * q_tiles;
    // A block without a tile (impossible with the bottom-right mask: the last query sees every key) loads nothing:
    // no copy may still be landing when the block exits.
    if (warp % 4 > 1 || n_tiles == 0) return;
    if (warp % 4 == 1) {  // the writer (line 9): lane 0 adds each warpgroup's region with one bulk copy
      const int q_blocks = (p.q_len + Br - 1) / Br;
      for (int x = 0; x < kDqTiles && x < n_tiles; ++x) named_bar_arrive(kBarDqFree + x, kDqHandover);  // both free
      for (int tile = 0; tile < n_tiles; ++tile) {
        const int h = hk * p.group() + tile / q_tiles, i0 = i_first + tile % q_tiles * Br, x = tile % kDqTiles;
        int* turn = kOrdered ? dq_order + (size_t(b) * p.heads + h) * q_blocks + i0 / Br : nullptr;  // tile's counter
        named_bar_sync(kBarDqFull + x, kDqHandover);
        if (lane == 0) {
          if constexpr (kOrdered) {  // the blocks that add to this tile: 0 .. adders - 1; those above jb go first
            const int adders = (p.visible_keys(min(i0 + Br, p.q_len) - 1) + Bc - 1) / Bc;
            dq_order_wait(turn, adders - 1 - jb);
          }
          // The Q block's rows before q_len: those of whole regions (in fragment order, one copy each), then the
          // rest (ordered: in rows, Br x D row-major across the tile, one copy; atomic: added by the MMA threads).
          float* dq_tile = dq + p.q_offset(b, h) + size_t(i0) * D;  // the Q block's range of dq
          const float* dQ_tile = dQs + x * kMma * kRegionFloats;
          const int rows = min(Br, p.q_len - i0);
          for (int w = 0; w < kMma; ++w)
            if (Tl::row0(w) + kRegionRows <= rows)
              bulk_reduce_add(dq_tile + kRegionFloats * w, dQ_tile + kRegionFloats * w, kRegionFloats * sizeof(float));
          if constexpr (kOrdered) {
            const int whole = rows / kRegionRows * kRegionRows;  // the rows of whole regions
            if (whole < rows)
              bulk_reduce_add(dq_tile + whole * D, dQ_tile + whole * D, (rows - whole) * D * sizeof(float));
          }
        }
        bulk_commit();
        if constexpr (kOrdered) {
          bulk_wait<0>();  // the additions are in global memory (all lanes: the others have no copy to wait for)
          if (lane == 0) dq_order_release(turn);  // block j - 1's turn at this tile
          if (tile + kDqTiles < n_tiles) named_bar_arrive(kBarDqFree + x, kDqHandover);  // tile x is free now
        } else {
          bulk_wait_read<1>();  // every group but this one has read its tile: tile - 1's may be rewritten ...
          if (tile >= 1 && tile + 1 < n_tiles) named_bar_arrive(kBarDqFree + (tile + 1) % kDqTiles, kDqHandover);
        }  // ... by tile + 1, which uses it
      }
      bulk_wait<0>();  // the additions themselves are done before the block ends
      return;
    }
    const int plane_kv = b * p.kv_heads + hk;
    if (lane == 0) {  // line 1
      mbar_arrive_expect_tx(full_kv, 2 * Tl::kv_bytes);
      for (int c = 0; c < kPanels; ++c) {
        tma_load_3d(Ks + c * Bc * kPanelCols, &tm_k, full_kv, c * kPanelCols, j0, plane_kv);
        tma_load_3d(Vs + c * Bc * kPanelCols, &tm_v, full_kv, c * kPanelCols, j0, plane_kv);
      }
    }
    for (int tile = 0; tile < n_tiles; ++tile) {  // line 4
      const int s = tile % kStages, h = hk * p.group() + tile / q_tiles, i0 = i_first + tile % q_tiles * Br;
      mbar_wait(&empty[s], ((tile / kStages) & 1) ^ 1);  // round r reuses buffer s after the MMA's release r - 1
      // L_i, D_i: Br rows at an offset that need not be 16-byte aligned (any q_len), so not a bulk copy. L_i is
      // stored times log2(e) (line 6 in base 2); rows past q_len get 0: line 6's mask zeroes them.
      #pragma unroll 2  // (d = 64: 4 rows a lane, 2 at a time; all 4 at once do not fit in 24 registers: spilled)
      for (int r = lane; r < Br; r += 32) {
        const bool in = i0 + r < p.q_len;
        Ls[s * Br + r] = in ? lse[p.lse_offset(b, h) + i0 + r] * kLog2e : 0.f;
        Ds[s * Br + r] = in ? Dv[p.lse_offset(b, h) + i0 + r] : 0.f;
      }
      if (lane == 0) {  // after its own stores: an arrive releases what the thread wrote before it
        mbar_arrive_expect_tx(&full[s], 2 * Tl::q_bytes);
        for (int c = 0; c < kPanels; ++c) {
          tma_load_3d(Qs + (s * kPanels + c) * Br * kPanelCols, &tm_q, &full[s], c * kPanelCols, i0, b * p.heads + h);
          tma_load_3d(dOs + (s * kPanels + c) * Br * kPanelCols, &tm_do, &full[s], c * kPanelCols, i0,
                      b * p.heads + h);
        }
      } else {
        mbar_arrive(&full[s]);
      }
    }
    return;
  }

  // MMA warpgroups. This thread holds keys kr and kr + 8 of the block (rows of dK_j, dV_j, S^T, dP^T), and rows
  // 16 (warp % 4) + g, + 8 of its dQ region.
  setmaxnreg_inc<Tl::kMmaRegs>();
  const int n_tiles = p.group() * q_tiles;  // (the producer's, computed on this side of setmaxnreg)
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int kr = 64 * wg + 16 * (warp % 4) + g;
  const unsigned char* Ks_wg = bytes_of(Ks) + 64 * wg * kRowBytes;  // its 64 keys within each K_j panel
  const unsigned char* Vs_wg = bytes_of(Vs) + 64 * wg * kRowBytes;
  // dQ region wg = dS K_j over all the block's keys: A = dS^T's panel of the region's queries (d = 64: panel wg;
  // d = 128: the only one), B = K_j's panel of its columns (d = 64: the only one; d = 128: panel wg)
  const unsigned char* dSt_dq = bytes_of(dSt) + (Tl::kRowSplit ? wg : 0) * panel_bytes(Bc);
  const unsigned char* Ks_dq = bytes_of(Ks) + (Tl::kRowSplit ? 0 : wg) * panel_bytes(Bc);
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
    float st[Br / 2], dpt[Br / 2];  // line 5: S^T and dP^T, 64 keys x Br queries per warpgroup
    // line 6. C fragment: n-tile n, element e -> key kr + 8 (e / 2), query i0 + 8n + 2t + e % 2.
    if constexpr (Tl::kRowSplit) {  // step 13's: two commit groups, P^T's exponentials run while dP^T's wgmma does
      wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk)
        wgmma_ss_n128<T>(st, desc_k_major(Ks_wg + k_major_step(kk, Bc)), desc_k_major(Qs_i + k_major_step(kk, Br)),
                         kk > 0);
      wgmma_commit();
      #pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk)
        wgmma_ss_n128<T>(dpt, desc_k_major(Vs_wg + k_major_step(kk, Bc)),
                         desc_k_major(dOs_i + k_major_step(kk, Br)), kk > 0);
      wgmma_commit();
      // The two queries of a thread's n-tile are neighbours: L_i, D_i of both in one float2 load each.
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
    } else {  // step 12's: one group
      wgmma_fence();
      #pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk)
        wgmma_ss_n64<T>(st, desc_k_major(Ks_wg + k_major_step(kk, Bc)), desc_k_major(Qs_i + k_major_step(kk, Br)),
                        kk > 0);
      #pragma unroll
      for (int kk = 0; kk < kStepsD; ++kk)
        wgmma_ss_n64<T>(dpt, desc_k_major(Vs_wg + k_major_step(kk, Bc)), desc_k_major(dOs_i + k_major_step(kk, Br)),
                        kk > 0);
      wgmma_commit();
      wgmma_wait<0>();
      fence_operands(st), fence_operands(dpt);
      #pragma unroll
      for (int n = 0; n < kTilesQ; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = 8 * n + 2 * t + e % 2;
          const float P = exp2f(fmaf(st[4 * n + e], tau_log2, -Ls_i[c]));
          st[4 * n + e] = P;
          dpt[4 * n + e] = P * (dpt[4 * n + e] - Ds_i[c]);
        }
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

    // line 9, first half: dS^T into shared memory, where dQ's wgmma reads it as dS
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
    for (int kk = 0; kk < kStepsQ; ++kk)  // B = dO_i rows (queries) 16 kk .. 16 kk + 15, all d columns
      wgmma_rs<T, D>(dV, pa[kk], desc_mn_major(dOs_i + mn_major_step(kk), panel_bytes(Br)));
    #pragma unroll
    for (int kk = 0; kk < kStepsQ; ++kk)
      wgmma_rs<T, D>(dK, dsa[kk], desc_mn_major(Qs_i + mn_major_step(kk), panel_bytes(Br)));
    wgmma_commit();

    // line 9: A = dS (the region's 64 queries x keys) read from dS^T, B = K_j; no branch (ptxas: C7519). d = 64:
    // issued behind dK, dV's wgmma, without waiting (P^T, dS^T's 32 + 32 registers and dQ's 32 fit next to dK_j,
    // dV_j's 32 + 32); d = 128: after dK, dV have landed, when P^T, dS^T's registers are free (ptxas: C7512).
    if constexpr (!Tl::kRowSplit) {
      wgmma_wait<0>();
      fence_operands(dV), fence_operands(dK);
      mbar_arrive(&empty[s]);  // Q_i, dO_i, L_i, D_i of buffer s are no longer read by this thread
      wgmma_fence();
    }
    float dQ[kTilesDq * 4];  // this warpgroup's dQ region: 64 rows x 64 columns
    #pragma unroll
    for (int kk = 0; kk < kStepsDq; ++kk)
      wgmma_ss_n64_mn<T>(dQ, desc_mn_major(dSt_dq + 16 * kk * kRowBytes, panel_bytes(Bc)),
                         desc_mn_major(Ks_dq + 16 * kk * kRowBytes, panel_bytes(Bc)), kk > 0);
    wgmma_commit();
    if constexpr (Tl::kRowSplit) {
      wgmma_wait<1>();  // dK, dV's group has landed (dQ's may still run)
      fence_operands(dV), fence_operands(dK);
      mbar_arrive(&empty[s]);  // Q_i, dO_i, L_i, D_i of buffer s are no longer read by this thread
    }
    wgmma_wait<0>();
    fence_operands(dQ);
    // tau dQ -> this warpgroup's region of dQ tile x, once the writer is done with it
    const int x = tile % kDqTiles, row0 = Tl::row0(wg);
    float* region = dQs + (x * kMma + wg) * kRegionFloats;
    named_bar_sync(kBarDqFree + x, kDqHandover);
    if (i0 + row0 + kRegionRows <= p.q_len) {  // a whole region: in fragment order, float4 (n-tile n, thread)
      float* dQ_frag = region + 4 * (threadIdx.x % 128);
      #pragma unroll
      for (int n = 0; n < kTilesDq; ++n)
        *reinterpret_cast<float4*>(dQ_frag + 4 * 128 * n) =
            make_float4(tau * dQ[4 * n], tau * dQ[4 * n + 1], tau * dQ[4 * n + 2], tau * dQ[4 * n + 3]);
      fence_view_async_shared();  // these stores, before the bulk copy (async proxy) reads them
    } else if constexpr (kOrdered) {  // partial: in rows (r: row g or g + 8) of the tile, Br x D row-major
      float* dQ_rows = dQs + x * kMma * kRegionFloats + (row0 + 16 * (warp % 4) + g) * D + Tl::col0(wg) + 2 * t;
      #pragma unroll
      for (int n = 0; n < kTilesDq; ++n)
        #pragma unroll
        for (int r = 0; r < 2; ++r)
          *reinterpret_cast<float2*>(dQ_rows + 8 * D * r + 8 * n) =
              make_float2(tau * dQ[4 * n + 2 * r], tau * dQ[4 * n + 2 * r + 1]);
      fence_view_async_shared();
    } else {  // partial: no range of its own; step 9's atomics, in rows (r: row g or g + 8)
      const int h = hk * p.group() + tile / q_tiles;
      #pragma unroll
      for (int n = 0; n < kTilesDq; ++n)
        #pragma unroll
        for (int r = 0; r < 2; ++r) {
          const int i = i0 + row0 + 16 * (warp % 4) + g + 8 * r;
          if (i < p.q_len)
            atomicAdd(reinterpret_cast<float2*>(dq + p.q_offset(b, h) + size_t(i) * D + Tl::col0(wg) + 8 * n + 2 * t),
                      make_float2(tau * dQ[4 * n + 2 * r], tau * dQ[4 * n + 2 * r + 1]));
        }
    }
    named_bar_arrive(kBarDqFull + x, kDqHandover);
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

// The postprocess: the 64 rows 64 blockIdx.x .. + 63 of head (blockIdx.z, blockIdx.y), whole, from fragment order to
// rows: one region at d = 64, two (the column panels) at d = 128. Thread x of region w reads the 8 float4 that MMA
// thread x of the warpgroup that made it stored (n-tile n, C-fragment element e: row 16 (x / 32) + g + 8 (e / 2),
// column 64 w + 8 n + 2 t + e % 2), and after the block's barrier (the range is rewritten in place) writes them as
// float2 into their rows.
template <int D>
__global__ void __launch_bounds__(128 * (D / kPanelCols)) dq_rows_kernel(fa::Problem p, float* __restrict__ dq) {
  const int w = threadIdx.x / 128, x = threadIdx.x % 128, lane = x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  float* rows = dq + p.q_offset(blockIdx.z, blockIdx.y) + size_t(blockIdx.x) * kRegionRows * D;
  float4 f[kPanelCols / 8];
  #pragma unroll
  for (int n = 0; n < kPanelCols / 8; ++n)
    f[n] = *reinterpret_cast<const float4*>(rows + kRegionFloats * w + 4 * (128 * n + x));
  __syncthreads();
  float* row = rows + size_t(16 * (x / 32) + g) * D + kPanelCols * w + 2 * t;
  #pragma unroll
  for (int n = 0; n < kPanelCols / 8; ++n) {
    *reinterpret_cast<float2*>(row + 8 * n) = make_float2(f[n].x, f[n].y);
    *reinterpret_cast<float2*>(row + 8 * D + 8 * n) = make_float2(f[n].z, f[n].w);
  }
}

template <class T, int D>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout, const float* Dv,
         float* dq, float* dk, float* dv, int* dq_order) {
  using Tc = typename fa::CudaType<T>::type;
  constexpr int Br = Tile<D>::Br;
  const CUtensorMap tm_q = tensor_map(q, D, p.q_len, p.batch * p.heads, Br);
  const CUtensorMap tm_do = tensor_map(dout, D, p.q_len, p.batch * p.heads, Br);
  const CUtensorMap tm_k = tensor_map(k, D, p.kv_len, p.batch * p.kv_heads, Bc);
  const CUtensorMap tm_v = tensor_map(v, D, p.kv_len, p.batch * p.kv_heads, Bc);
  // Block (x, kv head, batch) has linear index x + grid.x (kv head + kv_heads batch): the blocks of one (kv head,
  // batch) are launched in ascending x, which the ordered mode maps to descending j, the order of its turns.
  const dim3 grid((p.kv_len + Bc - 1) / Bc, p.kv_heads, p.batch);
  launch_sm90(dq_order ? kv_kernel<Tc, D, true> : kv_kernel<Tc, D, false>, grid, kThreads, Tile<D>::alloc, tm_q,
              tm_k, tm_v, tm_do, p, lse, Dv, dq, dk, dv, dq_order);
  if (p.q_len >= kRegionRows)  // the whole regions back into rows
    launch_sm90(dq_rows_kernel<D>, dim3(p.q_len / kRegionRows, p.heads, p.batch), 128 * (D / kPanelCols), 0, p, dq);
}

}  // namespace

template <class T>
void backward_v14_dq_ordered(const fa::Problem& p, const T* q, const T* k, const T* v, const float* lse, const T* dout,
                             const float* Dv, float* dq, float* dk, float* dv, int* dq_order) {
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, lse, dout, Dv, dq, dk, dv, dq_order);
  else run<T, 128>(p, q, k, v, lse, dout, Dv, dq, dk, dv, dq_order);
}
template void backward_v14_dq_ordered<fa::half_t>(const fa::Problem&, const fa::half_t*, const fa::half_t*,
                                                  const fa::half_t*, const float*, const fa::half_t*, const float*,
                                                  float*, float*, float*, int*);
template void backward_v14_dq_ordered<fa::bfloat16_t>(const fa::Problem&, const fa::bfloat16_t*,
                                                      const fa::bfloat16_t*, const fa::bfloat16_t*, const float*,
                                                      const fa::bfloat16_t*, const float*, float*, float*, float*,
                                                      int*);

}  // namespace wsq
