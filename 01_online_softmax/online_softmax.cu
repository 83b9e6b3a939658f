// Chapter 01: softmax from three passes to two (the online recurrence), the (m, l) merge operator,
// and attention fused into one pass per query row. fp32. Pseudo-code: README.md, Listings 1-4.
//
// Kernels 1-3 (softmax_rows<kVariant, kVec4>): one block per row of x [rows, cols]; the row is strided
// over the block's threads, float4 at a time when cols % 4 == 0 and x, y are 16-byte aligned (kVec4),
// else one float at a time. The block has 128..1024 threads (about 16 elements each, see
// threads_for), so that the rows in flight on the GPU fit in L2 and the second read of a row hits it.
// Shared memory: 32 (m, l) pairs = 256 B.
//   kernel 1, Variant::ThreePass   Listing 1: max, sum of exp, normalise  (x read 3 times)
//   kernel 2, Variant::Online      Listing 2: each thread runs the recurrence on its elements; the
//                                  block reduces max_t m_t, then sum_t l_t e^{m_t - m}   (x read twice)
//   kernel 3, Variant::Merge       Listing 3: the same per-thread recurrence, then ONE reduction of
//                                  the (m, l) pairs with the merge operator: warp shuffles, then
//                                  shared memory across warps                            (x read twice)
// Kernel 4 (attention_rows<kSlots, kForm>): see its own comment below.
#include "online_softmax.cuh"

#include <cstdint>
#include <string>

#include "cuda_check.cuh"

namespace online_softmax {
namespace {

constexpr int kWarp = 32;
constexpr int kMaxWarps = 32;           // 1024 threads per block at most
constexpr int kElemsPerThread = 16;     // target work per thread when choosing the block size
constexpr int kMinThreads = 128, kMaxThreads = 1024;
constexpr int kUnroll = 4;              // loads a thread has in flight before it uses them
constexpr unsigned kFull = 0xffffffffu;

enum class Variant { ThreePass, Online, Merge };

struct MaxSum {
  float m, l;
};

// The merge operator (README eq. (M)); (-inf, 0) is its identity.
__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {-INFINITY, 0.f};  // both empty: avoid exp(-inf - (-inf)) = NaN
  return {m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};
}

// Loads and stores of one chunk of a row: a float4 or a single float.
template <bool kVec4>
struct Chunk {
  static constexpr int kWidth = kVec4 ? 4 : 1;
  float v[kWidth];
  __device__ __forceinline__ void load(const float* row, int c) {
    if constexpr (kVec4) {
      const float4 t = reinterpret_cast<const float4*>(row)[c];
      v[0] = t.x, v[1] = t.y, v[2] = t.z, v[3] = t.w;
    } else {
      v[0] = row[c];
    }
  }
  __device__ __forceinline__ void store(float* row, int c) const {
    if constexpr (kVec4)
      reinterpret_cast<float4*>(row)[c] = make_float4(v[0], v[1], v[2], v[3]);
    else
      row[c] = v[0];
  }
};

// Calls f(chunk) for every chunk of the row this thread owns (chunks threadIdx.x + k blockDim.x),
// kUnroll chunks loaded before any is used so that several loads are in flight per thread.
template <bool kVec4, class F>
__device__ __forceinline__ void for_my_chunks(const float* row, int n_chunks, F f) {
  for (int c0 = threadIdx.x; c0 < n_chunks; c0 += kUnroll * blockDim.x) {
    Chunk<kVec4> ch[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * int(blockDim.x) < n_chunks) ch[u].load(row, c0 + u * blockDim.x);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (c0 + u * int(blockDim.x) < n_chunks) f(ch[u], c0 + u * blockDim.x);
  }
}

// Block-wide reduction of a float with op; every thread gets the result. red: kMaxWarps floats.
template <class Op>
__device__ float block_reduce(float x, float* red, Op op) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = op(x, __shfl_xor_sync(kFull, x, o));
  __syncthreads();  // red may still be read by the previous reduction
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < int(blockDim.x) / kWarp; ++w) x = op(x, red[w]);
  return x;
}

// Block-wide merge of (m, l) pairs (kernel 3): shuffles within a warp, then the warps' pairs through
// shared memory, every thread merging them in the same order (so all threads get the same result).
__device__ MaxSum block_merge(MaxSum s, MaxSum* red) {
  for (int o = kWarp / 2; o > 0; o /= 2)
    s = merge(s, {__shfl_xor_sync(kFull, s.m, o), __shfl_xor_sync(kFull, s.l, o)});
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = s;
  __syncthreads();
  s = red[0];
  for (int w = 1; w < int(blockDim.x) / kWarp; ++w) s = merge(s, red[w]);
  return s;
}

template <Variant kVariant, bool kVec4>
__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int cols) {
  constexpr int W = Chunk<kVec4>::kWidth;
  const float* row = x + size_t(blockIdx.x) * cols;
  float* out = y + size_t(blockIdx.x) * cols;
  const int n_chunks = cols / W;  // kVec4 only when cols % 4 == 0
  float m, l;
  if constexpr (kVariant == Variant::ThreePass) {
    __shared__ float red[kMaxWarps];
    // Listing 1, line 1: m = max_j x_j
    float t = -INFINITY;
    for_my_chunks<kVec4>(row, n_chunks, [&](const Chunk<kVec4>& ch, int) {
      for (int e = 0; e < W; ++e) t = fmaxf(t, ch.v[e]);
    });
    m = block_reduce(t, red, [](float a, float b) { return fmaxf(a, b); });
    // line 2: l = sum_j exp(x_j - m)
    t = 0.f;
    for_my_chunks<kVec4>(row, n_chunks, [&](const Chunk<kVec4>& ch, int) {
      for (int e = 0; e < W; ++e) t += expf(ch.v[e] - m);
    });
    l = block_reduce(t, red, [](float a, float b) { return a + b; });
  } else {
    // Listing 2, lines 1-3, on this thread's elements: the online recurrence, one chunk at a
    // time (the rescale e^{m - m_new} once per chunk, the exp of each element once).
    MaxSum s{-INFINITY, 0.f};
    for_my_chunks<kVec4>(row, n_chunks, [&](const Chunk<kVec4>& ch, int) {
      float m_new = s.m;
      for (int e = 0; e < W; ++e) m_new = fmaxf(m_new, ch.v[e]);
      if (m_new == -INFINITY) return;  // only -inf seen so far: nothing to add
      float sum = 0.f;
      for (int e = 0; e < W; ++e) sum += expf(ch.v[e] - m_new);
      s = {m_new, s.l * expf(s.m - m_new) + sum};
    });
    if constexpr (kVariant == Variant::Online) {
      __shared__ float red[kMaxWarps];
      // Kernel 2 combines the threads' states with the reductions it already knows: first the row
      // max, then each thread rescales its l to it and the block sums.
      m = block_reduce(s.m, red, [](float a, float b) { return fmaxf(a, b); });
      l = block_reduce(s.m == -INFINITY ? 0.f : s.l * expf(s.m - m), red, [](float a, float b) { return a + b; });
    } else {
      // Kernel 3: one reduction with the merge operator (Listing 3).
      __shared__ MaxSum red_pairs[kMaxWarps];
      const MaxSum r = block_merge(s, red_pairs);
      m = r.m, l = r.l;
    }
  }
  // Last line of every algorithm: y_j = exp(x_j - m) / l (a second or third read of the row).
  const float inv_l = 1.f / l;
  for_my_chunks<kVec4>(row, n_chunks, [&](Chunk<kVec4> ch, int c) {
    for (int e = 0; e < W; ++e) ch.v[e] = expf(ch.v[e] - m) * inv_l;
    ch.store(out, c);
  });
}

// About kElemsPerThread elements per thread, a power of two in [kMinThreads, kMaxThreads]. Few
// threads per row means many rows in flight per SM; for long rows that working set (rows in flight
// x 4 cols bytes) would outgrow L2 and the second read would go back to HBM, so long rows get more
// threads (fewer rows in flight).
int threads_for(int cols) {
  int t = kMinThreads;
  while (t < kMaxThreads && t * kElemsPerThread < cols) t *= 2;
  return t;
}
static_assert(kMaxThreads / kWarp <= kMaxWarps, "the reduction buffers hold one entry per warp");

template <Variant kVariant>
void launch_softmax(const float* x, float* y, int rows, int cols) {
  if (rows < 1 || cols < 1)
    throw fa::UsageError("softmax: rows and cols must be >= 1 (got " + std::to_string(rows) + " x " +
                         std::to_string(cols) + ")");
  const bool aligned = (reinterpret_cast<uintptr_t>(x) % 16 == 0) && (reinterpret_cast<uintptr_t>(y) % 16 == 0);
  const int threads = threads_for(cols);
  if (cols % 4 == 0 && aligned)
    softmax_rows<kVariant, true><<<unsigned(rows), threads>>>(x, y, cols);
  else
    softmax_rows<kVariant, false><<<unsigned(rows), threads>>>(x, y, cols);
  CHECK_LAUNCH();
}

// ---- kernel 4: fused attention, one warp per query row -------------------------------------------
// O_i and L_i for query row i of head (b, h), S never stored (Listing 4). Grid: one block of
// kRowsPerBlock warps per kRowsPerBlock consecutive query rows of one head (blocks never straddle
// heads); warp w owns row i. Lane t holds q_i[c] and the accumulator o_i[c] for c = t + 32 s,
// s < kSlots: registers need a compile-time size, so the kernel is instantiated for kSlots = 1, 2, 4, 8
// (head_dim <= 32, 64, 128, 256) and loads/stores are predicated on c < d. Per key j: each lane
// multiplies its slice of k_j, a warp shuffle reduction gives x_j = scale q_i . k_j to every lane, and
// every lane updates (m, l) (warp-uniform) and its slice of o_i. kKeysPerStep keys are reduced
// together so their shuffles overlap; the recurrence still absorbs them one at a time (line 3-5).
// No shared memory, no barriers: a warp whose row is past Nq simply returns. Each warp reads all the
// K and V rows its query sees (from L2/L1; the rows of one block share them) - tiling K and V through
// shared memory is chapter 02.
constexpr int kRowsPerBlock = 4;
constexpr int kKeysPerStep = 4;
constexpr int kMaxHeadDim = 256;

template <int kSlots, Form kForm>
__global__ void attention_rows(fa::Problem p, int row_blocks, const float* __restrict__ q,
                               const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ o,
                               float* __restrict__ lse) {
  const int lane = threadIdx.x % kWarp;
  const int bh = blockIdx.x / row_blocks;  // b * H + h
  const int i = (blockIdx.x % row_blocks) * kRowsPerBlock + threadIdx.x / kWarp;
  if (i >= p.q_len) return;
  const int b = bh / p.heads, h = bh % p.heads, d = p.head_dim;
  const float* Q = q + p.q_offset(b, h) + size_t(i) * d;
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));  // GQA: query head h reads kv head h / G
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));
  const int n = p.visible_keys(i);  // causal, bottom-right aligned; warp-uniform
  const float scale = p.softmax_scale();

  float qr[kSlots], acc[kSlots];
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int c = lane + kWarp * s;
    qr[s] = c < d ? Q[c] : 0.f;
    acc[s] = 0.f;
  }
  float m = -INFINITY, l = 0.f;  // line 1
  for (int j0 = 0; j0 < n; j0 += kKeysPerStep) {
    float x[kKeysPerStep];
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {  // line 2: this lane's share of q_i . k_j
      x[u] = 0.f;
      const int j = j0 + u;
      if (j < n) {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int c = lane + kWarp * s;
          if (c < d) x[u] += qr[s] * K[size_t(j) * d + c];
        }
      }
    }
#pragma unroll
    for (int off = kWarp / 2; off > 0; off /= 2)
#pragma unroll
      for (int u = 0; u < kKeysPerStep; ++u) x[u] += __shfl_xor_sync(kFull, x[u], off);
#pragma unroll
    for (int u = 0; u < kKeysPerStep; ++u) {
      const int j = j0 + u;
      if (j >= n) break;  // warp-uniform
      const float xj = scale * x[u];
      const float m_new = fmaxf(m, xj);                                // line 3
      const float alpha = expf(m - m_new), pj = expf(xj - m_new);      // exp(-inf) = 0 at j = 0
      const float l_new = l * alpha + pj;                               // line 4
      if constexpr (kForm == Form::Fa1NormalisedEachStep) {
        const float keep = l * alpha / l_new, add = pj / l_new;         // line 5, FA1 form
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {
          const int c = lane + kWarp * s;
          if (c < d) acc[s] = acc[s] * keep + add * V[size_t(j) * d + c];
        }
      } else {
#pragma unroll
        for (int s = 0; s < kSlots; ++s) {                              // line 5, FA2 form
          const int c = lane + kWarp * s;
          if (c < d) acc[s] = acc[s] * alpha + pj * V[size_t(j) * d + c];
        }
      }
      m = m_new, l = l_new;
    }
  }
  // line 7: the FA2 form divides once; an empty row (n = 0) keeps acc = 0.
  const float final_scale = (kForm == Form::Fa2DeferredNormalisation && n > 0) ? 1.f / l : 1.f;
  float* O = o + p.q_offset(b, h) + size_t(i) * d;
#pragma unroll
  for (int s = 0; s < kSlots; ++s) {
    const int c = lane + kWarp * s;
    if (c < d) O[c] = acc[s] * final_scale;
  }
  if (lane == 0) lse[p.lse_offset(b, h) + i] = n > 0 ? m + logf(l) : -INFINITY;  // line 8
}

template <int kSlots>
void launch_attention(const fa::Problem& p, Form form, const float* q, const float* k, const float* v, float* o,
                      float* lse) {
  static_assert(kSlots * kWarp <= kMaxHeadDim, "a lane holds kSlots elements of a head_dim <= 256 row");
  const int row_blocks = (p.q_len + kRowsPerBlock - 1) / kRowsPerBlock;
  const long long blocks = (long long)p.batch * p.heads * row_blocks;
  if (blocks > 0x7FFFFFFFLL) throw fa::UsageError("attention_fused: batch * heads * ceil(q_len / 4) must be < 2^31");
  const dim3 grid{unsigned(blocks)}, block{unsigned(kRowsPerBlock * kWarp)};
  if (form == Form::Fa1NormalisedEachStep)
    attention_rows<kSlots, Form::Fa1NormalisedEachStep><<<grid, block>>>(p, row_blocks, q, k, v, o, lse);
  else
    attention_rows<kSlots, Form::Fa2DeferredNormalisation><<<grid, block>>>(p, row_blocks, q, k, v, o, lse);
  CHECK_LAUNCH();
}

}  // namespace

void softmax_3pass(const float* x, float* y, int rows, int cols) { launch_softmax<Variant::ThreePass>(x, y, rows, cols); }
void softmax_online_2pass(const float* x, float* y, int rows, int cols) {
  launch_softmax<Variant::Online>(x, y, rows, cols);
}
void softmax_online_merge(const float* x, float* y, int rows, int cols) {
  launch_softmax<Variant::Merge>(x, y, rows, cols);
}

void check_supported(const fa::Problem& p) {
  p.validate();
  if (p.dropout_p > 0.f)
    throw fa::UsageError("attention_fused: no dropout in chapter 01 (got " + std::to_string(p.dropout_p) +
                         "); dropout comes back in chapter 02");
  if (p.head_dim > kMaxHeadDim)
    throw fa::UsageError("attention_fused: head_dim must be <= 256 (got " + std::to_string(p.head_dim) + ")");
}

void attention_fused(const fa::Problem& p, Form form, const float* q, const float* k, const float* v, float* o,
                     float* lse) {
  check_supported(p);
  if (p.head_dim <= 32)
    launch_attention<1>(p, form, q, k, v, o, lse);
  else if (p.head_dim <= 64)
    launch_attention<2>(p, form, q, k, v, o, lse);
  else if (p.head_dim <= 128)
    launch_attention<4>(p, form, q, k, v, o, lse);
  else
    launch_attention<8>(p, form, q, k, v, o, lse);
}

}  // namespace online_softmax
