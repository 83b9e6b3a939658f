// Step 11's quantisation pass (FP8.md): bf16 Q, K, V -> e4m3 bytes and scales. One block of 128
// threads per 128-row block of one (batch, head) plane; thread r owns row r of the block (its d values in registers:
// the Hadamard rotation needs the whole row):
//   load:     the block's 128 x d bf16 tile copied into shared memory by all threads in 16-byte pieces (consecutive
//             threads, consecutive addresses: coalesced), then each thread reads its own row from there (rows
//             padded by 16 bytes: the eight threads of one 16-byte access hit eight different bank groups);
//             rotated if asked (signs from a bit mask the block computes once, fast Walsh-Hadamard transform,
//             1 / sqrt(d): fp8.hpp rotate_row_with)
//   amax:     the row's largest |x|, then the block's: a warp shuffle per warp and four values in shared memory
//   write:    scale s = amax / 448, the row's e4m3 bytes x / s (the hardware's cvt, four at a time) staged in shared
//             memory and written out by all threads in 16-byte pieces again, and s
// Per-block scales (the default) take one kernel per tensor, one read of it. Per-tensor scales take two: amax_kernel
// writes each block's maximum, write_kernel reads them all and uses the largest.
// V is written transposed (row c of Vt is column c of V, keys along it: the K-major B operand that e4m3 wgmma needs)
// and with each 16-key group in key_at's order (P's registers are then A fragments as they are): thread r writes its
// bytes down column pos(r) of the d x 128 shared tile, and the tile's rows leave as 128-byte runs of Vt.
// Every computation is fp8.hpp's, so the bytes equal fp8_model.hpp's quantise() (test_05_fp8_gpu checks it).
//
// What made the first version ten times slower than the memory allows: each thread read its row two bytes at a
// time (a warp's load touched 32 rows 256 bytes apart), converted V with the software e4m3_bits, recomputed the
// random signs (two 64-bit multiplies each) for every element, and read every tensor twice.
#include <algorithm>

#include "cuda_check.cuh"
#include "hopper/fp8.cuh"
#include "lowp.cuh"

namespace wsq::fp8 {
namespace {

constexpr int kThreads = kBlockRows;  // one thread per row of a block
constexpr int kWarps = kThreads / 32;
constexpr int kPad = 16;              // bytes after each row of a shared tile
enum class Out { rows, transposed };  // Q8, K8: rows padded to 128 bytes; Vt8: V transposed, keys permuted

template <int D>
struct Smem {
  static constexpr int in_stride = 2 * D + kPad;           // a bf16 row of the input tile
  static constexpr int rows_stride = kRowBytes + kPad;     // an e4m3 row of Q8 / K8
  static constexpr int vt_stride = kBlockRows + kPad;      // a row of Vt: 128 keys
  static constexpr int bytes = std::max(kBlockRows * in_stride, std::max(kBlockRows * rows_stride, D * vt_stride));
};

template <int D>
struct SharedState {
  alignas(16) unsigned char buf[Smem<D>::bytes];  // the input tile, then the output tile
  uint32_t signs[D / 32];                         // bit c: D's entry c is -1
  float warp_max[kWarps];
};

struct MaskSigns {
  const uint32_t* bits;
  __device__ bool operator()(int c) const { return (bits[c / 32] >> (c % 32)) & 1u; }
};

// Row threadIdx.x of block `tile` into y (rows past len: zeros), rotated if asked. Ends with the block's
// __syncthreads; the caller must sync again before it writes into s.buf.
template <int D>
__device__ void load_row(const __nv_bfloat16* x, int plane, int len, int tile, bool rotate, uint64_t seed,
                         SharedState<D>& s, float (&y)[D]) {
  constexpr int kChunks = 2 * D / 16;  // 16-byte pieces of a bf16 row
  if (rotate && threadIdx.x < D) {     // the signs, once per block: D / 32 whole warps
    const uint32_t bits = __ballot_sync(0xffffffffu, sign_flip(seed, threadIdx.x));
    if (threadIdx.x % 32 == 0) s.signs[threadIdx.x / 32] = bits;
  }
  const int row0 = tile * kBlockRows;
  const uint4* src = reinterpret_cast<const uint4*>(x + (size_t(plane) * len + row0) * D);
  #pragma unroll
  for (int i = 0; i < kChunks; ++i) {  // piece `chunk` of the tile: row chunk / kChunks, bytes 16 (chunk % kChunks)
    const int chunk = threadIdx.x + i * kThreads, r = chunk / kChunks, c = chunk % kChunks;
    const uint4 v = row0 + r < len ? src[chunk] : make_uint4(0u, 0u, 0u, 0u);
    *reinterpret_cast<uint4*>(s.buf + r * Smem<D>::in_stride + 16 * c) = v;
  }
  __syncthreads();
  const unsigned char* mine = s.buf + threadIdx.x * Smem<D>::in_stride;
  #pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    const uint4 v = *reinterpret_cast<const uint4*>(mine + 16 * c);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
    #pragma unroll
    for (int j = 0; j < 4; ++j) {  // two bf16 a word, the lower first; bf16 -> float is exact
      y[8 * c + 2 * j] = __uint_as_float(w[j] << 16);
      y[8 * c + 2 * j + 1] = __uint_as_float(w[j] & 0xFFFF0000u);
    }
  }
  if (rotate) rotate_row_with<D>(y, MaskSigns{s.signs});
}

template <int D>
__device__ float row_amax(const float (&y)[D]) {
  float a = 0.f;
  #pragma unroll
  for (int c = 0; c < D; ++c) a = fmaxf(a, fabsf(y[c]));
  return a;
}

// The largest a of the block (a >= 0; max is exact, so the order does not matter). Has a __syncthreads.
template <int D>
__device__ float block_max(float a, SharedState<D>& s) {
  #pragma unroll
  for (int o = 16; o > 0; o /= 2) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, o));
  if (threadIdx.x % 32 == 0) s.warp_max[threadIdx.x / 32] = a;
  __syncthreads();
  a = s.warp_max[0];
  #pragma unroll
  for (int w = 1; w < kWarps; ++w) a = fmaxf(a, s.warp_max[w]);
  return a;
}

template <int D>
__global__ void __launch_bounds__(kThreads) amax_kernel(const __nv_bfloat16* __restrict__ x, int len, bool rotate,
                                                        uint64_t seed, float* __restrict__ amax) {
  __shared__ SharedState<D> s;
  float y[D];
  load_row<D>(x, blockIdx.y, len, blockIdx.x, rotate, seed, s, y);
  const float a = block_max<D>(row_amax<D>(y), s);
  if (threadIdx.x == 0) amax[blockIdx.y * gridDim.x + blockIdx.x] = a;
}

// per_tensor: the scale from the largest of amax[0 .. n_blocks); else from this block's own rows.
template <int D, Out kOut>
__global__ void __launch_bounds__(kThreads) write_kernel(const __nv_bfloat16* __restrict__ x, int len, bool rotate,
                                                         uint64_t seed, bool per_tensor, int n_blocks,
                                                         const float* __restrict__ amax, uint8_t* __restrict__ out,
                                                         float* __restrict__ scale) {
  __shared__ SharedState<D> s;
  const int plane = blockIdx.y, tile = blockIdx.x, row0 = tile * kBlockRows;
  float y[D];
  load_row<D>(x, plane, len, tile, rotate, seed, s, y);
  float a;
  if (per_tensor) {
    float m = 0.f;
    for (int i = threadIdx.x; i < n_blocks; i += kThreads) m = fmaxf(m, amax[i]);
    a = block_max<D>(m, s);
  } else {
    a = block_max<D>(row_amax<D>(y), s);
  }
  // block_max's __syncthreads also means every thread has read its row out of s.buf: the output may go there.
  const float sc = scale_of(a), inv = 1.f / sc;
  if (threadIdx.x == 0) scale[plane * gridDim.x + tile] = sc;
  if constexpr (kOut == Out::rows) {
    unsigned char* mine = s.buf + threadIdx.x * Smem<D>::rows_stride;
    #pragma unroll
    for (int c = 0; c < kRowBytes; c += 16) {  // the pad (c >= D) written as zeros
      uint32_t w[4];
      #pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int e = c + 4 * j;
        w[j] = e < D ? pack4_e4m3(y[e] * inv, y[e + 1] * inv, y[e + 2] * inv, y[e + 3] * inv) : 0u;
      }
      *reinterpret_cast<uint4*>(mine + c) = make_uint4(w[0], w[1], w[2], w[3]);
    }
    __syncthreads();
    constexpr int kChunks = kRowBytes / 16;  // 16-byte pieces of an e4m3 row
    uint8_t* dst = out + (size_t(plane) * len + row0) * kRowBytes;  // the block's rows are contiguous
    #pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int chunk = threadIdx.x + i * kThreads, r = chunk / kChunks, c = chunk % kChunks;
      if (row0 + r < len)
        *reinterpret_cast<uint4*>(dst + size_t(chunk) * 16) =
            *reinterpret_cast<const uint4*>(s.buf + r * Smem<D>::rows_stride + 16 * c);
    }
  } else {
    // Key row0 + r goes to position pos of its 16-key group, where key_at(pos) == r (rows past len: zeros, which
    // load_row gave them). The inverse of key_at within a group: key 8a + 2t + b sits at 4t + 2a + b.
    const int r = threadIdx.x, k = r % 16, pos = (r / 16) * 16 + 4 * ((k % 8) / 2) + 2 * (k / 8) + k % 2;
    #pragma unroll
    for (int c = 0; c < D; c += 4) {
      const uint32_t w = pack4_e4m3(y[c] * inv, y[c + 1] * inv, y[c + 2] * inv, y[c + 3] * inv);
      #pragma unroll
      for (int i = 0; i < 4; ++i) s.buf[(c + i) * Smem<D>::vt_stride + pos] = uint8_t(w >> (8 * i));
    }
    __syncthreads();
    constexpr int kChunks = kBlockRows / 16;  // 16-byte pieces of a 128-key row of Vt
    const int padded = gridDim.x * kBlockRows;
    #pragma unroll
    for (int i = 0; i < D * kChunks / kThreads; ++i) {
      const int chunk = threadIdx.x + i * kThreads, c = chunk / kChunks, part = chunk % kChunks;
      *reinterpret_cast<uint4*>(out + (size_t(plane) * D + c) * padded + row0 + 16 * part) =
          *reinterpret_cast<const uint4*>(s.buf + c * Smem<D>::vt_stride + 16 * part);
    }
  }
}

template <int D>
void quantise_d(const fa::Problem& p, const Options& o, const fa::bfloat16_t* q, const fa::bfloat16_t* k,
                const fa::bfloat16_t* v, Tensors& out) {
  const bool per_tensor = o.scaling == Scaling::tensor;
  auto one = [&](const fa::bfloat16_t* x, int planes, int len, bool rotate, uint8_t* bytes, float* scale, auto kind) {
    const dim3 grid(tiles(len), planes);
    const auto* xc = reinterpret_cast<const __nv_bfloat16*>(x);
    if (per_tensor) {
      amax_kernel<D><<<grid, kThreads>>>(xc, len, rotate, o.seed, out.amax.get());
      CHECK_LAUNCH();
    }
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
