// Chapter 00: standard attention (FA1 paper's Algorithm 0 forward, Algorithm 3 backward), fp32.
//
// Forward, three kernels, each a full round trip through HBM:
//   1. S = scale * Q K^T            batched_gemm    writes the Nq x Nk matrix S
//   2. P = softmax(mask(S)), L      softmax_rows    reads S, writes P (and P^drop = dropout(P)), L
//   3. O = P^drop V                     batched_gemm    reads P^drop
// Backward (Algorithm 3), five kernels:
//   dV = P^drop^T dO;  dP = (dO V^T) o Z/(1-p);  dS = P o (dP - D), D_i = rowsum(P_i o dP_i);
//   dQ = scale dS K;  dK = scale dS^T Q
// One tiled matrix-product kernel serves all five products (no cuBLAS: the chapter shows the whole
// computation). GQA: query head h reads kv head h / G, and dK, dV of a kv head sum over its G query
// heads. Because the G heads of a group are adjacent in memory, that sum is a single product whose
// inner dimension is G*Nq: dK = scale [dS_1; ...; dS_G]^T [Q_1; ...; Q_G].
#include "naive.cuh"

#include <cfloat>
#include <string>

#include "cuda_check.cuh"

namespace naive {
namespace {

// ---- batched_gemm -------------------------------------------------------------------------------
// C[z] = alpha * op(A[z / divA]) * op(B[z / divB]) for z in [0, batch); C[z] is M x N row-major.
// op(A)(m, k) = transA ? A[k * lda + m] : A[m * lda + k]   (likewise for B with (k, n)).
// Grid (ceil(N / kTile), ceil(M / kTile), batch); block kTile x kRowsPerPass threads. Each thread
// computes kTile / kRowsPerPass = 4 elements of one column of the kTile x kTile output tile.
// Shared memory: two kTile x (kTile + 1) float tiles = 8.4 KB (the +1 column avoids bank conflicts
// when a tile is read along its other dimension).
constexpr int kTile = 32;
constexpr int kRowsPerPass = 8;
static_assert(kTile % kRowsPerPass == 0, "a thread computes kTile / kRowsPerPass rows");

struct GemmArgs {
  int M, N, K;
  float alpha;
  const float* A;
  int lda;
  long long strideA;
  int divA;
  const float* B;
  int ldb;
  long long strideB;
  int divB;
  float* C;
  long long strideC;  // ldc = N
};

template <bool kTransA, bool kTransB>
__global__ void batched_gemm(GemmArgs g) {
  __shared__ float As[kTile][kTile + 1];  // As[m][k]
  __shared__ float Bs[kTile][kTile + 1];  // Bs[k][n]
  const int z = blockIdx.z;
  const float* A = g.A + (z / g.divA) * g.strideA;
  const float* B = g.B + (z / g.divB) * g.strideB;
  float* C = g.C + z * g.strideC;
  const int m0 = blockIdx.y * kTile, n0 = blockIdx.x * kTile;
  const int tx = threadIdx.x, ty = threadIdx.y;

  float acc[kTile / kRowsPerPass] = {};
  for (int k0 = 0; k0 < g.K; k0 += kTile) {
    // Load the tiles so that consecutive threads (tx) read consecutive addresses: along k for a
    // row-major A, along m for a transposed one.
    for (int r = ty; r < kTile; r += kRowsPerPass) {
      const int am = kTransA ? tx : r, ak = kTransA ? r : tx;
      const int gm = m0 + am, gk = k0 + ak;
      As[am][ak] = (gm < g.M && gk < g.K) ? (kTransA ? A[(long long)gk * g.lda + gm] : A[(long long)gm * g.lda + gk]) : 0.f;
      const int bk = kTransB ? tx : r, bn = kTransB ? r : tx;
      const int hk = k0 + bk, hn = n0 + bn;
      Bs[bk][bn] = (hk < g.K && hn < g.N) ? (kTransB ? B[(long long)hn * g.ldb + hk] : B[(long long)hk * g.ldb + hn]) : 0.f;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < kTile; ++kk) {
      const float b = Bs[kk][tx];
#pragma unroll
      for (int r = 0; r < kTile / kRowsPerPass; ++r) acc[r] += As[ty + r * kRowsPerPass][kk] * b;
    }
    __syncthreads();
  }
#pragma unroll
  for (int r = 0; r < kTile / kRowsPerPass; ++r) {
    const int m = m0 + ty + r * kRowsPerPass, n = n0 + tx;
    if (m < g.M && n < g.N) C[(long long)m * g.N + n] = g.alpha * acc[r];
  }
}

constexpr int kMaxGridYZ = 65535;  // CUDA's limit on gridDim.y and gridDim.z

template <bool kTransA, bool kTransB>
void gemm(const GemmArgs& g, int batch) {
  if (batch > kMaxGridYZ) throw fa::UsageError("naive: batch * heads must be <= 65535 (one grid z-slice each)");
  const long long tiles_m = (g.M + kTile - 1) / kTile;  // grid.y: M is q_len or kv_len
  if (tiles_m > kMaxGridYZ)
    throw fa::UsageError("naive: q_len and kv_len must be <= " + std::to_string(kMaxGridYZ * kTile) +
                         " (one grid row per " + std::to_string(kTile) + " rows of S)");
  const dim3 grid((g.N + kTile - 1) / kTile, unsigned(tiles_m), batch);
  batched_gemm<kTransA, kTransB><<<grid, dim3(kTile, kRowsPerPass)>>>(g);
  CHECK_LAUNCH();
}

// ---- row reductions -----------------------------------------------------------------------------
constexpr int kRowThreads = 256;  // one block per row of S; the row is strided over its threads
constexpr int kWarps = kRowThreads / 32;

// Reduce over the block with op; every thread gets the result. `red` holds kWarps floats.
template <class Op>
__device__ float block_reduce(float x, float* red, Op op) {
  for (int o = 16; o > 0; o /= 2) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
  __syncthreads();  // red may still be read by a previous reduction
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = x;
  __syncthreads();
  x = red[0];
  for (int w = 1; w < kWarps; ++w) x = op(x, red[w]);
  return x;
}
struct Max {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Row r of the [B*H*Nq, Nk] matrix belongs to head z = r / Nq (b = z / H, h = z % H), query i = r % Nq;
// it sees keys 0 .. visible - 1 (Problem::visible_keys: causal, bottom-right aligned).
struct RowInfo {
  int b, h, i, visible;
};
__device__ RowInfo row_info(const fa::Problem& p, long long r) {
  const int i = int(r % p.q_len);
  const int z = int(r / p.q_len);
  return {z / p.heads, z % p.heads, i, p.visible_keys(i)};
}

// softmax_rows: one block of kRowThreads per row. Three passes over the row in HBM (safe softmax):
// m = max_j S_ij;  l = sum_j exp(S_ij - m);  P_ij = exp(S_ij - m) / l, and P^drop_ij = P_ij Z_ij / (1-p).
// L_i = m + log l. A row with no visible key: P = 0, L = -inf.
__global__ void softmax_rows(fa::Problem p, const float* S, float* P, float* Pd, float* lse) {
  __shared__ float red[kWarps];
  const long long r = blockIdx.x;
  const RowInfo ri = row_info(p, r);
  const float* s = S + r * p.kv_len;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < ri.visible; j += kRowThreads) m = fmaxf(m, s[j]);
  m = block_reduce(m, red, Max());
  float l = 0.f;
  for (int j = threadIdx.x; j < ri.visible; j += kRowThreads) l += expf(s[j] - m);
  l = block_reduce(l, red, Sum());
  for (int j = threadIdx.x; j < p.kv_len; j += kRowThreads) {
    const float pij = j < ri.visible ? expf(s[j] - m) / l : 0.f;
    P[r * p.kv_len + j] = pij;
    if (Pd) Pd[r * p.kv_len + j] = pij * p.dropout_scale(ri.b, ri.h, ri.i, j);
  }
  if (threadIdx.x == 0) lse[r] = ri.visible > 0 ? m + logf(l) : -INFINITY;
}

// softmax_backward_rows: one block per row, dP overwritten in place by dS.
// dP_ij <- dP^drop_ij Z_ij / (1-p);  D_i = sum_j P_ij dP_ij;  dS_ij = P_ij (dP_ij - D_i).
// (D_i = rowsum(dO_i o O_i) too, as the README shows; here P and dP are at hand, so sum them.)
__global__ void softmax_backward_rows(fa::Problem p, const float* P, float* dP) {
  __shared__ float red[kWarps];
  const long long r = blockIdx.x;
  const RowInfo ri = row_info(p, r);
  const float* pr = P + r * p.kv_len;
  float* dpr = dP + r * p.kv_len;
  float D_i = 0.f;
  for (int j = threadIdx.x; j < p.kv_len; j += kRowThreads) D_i += pr[j] * dpr[j] * p.dropout_scale(ri.b, ri.h, ri.i, j);
  D_i = block_reduce(D_i, red, Sum());
  for (int j = threadIdx.x; j < p.kv_len; j += kRowThreads)
    dpr[j] = pr[j] * (dpr[j] * p.dropout_scale(ri.b, ri.h, ri.i, j) - D_i);
}

}  // namespace

size_t workspace_bytes(const fa::Problem& p, bool backward) {
  const size_t matrices = 2 + (p.dropout_p > 0.f) + (backward ? 1 : 0);  // S, P, [P^drop], [dP]
  return matrices * p.s_elems() * sizeof(float);
}

Workspace::Workspace(const fa::Problem& p, bool backward)
    : S(p.s_elems()), P(p.s_elems()), Pd(p.dropout_p > 0.f ? p.s_elems() : 0), dP(backward ? p.s_elems() : 0) {}

void softmax(const fa::Problem& p, const float* S, float* P, float* Pd, float* lse) {
  if (p.dropout_p > 0.f && !Pd) throw std::invalid_argument("naive::softmax: dropout needs a P^drop buffer");
  const long long rows = (long long)p.batch * p.heads * p.q_len;
  if (rows > 0x7FFFFFFFLL) throw fa::UsageError("naive: batch * heads * q_len must be < 2^31");
  softmax_rows<<<unsigned(rows), kRowThreads>>>(p, S, P, p.dropout_p > 0.f ? Pd : nullptr, lse);
  CHECK_LAUNCH();
}

void forward(const fa::Problem& p, const float* q, const float* k, const float* v, float* o, float* lse,
             Workspace& ws) {
  const int BH = p.batch * p.heads, G = p.group(), Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  const long long sq = (long long)Nq * d, sk = (long long)Nk * d, ss = (long long)Nq * Nk;
  // 1. S = scale * Q K^T   (M = Nq, N = Nk, K = d; K^T read as a transposed K)
  gemm<false, true>({Nq, Nk, d, p.softmax_scale(), q, d, sq, 1, k, d, sk, G, ws.S.get(), ss}, BH);
  // 2. P = softmax(mask(S)), P^drop = dropout(P), L
  softmax(p, ws.S.get(), ws.P.get(), ws.Pd.get(), lse);
  // 3. O = P^drop V            (M = Nq, N = d, K = Nk)
  const float* Pd = p.dropout_p > 0.f ? ws.Pd.get() : ws.P.get();
  gemm<false, false>({Nq, d, Nk, 1.f, Pd, Nk, ss, 1, v, d, sk, G, o, sq}, BH);
}

void backward(const fa::Problem& p, const float* q, const float* k, const float* v, const float* dout,
              Workspace& ws, float* dq, float* dk, float* dv) {
  if (!ws.dP.size()) throw std::invalid_argument("naive::backward: the workspace was made without backward");
  const int BH = p.batch * p.heads, BHkv = p.batch * p.kv_heads, G = p.group();
  const int Nq = p.q_len, Nk = p.kv_len, d = p.head_dim;
  const long long sq = (long long)Nq * d, sk = (long long)Nk * d, ss = (long long)Nq * Nk;
  const float scale = p.softmax_scale();
  const float* Pd = p.dropout_p > 0.f ? ws.Pd.get() : ws.P.get();
  // dV = P^drop^T dO, summed over the group: inner dimension G*Nq (M = Nk, N = d)
  gemm<true, false>({Nk, d, G * Nq, 1.f, Pd, Nk, G * ss, 1, dout, d, G * sq, 1, dv, sk}, BHkv);
  // dP^drop = dO V^T (M = Nq, N = Nk, K = d)
  gemm<false, true>({Nq, Nk, d, 1.f, dout, d, sq, 1, v, d, sk, G, ws.dP.get(), ss}, BH);
  // dS = P o (dP - D), in place
  softmax_backward_rows<<<unsigned((long long)BH * Nq), kRowThreads>>>(p, ws.P.get(), ws.dP.get());
  CHECK_LAUNCH();
  // dQ = scale dS K (M = Nq, N = d, K = Nk)
  gemm<false, false>({Nq, d, Nk, scale, ws.dP.get(), Nk, ss, 1, k, d, sk, G, dq, sq}, BH);
  // dK = scale dS^T Q, summed over the group (M = Nk, N = d, K = G*Nq)
  gemm<true, false>({Nk, d, G * Nq, scale, ws.dP.get(), Nk, G * ss, 1, q, d, G * sq, 1, dk, sk}, BHkv);
}

}  // namespace naive
