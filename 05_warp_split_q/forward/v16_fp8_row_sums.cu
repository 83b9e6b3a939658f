// Step 16 (Hopper, sm_90a only): step 15 with the row sums l_i computed by the tensor cores. Lines 6-7 sum each row
// of P_ij on the FMA pipe: 64 FADD a thread and tile, two dependent chains of 32, in the softmax that FP8.md §17
// shows is the critical path, beside 64 ex2, 64 FFMA and 64 FMNMX. But l_i = P_ij 1 is one more column of P_ij V_j:
// with Vt8 followed by rows of ones, the product P8 [V8 | 1] = [P8 V8 | P8 1] gives O~'s update and the row sum in the
// same wgmma. The tensor cores have time to spare (busy 30-45 % of a tile) and wgmma's N grows by its smallest step,
// 8 columns (the 8 rows of ones fill one 1024-byte swizzle atom, and a row of equal bytes is its own swizzle), so
// the product gets 6 % longer at d = 128 and 12.5 % at d = 64 while the softmax loses its 64 FADD. Two more changes
// follow: l_i is now the sum of the e4m3 values that multiply V, kPScale P rounded (steps 11-15 summed the unrounded
// P), so numerator and denominator see the same rounding; and the sum covers the whole row, all 128 keys of the 4
// lanes that share it, so the quad_sum at the end goes. l_i is updated where O~ is, when P V is done: l_i = l_i
// alpha + (P8 1), with alpha alone (O~'s factor f also carries V's scale ratio; l_i counts P, not V's units).
// On an H200 (FP8.md §13), against step 15: from N = 2048 on +2.2-3.5 % at d = 128 and +2.0-2.9 % at d = 64, causal
// and not; level at N = 512.
// `diff v15_fp8_three_warpgroups.cu v16_fp8_row_sums.cu` is the lesson.
//
// Computes, for each work item (Q block Q_i of Br rows, head h, batch b), per consumer warpgroup, the lines of
// README Algorithm 1 as step 15 does, except:
//   line 7     l_i is not summed by the softmax; line 8's P V product, N = d + 8, returns P_ij 1 in its last columns
//   line 8     O~_i = O~_i f + PV[:, :d] and l_i = l_i alpha + PV[:, d] (every lane of a row holds the whole sum)
//   line 9     O_i = O~_i sv / l_i and L_i from l_i as it is (no sum over the 4 lanes)
// Thread mapping as in step 15: consumer warpgroups 0 .. C - 1 (rows 64 w .. 64 w + 63 of every item; C = 3 at
// d = 64, 2 at d = 128), producer warpgroup C. Shared memory: step 15's plus 8 rows of ones after each of the 3 Vt8
// buffers: (2 Br + 3 x 128 + 3 (d + 8)) x 128 B = 123 KiB (d = 64, Br = 192), 131 KiB (d = 128, Br = 128), plus 16
// mbarriers and 2 item indices. ptxas: 4 more accumulators a thread (d = 128: 68); it stores 40 bytes a thread to
// the stack at d = 128 (as step 15) and 52 at d = 64 (step 15: 8).
#include <algorithm>
#include <type_traits>

#include "launch.cuh"
#include "tc.cuh"
#include "steps.hpp"
#include "hopper/tma_host.cuh"
#include "hopper/wgmma.cuh"
#include "hopper/fp8.hpp"

namespace wsq {
namespace {

using namespace sm90;

constexpr int Bc = fp8::kBlockRows;     // the K/V tiles are the scale blocks: one sk_j, sv_j
constexpr int kK = 32;                   // e4m3 wgmma: k = 32 (32 bytes of a row) per instruction
constexpr int kRowsPerConsumer = 64;     // a wgmma has M = 64: one consumer warpgroup per 64 rows
template <int D>
constexpr int kConsumers = D == 64 ? 3 : 2;  // consumer warpgroups: three where the registers allow (below)
// Three consumer warpgroups run without step 14's turns and without its softmax under their own P V (the header).
template <int D>
constexpr bool kThree = kConsumers<D> == 3;
template <int D>
constexpr int Br = kRowsPerConsumer * kConsumers<D>;  // 192 at d = 64, 128 at d = 128
template <int D>
constexpr int kConsumerThreads = 128 * kConsumers<D>;
template <int D>
constexpr int kThreads = kConsumerThreads<D> + 128;  // + the producer warpgroup (warpgroup kConsumers)
// Registers per thread after the split (setmaxnreg): the producer needs few, the consumers hold S and O~. The
// block keeps what __launch_bounds__(kThreads, 1) gave it. d = 64: 512 x 128 = 65,536 at launch, 128 x 32 +
// 384 x 160 = 65,536 after (168 for the consumers would need 67,584 even with the producer at 24). d = 128: step 14's 384 x 168 = 64,512, then
// 128 x 24 + 256 x 240.
template <int D>
constexpr int kLaunchRegs = 65536 / kThreads<D> / 8 * 8;
template <int D>
constexpr int kProducerRegs = D == 64 ? 32 : 24;
template <int D>
constexpr int kConsumerRegs = D == 64 ? 160 : 240;
template <int D>
constexpr bool kRegistersFit = 128 * kProducerRegs<D> + kConsumerThreads<D> * kConsumerRegs<D> <= kThreads<D> * kLaunchRegs<D>;
static_assert(kRegistersFit<64> && kRegistersFit<128>,
              "setmaxnreg only moves registers the block already holds: more would make the consumers wait forever");
constexpr int kStages = 3;               // K/V buffers: the tile being computed and two being loaded
constexpr int kQBuffers = 2;             // Q8 buffers: the item being computed and the next
constexpr int kTurnBarrier = 1;         // named barriers 1 and 2 (0 is __syncthreads'), with two warpgroups
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
constexpr float kPScaleLog2 = 8.f;       // kPScale = 2^8, added to the exponent instead of multiplied into P
static_assert(fp8::kPScale == 256.f, "kPScaleLog2 is log2(kPScale)");

// The work counter: items handed out after every block's first, and the blocks that have seen the end. Zero at
// every launch: the last block to see the end sets both back. One launch at a time (the program's one stream).
__device__ int next_item = 0, blocks_done = 0;

// 2^x with the MUFU.EX2 alone: exp2f (no flush-to-zero) wraps it in a compare and two predicated multiplies for
// results below 2^-126, which here are P values far under e4m3's smallest (2^-9 / kPScale). The CPU emulation: exp2f.
__device__ __forceinline__ float ex2_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

static_assert(fp8::kRowBytes == kRowBytes, "a quantised row is one 128-byte swizzle row: one TMA box, one panel");

// Work item -> (Q block x, head h, batch b). Causal: item / (B H) counts down the Q blocks, so every head's longest
// item comes before any shorter one; otherwise item / Tr is the head, and consecutive items share K and V.
struct Item {
  int x, h, b;
};
__device__ __forceinline__ Item item_of(int item, const fa::Problem& p, int tiles_q) {
  const int planes = p.batch * p.heads;
  const int x = p.causal ? tiles_q - 1 - item / planes : item % tiles_q;
  const int plane = p.causal ? item % planes : item / tiles_q;
  return {x, plane % p.heads, plane / p.heads};
}

// The order the producer hands the items out in: the counter's kth take -> the item number above (what the consumers
// decode with item_of). Without a mask the same number. Causal, two wishes pull apart: the longest items should go
// first, so that the short ones fill the end of the launch; and the items that run together should share K and V,
// so that L2 serves them. item_of's order alone (longest first across all planes) gives the first and loses the
// second: at N <= 2048 every Q block then reads its K/V from memory. So the planes (head, batch) are cut into groups
// of about G = 4 x blocks / Tr, and within a group the Q blocks go longest first, across its planes. A group's K/V
// is then about 4 x blocks x 2 Bc d bytes whatever N (17 MiB at d = 128 on 132 SMs: it stays in L2 while the group
// runs), and the last group still holds about 2 Tr tiles per block, twice its longest item. The groups differ by at
// most one plane: the first planes % groups of them have one more. Only the producer computes this.
__device__ __forceinline__ int handed_out(int take, const fa::Problem& p, int tiles_q) {
  if (!p.causal) return take;
  const int planes = p.batch * p.heads;
  const int wanted = min(planes, (4 * int(gridDim.x) + tiles_q - 1) / tiles_q);
  const int groups = (planes + wanted - 1) / wanted;
  const int size_small = planes / groups, groups_big = planes % groups;  // groups_big groups of size_small + 1 first
  const int takes_big = groups_big * (size_small + 1) * tiles_q;
  const bool big = take < takes_big;
  const int size = big ? size_small + 1 : size_small, rest = big ? take : take - takes_big;
  const int group = rest / (size * tiles_q), in_group = rest % (size * tiles_q);
  const int plane = (big ? 0 : takes_big / tiles_q) + group * size + in_group % size;
  return in_group / size * planes + plane;  // Q block Tr - 1 - in_group / size of the plane, numbered as item_of reads it
}

// Shared memory, in order: 2 Q8 buffers, K8 buffers, Vt8 buffers + ones (each a multiple of 1024 bytes: every panel starts
// on a swizzle-atom boundary), then the mbarriers and the index of the item in each Q buffer. One panel each: a row
// of Q8 or K8 (d <= 128 bytes), a row of Vt8 (Bc = 128 keys) fits one 128-byte swizzle row.
template <int D>
struct Layout {
  static constexpr uint32_t q_bytes = Br<D> * kRowBytes, k_tile_bytes = Bc * kRowBytes, v_tile_bytes = D * kRowBytes;
  // A Vt8 buffer: the D rows TMA writes, then 8 rows of ones (one 1024-byte atom) that are never overwritten.
  static constexpr uint32_t v_stage_bytes = v_tile_bytes + kAtomBytes;
  static constexpr size_t bytes = kQBuffers * q_bytes + kStages * (k_tile_bytes + v_stage_bytes) +
                                  (2 * kQBuffers + 4 * kStages) * sizeof(uint64_t) + kQBuffers * sizeof(int);
  static constexpr size_t alloc = bytes + kAtomBytes;  // slack to round the dynamic base up to 1024 bytes
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads<D>, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, fa::Problem p, fp8::Scales sc, T* __restrict__ o,
           float* __restrict__ lse) {
  using L = Layout<D>;
  constexpr int kConsumers = wsq::kConsumers<D>, Br = wsq::Br<D>, kConsumerThreads = wsq::kConsumerThreads<D>;
  constexpr int kStepsQK = D / kK;    // k-steps of S = Q K^T (d = 64: the first 64 bytes of each 128-byte row)
  constexpr int kTilesS = Bc / 8;     // n-tiles (8 keys) of S: S holds 4 kTilesS floats per thread
  constexpr int kStepsPV = Bc / kK;   // k-steps of O += P V
  constexpr int kTilesO = D / 8;      // n-tiles (8 columns) of O~

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kAtomBytes - 1) / kAtomBytes * kAtomBytes);
  unsigned char* Qs = smem;                                // kQBuffers buffers of Br rows
  unsigned char* Ks = Qs + kQBuffers * L::q_bytes;         // kStages buffers of Bc rows
  unsigned char* Vs = Ks + kStages * L::k_tile_bytes;      // kStages buffers of D + 8 rows (Vt, then the ones)
  uint64_t* full_q = reinterpret_cast<uint64_t*>(Vs + kStages * L::v_stage_bytes);  // [kQBuffers]
  uint64_t* empty_q = full_q + kQBuffers;  // [kQBuffers]
  uint64_t* full_k = empty_q + kQBuffers;  // [kStages]
  uint64_t* full_v = full_k + kStages;  // [kStages]
  uint64_t* empty_k = full_v + kStages; // [kStages]
  uint64_t* empty_v = empty_k + kStages; // [kStages]
  int* item_in = reinterpret_cast<int*>(empty_v + kStages);  // [kQBuffers]: the item whose Q8_i the buffer holds

  const int tiles_q = (p.q_len + Br - 1) / Br, n_items = tiles_q * p.heads * p.batch;
  const int q_blocks = fp8::tiles(p.q_len);  // Q's scale blocks of 128 rows (the items are Br rows)
  // The warpgroup index read through a shuffle: ptxas then knows it is the same in every lane, so the consumer
  // branch is not "divergent" (wgmma in a path ptxas thinks divergent gets serialised, warning C7520).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    for (int s = 0; s < kQBuffers; ++s)
      mbar_init(&full_q[s], 1), mbar_init(&empty_q[s], kConsumerThreads);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], 1), mbar_init(&full_v[s], 1);  // the producer's arrive + the copy's bytes
      mbar_init(&empty_k[s], kConsumerThreads), mbar_init(&empty_v[s], kConsumerThreads);  // every consumer thread
    }
    fence_barrier_init();
  }
  // Rows D .. D + 7 of every Vt8 buffer: e4m3 1.0 (0x38) in every byte, so P V's last 8 columns are the row sums of
  // P8 (a row of equal bytes is its own swizzle). Written once; the fence makes them visible to wgmma (async proxy).
  for (int x = threadIdx.x; x < kStages * kAtomBytes / 4; x += kThreads<D>)
    reinterpret_cast<uint32_t*>(Vs + (x / (kAtomBytes / 4)) * L::v_stage_bytes + L::v_tile_bytes)[x % (kAtomBytes / 4)] =
        0x38383838u;
  fence_view_async_shared();
  __syncthreads();  // the only block-wide barrier: afterwards producer and consumers meet only at mbarriers

  if (wg == kConsumers) {  // the producer warpgroup
    setmaxnreg_dec<kProducerRegs<D>>();
    if (warp % 4 != 0 || lane != 0) return;
    int take = blockIdx.x, loaded = 0;  // loaded: K/V tiles so far, over all items (buffer loaded % kStages)
    for (int nth = 0;; ++nth) {         // this block's nth item
      const int qb = nth % kQBuffers;
      mbar_wait(&empty_q[qb], ((nth / kQBuffers) & 1) ^ 1);  // the consumers are done with its item nth - 2
      const int item = take < n_items ? handed_out(take, p, tiles_q) : n_items;
      item_in[qb] = item;  // published by the arrive below (release), read after the consumers' wait (acquire)
      if (item >= n_items) {
        mbar_arrive(&full_q[qb]);  // no bytes: the consumers read the index, past the end, and stop
        __threadfence();           // this block's last take from next_item before its report
        if (atomicAdd(&blocks_done, 1) == int(gridDim.x) - 1) next_item = 0, blocks_done = 0;  // the last block
        return;
      }
      const int next = int(gridDim.x) + atomicAdd(&next_item, 1);  // the next item, used after this one's loads
      const Item it = item_of(item, p, tiles_q);
      const int i0 = it.x * Br, plane = it.b * p.kv_heads + p.kv_head_of(it.h);
      const int n_tiles = (p.visible_keys(min(i0 + Br, p.q_len) - 1) + Bc - 1) / Bc;
      // line 1: Q8_i. The maps describe each 128-byte row as 64 16-bit columns: TMA moves bytes.
      mbar_arrive_expect_tx(&full_q[qb], L::q_bytes);
      tma_load_3d(Qs + qb * L::q_bytes, &tm_q, &full_q[qb], 0, i0, it.b * p.heads + it.h);
      for (int tile = 0; tile < n_tiles; ++tile, ++loaded) {
        const int s = loaded % kStages, round = loaded / kStages;
        mbar_wait(&empty_k[s], (round & 1) ^ 1);  // round r reuses buffer s after the consumers' release r - 1
        mbar_arrive_expect_tx(&full_k[s], L::k_tile_bytes);
        tma_load_3d(Ks + s * L::k_tile_bytes, &tm_k, &full_k[s], 0, tile * Bc, plane);
        mbar_wait(&empty_v[s], (round & 1) ^ 1);
        mbar_arrive_expect_tx(&full_v[s], L::v_tile_bytes);  // Vt8 rows 0 .. D - 1, keys tile * Bc .. + 127
        tma_load_3d(Vs + s * L::v_stage_bytes, &tm_v, &full_v[s], tile * Bc / 2, 0, plane);
      }
      take = next;
    }
  }

  // Consumers. Warpgroup wg owns rows 64 wg .. 64 wg + 63 of every item; this thread rows r0 and r0 + 8.
  setmaxnreg_inc<kConsumerRegs<D>>();
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int r0 = kRowsPerConsumer * wg + 16 * (warp % 4) + g;
  const int tiles_k = fp8::tiles(p.kv_len);
  const uint64_t desc_ks = desc_k_major(Ks), desc_vs = desc_k_major(Vs);  // K/V buffer 0's descriptors

  // The turn barriers (two warpgroups only): warpgroup w waits on kTurnBarrier + w before issuing its products and
  // then arrives on the other's, for every tile of every item. Warpgroup 1 arrives once up front, so warpgroup 0 goes
  // first; warpgroup 0 waits once more at the end, for warpgroup 1's last arrive: every arrive is matched, whatever
  // the items. Three warpgroups issue whenever their operands are ready: with products of ~250 cycles a warpgroup
  // and three softmaxes to keep apart, a fixed order made a warpgroup that was ready wait for one that was not.
  constexpr bool kTurns = !kThree<D>;
  const int my_turn = kTurnBarrier + wg, other_turn = kTurnBarrier + 1 - wg;
  if (kTurns && wg == 1) named_bar_arrive(other_turn, kConsumerThreads);

  float s_acc[Bc / 2] = {};  // S (m64n128)
  // PV = P8 V8 of one tile, in its own accumulator: the e4m3 wgmma adds with about 14 bits (FP8.md §10), so O~ is
  // summed in fp32 here; f (per row) takes O~ into the units of the next PV.
  float pv[(D + 8) / 2] = {}, f[2] = {0.f, 0.f}, fl[2] = {0.f, 0.f};  // fl: f without V's ratio, for l
  uint32_t pf[kStepsPV][4];  // P8_i(j-1) as A fragments (4 e4m3 a register): read by the P V issued in iteration j
  int used = 0;  // K/V tiles consumed so far, over all items (buffer used % kStages)
  for (int nth = 0;; ++nth) {  // this block's nth item
    const int qb = nth % kQBuffers;
    mbar_wait(&full_q[qb], (nth / kQBuffers) & 1);
    // Read through a shuffle, like wg: ptxas then knows the item is the same in every lane, and so are the tile
    // counts and buffer indices that follow from it, which stay in uniform registers, where the wgmma descriptors
    // must be (read from shared memory alone, it made every descriptor non-uniform: ~60 instructions rebuilt them
    // after the turn barrier, FP8.md §11).
    const int item = __shfl_sync(0xffffffffu, item_in[qb], 0);
    if (item >= n_items) break;
    const Item it = item_of(item, p, tiles_q);
    const int i0 = it.x * Br;
    const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);  // causal: blocks past the diagonal skipped
    const int n_tiles = (kv_end + Bc - 1) / Bc;
    const int plane = it.b * p.kv_heads + p.kv_head_of(it.h);
    const int scales_at = plane * tiles_k;  // the descales of K_j and V_j, per tile: sc.k, sc.v from here
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, acc[D / 2] = {};  // line 2 (acc: O~, m64nD)
    // S in base-2 units, Q's descale folded in (K's per tile, in softmax()): that of the 128-row scale block this
    // warpgroup's 64 rows lie in (the last block for rows past the end, which are computed and not written).
    const int q_block = min((i0 + kRowsPerConsumer * wg) / fp8::kBlockRows, q_blocks - 1);
    const float scale_log2 = p.softmax_scale() * kLog2e * sc.q[size_t(it.b * p.heads + it.h) * q_blocks + q_block];

    // Tile `tile`'s K/V buffer and the parity of its phase: the tiles are counted over all items so far.
    auto buffer = [&](int tile) { return (used + tile) % kStages; };
    auto phase = [&](int tile) { return ((used + tile) / kStages) & 1; };
    // The operands' descriptors: this item's Q8 buffer; a k-step or another buffer is an add to the start address
    // field (bits 0-13, in 16-byte units; shared memory ends below 2^18 bytes, so the add never carries out of it).
    const uint64_t desc_q = desc_k_major(Qs + qb * L::q_bytes + kRowsPerConsumer * wg * kRowBytes);
    // line 5: S_ij = Q8_i K8_j^T; k32 step kk reads bytes 32 kk .. 32 kk + 31 of each row: the same 32-byte steps
    // through a 128-byte row as step 10's k16 steps of 16-bit values (sm90_layout.hpp: k_major_step).
    auto issue_s = [&](int tile) {
      const uint64_t desc_k = desc_ks + buffer(tile) * (L::k_tile_bytes >> 4);
      #pragma unroll
      for (int kk = 0; kk < kStepsQK; ++kk)
        wgmma_ss_n128_e4m3(s_acc, desc_q + (k_major_step(kk, Br) >> 4), desc_k + (k_major_step(kk, Bc) >> 4), kk > 0);
      wgmma_commit();
    };
    // PV = P8 [Vt8_tile | 1]^T from the tile's buffer: B = rows 0 .. D + 7 (n: Vt, then the ones), keys 32 kk .. 32 kk
    // + 31 (k): K-major. The first k-step overwrites pv (accumulate = 0): each tile's sum starts fresh.
    auto issue_pv = [&](int tile) {
      const uint64_t desc_v = desc_vs + buffer(tile) * (L::v_stage_bytes >> 4);
      #pragma unroll
      for (int kk = 0; kk < kStepsPV; ++kk)
        wgmma_rs_e4m3<D + 8>(pv, pf[kk], desc_v + (k_major_step(kk, D) >> 4), kk > 0);
      wgmma_commit();
    };
    // lines 6-7 for tile j, c = scale_log2 sk_j: mask, m_new, kPScale P_ij = exp2(c S_ij - m_new + 8) in place of
    // S (l_i: P V's last column, in add_pv); alpha = exp2(m_i - m_new) per row. `positive` (c > 0) picks max or min
    // of the unscaled S: c max S = max c S when c > 0, c min S when c < 0 (rounding is monotonic: the same float
    // either way). Called as two instantiations behind one uniform branch per tile, so no element pays for the choice.
    auto softmax = [&](int tile, float c, float (&alpha)[2], auto positive) {
      constexpr bool kPositive = decltype(positive)::value;
      const int j0 = tile * Bc;
      // S's C fragment: n-tile n, element e -> row r0 + 8 (e / 2), key j0 + 8 n + 2 t + e % 2. Only a tile that
      // crosses the causal diagonal or the end of the keys needs the per-element test, behind one branch per tile.
      // A masked score is the value c turns into -inf: -inf for c > 0, +inf for c < 0.
      const bool need_mask = j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
      if (need_mask) {
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n)
          #pragma unroll
          for (int e = 0; e < 4; ++e)
            if (!p.visible(i0 + r0 + 8 * (e / 2), j0 + 8 * n + 2 * t + e % 2))
              s_acc[4 * n + e] = kPositive ? -INFINITY : INFINITY;
      }
      #pragma unroll
      for (int r = 0; r < 2; ++r) {  // row r0 + 8r; the 4 lanes of a group share the row
        float ext = kPositive ? -INFINITY : INFINITY;  // the largest (c > 0) or smallest (c < 0) unscaled score
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n)
          ext = kPositive ? fmaxf(ext, fmaxf(s_acc[4 * n + 2 * r], s_acc[4 * n + 2 * r + 1]))
                          : fminf(ext, fminf(s_acc[4 * n + 2 * r], s_acc[4 * n + 2 * r + 1]));
        ext = kPositive ? quad_max(ext) : -quad_max(-ext);
        const float m_new = fmaxf(m[r], c * ext);  // c ext = -inf when the row has no key in this tile
        const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp2(-inf) = 0
        alpha[r] = ex2_ftz(m[r] - m_use);
        const float bias = kPScaleLog2 - m_use;
        #pragma unroll
        for (int n = 0; n < kTilesS; ++n)
          #pragma unroll
          for (int e = 2 * r; e < 2 * r + 2; ++e) s_acc[4 * n + e] = ex2_ftz(fmaf(s_acc[4 * n + e], c, bias));
        m[r] = m_new;
      }
    };
    auto softmax_tile = [&](int tile, float sk_j, float (&alpha)[2]) {
      const float c = scale_log2 * sk_j;  // the descales of Q_i and K_j folded into the softmax scale
      if (c > 0.f) softmax(tile, c, alpha, std::true_type{});
      else softmax(tile, c, alpha, std::false_type{});
    };
    // line 8, once the P V product in flight is done: O~ = O~ f + PV in fp32, one FFMA an element. f, set by the
    // tile before, takes O~ to PV's units: the running maximum m_(j-1), the V scale sv_(j-1) (O~ counts in units of
    // the newest V tile's scale). Then l_i = l_i fl + P8 1 (column D: kPScale P summed over the row's 128 keys), fl
    // = alpha alone: l_i has no V scale.
    auto add_pv = [&] {
      #pragma unroll
      for (int n = 0; n < kTilesO; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e) acc[4 * n + e] = fmaf(acc[4 * n + e], f[e / 2], pv[4 * n + e]);
      l[0] = fmaf(l[0], fl[0], pv[D / 2]), l[1] = fmaf(l[1], fl[1], pv[D / 2 + 2]);  // rows r0, r0 + 8: whole rows
    };
    // Then f for the next add: alpha sv_(j-1) / sv_j, and P_ij -> e4m3 A fragments: A register x, byte i of k32 step
    // kk takes the accumulator a_from_c(kk, x, i) (hopper/fp8.hpp; the keys it holds are the ones Vt8 stores at that
    // position). All of P is packed before the next wgmma: a register written between two wgmma would make ptxas wait.
    auto next_factor_and_pack = [&](const float (&alpha)[2], float v_ratio) {
      f[0] = alpha[0] * v_ratio, f[1] = alpha[1] * v_ratio, fl[0] = alpha[0], fl[1] = alpha[1];
      #pragma unroll
      for (int kk = 0; kk < kStepsPV; ++kk)
        #pragma unroll
        for (int x = 0; x < 4; ++x)
          pf[kk][x] = fp8::pack4_e4m3(s_acc[fp8::a_from_c(kk, x, 0)], s_acc[fp8::a_from_c(kk, x, 1)],
                                      s_acc[fp8::a_from_c(kk, x, 2)], s_acc[fp8::a_from_c(kk, x, 3)]);
    };

    // The descales travel one tile ahead: sk_next, sv_next are those of the tile after the current one (the last
    // tile's again at the end: a valid index, no branch), sv_prev is sv_(j-1), kept from the iteration before.
    float sk_next = 0.f, sv_next = 0.f, sv_prev = 0.f;
    if (n_tiles > 0) {  // tile 0: nothing to overlap with yet
      float alpha[2];
      const float sk_0 = sc.k[scales_at];
      sv_prev = sc.v[scales_at];
      sk_next = sc.k[scales_at + min(1, n_tiles - 1)], sv_next = sc.v[scales_at + min(1, n_tiles - 1)];
      mbar_wait(&full_k[buffer(0)], phase(0));  // line 4
      if (kTurns) named_bar_sync(my_turn, kConsumerThreads);
      wgmma_fence();
      issue_s(0);
      if (kTurns) named_bar_arrive(other_turn, kConsumerThreads);
      wgmma_wait<0>();
      fence_operands(s_acc);
      mbar_arrive(&empty_k[buffer(0)]);
      softmax_tile(0, sk_0, alpha);
      next_factor_and_pack(alpha, 1.f);  // f = alpha = 0: O~ is still 0
    }
    for (int tile = 1; tile < n_tiles; ++tile) {  // line 3
      const int prev = tile - 1;  // the tile whose P V product this iteration issues
      float alpha[2];
      // line 4: this tile's descales (requested an iteration ago), the next tile's requested now, then the buffers
      const float sk_j = sk_next, sv_j = sv_next;
      sk_next = sc.k[scales_at + min(tile + 1, n_tiles - 1)], sv_next = sc.v[scales_at + min(tile + 1, n_tiles - 1)];
      mbar_wait(&full_k[buffer(tile)], phase(tile));
      mbar_wait(&full_v[buffer(prev)], phase(prev));
      if (kTurns) named_bar_sync(my_turn, kConsumerThreads);
      wgmma_fence();  // line 5: S_ij, and PV = P_i(j-1) V_(j-1) right behind it
      issue_s(tile);
      issue_pv(prev);
      if (kTurns) named_bar_arrive(other_turn, kConsumerThreads);
      const float v_ratio = sv_prev / sv_j;  // from registers, behind the products just issued
      if constexpr (kThree<D>) {  // both products first: P8_i(j-1) and PV free before the softmax (160 registers)
        wgmma_wait<0>();  // S_ij and PV are done
        fence_operands(s_acc);
        fence_operands(pv);
        mbar_arrive(&empty_k[buffer(tile)]);  // this thread is done with K_j
        mbar_arrive(&empty_v[buffer(prev)]);  // this thread is done with V_(j-1)
        add_pv();                             // line 8 of tile j - 1
        softmax_tile(tile, sk_j, alpha);      // lines 6-7, while the other warpgroups' products run
      } else {
        wgmma_wait<1>();  // S_ij is done (the older group); P V may still run
        fence_operands(s_acc);
        mbar_arrive(&empty_k[buffer(tile)]);  // this thread is done with K_j
        softmax_tile(tile, sk_j, alpha);      // lines 6-7, while P V runs
        wgmma_wait<0>();                      // line 8: PV is done
        fence_operands(pv);
        mbar_arrive(&empty_v[buffer(prev)]);  // this thread is done with V_(j-1)
        add_pv();
      }
      next_factor_and_pack(alpha, v_ratio);
      sv_prev = sv_j;
    }
    mbar_arrive(&empty_q[qb]);  // every S of this item is done: the producer may load item nth + 2's Q8 here
    if (n_tiles > 0) {  // line 8 of the last tile: its P V
      const int last = n_tiles - 1;
      mbar_wait(&full_v[buffer(last)], phase(last));
      wgmma_fence();
      issue_pv(last);
      wgmma_wait<0>();
      fence_operands(pv);
      mbar_arrive(&empty_v[buffer(last)]);
      add_pv();
    }

    const int h = item_of(item, p, tiles_q).h, b = item_of(item, p, tiles_q).b;  // after the loop: no registers in it
    #pragma unroll
    for (int r = 0; r < 2; ++r) {  // line 9
      const float l_row = l[r];  // the whole row's sum: P V's column D
      const float inv_l = l_row > 0.f ? sv_prev / l_row : 0.f;  // V's descale (the last tile's); l_row counts kPScale P
      const int i = i0 + r0 + 8 * r;
      if (i >= p.q_len) continue;
      T* O = o + p.q_offset(b, h) + size_t(i) * D;
      #pragma unroll
      for (int n = 0; n < kTilesO; ++n)
        *reinterpret_cast<uint32_t*>(O + 8 * n + 2 * t) = pack2<T>(acc[4 * n + 2 * r] * inv_l, acc[4 * n + 2 * r + 1] * inv_l);
      if (t == 0) lse[p.lse_offset(b, h) + i] = l_row > 0.f ? (m[r] + log2f(l_row) - kPScaleLog2) * kLn2 : -INFINITY;
    }
    used += n_tiles;
  }
  if (kTurns && wg == 0) named_bar_sync(my_turn, kConsumerThreads);  // warpgroup 1's last arrive
}

template <int D>
void run(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse) {
  using T = fa::bfloat16_t;
  using Tc = typename fa::CudaType<T>::type;
  // Each 128-byte row described as 64 16-bit values: TMA copies bytes, and the maps and the swizzle are step 10's.
  auto bytes = [](const uint8_t* x) { return reinterpret_cast<const fa::half_t*>(x); };
  constexpr int kCols = fp8::kRowBytes / 2;
  const CUtensorMap tm_q = tensor_map(bytes(in.q), kCols, p.q_len, p.batch * p.heads, Br<D>);
  const CUtensorMap tm_k = tensor_map(bytes(in.k), kCols, p.kv_len, p.batch * p.kv_heads, Bc);
  const CUtensorMap tm_v = tensor_map(bytes(in.vt), fp8::padded_keys(p.kv_len) / 2, D, p.batch * p.kv_heads, D);
  const int items = (p.q_len + Br<D> - 1) / Br<D> * p.heads * p.batch;
  const dim3 grid(std::min(items, sm_count()));  // one block per SM (its threads hold all the SM's registers)
  launch_tma_fp8<Tc>(kernel<Tc, D>, grid, kThreads<D>, Layout<D>::alloc, tm_q, tm_k, tm_v, p, {in.sq, in.sk, in.sv},
                     fa::cuda_ptr(o), lse);
}

}  // namespace

void forward_v16_fp8_row_sums(const fa::Problem& p, const fp8::View& in, fa::bfloat16_t* o, float* lse) {
  if (p.head_dim == 64) run<64>(p, in, o, lse);
  else run<128>(p, in, o, lse);
}

}  // namespace wsq
