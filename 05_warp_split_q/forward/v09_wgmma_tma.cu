// Step 9 (Hopper, sm_90a only): the same algorithm on Hopper's own machinery. Three changes, all of one kind (let
// dedicated hardware move and multiply the tiles while the threads do the softmax):
//   * wgmma instead of mma.sync: a warpgroup (4 warps, 128 threads) issues one 64 x N x 16 product; the tensor
//     cores read Q and K_j (and V_j) straight from shared memory through matrix descriptors: no ldmatrix, no
//     operand registers except P, which stays in registers exactly as in step 5 (C layout of S = A layout of P).
//   * TMA instead of cp.async: one thread asks the copy engine for a whole tile (a box of the tensor); the
//     engine swizzles it into shared memory and counts the bytes on an mbarrier that the consumers wait on.
//   * warp specialisation: a producer warpgroup (one of its threads) only issues copies, two consumer warpgroups
//     only compute; they meet at mbarriers (full_k[s], full_v[s]: K_j, V_j in buffer s have landed - two barriers,
//     so that S = Q K_j^T can start before V_j is there; empty[s]: every consumer is done with buffer s), so the
//     copy of tile j + 1 runs while tile j is computed without any block-wide __syncthreads.
//
// Computes, for one Q block Q_i of Br = 128 rows (README, Algorithm 1):
//   line 1   producer: TMA Q_i (once); then K_j, V_j into buffer j % 2 once the consumers have freed it
//   line 2   m_i = -inf, l_i = 0, O~_i = 0                        (registers of the consumer that owns the rows)
//   line 3   for each K/V block j (causal: only up to the last key the block's last row sees)
//   line 4     wait full_k[j % 2]
//   line 5     S_ij = scale Q_i K_j^T                               wgmma m64n128k16, A and B from shared memory
//   line 6     m_new = max(m_i, rowmax S_ij), P_ij = exp(S_ij - m_new)  (masked entries are -inf -> P = 0)
//   line 7     l_i = exp(m_i - m_new) l_i + rowsum P_ij
//   line 8     wait full_v[j % 2]; O~_i = exp(m_i - m_new) O~_i + P_ij V_j   wgmma m64n{d}k16, A = P in registers
//              then arrive on empty[j % 2]
//   line 9   O_i = O~_i / l_i, L_i = m_i + log l_i                  (l_i = 0: O = 0, L = -inf)
// Thread mapping: 384 threads = consumer warpgroups 0 and 1 (warps 0-7; warpgroup w owns rows 64 w .. 64 w + 63,
// warp k of it rows 16 k .. 16 k + 15 with lane (g, t) holding rows g and g + 8 as in mma.sync's C fragment) and
// the producer warpgroup 2 (one lane issues every copy). __launch_bounds__(384, 1) gives every thread 168
// registers (65536 / 384, rounded down to a multiple of 8); the producer gives most of its share back
// (setmaxnreg) so that each consumer thread can hold O~ (d / 2 floats), S (64 floats) and P (32 registers)
// without spilling.
// Shared memory: Q_i Br x d, and 2 buffers each of K_j and V_j, Bc x d, 16-bit, as 64-column panels (tma_host.cuh):
// (128 + 4 x 128) x d x 2 B = 80 KiB (d = 64), 160 KiB (d = 128), plus 7 mbarriers and 1 KiB of alignment slack.
#include "launch.cuh"
#include "tc.cuh"
#include "steps.hpp"
#include "hopper/tma_host.cuh"
#include "hopper/wgmma.cuh"

namespace wsq {
namespace {

using namespace sm90;

constexpr int Br = 128, Bc = 128;        // Bc = 128: S of one warpgroup is one m64n128 wgmma per k16 step
constexpr int kConsumers = 2;            // consumer warpgroups
constexpr int kRowsPerConsumer = Br / kConsumers;
constexpr int kConsumerThreads = 128 * kConsumers;
constexpr int kThreads = kConsumerThreads + 128;  // + the producer warpgroup (warpgroup 2)
// Registers per thread after the split (setmaxnreg): the producer needs few, the consumers hold S and O~. The
// block starts with 384 x 168 = 64,512 registers and keeps that total: 128 x 40 + 256 x 232 = 64,512.
constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;  // what __launch_bounds__(kThreads, 1) gives each thread
constexpr int kProducerRegs = 40, kConsumerRegs = 232;
static_assert(128 * kProducerRegs + kConsumerThreads * kConsumerRegs <= kThreads * kLaunchRegs,
              "setmaxnreg only moves registers the block already holds: more would make the consumers wait forever");
constexpr int kStages = 2;               // K/V buffers: the tile being computed and the one being loaded
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;
static_assert(kRowsPerConsumer == 64, "a wgmma has M = 64: one consumer warpgroup per 64 rows");

// Shared memory, in order: Q panels, K buffers, V buffers (each a multiple of 1024 bytes: every panel starts on a
// swizzle-atom boundary), then the mbarriers.
template <int D>
struct Layout {
  static constexpr int kPanels = D / kPanelCols;
  static constexpr uint32_t q_bytes = Br * D * 2, kv_tile_bytes = Bc * D * 2;
  static constexpr size_t bytes = q_bytes + 2 * kStages * kv_tile_bytes + (1 + 3 * kStages) * sizeof(uint64_t);
  static constexpr size_t alloc = bytes + kAtomBytes;  // slack to round the dynamic base up to 1024 bytes
};

template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1)
    kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
           const __grid_constant__ CUtensorMap tm_v, fa::Problem p, T* __restrict__ o, float* __restrict__ lse) {
  using L = Layout<D>;
  constexpr int kStepsQK = D / 16;    // k-steps of S = Q K^T
  constexpr int kTilesS = Bc / 8;     // n-tiles (8 keys) of S: S holds 4 kTilesS floats per thread
  constexpr int kStepsPV = Bc / 16;   // k-steps of O += P V
  constexpr int kTilesO = D / 8;      // n-tiles (8 columns) of O~

  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(smem_raw) + kAtomBytes - 1) / kAtomBytes * kAtomBytes);
  T* Qs = reinterpret_cast<T*>(smem);
  T* Ks = Qs + Br * D;                  // kStages buffers of Bc x D
  T* Vs = Ks + kStages * Bc * D;        // kStages buffers of Bc x D
  uint64_t* full_q = reinterpret_cast<uint64_t*>(Vs + kStages * Bc * D);
  uint64_t* full_k = full_q + 1;        // [kStages]
  uint64_t* full_v = full_k + kStages;  // [kStages]
  uint64_t* empty = full_v + kStages;   // [kStages]

  const int i0 = blockIdx.x * Br, h = blockIdx.y, b = blockIdx.z;
  const int kv_end = p.visible_keys(min(i0 + Br, p.q_len) - 1);  // causal: blocks past the diagonal skipped
  const int n_tiles = (kv_end + Bc - 1) / Bc;
  // The warpgroup index read through a shuffle: ptxas then knows it is the same in every lane, so the consumer
  // branch is not "divergent" (wgmma in a path ptxas thinks divergent gets serialised, warning C7520).
  const int wg = __shfl_sync(0xffffffffu, int(threadIdx.x) / 128, 0);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  if (threadIdx.x == 0) {
    mbar_init(full_q, 1);
    for (int s = 0; s < kStages; ++s) {
      mbar_init(&full_k[s], 1), mbar_init(&full_v[s], 1);  // the producer's arrive + the copy's bytes
      mbar_init(&empty[s], kConsumerThreads);              // every consumer thread arrives once per use
    }
    fence_barrier_init();
  }
  __syncthreads();  // the only block-wide barrier: afterwards producer and consumers meet only at mbarriers

  if (wg == kConsumers) {  // the producer warpgroup
    setmaxnreg_dec<kProducerRegs>();
    if (warp % 4 != 0 || lane != 0) return;
    // line 1: Q_i once. Panel c holds columns 64c .. 64c + 63 of every row.
    mbar_arrive_expect_tx(full_q, L::q_bytes);
    for (int c = 0; c < L::kPanels; ++c)
      tma_load_3d(Qs + c * Br * kPanelCols, &tm_q, full_q, c * kPanelCols, i0, b * p.heads + h);
    const int plane = b * p.kv_heads + p.kv_head_of(h);
    for (int tile = 0; tile < n_tiles; ++tile) {
      const int s = tile % kStages, round = tile / kStages;
      mbar_wait(&empty[s], (round & 1) ^ 1);  // round r reuses buffer s after the consumers' release r - 1
      mbar_arrive_expect_tx(&full_k[s], L::kv_tile_bytes);
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_3d(Ks + (s * L::kPanels + c) * Bc * kPanelCols, &tm_k, &full_k[s], c * kPanelCols, tile * Bc, plane);
      mbar_arrive_expect_tx(&full_v[s], L::kv_tile_bytes);
      for (int c = 0; c < L::kPanels; ++c)
        tma_load_3d(Vs + (s * L::kPanels + c) * Bc * kPanelCols, &tm_v, &full_v[s], c * kPanelCols, tile * Bc, plane);
    }
    return;
  }

  // Consumers. Warpgroup wg owns rows 64 wg .. 64 wg + 63; this thread rows r0 and r0 + 8 of the block.
  setmaxnreg_inc<kConsumerRegs>();
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  const int r0 = kRowsPerConsumer * wg + 16 * (warp % 4) + g;
  const T* Qs_wg = Qs + kRowsPerConsumer * wg * kPanelCols;  // its 64 rows within each Q panel (8 atoms)

  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // line 2
  float acc[D / 2] = {}, s_acc[Bc / 2] = {};                // O~ (m64nD C fragment) and S (m64n128)
  const float scale_log2 = p.softmax_scale() * kLog2e;     // S in base-2 units
  // A masked score is written before the scale is applied, as the value the scale turns into -inf: -inf for a
  // positive scale, +inf for a negative one (a plain -inf would become +inf, and the row NaN).
  const float masked = scale_log2 < 0.f ? INFINITY : -INFINITY;
  mbar_wait(full_q, 0);

  for (int tile = 0; tile < n_tiles; ++tile) {  // line 3
    const int s = tile % kStages, parity = (tile / kStages) & 1, j0 = tile * Bc;
    const T* Ks_j = Ks + s * L::kPanels * Bc * kPanelCols;
    const T* Vs_j = Vs + s * L::kPanels * Bc * kPanelCols;

    mbar_wait(&full_k[s], parity);  // line 4
    wgmma_fence();                  // line 5: k16 step kk reads columns 16 kk .. 16 kk + 15 of Q and K_j
    #pragma unroll
    for (int kk = 0; kk < kStepsQK; ++kk) {
      const auto* q_at = reinterpret_cast<const unsigned char*>(Qs_wg) + k_major_step(kk, Br);  // sm90_layout.hpp
      const auto* k_at = reinterpret_cast<const unsigned char*>(Ks_j) + k_major_step(kk, Bc);
      wgmma_ss_n128<T>(s_acc, desc_k_major(q_at), desc_k_major(k_at), kk > 0);
    }
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(s_acc);

    // S's C fragment: n-tile n, element e -> row r0 + 8 (e / 2), key j0 + 8 n + 2 t + e % 2. Only a tile that
    // crosses the causal diagonal or the end of the keys needs the per-element test, and the test sits behind one
    // branch per tile: written into each element's expression (keep = !need_mask || visible), it compiled to a
    // test and a branch per element in every tile of a causal problem, half again the softmax's instructions.
    const bool need_mask = j0 + Bc > p.kv_len || (p.causal && j0 + Bc - 1 > i0 + p.causal_shift());
    if (need_mask) {
      #pragma unroll
      for (int n = 0; n < kTilesS; ++n)
        #pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!p.visible(i0 + r0 + 8 * (e / 2), j0 + 8 * n + 2 * t + e % 2)) s_acc[4 * n + e] = masked;
    }
    #pragma unroll
    for (int x = 0; x < Bc / 2; ++x) s_acc[x] *= scale_log2;

    #pragma unroll
    for (int r = 0; r < 2; ++r) {  // lines 6-7, row r0 + 8r; the 4 lanes of a group share the row
      float mx = m[r];
      #pragma unroll
      for (int n = 0; n < kTilesS; ++n) mx = fmaxf(mx, fmaxf(s_acc[4 * n + 2 * r], s_acc[4 * n + 2 * r + 1]));
      const float m_new = quad_max(mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: exp(-inf - 0) = 0
      const float alpha = exp2f(m[r] - m_use);
      float sum = 0.f;
      #pragma unroll
      for (int n = 0; n < kTilesS; ++n)
        #pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) sum += (s_acc[4 * n + e] = exp2f(s_acc[4 * n + e] - m_use));
      l[r] = alpha * l[r] + sum;  // this lane's share of the row sum; the 4 shares are added at the end
      m[r] = m_new;
      #pragma unroll
      for (int n = 0; n < kTilesO; ++n) acc[4 * n + 2 * r] *= alpha, acc[4 * n + 2 * r + 1] *= alpha;
    }

    // line 8: P's A fragment for keys 16 kk .. 16 kk + 15 = S's n-tiles 2 kk and 2 kk + 1 (as in step 5). All of P
    // is packed before the first wgmma: a register written between two wgmma would make ptxas wait for the first.
    uint32_t pf[kStepsPV][4];
    #pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)
      #pragma unroll
      for (int x = 0; x < 4; ++x) pf[kk][x] = pack2<T>(s_acc[8 * kk + 2 * x], s_acc[8 * kk + 2 * x + 1]);
    mbar_wait(&full_v[s], parity);
    wgmma_fence();  // the registers of P and the rescaled O~ were written by ordinary instructions
    #pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk)  // B = V_j rows 16 kk .. 16 kk + 15 (two 8-row atoms), all d columns
      wgmma_rs<T, D>(acc, pf[kk],
                     desc_mn_major(reinterpret_cast<const unsigned char*>(Vs_j) + mn_major_step(kk), panel_bytes(Bc)));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(acc);
    mbar_arrive(&empty[s]);  // this thread is done with K_j and V_j in buffer s
  }

  #pragma unroll
  for (int r = 0; r < 2; ++r) {  // line 9
    const float l_row = quad_sum(l[r]);
    const float inv_l = l_row > 0.f ? 1.f / l_row : 0.f;
    const int i = i0 + r0 + 8 * r;
    if (i >= p.q_len) continue;
    T* O = o + p.q_offset(b, h) + size_t(i) * D;
    #pragma unroll
    for (int n = 0; n < kTilesO; ++n)
      *reinterpret_cast<uint32_t*>(O + 8 * n + 2 * t) = pack2<T>(acc[4 * n + 2 * r] * inv_l, acc[4 * n + 2 * r + 1] * inv_l);
    if (t == 0) lse[p.lse_offset(b, h) + i] = l_row > 0.f ? (m[r] + log2f(l_row)) * kLn2 : -INFINITY;
  }
}

template <class T, int D>
void run(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  using Tc = typename fa::CudaType<T>::type;
  const CUtensorMap tm_q = tensor_map(q, D, p.q_len, p.batch * p.heads, Br);
  const CUtensorMap tm_k = tensor_map(k, D, p.kv_len, p.batch * p.kv_heads, Bc);
  const CUtensorMap tm_v = tensor_map(v, D, p.kv_len, p.batch * p.kv_heads, Bc);
  const dim3 grid((p.q_len + Br - 1) / Br, p.heads, p.batch);
  launch_tma<Tc>(kernel<Tc, D>, grid, kThreads, Layout<D>::alloc, tm_q, tm_k, tm_v, p, fa::cuda_ptr(o), lse);
}

}  // namespace

template <class T>
void forward_v9_wgmma_tma(const fa::Problem& p, const T* q, const T* k, const T* v, T* o, float* lse) {
  if (p.head_dim == 64) run<T, 64>(p, q, k, v, o, lse);
  else run<T, 128>(p, q, k, v, o, lse);
}
WSQ_INSTANTIATE(forward_v9_wgmma_tma)

}  // namespace wsq
