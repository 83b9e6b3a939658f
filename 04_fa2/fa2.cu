// Chapter 04: FlashAttention-2 (seed FA2 Algorithm 1 forward, Algorithm 2 backward), fp32 on CUDA cores.
//
// What changes against chapters 02/03, each visible below:
//   * loop order: a block owns a Q block Q_i (outer loop = the grid) and streams K_j, V_j (inner loop), so O_i,
//     l_i, m_i stay on chip for the whole row block and never round-trip HBM;
//   * deferred normalisation: the accumulator O~_i is unnormalised, rescaled by exp(m_old - m_new) per K/V block,
//     divided by l_i once at the end; only O and L = m + log l are written;
//   * sequence parallelism: the grid is (Q block, head, batch) forward, (K/V block, kv head, batch) backward;
//   * causal block skipping: K/V blocks entirely above the diagonal are not visited; only blocks that cross it
//     (or the ragged tail) evaluate the mask;
//   * register tiling as in 02 (256 threads as a 16 x 16 grid, a 4 x 4 micro-tile of S_ij per thread), now also for
//     the output: each thread keeps 4 x d/16 elements of O~_i (or of dK_j, dV_j) in registers across the K/V loop.
// Backward: D = rowsum(dO o O) by its own kernel; dK_j, dV_j accumulate on chip; dQ by atomicAdd or by a
// deterministic second kernel. Instantiations: head_dim 16, 32, 64, 128 for every kernel.
#include "fa2.cuh"

#include <cstdint>
#include <string>

#include "cuda_check.cuh"
#include "philox.hpp"

namespace fa2 {
namespace {

// ---- tiles and thread mapping ------------------------------------------------------------------------
constexpr int kThreads = 256;
constexpr int kTx = 16;                 // threads along a tile's columns (16 consecutive lanes = one tile row group)
constexpr int kTy = kThreads / kTx;     // threads along a tile's rows
constexpr int kPad = 4;                 // shared-memory row padding (floats): keeps float4 accesses conflict-free
constexpr int kFwdBr = 64, kFwdBc = 64; // forward and deterministic-dQ tiles
constexpr int kBwdBr = 32, kBwdBc = 64; // main backward tiles (Br smaller: six tiles live in shared memory)
constexpr int kMicro = 4;               // rows (or columns) of S_ij per thread along the 16-thread side
static_assert(kThreads % 32 == 0 && kTx == 16, "row reductions shuffle over 16 consecutive lanes of a warp");
static_assert(kFwdBr == kTy * kMicro && kFwdBc == kTx * kMicro, "forward: 4 x 4 micro-tile of S_ij per thread");
static_assert(kBwdBc == kTy * kMicro && kBwdBr % kTx == 0, "backward: 4 key rows x Br/16 query columns per thread");
static_assert(kBwdBc % 4 == 0, "dQ += dS K_j reads dS_ij four keys at a time");

// The output columns of thread tx in a [rows, D] tile: kN = D/16 columns, in kN/kVec runs of kVec contiguous
// floats (one vector load each): d=16: tx; d=32: 2tx..2tx+1; d=64: 4tx..4tx+3; d=128: 4tx.. and 64+4tx..
template <int D>
struct OutCols {
  static_assert(D % kTx == 0, "head_dim must be a multiple of 16");
  static constexpr int kN = D / kTx;
  static constexpr int kVec = kN < 4 ? kN : 4;
  __device__ static int col(int tx, int e) { return (e / kVec) * (kTx * kVec) + tx * kVec + e % kVec; }
  __device__ static void load(const float* row, int tx, float (&x)[kN]) {
#pragma unroll
    for (int g = 0; g < kN / kVec; ++g) {
      const float* src = row + g * kTx * kVec + tx * kVec;
      if constexpr (kVec == 4) {
        const float4 t = *reinterpret_cast<const float4*>(src);
        x[4 * g] = t.x, x[4 * g + 1] = t.y, x[4 * g + 2] = t.z, x[4 * g + 3] = t.w;
      } else if constexpr (kVec == 2) {
        const float2 t = *reinterpret_cast<const float2*>(src);
        x[2 * g] = t.x, x[2 * g + 1] = t.y;
      } else {
        x[g] = src[0];
      }
    }
  }
};

// Everything a kernel needs from fa::Problem, as plain numbers (Problem's methods are host code).
struct Shape {
  int heads, kv_heads, group, q_len, kv_len, causal;
  float scale, dropout_p, inv_keep;  // inv_keep = 1 / (1 - p)
  uint32_t threshold;                // fa::dropout_threshold(p)
  uint64_t seed, offset;
};

__device__ __forceinline__ float4 lds4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  return fmaf(a.w, b.w, fmaf(a.z, b.z, fmaf(a.y, b.y, fmaf(a.x, b.x, acc))));
}
__device__ __forceinline__ float at(float4 v, int r) { return r == 0 ? v.x : r == 1 ? v.y : r == 2 ? v.z : v.w; }

// Reductions over the 16 lanes that hold one row of S_ij (lanes 0-15 or 16-31 of a warp).
__device__ __forceinline__ float row_max(float x) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float row_sum(float x) {
#pragma unroll
  for (int o = kTx / 2; o > 0; o /= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Rows [row0, row0 + rows) of a [len, D] matrix into shared memory with row stride ld; rows past len are 0.
template <int D>
__device__ void load_rows(float* dst, int ld, const float* src, int row0, int rows, int len) {
  static_assert(D % 4 == 0, "rows are copied as float4");
  constexpr int kVecs = D / 4;
  for (int e = threadIdx.x; e < rows * kVecs; e += kThreads) {
    const int r = e / kVecs, c4 = e % kVecs;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + r < len) x = reinterpret_cast<const float4*>(src + size_t(row0 + r) * D)[c4];
    *reinterpret_cast<float4*>(dst + r * ld + 4 * c4) = x;
  }
}

// Z_ij / (1 - p) for element (i, j) of head (b, h): the same Philox draw as every chapter.
__device__ __forceinline__ float dropout_factor(const Shape& s, int b, int h, int i, int j) {
  if (s.dropout_p == 0.f) return 1.f;
  return fa::dropout_keep(s.seed, s.offset, b, h, i, j, s.threshold) ? s.inv_keep : 0.f;
}

// Causal (bottom-right): query i sees key j iff j <= i + diag, diag = kv_len - q_len.
// Number of keys the rows [i0, i0 + rows) see at most: the K/V loop of a Q block stops there (block skipping).
__device__ __forceinline__ int kv_end_of(const Shape& s, int i0, int rows) {
  if (!s.causal) return s.kv_len;
  const int last_row = min(i0 + rows, s.q_len) - 1;
  return max(0, min(s.kv_len, last_row + (s.kv_len - s.q_len) + 1));
}
// Does the (Q block at i0, K/V block at j0) tile need the mask? Only where it crosses the diagonal or the tail.
__device__ __forceinline__ bool needs_mask(const Shape& s, int i0, int j0, int bc) {
  return j0 + bc > s.kv_len || (s.causal && j0 + bc - 1 > i0 + (s.kv_len - s.q_len));
}
__device__ __forceinline__ bool masked(const Shape& s, int i, int j) {
  return j >= s.kv_len || (s.causal && j > i + (s.kv_len - s.q_len));
}

// ---- forward ------------------------------------------------------------------------------------------
// O_i, L_i for one Q block (FA2 Algorithm 1, lines 1-11 of the README). Grid (ceil(Nq/Br), H, B), 256 threads.
// Thread (ty, tx) owns rows ty*4..ty*4+3 of the block: S_ij columns tx + 16c (c < 4) and O columns
// OutCols<D>::col(tx, .), plus the row statistics m, l (replicated over the 16 lanes of a row).
// Shared memory (floats): Q_i [Br][D+4], K_j [Bc][D+4], V_j [Bc][D], P~_ij^T [Bc][Br+4]
//   = 68.6 KB at d = 64, 117.8 KB at d = 128 (dynamic, limit raised by cudaFuncSetAttribute).
template <int D>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(Shape s, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                   float* __restrict__ o, float* __restrict__ lse) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdP = kFwdBr + kPad;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + kFwdBr * kLd;
  float* Vs = Ks + kFwdBc * kLd;
  float* Pts = Vs + kFwdBc * D;  // P~_ij transposed: [key][query], so the P~ V loop reads 4 rows as one float4

  const int i0 = blockIdx.x * kFwdBr, h = blockIdx.y, b = blockIdx.z, hk = h / s.group;  // GQA: kv head of h
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const float* Q = q + (size_t(b) * s.heads + h) * s.q_len * D;
  const float* K = k + (size_t(b) * s.kv_heads + hk) * s.kv_len * D;
  const float* V = v + (size_t(b) * s.kv_heads + hk) * s.kv_len * D;

  load_rows<D>(Qs, kLd, Q, i0, kFwdBr, s.q_len);  // line 2 (visible after the loop's first barrier)
  float m[kMicro], l[kMicro], acc[kMicro][Cols::kN];
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) acc[r][e] = 0.f;
  }

  const int kv_end = kv_end_of(s, i0, kFwdBr);  // line 3: blocks past the diagonal are skipped
  for (int j0 = 0; j0 < kv_end; j0 += kFwdBc) {
    __syncthreads();  // the previous iteration has finished reading K_j, V_j and P~_ij
    load_rows<D>(Ks, kLd, K, j0, kFwdBc, s.kv_len);  // line 4
    load_rows<D>(Vs, D, V, j0, kFwdBc, s.kv_len);
    __syncthreads();

    float S[kMicro][kMicro] = {};  // line 5: S_ij = tau Q_i K_j^T
#pragma unroll 4
    for (int c4 = 0; c4 < D; c4 += 4) {
      float4 qv[kMicro], kv[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) qv[r] = lds4(Qs + (ty * kMicro + r) * kLd + c4);
#pragma unroll
      for (int c = 0; c < kMicro; ++c) kv[c] = lds4(Ks + (tx + kTx * c) * kLd + c4);
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) S[r][c] = dot4(qv[r], kv[c], S[r][c]);
    }
    const bool mask = needs_mask(s, i0, j0, kFwdBc);
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        S[r][c] *= s.scale;
        if (mask && masked(s, i0 + ty * kMicro + r, j0 + tx + kTx * c)) S[r][c] = -INFINITY;
      }

#pragma unroll
    for (int r = 0; r < kMicro; ++r) {  // lines 6-7: online softmax statistics, one exp per element
      float mx = S[r][0];
#pragma unroll
      for (int c = 1; c < kMicro; ++c) mx = fmaxf(mx, S[r][c]);
      const float m_new = fmaxf(m[r], row_max(mx));
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // nothing visible yet: avoid (-inf) - (-inf)
      const float alpha = expf(m[r] - m_use);
      float rs = 0.f;
#pragma unroll
      for (int c = 0; c < kMicro; ++c) rs += (S[r][c] = expf(S[r][c] - m_use));
      l[r] = alpha * l[r] + row_sum(rs);  // l sums P before dropout: dropout acts after the softmax
      m[r] = m_new;
#pragma unroll
      for (int e = 0; e < Cols::kN; ++e) acc[r][e] *= alpha;  // line 8, first half: rescale, do not divide
    }
    if (s.dropout_p > 0.f)
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) S[r][c] *= dropout_factor(s, b, h, i0 + ty * kMicro + r, j0 + tx + kTx * c);
#pragma unroll
    for (int c = 0; c < kMicro; ++c)
      *reinterpret_cast<float4*>(Pts + (tx + kTx * c) * kLdP + ty * kMicro) =
          make_float4(S[0][c], S[1][c], S[2][c], S[3][c]);
    __syncthreads();

#pragma unroll 4
    for (int jj = 0; jj < kFwdBc; ++jj) {  // line 8, second half: O~_i += P~_ij V_j
      const float4 pv = lds4(Pts + jj * kLdP + ty * kMicro);
      float vv[Cols::kN];
      Cols::load(Vs + jj * D, tx, vv);
#pragma unroll
      for (int e = 0; e < Cols::kN; ++e) {
        acc[0][e] = fmaf(pv.x, vv[e], acc[0][e]);
        acc[1][e] = fmaf(pv.y, vv[e], acc[1][e]);
        acc[2][e] = fmaf(pv.z, vv[e], acc[2][e]);
        acc[3][e] = fmaf(pv.w, vv[e], acc[3][e]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kMicro; ++r) {  // lines 9-11: one division per row, O and L are all that is written
    const int i = i0 + ty * kMicro + r;
    if (i >= s.q_len) continue;
    const float inv_l = l[r] > 0.f ? 1.f / l[r] : 0.f;  // l = 0 only for a row that sees no key: O = 0
    float* Orow = o + ((size_t(b) * s.heads + h) * s.q_len + i) * D;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) Orow[Cols::col(tx, e)] = acc[r][e] * inv_l;
    if (tx == 0) lse[(size_t(b) * s.heads + h) * s.q_len + i] = l[r] > 0.f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

// ---- backward: D = rowsum(dO o O) -----------------------------------------------------------------------
// Backward line 1. One warp per row of [B*H*Nq, d]; 8 rows per 256-thread block; no shared memory.
constexpr int kWarpsPerBlock = kThreads / 32;
__global__ void __launch_bounds__(kThreads)
    rowsum_do_o_kernel(const float* __restrict__ o, const float* __restrict__ dout, float* __restrict__ Dv,
                       size_t rows, int d) {
  const size_t row = size_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32;
  if (row >= rows) return;  // whole warps leave; there is no barrier below
  const int lane = threadIdx.x % 32;
  float acc = 0.f;
  for (int c = lane; c < d; c += 32) acc = fmaf(dout[row * d + c], o[row * d + c], acc);
#pragma unroll
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  if (lane == 0) Dv[row] = acc;
}

// Loads L_i and D_i of a Q block into shared memory. An empty row (L = -inf) and a row past q_len are stored
// as L = +inf, so that P = exp(S - L) = 0 there without a branch in the inner loops.
__device__ void load_stats(float* Ls, float* Ds, const float* lse_h, const float* D_h, int i0, int rows, int len) {
  for (int t = threadIdx.x; t < rows; t += kThreads) {
    const int i = i0 + t;
    const float L = i < len ? lse_h[i] : -INFINITY;
    Ls[t] = L == -INFINITY ? INFINITY : L;
    Ds[t] = i < len ? D_h[i] : 0.f;
  }
}

// ---- backward: the K/V-block kernel -------------------------------------------------------------------
// dK_j, dV_j for one K/V block of kv head hk (README Algorithm 2, lines 2-12), summed over the query heads of
// the GQA group (looped inside the block, so the sum is deterministic); with kAtomicDq also dQ_i += tau dS_ij K_j
// by atomicAdd (line 11). Grid (ceil(Nk/Bc), Hkv, B), 256 threads.
// Thread (ty, tx) owns key rows j = ty*4..ty*4+3 of S_ij^T (query columns tx + 16c, c < Br/16) and of dK_j, dV_j
// (columns OutCols<D>::col(tx, .)); for dQ_i it owns query rows ty*2, ty*2+1.
// Shared memory (floats): K_j, V_j [Bc][D+4]; Q_i, dO_i [Br][D+4]; P~_ij, dS_ij [Br][Bc+4]; L_i, D_i [Br]
//   = 69.9 KB at d = 64, 119.0 KB at d = 128 (1 KB = 1000 bytes).
template <int D, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads)
    backward_kv_kernel(Shape s, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ Dv,
                       float* __restrict__ dq, float* __restrict__ dk, float* __restrict__ dv) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdS = kBwdBc + kPad;
  constexpr int kI = kBwdBr / kTx;        // query columns of S^T per thread
  constexpr int kQRows = kBwdBr / kTy;    // dQ rows per thread
  static_assert(kQRows * kTy == kBwdBr, "dQ_i rows are split evenly over the 16 thread rows");
  extern __shared__ float4 smem4[];
  float* Ks = reinterpret_cast<float*>(smem4);
  float* Vs = Ks + kBwdBc * kLd;
  float* Qs = Vs + kBwdBc * kLd;
  float* dOs = Qs + kBwdBr * kLd;
  float* Ps = dOs + kBwdBr * kLd;   // P~_ij  [query][key]
  float* dSs = Ps + kBwdBr * kLdS;  // dS_ij  [query][key]
  float* Ls = dSs + kBwdBr * kLdS;
  float* Ds = Ls + kBwdBr;

  const int j0 = blockIdx.x * kBwdBc, hk = blockIdx.y, b = blockIdx.z;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const size_t kv_base = (size_t(b) * s.kv_heads + hk) * s.kv_len * D;
  load_rows<D>(Ks, kLd, k + kv_base, j0, kBwdBc, s.kv_len);  // line 3
  load_rows<D>(Vs, kLd, v + kv_base, j0, kBwdBc, s.kv_len);
  float dK[kMicro][Cols::kN] = {}, dV[kMicro][Cols::kN] = {};

  // Causal: query i sees key j0 iff i >= j0 - diag; Q blocks wholly before that are skipped.
  const int i_first = s.causal ? max(0, j0 - (s.kv_len - s.q_len)) : 0;
  for (int g = 0; g < s.group; ++g) {  // line 4: the query heads of this kv head's group
    const int h = hk * s.group + g;
    const size_t q_base = (size_t(b) * s.heads + h) * s.q_len;  // row index of (b, h, 0)
    for (int i0 = i_first / kBwdBr * kBwdBr; i0 < s.q_len; i0 += kBwdBr) {
      __syncthreads();  // the previous iteration has finished reading Q_i, dO_i, P~, dS (and K_j, V_j are loaded)
      load_rows<D>(Qs, kLd, q + q_base * D, i0, kBwdBr, s.q_len);  // line 5
      load_rows<D>(dOs, kLd, dout + q_base * D, i0, kBwdBr, s.q_len);
      load_stats(Ls, Ds, lse + q_base, Dv + q_base, i0, kBwdBr, s.q_len);
      __syncthreads();

      float St[kMicro][kI] = {}, dPt[kMicro][kI] = {};  // S_ij^T = K_j Q_i^T, dP~_ij^T = V_j dO_i^T
#pragma unroll 4
      for (int c4 = 0; c4 < D; c4 += 4) {
        float4 kv[kMicro], vv[kMicro], qv[kI], dov[kI];
#pragma unroll
        for (int r = 0; r < kMicro; ++r) {
          kv[r] = lds4(Ks + (ty * kMicro + r) * kLd + c4);
          vv[r] = lds4(Vs + (ty * kMicro + r) * kLd + c4);
        }
#pragma unroll
        for (int c = 0; c < kI; ++c) {
          qv[c] = lds4(Qs + (tx + kTx * c) * kLd + c4);
          dov[c] = lds4(dOs + (tx + kTx * c) * kLd + c4);
        }
#pragma unroll
        for (int r = 0; r < kMicro; ++r)
#pragma unroll
          for (int c = 0; c < kI; ++c) {
            St[r][c] = dot4(kv[r], qv[c], St[r][c]);
            dPt[r][c] = dot4(vv[r], dov[c], dPt[r][c]);
          }
      }
      const bool mask = needs_mask(s, i0, j0, kBwdBc);
#pragma unroll
      for (int c = 0; c < kI; ++c) {  // lines 6, 8, 9 element-wise; P~ and dS go to shared memory
        const int il = tx + kTx * c, i = i0 + il;
        float Pd[kMicro], dS[kMicro];
#pragma unroll
        for (int r = 0; r < kMicro; ++r) {
          const int j = j0 + ty * kMicro + r;
          const bool off = mask && masked(s, i, j);
          const float P = off ? 0.f : expf(s.scale * St[r][c] - Ls[il]);  // line 6: P from L, no m or l needed
          const float z = off ? 0.f : dropout_factor(s, b, h, i, j);       // the forward's mask, regenerated
          Pd[r] = P * z;
          dS[r] = P * (dPt[r][c] * z - Ds[il]);  // lines 8-9
        }
        *reinterpret_cast<float4*>(Ps + il * kLdS + ty * kMicro) = make_float4(Pd[0], Pd[1], Pd[2], Pd[3]);
        *reinterpret_cast<float4*>(dSs + il * kLdS + ty * kMicro) = make_float4(dS[0], dS[1], dS[2], dS[3]);
      }
      __syncthreads();

#pragma unroll 2
      for (int ii = 0; ii < kBwdBr; ++ii) {  // line 7: dV_j += P~^T dO_i;  line 10: dK_j += dS^T Q_i (tau at the end)
        const float4 p4 = lds4(Ps + ii * kLdS + ty * kMicro), ds4 = lds4(dSs + ii * kLdS + ty * kMicro);
        float dov[Cols::kN], qv[Cols::kN];
        Cols::load(dOs + ii * kLd, tx, dov);
        Cols::load(Qs + ii * kLd, tx, qv);
#pragma unroll
        for (int r = 0; r < kMicro; ++r)
#pragma unroll
          for (int e = 0; e < Cols::kN; ++e) {
            dV[r][e] = fmaf(at(p4, r), dov[e], dV[r][e]);
            dK[r][e] = fmaf(at(ds4, r), qv[e], dK[r][e]);
          }
      }

      if constexpr (kAtomicDq) {  // line 11: dQ_i += tau dS_ij K_j, added into HBM by every K/V block
        float acc[kQRows][Cols::kN] = {};
#pragma unroll 2
        for (int jj = 0; jj < kBwdBc; jj += 4) {
          float4 ds[kQRows];
#pragma unroll
          for (int r = 0; r < kQRows; ++r) ds[r] = lds4(dSs + (ty * kQRows + r) * kLdS + jj);
#pragma unroll
          for (int t = 0; t < 4; ++t) {
            float kc[Cols::kN];
            Cols::load(Ks + (jj + t) * kLd, tx, kc);
#pragma unroll
            for (int r = 0; r < kQRows; ++r)
#pragma unroll
              for (int e = 0; e < Cols::kN; ++e) acc[r][e] = fmaf(at(ds[r], t), kc[e], acc[r][e]);
          }
        }
#pragma unroll
        for (int r = 0; r < kQRows; ++r) {
          const int i = i0 + ty * kQRows + r;
          if (i >= s.q_len) continue;
          float* dQrow = dq + (q_base + i) * D;
#pragma unroll
          for (int e = 0; e < Cols::kN; ++e) atomicAdd(dQrow + Cols::col(tx, e), s.scale * acc[r][e]);
        }
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kMicro; ++r) {  // line 12
    const int j = j0 + ty * kMicro + r;
    if (j >= s.kv_len) continue;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) {
      dk[kv_base + size_t(j) * D + Cols::col(tx, e)] = s.scale * dK[r][e];
      dv[kv_base + size_t(j) * D + Cols::col(tx, e)] = dV[r][e];
    }
  }
}

// ---- backward: deterministic dQ -------------------------------------------------------------------------
// dQ_i for one Q block of head h (README Algorithm 2, lines 13-16): the forward's loop shape, recomputing S_ij,
// P_ij, dP_ij and dS_ij per K/V block and summing tau dS_ij K_j on chip in a fixed order. Grid (ceil(Nq/Br), H, B),
// 256 threads; thread (ty, tx) owns rows ty*4.. of S_ij (columns tx + 16c) and of dQ_i (columns OutCols<D>).
// Shared memory (floats): Q_i, dO_i [Br][D+4]; K_j, V_j [Bc][D+4]; dS_ij^T [Bc][Br+4]; L_i, D_i [Br]
//   = 87.6 KB at d = 64, 153.1 KB at d = 128 (fits the A100 limit of 163 KiB).
template <int D>
__global__ void __launch_bounds__(kThreads)
    backward_dq_kernel(Shape s, const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                       const float* __restrict__ lse, const float* __restrict__ dout, const float* __restrict__ Dv,
                       float* __restrict__ dq) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdP = kFwdBr + kPad;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* dOs = Qs + kFwdBr * kLd;
  float* Ks = dOs + kFwdBr * kLd;
  float* Vs = Ks + kFwdBc * kLd;
  float* dSts = Vs + kFwdBc * kLd;  // dS_ij transposed: [key][query]
  float* Ls = dSts + kFwdBc * kLdP;
  float* Ds = Ls + kFwdBr;

  const int i0 = blockIdx.x * kFwdBr, h = blockIdx.y, b = blockIdx.z, hk = h / s.group;
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const size_t q_base = (size_t(b) * s.heads + h) * s.q_len;
  const size_t kv_base = (size_t(b) * s.kv_heads + hk) * s.kv_len * D;
  load_rows<D>(Qs, kLd, q + q_base * D, i0, kFwdBr, s.q_len);  // line 14
  load_rows<D>(dOs, kLd, dout + q_base * D, i0, kFwdBr, s.q_len);
  load_stats(Ls, Ds, lse + q_base, Dv + q_base, i0, kFwdBr, s.q_len);
  float acc[kMicro][Cols::kN] = {};

  const int kv_end = kv_end_of(s, i0, kFwdBr);
  for (int j0 = 0; j0 < kv_end; j0 += kFwdBc) {  // line 15
    __syncthreads();
    load_rows<D>(Ks, kLd, k + kv_base, j0, kFwdBc, s.kv_len);
    load_rows<D>(Vs, kLd, v + kv_base, j0, kFwdBc, s.kv_len);
    __syncthreads();

    float S[kMicro][kMicro] = {}, dP[kMicro][kMicro] = {};
#pragma unroll 4
    for (int c4 = 0; c4 < D; c4 += 4) {
      float4 qv[kMicro], dov[kMicro], kv[kMicro], vv[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) {
        qv[r] = lds4(Qs + (ty * kMicro + r) * kLd + c4);
        dov[r] = lds4(dOs + (ty * kMicro + r) * kLd + c4);
      }
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        kv[c] = lds4(Ks + (tx + kTx * c) * kLd + c4);
        vv[c] = lds4(Vs + (tx + kTx * c) * kLd + c4);
      }
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) {
          S[r][c] = dot4(qv[r], kv[c], S[r][c]);
          dP[r][c] = dot4(dov[r], vv[c], dP[r][c]);
        }
    }
    const bool mask = needs_mask(s, i0, j0, kFwdBc);
#pragma unroll
    for (int c = 0; c < kMicro; ++c) {
      const int j = j0 + tx + kTx * c;
      float dS[kMicro];
#pragma unroll
      for (int r = 0; r < kMicro; ++r) {
        const int il = ty * kMicro + r, i = i0 + il;
        const bool off = mask && masked(s, i, j);
        const float P = off ? 0.f : expf(s.scale * S[r][c] - Ls[il]);
        const float z = off ? 0.f : dropout_factor(s, b, h, i, j);
        dS[r] = P * (dP[r][c] * z - Ds[il]);
      }
      *reinterpret_cast<float4*>(dSts + (tx + kTx * c) * kLdP + ty * kMicro) = make_float4(dS[0], dS[1], dS[2], dS[3]);
    }
    __syncthreads();

#pragma unroll 4
    for (int jj = 0; jj < kFwdBc; ++jj) {  // dQ_i += dS_ij K_j (tau at the end)
      const float4 ds = lds4(dSts + jj * kLdP + ty * kMicro);
      float kc[Cols::kN];
      Cols::load(Ks + jj * kLd, tx, kc);
#pragma unroll
      for (int e = 0; e < Cols::kN; ++e) {
        acc[0][e] = fmaf(ds.x, kc[e], acc[0][e]);
        acc[1][e] = fmaf(ds.y, kc[e], acc[1][e]);
        acc[2][e] = fmaf(ds.z, kc[e], acc[2][e]);
        acc[3][e] = fmaf(ds.w, kc[e], acc[3][e]);
      }
    }
  }

#pragma unroll
  for (int r = 0; r < kMicro; ++r) {  // line 16
    const int i = i0 + ty * kMicro + r;
    if (i >= s.q_len) continue;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) dq[(q_base + i) * D + Cols::col(tx, e)] = s.scale * acc[r][e];
  }
}

// ---- host side ------------------------------------------------------------------------------------------
Shape shape_of(const fa::Problem& p) {
  Shape s;
  s.heads = p.heads, s.kv_heads = p.kv_heads, s.group = p.group();  // kv head of h = h / group = p.kv_head_of(h)
  s.q_len = p.q_len, s.kv_len = p.kv_len, s.causal = p.causal ? 1 : 0;
  s.scale = p.softmax_scale(), s.dropout_p = p.dropout_p, s.inv_keep = 1.f / (1.f - p.dropout_p);
  s.threshold = fa::dropout_threshold(p.dropout_p);
  s.seed = p.seed, s.offset = p.offset;
  return s;
}

void check_problem(const fa::Problem& p, std::initializer_list<const void*> ptrs) {
  check_supported(p);
  for (const void* ptr : ptrs)
    if (reinterpret_cast<uintptr_t>(ptr) % 16 != 0)
      throw fa::UsageError("fa2: tensors must be 16-byte aligned (the kernels load float4)");
}

int blocks(int n, int tile) { return (n + tile - 1) / tile; }

template <class Kernel>
void set_smem(Kernel kernel, size_t bytes) {
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)));
}

template <int D>
void forward_d(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse) {
  constexpr size_t kSmem = sizeof(float) * ((kFwdBr + kFwdBc) * (D + kPad) + kFwdBc * D + kFwdBc * (kFwdBr + kPad));
  set_smem(forward_kernel<D>, kSmem);
  const dim3 grid(blocks(p.q_len, kFwdBr), p.heads, p.batch);
  forward_kernel<D><<<grid, kThreads, kSmem>>>(shape_of(p), q, k, v, o, lse);
  CHECK_LAUNCH();
}

template <int D>
void backward_d(const fa::Problem& p, const float* q, const float* k, const float* v, const float* lse,
                const float* dout, const float* Dv, float* dq, float* dk, float* dv, DqMode mode) {
  const Shape s = shape_of(p);
  constexpr size_t kSmemKv =
      sizeof(float) * (2 * (kBwdBc + kBwdBr) * (D + kPad) + 2 * kBwdBr * (kBwdBc + kPad) + 2 * kBwdBr);
  const dim3 grid_kv(blocks(p.kv_len, kBwdBc), p.kv_heads, p.batch);
  if (mode == DqMode::Atomic) {
    CUDA_CHECK(cudaMemsetAsync(dq, 0, p.q_elems() * sizeof(float)));
    set_smem(backward_kv_kernel<D, true>, kSmemKv);
    backward_kv_kernel<D, true><<<grid_kv, kThreads, kSmemKv>>>(s, q, k, v, lse, dout, Dv, dq, dk, dv);
    CHECK_LAUNCH();
    return;
  }
  set_smem(backward_kv_kernel<D, false>, kSmemKv);
  backward_kv_kernel<D, false><<<grid_kv, kThreads, kSmemKv>>>(s, q, k, v, lse, dout, Dv, dq, dk, dv);
  CHECK_LAUNCH();
  constexpr size_t kSmemQ =
      sizeof(float) * (2 * (kFwdBr + kFwdBc) * (D + kPad) + kFwdBc * (kFwdBr + kPad) + 2 * kFwdBr);
  set_smem(backward_dq_kernel<D>, kSmemQ);
  const dim3 grid_q(blocks(p.q_len, kFwdBr), p.heads, p.batch);
  backward_dq_kernel<D><<<grid_q, kThreads, kSmemQ>>>(s, q, k, v, lse, dout, Dv, dq);
  CHECK_LAUNCH();
}

}  // namespace

void check_supported(const fa::Problem& p) {
  p.validate();
  if (p.head_dim != 16 && p.head_dim != 32 && p.head_dim != 64 && p.head_dim != 128)
    throw fa::UsageError("fa2: head_dim must be 16, 32, 64 or 128 (got " + std::to_string(p.head_dim) + ")");
  if (p.heads > 65535 || p.batch > 65535)
    throw fa::UsageError("fa2: heads and batch must be <= 65535 (grid dimensions y and z)");
}

Tiles forward_tiles() { return {kFwdBr, kFwdBc}; }
Tiles backward_tiles() { return {kBwdBr, kBwdBc}; }

void forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse) {
  check_problem(p, {q, k, v, o});
  switch (p.head_dim) {
    case 16: return forward_d<16>(p, q, k, v, o, lse);
    case 32: return forward_d<32>(p, q, k, v, o, lse);
    case 64: return forward_d<64>(p, q, k, v, o, lse);
    default: return forward_d<128>(p, q, k, v, o, lse);
  }
}

size_t backward_workspace_bytes(const fa::Problem& p) { return p.lse_elems() * sizeof(float); }

void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* o, const float* lse,
              const float* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace) {
  check_problem(p, {q, k, v, o, dout, dq, dk, dv});
  float* Dv = static_cast<float*>(workspace);
  const size_t rows = p.lse_elems();
  rowsum_do_o_kernel<<<unsigned((rows + kWarpsPerBlock - 1) / kWarpsPerBlock), kThreads>>>(o, dout, Dv, rows,
                                                                                          p.head_dim);
  CHECK_LAUNCH();
  switch (p.head_dim) {
    case 16: return backward_d<16>(p, q, k, v, lse, dout, Dv, dq, dk, dv, mode);
    case 32: return backward_d<32>(p, q, k, v, lse, dout, Dv, dq, dk, dv, mode);
    case 64: return backward_d<64>(p, q, k, v, lse, dout, Dv, dq, dk, dv, mode);
    default: return backward_d<128>(p, q, k, v, lse, dout, Dv, dq, dk, dv, mode);
  }
}

}  // namespace fa2
