// Step 2, split_kv (README §2): Flash-Decoding. The keys of every row are cut into S splits (plan.hpp's split_range:
// whole 32-key chunks), one block per split; each runs the online softmax over its keys and writes a partial
// (O_s, LSE_s) to a workspace, and the merge kernel (merge.cu, Listing 2) combines the partials by their LSE.
// The idea over step 1: more blocks, by cutting the one long dimension of a decode step, so that every SM streams
// K/V. Still one query head per block (a unit = one query head, q_len rows), as in step 1.
// Grid (splits, row chunks, B x H), 128 threads = 4 warps; a unit of more than 16 rows is cut into row chunks.
// Warp w takes the split's 32-key chunks w, w + 4, ... (split-K inside the block: too few rows for split-Q).
// Per chunk a warp copies K_j and V_j to its own shared memory (copy_chunk), then
//   S:   lane j computes S_rj = q_r . k_j for every row r (its key row read from padded shared memory),
//   P:   the running max (warp max per row, O~ rescaled by alpha), P to shared memory,
//   PV:  lane c owns d/32 output columns and adds P_rj V_j[c] over the chunk.
// Shared memory (Smem<D, R, 1, false>): K, V chunks 4 x 2 x 32 x (d + 8) x 2 B (69.6 KB at d = 128, 36.9 KB at
// d = 64), the end-of-loop scratch reusing them; Q R x d x 4 B and P 4 x R x 32 x 4 B (8 KB each at 16 rows, d = 128).
// README Listing 1, lines 1-12; Listing 2 is the merge kernel (merge.cu) when there is more than one split.
#include "kv_copy.cuh"
#include "launch.cuh"
#include "merge.cuh"
#include "steps.hpp"

namespace fdec::v02_split_kv {
namespace {

constexpr bool kPacked = false;  // one query head per block

// Listing 1, lines 2-10, for the block's rows over its split's keys: each warp ends with (m, l, O~) of its
// chunks, which it writes to the scratch.
template <class T, int D, int R>
__device__ __forceinline__ void attend(const Args<T>& a, int b, int hk, int r0, int nrows, KeyRange keys,
                                       const fa::Problem& pb, char* smem) {
  using L = Smem<D, R, 1, false>;
  constexpr int kCols = D / 32;  // output columns per lane
  constexpr int kStride = kWarps * kKeysPerWarp;  // from one chunk of a warp to its next
  static_assert(D % 64 == 0, "lane owns an even number of columns");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float* Qs = reinterpret_cast<const float*>(smem + L::kKV);
  float* Ps = reinterpret_cast<float*>(smem + L::kKV + L::kQ) + warp * R * kKeysPerWarp;

  float m[R], l[R], acc[R][kCols];
  int query[R];  // the query index of each row; -1 for the rows past the unit (zeros, masked)
#pragma unroll
  for (int r = 0; r < R; ++r) {
    query[r] = r < nrows ? a.rows.query(r0 + r) : -1;
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.f;
  }

  for (int c0 = keys.begin + warp * kKeysPerWarp; c0 < keys.end; c0 += kStride) {
    T* Ks = reinterpret_cast<T*>(smem + warp * L::kKVWarp);  // the warp's own K and V chunk buffers
    T* Vs = Ks + kKeysPerWarp * L::kLdKV;
    // line 4: K_j, V_j of the chunk -> shared (rows past the split: zeros, nothing read), as two cp.async groups
    copy_chunk<T, D, ContiguousRows>(a, b, hk, c0, keys.end, Ks, Vs);
    cp_async_wait<1>();  // K_j has landed; V_j may still be in flight
    __syncwarp();

    // line 5: S_rj = (scale q_r) . k_j, lane = key j
    const int key = c0 + lane;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.f;
#pragma unroll 4
    for (int col = 0; col < D; col += kVec) {
      float kf[kVec];
      load_floats8<T>(Ks + lane * L::kLdKV + col, kf);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 q0 = *reinterpret_cast<const float4*>(Qs + r * D + col);  // same address in every lane
        const float4 q1 = *reinterpret_cast<const float4*>(Qs + r * D + col + 4);
        s[r] = fmaf(q0.x, kf[0], fmaf(q0.y, kf[1], fmaf(q0.z, kf[2], fmaf(q0.w, kf[3], s[r]))));
        s[r] = fmaf(q1.x, kf[4], fmaf(q1.y, kf[5], fmaf(q1.z, kf[6], fmaf(q1.w, kf[7], s[r]))));
      }
    }
    // lines 6-8: mask, then P with the running max, and O~ rescaled by alpha
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (!(key < keys.end && query[r] >= 0 && pb.visible(query[r], key))) s[r] = -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s[r]));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
      const float alpha = expf(m[r] - m_use);
      const float p = expf(s[r] - m_use);
      l[r] = l[r] * alpha + p;  // each lane sums its own keys; the lanes are summed once, after the loop
      m[r] = m_new;
#pragma unroll
      for (int c = 0; c < kCols; ++c) acc[r][c] *= alpha;
      Ps[r * kKeysPerWarp + lane] = p;
    }
    cp_async_wait<0>();
    __syncwarp();  // V_j and every lane's P are in shared memory

    // line 9: O~_r += P_rj V_j over the 32 keys; lane owns columns lane*kCols .. +kCols-1
#pragma unroll 2
    for (int j = 0; j < kKeysPerWarp; j += 4) {
      float vf[4][kCols];
#pragma unroll
      for (int t = 0; t < 4; ++t) load_floats<T>(Vs + (j + t) * L::kLdKV + lane * kCols, vf[t]);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 p4 = *reinterpret_cast<const float4*>(Ps + r * kKeysPerWarp + j);
#pragma unroll
        for (int c = 0; c < kCols; ++c)
          acc[r][c] = fmaf(p4.w, vf[3][c], fmaf(p4.z, vf[2][c], fmaf(p4.y, vf[1][c], fmaf(p4.x, vf[0][c], acc[r][c]))));
      }
    }
    __syncwarp();  // every lane is done with K_j, V_j, P before the next chunk overwrites them
  }

  // line 10: the warp's (m, l, O~) -> scratch, which overlays the K/V buffers of every warp: wait for all (no copy
  // is in flight any more: the last iteration waited for both groups). The scratch row is every step's layout (m,
  // l, the row's largest score, O~); with the running max the largest score is m itself.
#pragma unroll
  for (int r = 0; r < R; ++r) l[r] = warp_sum(l[r]);
  __syncthreads();
  float* scratch = reinterpret_cast<float*>(smem) + warp * R * (D + 3);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    float* row = scratch + r * (D + 3);
    if (lane == 0) row[D] = m[r], row[D + 1] = l[r], row[D + 2] = m[r];
#pragma unroll
    for (int c = 0; c < kCols; ++c) row[lane * kCols + c] = acc[r][c];
  }
  __syncthreads();
}

// Lines 11-12 for the block's rows, once attend has left every warp's (m, l, O~) in the scratch: the warps merged,
// then the partial s of `splits` written (O_s, LSE_s), or with one split O and LSE themselves. fin: the block's M, L
// and warp weights (Smem's kFin).
template <class T, int D, int R>
__device__ __forceinline__ void finish(const Args<T>& a, const char* smem, float* fin, int b, int u, int r0, int nrows,
                                       int s, int splits) {
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
}

// One block = (split s, row chunk, batch entry b x query head u); Smem<D, R, 1, false>::kBytes of dynamic shared
// memory.
template <class T, int D, int R>
__global__ void __launch_bounds__(kThreads, 1) split_kernel(Args<T> a) {
  using L = Smem<D, R, 1, false>;
  extern __shared__ float4 smem4[];
  char* smem = reinterpret_cast<char*>(smem4);
  const int units = gridDim.z / a.p.batch;
  const int s = blockIdx.x, b = blockIdx.z / units, u = blockIdx.z % units;
  const int r0 = blockIdx.y * R, nrows = min(R, a.rows.per_unit() - r0);
  const int hk = a.p.kv_head_of(a.rows.head(u, r0));  // every row of a unit shares one kv head
  const int n_b = a.kv_lens[b];
  const fa::Problem pb = seen_by(a.p, n_b);
  const KeyRange keys = split_range(n_b, a.splits, s);  // line 2

  // line 1: the block's query rows (scaled) -> shared; rows past the unit are zeros (and masked in attend)
  float* Qs = reinterpret_cast<float*>(smem + L::kKV);
  const float scale = a.p.softmax_scale();
  for (int e = threadIdx.x; e < R * D; e += kThreads) {
    const int r = e / D, c = e % D;
    float x = 0.f;
    if (r < nrows) x = float(a.q[a.p.q_offset(b, a.rows.head(u, r0 + r)) + size_t(a.rows.query(r0 + r)) * D + c]);
    Qs[e] = x * scale;
  }
  __syncthreads();

  attend<T, D, R>(a, b, hk, r0, nrows, keys, pb, smem);

  float* fin = reinterpret_cast<float*>(smem + L::kKV + L::kQ + L::kP);  // [R] M, [R] L, [kWarps][R] weights
  finish<T, D, R>(a, smem, fin, b, u, r0, nrows, s, a.splits);
}

void forward(const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o, float* lse,
             const Launch& launch, float phi, float* workspace, int* fallbacks) {
  with_config(t, p.head_dim, launch.row_bucket, [&](auto tag, auto dim, auto rows) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, R = decltype(rows)::value, kBytes = Smem<D, R, 1, false>::kBytes;
    const Args<T> a = make_args<T>(p, kPacked, q, cache, o, lse, launch, phi, workspace, fallbacks);
    launch_kernel(ready<split_kernel<T, D, R>, kBytes>(), split_grid(p, kPacked, launch), kBytes, a);
    if (launch.splits > 1) merge_partials<T, D>(int(p.lse_elems()), launch.splits, a.ws_o, a.ws_lse, a.o, a.lse);
  });
}

int smem_bytes(int head_dim, int row_bucket) { return split_smem_bytes(head_dim, row_bucket, 1); }

int blocks_per_sm(fa::Dtype t, int head_dim, int row_bucket) {
  int n = 0;
  with_config(t, head_dim, row_bucket, [&](auto tag, auto dim, auto rows) {
    using T = typename decltype(tag)::type;
    constexpr int D = decltype(dim)::value, R = decltype(rows)::value;
    n = occupancy<split_kernel<T, D, R>, Smem<D, R, 1, false>::kBytes>();
  });
  return n;
}

}  // namespace

// The step's row of the registry (flash_decoding.cu): the properties it turns on, each with the step that brought
// it in (the others keep Kernel's defaults: off, one stage), and its host functions.
Kernel kernel() {
  Kernel k;
  k.packed = kPacked;    // one query head per block, as step 1
  k.splits = true;       // this step: the keys split across blocks, merged by LSE
  k.forward = forward;
  k.smem_bytes = smem_bytes;
  k.blocks_per_sm = blocks_per_sm;
  return k;
}

}  // namespace fdec::v02_split_kv
