// Step 11's quantisation pass (README section 7): bf16 Q, K, V -> e4m3 bytes and scales, in two kernels per
// tensor. One block per 128-row block of one (batch, head) plane, one thread per row (its d values in registers):
//   amax:     rotate the row if asked (signs, fast Walsh-Hadamard transform, 1/sqrt(d): fp8.hpp rotate_row), the
//             block's largest |x| by a shared-memory max
//   write:    scale s = amax / 448 (per tensor: the largest amax of every block), the row's e4m3 bytes x / s, and s
// V is written transposed (row c of Vt is column c of V, keys along it: the K-major B operand that e4m3 wgmma needs)
// and with each 16-key group in key_at's order (P's registers are then A fragments as they are). Every
// computation is fp8.hpp's, so the bytes equal fp8_model.hpp's quantise() (test_05_gpu checks it).
#include <algorithm>

#include "cuda_check.cuh"
#include "hopper/fp8.cuh"
#include "lowp.cuh"

namespace wsq::fp8 {
namespace {

constexpr int kThreads = kBlockRows;  // one thread per row of a block
enum class Out { rows, transposed };  // Q8, K8: rows padded to 128 bytes; Vt8: V transposed, keys permuted

template <int D>
__device__ void load_row(const __nv_bfloat16* x, int plane, int len, int row, bool rotate, uint64_t seed,
                         float (&y)[D]) {
  #pragma unroll
  for (int c = 0; c < D; ++c) y[c] = row < len ? __bfloat162float(x[(size_t(plane) * len + row) * D + c]) : 0.f;
  if (rotate) rotate_row<D>(y, seed);
}

template <int D>
__global__ void __launch_bounds__(kThreads) amax_kernel(const __nv_bfloat16* __restrict__ x, int len, bool rotate,
                                                        uint64_t seed, float* __restrict__ amax) {
  __shared__ unsigned int block_max;  // a non-negative float's bits order as the float does
  if (threadIdx.x == 0) block_max = 0;
  __syncthreads();
  float y[D];
  load_row<D>(x, blockIdx.y, len, blockIdx.x * kBlockRows + threadIdx.x, rotate, seed, y);
  float a = 0.f;
  #pragma unroll
  for (int c = 0; c < D; ++c) a = fmaxf(a, fabsf(y[c]));
  atomicMax(&block_max, __float_as_uint(a));
  __syncthreads();
  if (threadIdx.x == 0) amax[blockIdx.y * gridDim.x + blockIdx.x] = __uint_as_float(block_max);
}

template <int D, Out kOut>
__global__ void __launch_bounds__(kThreads) write_kernel(const __nv_bfloat16* __restrict__ x, int len, bool rotate,
                                                         uint64_t seed, bool per_tensor, int n_blocks,
                                                         const float* __restrict__ amax, uint8_t* __restrict__ out,
                                                         float* __restrict__ scale) {
  __shared__ unsigned int tensor_max;
  const int plane = blockIdx.y, tile = blockIdx.x, row = tile * kBlockRows + threadIdx.x;
  float a = amax[plane * gridDim.x + tile];
  if (per_tensor) {  // the largest of all n_blocks maxima of the tensor
    if (threadIdx.x == 0) tensor_max = 0;
    __syncthreads();
    float m = 0.f;
    for (int x = threadIdx.x; x < n_blocks; x += kThreads) m = fmaxf(m, amax[x]);
    atomicMax(&tensor_max, __float_as_uint(m));
    __syncthreads();
    a = __uint_as_float(tensor_max);
  }
  const float s = scale_of(a), inv = 1.f / s;
  if (threadIdx.x == 0) scale[plane * gridDim.x + tile] = s;
  float y[D];
  load_row<D>(x, plane, len, row, rotate, seed, y);
  if constexpr (kOut == Out::rows) {
    if (row >= len) return;
    uint8_t* o = out + (size_t(plane) * len + row) * kRowBytes;
    #pragma unroll
    for (int c = 0; c < kRowBytes; c += 4)  // the pad (c >= D) written as zeros
      *reinterpret_cast<uint32_t*>(o + c) =
          c < D ? pack4_e4m3(y[c] * inv, y[c + 1] * inv, y[c + 2] * inv, y[c + 3] * inv) : 0u;
  } else {
    // Key `row` goes to position pos of its 16-key group, where key_at(pos) == row (rows past len: zeros, which
    // load_row gave them). The inverse of key_at within a group: key 8a + 2t + b sits at 4t + 2a + b.
    const int k = row % 16, pos = (row / 16) * 16 + 4 * ((k % 8) / 2) + 2 * (k / 8) + k % 2;
    const int padded = gridDim.x * kBlockRows;
    #pragma unroll
    for (int c = 0; c < D; ++c) out[(size_t(plane) * D + c) * padded + pos] = e4m3_bits(y[c] * inv);
  }
}

template <int D>
void quantise_d(const fa::Problem& p, const Options& o, const fa::bfloat16_t* q, const fa::bfloat16_t* k,
                const fa::bfloat16_t* v, Tensors& out) {
  const bool per_tensor = o.scaling == Scaling::tensor;
  auto one = [&](const fa::bfloat16_t* x, int planes, int len, bool rotate, uint8_t* bytes, float* scale, auto kind) {
    const dim3 grid(tiles(len), planes);
    const auto* xc = reinterpret_cast<const __nv_bfloat16*>(x);
    amax_kernel<D><<<grid, kThreads>>>(xc, len, rotate, o.seed, out.amax.get());
    CHECK_LAUNCH();
    write_kernel<D, decltype(kind)::value><<<grid, kThreads>>>(xc, len, rotate, o.seed, per_tensor,
                                                               int(grid.x * grid.y), out.amax.get(), bytes, scale);
    CHECK_LAUNCH();
  };
  using Rows = std::integral_constant<Out, Out::rows>;
  using Transposed = std::integral_constant<Out, Out::transposed>;
  one(q, p.batch * p.heads, p.q_len, o.hadamard, out.q.get(), out.sq.get(), Rows{});
  one(k, p.batch * p.kv_heads, p.kv_len, o.hadamard, out.k.get(), out.sk.get(), Rows{});
  one(v, p.batch * p.kv_heads, p.kv_len, false, out.vt.get(), out.sv.get(), Transposed{});
}

}  // namespace

Tensors::Tensors(const fa::Problem& p)
    : q(size_t(p.batch) * p.heads * p.q_len * kRowBytes),
      k(size_t(p.batch) * p.kv_heads * p.kv_len * kRowBytes),
      vt(size_t(p.batch) * p.kv_heads * p.head_dim * padded_keys(p.kv_len)),
      sq(size_t(p.batch) * p.heads * tiles(p.q_len)),
      sk(size_t(p.batch) * p.kv_heads * tiles(p.kv_len)),
      sv(size_t(p.batch) * p.kv_heads * tiles(p.kv_len)),
      amax(std::max(sq.size(), sk.size())) {}

void quantise(const fa::Problem& p, const Options& o, const fa::bfloat16_t* q, const fa::bfloat16_t* k,
              const fa::bfloat16_t* v, Tensors& out) {
  if (p.head_dim == 64) quantise_d<64>(p, o, q, k, v, out);
  else quantise_d<128>(p, o, q, k, v, out);
}

}  // namespace wsq::fp8
