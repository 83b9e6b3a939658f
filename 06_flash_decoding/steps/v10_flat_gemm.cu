// Step 10, flat_gemm (README §5): split_kv_mma with FlashDecoding++'s flat GEMM. The idea over step 6: pad the
// block's rows to 8, not 16, by swapping the operands. Step 6 puts the rows on the M = 16 side of mma.m16n8k16, so 1
// to 8 rows fill at most half a tile. Here the keys are the M side and the rows the N = 8 side: S^T = K_j Q_i^T (A =
// 16 keys of K_j from shared memory, B = Q_i^T in registers) and O~^T += V_j^T P^T (A = V_j^T by ldmatrix .trans, B =
// P^T). P^T is S^T's C fragment transposed in registers by movmatrix; the softmax runs down the columns of S^T.
// Everything else is step 6's: the splits, the warps' chunks, the two stages, the copies, lines 10-13, the merge.
// Grid (splits, row chunks, B x Hkv), 128 threads = 4 warps; every unit is cut into 8-row chunks (row bucket 8).
// Shared memory (Smem<D, 8, 2, true>): the two K/V stages and the merge weights, Q and P being registers: 139,456
// bytes at d = 128 (73,920 at d = 64), one block per SM.
// Per warp and 32-key chunk (K_j and V_j: 4 d bytes a key, 128 d a chunk, 16 KB at d = 128, the same in both):
//   split_kv_mma, rows padded to 16: S = Q K_j^T d/4 mma + d/8 ldmatrix.x4, P V_j d/4 mma + d/8 ldmatrix.x4.trans:
//     d/2 mma (64 at d = 128; d/64 a key): one per 256 bytes, 16 tensor-core FLOP a byte; a lane holds 16 scores (16
//     exponentials) and d/2 floats of O~; a row's max and sum take 2 shuffles;
//   flat_gemm, rows padded to 8: S^T d/8 mma + d/8 ldmatrix.x4, O~^T d/8 mma + d/8 ldmatrix.x4.trans, 4 movmatrix:
//     d/4 mma (32 at d = 128; d/128 a key): one per 512 bytes, 8 FLOP a byte; 8 scores (8 exponentials) and d/4
//     floats of O~ a lane; 3 shuffles.
// The ldmatrix count is the bytes' (every byte of K_j, V_j reaches a tensor core once), the mma count the padding's.
// So flat_gemm wins with 1 to 8 rows (GQA up to 8, or MHA/MQA at q_len up to 8): half the mma and the softmax work
// for the same bytes. With 9 to 16 rows split_kv_mma wins: flat_gemm needs two row chunks, two blocks that each read
// K_j, V_j, and decoding is a read of K and V (in general ceil(rows / 8) reads against ceil(rows / 16)).
// README Listing 1' transposed (lines 1' and 5'-9'), Listing 1's lines 2-4 and 10-13, Listing 2 in the last block.
// mma.sync, ldmatrix, movmatrix and the fragment maps are common/'s ptx.cuh (fa::tc) and frag.hpp (fa::frag).
#include "kv_copy.cuh"
#include "launch.cuh"
#include "merge.cuh"
#include "ptx.cuh"
#include "steps.hpp"

namespace fdec::v10_flat_gemm {
namespace {

constexpr bool kPacked = true;  // the query heads of a kv group share a block

// The 8 lanes with the same t = lane % 4 hold the same columns (query rows) of a C fragment: reduce over g = lane / 4.
__device__ __forceinline__ float column_max(float x) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float column_sum(float x) {
#pragma unroll
  for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Listing 1' transposed, for the block's rows padded to 8 (rows >= nrows: Q = 0 and masked). The copies (line 4), the
// warps' chunks, the stages and lines 10-13 are step 6's; what changes is which side of the mma holds the rows. With
// g = lane / 4 and t = lane % 4 (frag.hpp):
//   Q     B fragments of Q_i^T (d x 8, the dtype, unscaled), loaded from global memory once: lane holds row g,
//         columns 2t, 2t + 1, 2t + 8, 2t + 9 of every 16-column k-step (d / 16 x 2 registers);
//   S^T   C fragments of S^T = K_j Q_i^T (32 keys x 8 rows, fp32, two 16-key m-tiles): keys 16 mt + g and
//         16 mt + g + 8, rows 2t and 2t + 1; the 8 lanes of a column t share the rows, so a row's max is a local
//         max and 3 shuffles (xor 4, 8, 16);
//   P^T   B fragments of P^T (16 keys x 8 rows per k-step): lane holds row g, keys 2t, 2t + 1 (+ 8). Each 8 x 8 half
//         of S^T's C fragment (c0 c1: keys g, c2 c3: keys g + 8), rounded to the dtype, is in movmatrix's layout
//         (lane L: row L / 4, columns 2 (L % 4), + 1); its transpose is P^T's register for those 8 keys;
//   O~^T  C fragments of O~^T (d x 8, fp32, d / 16 m-tiles): columns 16 mt + g and 16 mt + g + 8 of O~, rows 2t
//         and 2t + 1 (d / 4 floats).
// K_j sits in shared memory as [key][d], which is the A operand (m = key, k = d) stored row by row: ldmatrix without
// .trans, a_tile's addresses. V_j^T as A (m = d, k = key) is V_j [key][d] read transposed: ldmatrix .trans, with the
// addresses that give step 6 the B fragments of a [n][k] tile (nk_tile: matrices keys 0-7 | d 0-7, keys 0-7 | d 8-15,
// keys 8-15 | d 0-7, keys 8-15 | d 8-15, which .trans turns into A's four 8x8 quarters). Each 8-row ldmatrix phase
// reads 8 rows at one column: the rows' 16-byte padding makes them 8 distinct groups of 4 banks.
// Per warp and chunk at d = 128: 16 + 16 mma.sync, 16 + 16 ldmatrix.x4 and 4 movmatrix.
template <class T, int D>
__device__ __forceinline__ void attend_flat(const Args<T>& a, int b, int u, int hk, int r0, int nrows, KeyRange keys,
                                            const fa::Problem& pb, char* smem) {
  namespace frag = fa::frag;
  constexpr int R = kFlatRows;
  using L = Smem<D, R, 2, true>;
  constexpr int kStepsQK = D / 16;             // k-steps of S^T = K_j Q_i^T
  constexpr int kTilesS = kKeysPerWarp / 16;   // m-tiles of S^T (16 keys each), also the k-steps of V_j^T P^T
  constexpr int kTilesO = D / 16;              // m-tiles of O~^T (16 columns of O~ each)
  constexpr int kStride = kWarps * kKeysPerWarp;
  constexpr int kAhead = 2;                    // K, V of the chunk copied ahead (step 4)
  static_assert(R == 8, "the N of one mma.m16n8k16 tile of rows");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  auto Ks_of = [&](int stage) { return reinterpret_cast<T*>(smem + stage * L::kStage + warp * L::kKVWarp); };

  // line 1': Q's fragments for row g (a padding row: zeros), and, for the two rows 2t + j of this lane's S^T columns,
  // the end of the keys the row sees in this split (line 6: a row sees a prefix of the keys; a padding row sees none)
  const T* q_row = g < nrows ? a.q + a.p.q_offset(b, a.rows.head(u, r0 + g)) + size_t(a.rows.query(r0 + g)) * D
                             : nullptr;
  int seen_end[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int r = 2 * t + j;
    seen_end[j] = r < nrows ? min(keys.end, pb.visible_keys(a.rows.query(r0 + r))) : keys.begin;
  }
  uint32_t qf[kStepsQK][2];
#pragma unroll
  for (int ks = 0; ks < kStepsQK; ++ks)
#pragma unroll
    for (int reg = 0; reg < 2; ++reg) {  // register reg holds elements 2 reg, 2 reg + 1: two columns (k) of row g
      const frag::RowCol rc = frag::b_elem(lane, 2 * reg);
      qf[ks][reg] = q_row ? *reinterpret_cast<const uint32_t*>(q_row + 16 * ks + rc.row) : 0u;
    }

  const float scale = a.p.softmax_scale();
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // line 3, rows 2t and 2t + 1
  float acc[kTilesO][4] = {};

  const int first = keys.begin + warp * kKeysPerWarp;
  int stage = 0;
  for (int c0 = first; c0 < keys.end; c0 += kStride) {
    T* Ks = Ks_of(stage);
    T* Vs = Ks + kKeysPerWarp * L::kLdKV;
    // line 4: step 5's (the next chunk into the other buffer)
    if (c0 + kStride < keys.end) {
      T* Kn = Ks_of(stage ^ 1);
      copy_chunk<T, D, ContiguousRows>(a, b, hk, c0 + kStride, keys.end, Kn, Kn + kKeysPerWarp * L::kLdKV);
    } else {
      cp_async_commit(), cp_async_commit();
    }
    cp_async_wait<kAhead + 1>();
    __syncwarp();

    // line 5': S^T = K_j Q_i^T, fp32 accumulation; one 16-key m-tile per ldmatrix.x4 and k-step
    float s[kTilesS][4] = {};
#pragma unroll
    for (int mt = 0; mt < kTilesS; ++mt)
#pragma unroll
      for (int ks = 0; ks < kStepsQK; ++ks) {
        uint32_t ka[4];
        const T* k_row = Ks + (16 * mt + frag::a_tile_row(lane)) * L::kLdKV + 16 * ks + frag::a_tile_col(lane);
        fa::tc::ldmatrix_x4(ka, k_row);
        fa::tc::mma_16816<T>(s[mt], ka, qf[ks]);
      }
    // line 6': scale, and mask what a row does not see: keys past the split, causal keys, everything for padding
#pragma unroll
    for (int mt = 0; mt < kTilesS; ++mt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = c0 + 16 * mt + frag::c_elem(lane, e).row;
        s[mt][e] = key < seen_end[e & 1] ? s[mt][e] * scale : -INFINITY;
      }
    // lines 7'-8': per row (a column of S^T), the running max over the 8 lanes of the column, P = e^(S - m_new), l
    // and O~ rescaled
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      float mx = m[j];
#pragma unroll
      for (int mt = 0; mt < kTilesS; ++mt) mx = fmaxf(mx, fmaxf(s[mt][j], s[mt][j + 2]));
      const float m_new = column_max(mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
      const float alpha = expf(m[j] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int mt = 0; mt < kTilesS; ++mt)
#pragma unroll
        for (int e = j; e < 4; e += 2) sum += (s[mt][e] = expf(s[mt][e] - m_use));
      l[j] = l[j] * alpha + sum;  // this lane's share of the row; the column's 8 shares are added after the loop
      m[j] = m_new;
#pragma unroll
      for (int mt = 0; mt < kTilesO; ++mt) acc[mt][j] *= alpha, acc[mt][j + 2] *= alpha;
    }
    cp_async_wait<kAhead>();
    __syncwarp();  // V_j has landed

    // line 9': O~^T += V_j^T P^T, P^T (rounded to the dtype) from S^T's C fragments by one transpose per 8 keys
#pragma unroll
    for (int kk = 0; kk < kTilesS; ++kk) {
      const uint32_t pf[2] = {fa::tc::movmatrix_trans(fa::tc::pack2<T>(s[kk][0], s[kk][1])),   // keys 16 kk + 0-7
                              fa::tc::movmatrix_trans(fa::tc::pack2<T>(s[kk][2], s[kk][3]))};  // keys 16 kk + 8-15
#pragma unroll
      for (int mt = 0; mt < kTilesO; ++mt) {
        uint32_t va[4];
        const T* v_row = Vs + (16 * kk + frag::nk_tile_row(lane)) * L::kLdKV + 16 * mt + frag::nk_tile_col(lane);
        fa::tc::ldmatrix_x4_trans(va, v_row);
        fa::tc::mma_16816<T>(acc[mt], va, pf);
      }
    }
    __syncwarp();  // every lane is done with K_j, V_j before the next chunk overwrites them
    stage ^= 1;
  }

  // line 10: the warp's (m, l, m, O~) -> scratch, in every step's layout (the row's largest score is m itself)
#pragma unroll
  for (int j = 0; j < 2; ++j) l[j] = column_sum(l[j]);
  __syncthreads();
  float* scratch = reinterpret_cast<float*>(smem) + warp * R * (D + 3);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float* row = scratch + (2 * t + j) * (D + 3);
    if (g == 0) row[D] = m[j], row[D + 1] = l[j], row[D + 2] = m[j];
#pragma unroll
    for (int mt = 0; mt < kTilesO; ++mt)
#pragma unroll
      for (int e = j; e < 4; e += 2) row[16 * mt + frag::c_elem(lane, e).row] = acc[mt][e];
  }
  __syncthreads();
}

// Lines 11-13 for the block's rows, once attend_flat has left every warp's (m, l, O~) in the scratch: the warps merged,
// then the partial s of `splits` written (O_s, LSE_s), or with one split O and LSE themselves; then the block that
// brings the rows' arrival counter `done` to `splits` merges them (Listing 2). fin: the block's M, L and warp
// weights (Smem's kFin).
template <class T, int D, int R>
__device__ __forceinline__ void finish(const Args<T>& a, const char* smem, float* fin, int b, int u, int r0, int nrows,
                                       int s, int splits, int* done) {
  // line 11: merge the warps: M = max m_w, L = sum l_w e^(m_w - M), O~ = sum O~_w e^(m_w - M)
  const float* scratch = reinterpret_cast<const float*>(smem);
  if (threadIdx.x < R) {
    const int r = threadIdx.x;
    float M = -INFINITY, Lsum = 0.f;
    for (int w = 0; w < kWarps; ++w) M = fmaxf(M, scratch[(w * R + r) * (D + 3) + D]);
    for (int w = 0; w < kWarps; ++w) {
      const float mw = scratch[(w * R + r) * (D + 3) + D];
      const float wt = mw == -INFINITY ? 0.f : expf(mw - M);
      fin[2 * R + w * R + r] = wt;
      Lsum += wt * scratch[(w * R + r) * (D + 3) + D + 1];
    }
    fin[r] = M, fin[R + r] = Lsum;
  }
  __syncthreads();

  // line 12: the partial (O_s, LSE_s), or with one split O and LSE themselves
  const bool direct = splits == 1;
  for (int e = threadIdx.x; e < nrows * D; e += kThreads) {
    const int r = e / D, c = e % D;
    float o = 0.f;
    for (int w = 0; w < kWarps; ++w) o += fin[2 * R + w * R + r] * scratch[(w * R + r) * (D + 3) + c];
    const float Lsum = fin[R + r];
    o = Lsum > 0.f ? o / Lsum : 0.f;
    const size_t g = a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r);  // the query row
    if (direct) a.o[g * D + c] = T(o);
    else a.ws_o[(size_t(s) * a.q_rows + g) * D + c] = o;
  }
  if (threadIdx.x < nrows) {
    const int r = threadIdx.x;
    const float Lsum = fin[R + r];
    const float lse = Lsum > 0.f ? fin[r] + logf(Lsum) : -INFINITY;
    const size_t g = a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r);
    if (direct) a.lse[g] = lse;
    else a.ws_lse[size_t(s) * a.q_rows + g] = lse;
  }

  // line 13: publish the partial, count it; the block that brings the count to `splits` merges. The count is one
  // acquire-release atomic (README §4.2): the barrier orders every thread's workspace stores before thread 0's
  // atomic, whose release makes them visible device-wide with the count (release is cumulative); its acquire, passed
  // on by the second barrier, orders the last block's reads after every other block's published partial.
  if (direct) return;
  static __shared__ int last;  // one for the block (static: as every __shared__ variable is)
  __syncthreads();
  if (threadIdx.x == 0) {
    last = atomic_add_acq_rel(done, 1) == splits - 1;
    if (last) *done = 0;  // every other block of these rows has counted: ready for the next launch
  }
  __syncthreads();
  if (!last) return;
  for (int r = threadIdx.x / 32; r < nrows; r += kWarps)
    merge_row<T, D>(a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r), a.q_rows, splits, a.ws_o,
                    a.ws_lse, a.o, a.lse);
}

// The pipeline's prologue: each warp's first chunk of `keys` -> stage 0, in flight while its warp loads Q (line 1').
template <class T, int D>
__device__ __forceinline__ void copy_first_chunks(const Args<T>& a, int b, int hk, KeyRange keys, char* smem) {
  using L = Smem<D, kFlatRows, 2, true>;
  const int first = keys.begin + (threadIdx.x / 32) * kKeysPerWarp;
  T* Ks = reinterpret_cast<T*>(smem + (threadIdx.x / 32) * L::kKVWarp);
  if (first < keys.end) copy_chunk<T, D, ContiguousRows>(a, b, hk, first, keys.end, Ks, Ks + kKeysPerWarp * L::kLdKV);
}

// One block = (split s, 8-row chunk, batch entry b x kv head u); Smem<D, 8, 2, true>::kBytes of dynamic shared memory.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) split_kernel(Args<T> a) {
  constexpr int R = kFlatRows;  // one mma tile's N of rows, whatever the unit has (padding rows: Q = 0, masked)
  using L = Smem<D, R, 2, true>;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int units = gridDim.z / a.p.batch;
  const int s = blockIdx.x, b = blockIdx.z / units, u = blockIdx.z % units;
  const int r0 = blockIdx.y * R, nrows = min(R, a.rows.per_unit() - r0);
  const int hk = a.p.kv_head_of(a.rows.head(u, r0));  // every row of a unit shares one kv head
  const int n_b = a.kv_lens[b];
  const fa::Problem pb = seen_by(a.p, n_b);
  const KeyRange keys = split_range(n_b, a.splits, s);  // line 2

  copy_first_chunks<T, D>(a, b, hk, keys, smem);

  // lines 1' and 3-10: each warp loads Q's fragments into registers itself
  attend_flat<T, D>(a, b, u, hk, r0, nrows, keys, pb, smem);

  float* fin = reinterpret_cast<float*>(smem + L::kKV + L::kQ + L::kP);  // [R] M, [R] L, [kWarps][R] weights
  finish<T, D, R>(a, smem, fin, b, u, r0, nrows, s, a.splits, a.done + size_t(blockIdx.z) * gridDim.y + blockIdx.y);
}

void forward(const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o, float* lse,
             const Launch& launch, float phi, float* workspace, int* fallbacks) {
  with_dtype_dim(t, p.head_dim, [&](auto tag, auto dim) {  // launch.row_bucket is 8: one mma tile's N
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, kBytes = Smem<D, kFlatRows, 2, true>::kBytes;
    Args<T> a = make_args<T>(p, kPacked, q, cache, o, lse, launch, phi, workspace, fallbacks);
    const dim3 grid = split_grid(p, kPacked, launch);
    // the arrival counters, one per (row chunk, batch entry x unit); with one split there is nothing to merge
    a.done = launch.splits > 1 ? merge_counters(size_t(grid.y) * grid.z) : nullptr;
    launch_kernel(ready<split_kernel<T, D>, kBytes>(), grid, kBytes, a);
  });
}

// The row bucket is always 8 here (plan.hpp's row_bucket(rows, true, true)).
int smem_bytes(int head_dim, int) { return split_smem_bytes(head_dim, kFlatRows, 2, true); }

int blocks_per_sm(fa::Dtype t, int head_dim, int) {
  int n = 0;
  with_dtype_dim(t, head_dim, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    n = occupancy<split_kernel<T, D>, Smem<D, kFlatRows, 2, true>::kBytes>();
  });
  return n;
}

}  // namespace

// The step's row of the registry (flash_decoding.cu): the properties it turns on, each with the step that brought
// it in (the others keep Kernel's defaults: off, one stage), and its host functions.
Kernel kernel() {
  Kernel k;
  k.packed = kPacked;    // step 3: a kv group's query heads in one block
  k.splits = true;       // step 2: the keys split across blocks, merged by LSE
  k.stages = 2;          // step 4: two K/V buffers per warp, the next chunk copied during this one
  k.fused_merge = true;  // step 5: the last block of a row chunk merges, no merge kernel
  k.mma = true;          // step 6: S and P V on tensor cores
  k.flat = true;         // this step: the keys on the mma's M side, the rows padded to its N = 8
  k.forward = forward;
  k.smem_bytes = smem_bytes;
  k.blocks_per_sm = blocks_per_sm;
  return k;
}

}  // namespace fdec::v10_flat_gemm
