// Chapter 04, forward step 4 of 4 (= fa2::forward): step 3 with register micro-tiles and vector loads.
//
// Steps 1-3 keep 02's thread mapping: each thread owns Br/16 rows x 4 strided columns of S_ij and
// reads Q_i, K_j one float at a time from shared memory, P_ij one float at a time, V_j one float at a
// time; per FMA of S_ij it loads about one float. Here Br = Bc = 64 for every head_dim and each thread
// owns a 4 x 4 micro-tile of S_ij: four rows of Q_i and four rows of K_j arrive as float4s (16 FMAs
// per 8 loads of 16 bytes), P~_ij is stored transposed so the P~ V loop reads the 4 rows of a column
// as one float4, and each thread's d/16 columns of O~_i (OutCols) are read from V_j as float2/float4.
// Also: the mask is evaluated only on tiles that cross the diagonal or the end of the keys, and with a
// block mask (block-sparse attention, README §6) the K/V blocks it masks are skipped: never loaded, no FLOPs.
// The algorithm (FA2 Algorithm 1, deferred normalisation, grid over Q blocks) is step 3's.
#include "fa2_internal.cuh"
#include "fa2_tiles.cuh"

namespace fa2 {
namespace {

using namespace tile;

// ---- forward_kernel -----------------------------------------------------------------------------
// O_i, L_i for one Q block (FA2 Algorithm 1, lines 1-11 of the README). Grid (Tr, H, B), 256 threads.
// kSparse: block_mask holds the Tr x Tc bits of a fa::BlockMask on the device (block-sparse); the dense kernel
// (kSparse = false) is compiled without the test, so block sparsity costs dense attention nothing.
// Thread (ty, tx) owns rows ty*4..ty*4+3 of the block: S_ij columns tx + 16c (c < 4) and O columns
// OutCols<D>::col(tx, .), plus the row statistics m, l (replicated over the 16 lanes of a row).
// Shared memory (floats): Q_i [Br][D+4], K_j [Bc][D+4], V_j [Bc][D], P~_ij^T [Bc][Br+4]
//   = 68.6 KB at d = 64, 117.8 KB at d = 128 (dynamic, limit raised by cudaFuncSetAttribute).
template <int D, bool kSparse>
__global__ void __launch_bounds__(kThreads)
    forward_kernel(fa::Problem p, const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, float* __restrict__ o, float* __restrict__ lse,
                   const uint8_t* __restrict__ block_mask) {
  using Cols = OutCols<D>;
  constexpr int kLd = D + kPad, kLdP = kFwdBr + kPad;
  extern __shared__ float4 smem4[];
  float* Qs = reinterpret_cast<float*>(smem4);
  float* Ks = Qs + kFwdBr * kLd;
  float* Vs = Ks + kFwdBc * kLd;
  float* Pts = Vs + kFwdBc * D;  // P~_ij transposed: [key][query], so the P~ V loop reads 4 rows as one float4

  const int i0 = blockIdx.x * kFwdBr, h = blockIdx.y, b = blockIdx.z;  // line 1: one block per Q block
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  const float scale = p.softmax_scale();
  // Problem::dropout_scale(b, h, i, j) with its loop invariants (the keep threshold and 1/(1-p), an IEEE
  // division) computed once: nvcc does not hoist them out of the unrolled tile loops (ptxas -v: +40 registers).
  const uint32_t keep_threshold = p.dropout_threshold();
  const float keep_scale = 1.f / (1.f - p.dropout_p);
  auto dropout_scale = [&](int i, int j) {
    if (p.dropout_p == 0.f) return 1.f;
    return fa::dropout_keep(p.seed, p.offset, b, h, i, j, keep_threshold) ? keep_scale : 0.f;
  };
  const float* Q = q + p.q_offset(b, h);
  const float* K = k + p.kv_offset(b, p.kv_head_of(h));  // GQA: the kv head of query head h
  const float* V = v + p.kv_offset(b, p.kv_head_of(h));

  load_rows<D>(Qs, kLd, Q, i0, kFwdBr, p.q_len);  // line 2 (visible after the loop's first barrier)
  float m[kMicro], l[kMicro], acc[kMicro][Cols::kN];
#pragma unroll
  for (int r = 0; r < kMicro; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) acc[r][e] = 0.f;
  }

  const int kv_stop = kv_end(p, i0, kFwdBr);  // line 3: blocks past the diagonal are skipped
  for (int j0 = 0; j0 < kv_stop; j0 += kFwdBc) {
    if (kSparse && !fa::block_visible(block_mask, fa::mask_cols_of(p.kv_len), i0, j0)) continue;  // the same for the whole block
    __syncthreads();  // the previous iteration has finished reading K_j, V_j and P~_ij
    load_rows<D>(Ks, kLd, K, j0, kFwdBc, p.kv_len);  // line 4
    load_rows<D>(Vs, D, V, j0, kFwdBc, p.kv_len);
    __syncthreads();

    float S[kMicro][kMicro] = {};  // line 5: S_ij = scale Q_i K_j^T
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
    // The mask is evaluated only on tiles that cross the diagonal or the end of the keys.
    const bool mask = needs_mask(p, i0, j0, kFwdBc);
#pragma unroll
    for (int r = 0; r < kMicro; ++r)
#pragma unroll
      for (int c = 0; c < kMicro; ++c) {
        S[r][c] *= scale;
        if (mask && !p.visible(i0 + ty * kMicro + r, j0 + tx + kTx * c)) S[r][c] = -INFINITY;
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
    if (p.dropout_p > 0.f)
#pragma unroll
      for (int r = 0; r < kMicro; ++r)
#pragma unroll
        for (int c = 0; c < kMicro; ++c) S[r][c] *= dropout_scale(i0 + ty * kMicro + r, j0 + tx + kTx * c);
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
    if (i >= p.q_len) continue;
    const float inv_l = l[r] > 0.f ? 1.f / l[r] : 0.f;  // l = 0 only for a row that sees no key: O = 0
    float* Orow = o + p.q_offset(b, h) + size_t(i) * D;
#pragma unroll
    for (int e = 0; e < Cols::kN; ++e) Orow[Cols::col(tx, e)] = acc[r][e] * inv_l;
    if (tx == 0) lse[p.lse_offset(b, h) + i] = l[r] > 0.f ? m[r] + logf(l[r]) : -INFINITY;
  }
}

template <int D, bool kSparse>
void launch(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
            const uint8_t* block_mask) {
  constexpr size_t kSmem = sizeof(float) * ((kFwdBr + kFwdBc) * (D + kPad) + kFwdBc * D + kFwdBc * (kFwdBr + kPad));
  detail::allow_smem(forward_kernel<D, kSparse>, kSmem, D);
  const dim3 grid((p.q_len + kFwdBr - 1) / kFwdBr, p.heads, p.batch);
  forward_kernel<D, kSparse><<<grid, kThreads, kSmem>>>(p, q, k, v, o, lse, block_mask);
  CHECK_LAUNCH();
}
template <int D>
void launch(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
            const uint8_t* block_mask) {
  if (block_mask) launch<D, true>(p, q, k, v, o, lse, block_mask);
  else launch<D, false>(p, q, k, v, o, lse, nullptr);
}

}  // namespace

void forward_v4_micro_tile(const fa::Problem& p, const float* q, const float* k, const float* v, float* o,
                           float* lse, const uint8_t* block_mask) {
  detail::check_args(p, {q, k, v, o});
  switch (p.head_dim) {
    case 16: return launch<16>(p, q, k, v, o, lse, block_mask);
    case 32: return launch<32>(p, q, k, v, o, lse, block_mask);
    case 64: return launch<64>(p, q, k, v, o, lse, block_mask);
    default: return launch<128>(p, q, k, v, o, lse, block_mask);
  }
}

}  // namespace fa2
