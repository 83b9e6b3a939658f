// Step 7, split_kv_even (README §4.5): split_kv_mma's work dealt by plan.hpp's even decomposition instead of the
// (split, row chunk, unit) grid. The idea over step 6: every SM busy. Number the 32-key chunks of every tile (one
// block of the unsplit grid: batch entry, kv group, row chunk) end to end, T in all; block k of C takes chunks
// [k T / C, (k + 1) T / C), so the shares differ by at most one chunk whatever the lengths. A share that crosses a
// tile's end goes on into the next tile: each (block, tile) overlap is a piece, and a tile's pieces are merged like
// splits (one piece writes O and LSE directly, otherwise the last to arrive merges, step 5's counter per tile).
// Grid: C blocks (one per SM unless --splits says otherwise), 128 threads = 4 warps; fewer chunks than blocks
// (T < C): blocks T .. C - 1 have nothing to do. Each piece is step 6's block body for one tile and a key range.
// Shared memory: step 6's (Smem<D, 16, 2, true>): 139,648 bytes at d = 128 (74,112 at d = 64), one block per SM.
// README Listing 1' with Listing 1's lines 2-4 and 10-13 per piece, Listing 2 in a tile's last piece.
// mma.sync, ldmatrix and the fragment maps are common/'s ptx.cuh (fa::tc) and frag.hpp (fa::frag), as in chapter 05.
#include "kv_copy.cuh"
#include "launch.cuh"
#include "merge.cuh"
#include "ptx.cuh"
#include "steps.hpp"

namespace fdec::v07_split_kv_even {
namespace {

constexpr bool kPacked = true;  // the query heads of a kv group share a block

// Listing 1 with lines 5-9 on tensor cores (README §4.3, Listing 1'), for the block's rows padded to one 16-row
// tile (rows >= nrows: Q = 0 and masked): step 6's, for one piece. The copies (line 4), the warps' chunks, the
// stages and lines 10-13 are step 5's; what changes is who holds what. With g = lane / 4 and t = lane % 4 (frag.hpp):
//   Q     A fragments of Q_i (16 x d, the dtype, unscaled), loaded from global memory once: lane holds rows g and
//         g + 8, columns 2t, 2t + 1, 2t + 8, 2t + 9 of every 16-column k-step (d / 16 x 4 registers);
//   S     C fragments of S = Q K_j^T (16 x 32 keys, fp32): rows g and g + 8, keys 8n + 2t and 8n + 2t + 1 of n-tile n;
//         the 4 lanes of a quad share the rows, so a row's max is a local max and 2 shuffles;
//   P     the same registers, rounded to the dtype: the A fragments of P V_j (chapter 05's step 5);
//   O~    C fragments of O~ (16 x d, fp32): rows g and g + 8, columns 8n + 2t and 8n + 2t + 1 (d / 2 floats).
// K_j sits in shared memory as [key][d], which is the B operand (k = d, n = key) stored column by column: ldmatrix
// without .trans. V_j as [key][d] is B (k = key, n = d) stored row by row: ldmatrix .trans. The rows' 16-byte padding
// that keeps the CUDA-core reads conflict-free also gives each 8-row ldmatrix phase 8 distinct groups of 4 banks.
// Per warp and chunk at d = 128: 32 + 32 mma.sync and 16 + 16 ldmatrix.x4 (README §4.3 counts the rest).
template <class T, int D>
__device__ __forceinline__ void attend_mma(const Args<T>& a, int b, int u, int hk, int r0, int nrows, KeyRange keys,
                                           const fa::Problem& pb, char* smem) {
  namespace frag = fa::frag;
  constexpr int R = kMaxRows;
  using L = Smem<D, R, 2, true>;
  constexpr int kStepsQK = D / 16;             // k-steps of S = Q K_j^T
  constexpr int kTilesS = kKeysPerWarp / 8;    // n-tiles of S (8 keys each)
  constexpr int kStepsPV = kKeysPerWarp / 16;  // k-steps of P V_j (16 keys each)
  constexpr int kTilesO = D / 8;               // n-tiles of O~ (8 columns each)
  constexpr int kStride = kWarps * kKeysPerWarp;
  constexpr int kAhead = 2;                    // K, V of the chunk copied ahead (step 4)
  static_assert(R == 16, "one mma.m16n8k16 tile of rows");
  static_assert(kTilesS % 2 == 0 && kTilesO % 2 == 0, "ldmatrix.x4 loads the B fragments of two n-tiles");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = frag::group(lane), t = frag::thread_in_group(lane);
  auto Ks_of = [&](int stage) { return reinterpret_cast<T*>(smem + stage * L::kStage + warp * L::kKVWarp); };

  // line 1', for the two rows of this lane (row g + 8h of the tile): Q's fragments (a padding row: zeros), and the end
  // of the keys the row sees in this split (line 6: a row sees a prefix of the keys; a padding row sees none)
  const T* q_row[2];
  int seen_end[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = g + 8 * h;
    q_row[h] = r < nrows ? a.q + a.p.q_offset(b, a.rows.head(u, r0 + r)) + size_t(a.rows.query(r0 + r)) * D : nullptr;
    seen_end[h] = r < nrows ? min(keys.end, pb.visible_keys(a.rows.query(r0 + r))) : keys.begin;
  }
  uint32_t qf[kStepsQK][4];
#pragma unroll
  for (int ks = 0; ks < kStepsQK; ++ks)
#pragma unroll
    for (int reg = 0; reg < 4; ++reg) {  // register reg holds elements 2 reg, 2 reg + 1: one row, two columns
      const frag::RowCol rc = frag::a_elem(lane, 2 * reg);
      const T* row = q_row[rc.row >= 8];
      qf[ks][reg] = row ? *reinterpret_cast<const uint32_t*>(row + 16 * ks + rc.col) : 0u;
    }

  const float scale = a.p.softmax_scale();
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // line 3, rows g and g + 8 of the tile
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

    // line 5': S = Q K_j^T, fp32 accumulation; two n-tiles (16 keys) per ldmatrix.x4
    float s[kTilesS][4] = {};
#pragma unroll
    for (int np = 0; np < kTilesS / 2; ++np)
#pragma unroll
      for (int ks = 0; ks < kStepsQK; ++ks) {
        uint32_t kb[4];
        const T* k_row = Ks + (16 * np + frag::nk_tile_row(lane)) * L::kLdKV + 16 * ks + frag::nk_tile_col(lane);
        fa::tc::ldmatrix_x4(kb, k_row);
        fa::tc::mma_16816<T>(s[2 * np], qf[ks], kb);
        fa::tc::mma_16816<T>(s[2 * np + 1], qf[ks], kb + 2);
      }
    // line 6': scale, and mask what a row does not see: keys past the split, causal keys, everything for padding
#pragma unroll
    for (int n = 0; n < kTilesS; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = c0 + 8 * n + frag::c_elem(lane, e).col;
        s[n][e] = key < seen_end[e >> 1] ? s[n][e] * scale : -INFINITY;
      }
    // lines 7'-8': per row, the running max over the quad, P = e^(S - m_new), l and O~ rescaled
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = m[h];
#pragma unroll
      for (int n = 0; n < kTilesS; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      const float m_new = fa::tc::quad_max(mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
      const float alpha = expf(m[h] - m_use);
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < kTilesS; ++n)
#pragma unroll
        for (int e = 2 * h; e < 2 * h + 2; ++e) sum += (s[n][e] = expf(s[n][e] - m_use));
      l[h] = l[h] * alpha + sum;  // this lane's share of the row; the quad's 4 shares are added after the loop
      m[h] = m_new;
#pragma unroll
      for (int n = 0; n < kTilesO; ++n) acc[n][2 * h] *= alpha, acc[n][2 * h + 1] *= alpha;
    }
    cp_async_wait<kAhead>();
    __syncwarp();  // V_j has landed

    // line 9': O~ += P V_j, P (rounded to the dtype) straight from the C fragments of S to the A fragments of P
#pragma unroll
    for (int kk = 0; kk < kStepsPV; ++kk) {
      uint32_t pf[4];
#pragma unroll
      for (int reg = 0; reg < 4; ++reg) {
        const float* c = s[2 * kk + frag::p_from_s_ntile(reg)] + frag::p_from_s_celem(reg);
        pf[reg] = fa::tc::pack2<T>(c[0], c[1]);
      }
#pragma unroll
      for (int np = 0; np < kTilesO / 2; ++np) {
        uint32_t vb[4];
        const T* v_row = Vs + (16 * kk + frag::a_tile_row(lane)) * L::kLdKV + 16 * np + frag::a_tile_col(lane);
        fa::tc::ldmatrix_x4_trans(vb, v_row);
        fa::tc::mma_16816<T>(acc[2 * np], pf, vb);
        fa::tc::mma_16816<T>(acc[2 * np + 1], pf, vb + 2);
      }
    }
    __syncwarp();  // every lane is done with K_j, V_j before the next chunk overwrites them
    stage ^= 1;
  }

  // line 10: the warp's (m, l, m, O~) -> scratch, in every step's layout (the row's largest score is m itself)
#pragma unroll
  for (int h = 0; h < 2; ++h) l[h] = fa::tc::quad_sum(l[h]);
  __syncthreads();
  float* scratch = reinterpret_cast<float*>(smem) + warp * R * (D + 3);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float* row = scratch + (g + 8 * h) * (D + 3);
    if (t == 0) row[D] = m[h], row[D + 1] = l[h], row[D + 2] = m[h];
#pragma unroll
    for (int n = 0; n < kTilesO; ++n) {
      const frag::RowCol rc = frag::c_elem(lane, 2 * h);
      row[8 * n + rc.col] = acc[n][2 * h], row[8 * n + rc.col + 1] = acc[n][2 * h + 1];
    }
  }
  __syncthreads();
}

// Lines 11-13 for the block's rows, once attend_mma has left every warp's (m, l, O~) in the scratch: the warps merged,
// then the partial s of `splits` written (O_s, LSE_s), or with one split O and LSE themselves; then the block that
// brings the rows' arrival counter `done` to `splits` merges them (Listing 2). Here a split is a piece of a tile:
// s its index among the tile's pieces, `splits` their count (at most kMaxEvenBlocks). fin: the block's M, L and
// warp weights (Smem's kFin).
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
    merge_row<T, D, kMaxEvenBlocks>(a.p.lse_offset(b, a.rows.head(u, r0 + r)) + a.rows.query(r0 + r), a.q_rows,
                                    splits, a.ws_o, a.ws_lse, a.o, a.lse);
}

// The pipeline's prologue: each warp's first chunk of `keys` -> stage 0, in flight while its warp loads Q (line 1').
template <class T, int D>
__device__ __forceinline__ void copy_first_chunks(const Args<T>& a, int b, int hk, KeyRange keys, char* smem) {
  using L = Smem<D, kMaxRows, 2, true>;
  const int first = keys.begin + (threadIdx.x / 32) * kKeysPerWarp;
  T* Ks = reinterpret_cast<T*>(smem + (threadIdx.x / 32) * L::kKVWarp);
  if (first < keys.end) copy_chunk<T, D, ContiguousRows>(a, b, hk, first, keys.end, Ks, Ks + kKeysPerWarp * L::kLdKV);
}

// Block k walks its share of the chunks piece by piece; each piece is step 6's block body: the copies of its first
// chunks, attend_mma, and lines 11-13 with the piece as partial `part` of the tile's `parts`.
template <class T, int D>
__global__ void __launch_bounds__(kThreads, 1) even_kernel(Args<T> a, int row_chunks) {
  constexpr int R = kMaxRows;  // one mma tile of rows, whatever the unit has (padding rows: Q = 0, masked)
  using L = Smem<D, R, 2, true>;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  float* fin = reinterpret_cast<float*>(smem + L::kKV + L::kQ + L::kP);  // [R] M, [R] L, [kWarps][R] weights
  EvenWalk walk = even_walk(a.kv_lens, a.p.batch, a.p.kv_heads * row_chunks, gridDim.x);
  const int k = blockIdx.x;
  if (k >= walk.C) return;
  const long long x1 = even_begin(k + 1, walk.T, walk.C);
  for (long long x = even_begin(k, walk.T, walk.C); x < x1;) {
    const Piece pc = walk.piece(k, x, x1);
    x = pc.next;
    const int u = pc.tile / row_chunks, r0 = (pc.tile % row_chunks) * R, nrows = min(R, a.rows.per_unit() - r0);
    const int hk = a.p.kv_head_of(a.rows.head(u, r0));
    const fa::Problem pb = seen_by(a.p, a.kv_lens[pc.b]);
    __syncthreads();  // the previous piece's lines 11-12 are done with the scratch the copies below overwrite
    copy_first_chunks<T, D>(a, pc.b, hk, pc.keys, smem);
    attend_mma<T, D>(a, pc.b, u, hk, r0, nrows, pc.keys, pb, smem);
    finish<T, D, R>(a, smem, fin, pc.b, u, r0, nrows, pc.part, pc.parts,
                    a.done + size_t(pc.b) * walk.tiles_per_entry + pc.tile);
  }
}

void forward(const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o, float* lse,
             const Launch& launch, float phi, float* workspace, int* fallbacks) {
  with_dtype_dim(t, p.head_dim, [&](auto tag, auto dim) {  // launch.row_bucket is 16: one mma tile
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, kBytes = Smem<D, kMaxRows, 2, true>::kBytes;
    Args<T> a = make_args<T>(p, kPacked, q, cache, o, lse, launch, phi, workspace, fallbacks);
    // the arrival counters, one per tile (batch entry, kv group, row chunk); launch.splits counts the blocks
    a.done = merge_counters(size_t(p.batch) * p.kv_heads * launch.row_chunks);
    launch_kernel(ready<even_kernel<T, D>, kBytes>(), launch.splits, kBytes, a, launch.row_chunks);
  });
}

// The row bucket is always 16 here (plan.hpp's row_bucket(rows, true)).
int smem_bytes(int head_dim, int) { return split_smem_bytes(head_dim, kMaxRows, 2, true); }

int blocks_per_sm(fa::Dtype t, int head_dim, int) {
  int n = 0;
  with_dtype_dim(t, head_dim, [&](auto tag, auto dim) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value;
    n = occupancy<even_kernel<T, D>, Smem<D, kMaxRows, 2, true>::kBytes>();
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
  k.mma = true;          // step 6: S and P V on tensor cores, the rows padded to a 16-row tile
  k.even = true;         // this step: one block per SM, equal shares of all the chunks; splits = blocks
  k.forward = forward;
  k.smem_bytes = smem_bytes;
  k.blocks_per_sm = blocks_per_sm;
  return k;
}

}  // namespace fdec::v07_split_kv_even
