// Tensor-core peak of this GPU: the FLOP/s the products of chapter 05 reach when they have nothing else to do (no
// memory traffic, no softmax, no waiting): the ceilings of docs/roofline.md's tensor-core rows, measured here.
//   ./tensor_core_peak              mma.sync (every GPU), and wgmma on an sm_90 GPU; fp16 and bf16 operands
//   ./tensor_core_peak --reps 8192 --iters 20
// The mma.sync kernel: 4 warps per block, 8 blocks per SM; every warp issues 8 independent m16n8k16 products per
// round (8 accumulator chains hide the instruction's latency), operands in registers, never reloaded.
#include <cstdio>
#include <cstring>
#include <string>

#include "cuda_check.cuh"
#include "device.cuh"
#include "device_buffer.cuh"
#include "program.cuh"
#include "timer.cuh"

#include "forward/tc.cuh"
#include "tc_peak.cuh"

namespace wsq::peak {
namespace {

constexpr int kWarps = 4, kChains = 8;
constexpr double kFlopsPerMma = 2.0 * 16 * 8 * 16;

template <class T>
__global__ void __launch_bounds__(kWarps * 32) mma_sync_kernel(int reps, float* sink) {
  // Operands: the bits of small values of either type (their size does not change the speed; 0 could).
  const uint32_t a[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u ^ (threadIdx.x << 16)};
  const uint32_t b[2] = {0x3c003c00u, 0x3c003c00u ^ threadIdx.x};
  float d[kChains][4] = {};
  for (int r = 0; r < reps; ++r)
    #pragma unroll
    for (int c = 0; c < kChains; ++c) mma_16816<T>(d[c], a, b);
  float s = 0.f;
  #pragma unroll
  for (int c = 0; c < kChains; ++c) s += d[c][0] + d[c][1] + d[c][2] + d[c][3];
  if (s == -1.f) sink[0] = s;  // never true for these operands: keeps the products from being dead code
}

}  // namespace

double mma_sync(Type t, int blocks, int reps, float* sink) {
  if (t == Type::fp16) mma_sync_kernel<__half><<<blocks, kWarps * 32>>>(reps, sink);
  else mma_sync_kernel<__nv_bfloat16><<<blocks, kWarps * 32>>>(reps, sink);
  CHECK_LAUNCH();
  return kFlopsPerMma * kChains * reps * kWarps * double(blocks);
}

}  // namespace wsq::peak

namespace {

int parse_int(const char* flag, const char* value, int min) {
  char* end = nullptr;
  const long v = value ? std::strtol(value, &end, 10) : 0;
  if (!value || *end != '\0' || v < min || v > (1 << 24))
    throw fa::UsageError(std::string(flag) + " needs an integer from " + std::to_string(min) + " to 16777216");
  return int(v);
}

}  // namespace

int main(int argc, char** argv) try {
  int reps = 4096, iters = 10, warmup = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::printf(
          "tensor_core_peak: the FLOP/s of chapter 05's tensor-core products with nothing else to do (fp32\n"
          "accumulation; mma.sync m16n8k16 on every GPU, wgmma m64n128k16 on an sm_90 GPU of a build with them).\n"
          "  --reps N     product rounds per kernel launch [4096]\n"
          "  --iters N    timed launches, median reported [10]\n"
          "  --warmup N   untimed launches first [2]\n");
      return 0;
    }
    if (i + 1 >= argc) throw fa::UsageError("option " + a + " needs a value (see --help)");
    if (a == "--reps") reps = parse_int("--reps", argv[++i], 1);
    else if (a == "--iters") iters = parse_int("--iters", argv[++i], 1);
    else if (a == "--warmup") warmup = parse_int("--warmup", argv[++i], 0);
    else throw fa::UsageError("unknown option " + a + " (see --help)");
  }
  fa::require_gpu();
  const cudaDeviceProp& prop = fa::device_props();
  std::printf("gpu:     %s, %d SMs, compute capability %d.%d\n", prop.name, prop.multiProcessorCount, prop.major,
              prop.minor);
  fa::DeviceBuffer<float> sink(1);
  using wsq::peak::Type;
  std::printf("%-34s %-6s %10s %10s\n", "instruction", "dtype", "ms", "TFLOP/s");
  for (Type t : {Type::fp16, Type::bf16}) {
    const char* name = t == Type::fp16 ? "fp16" : "bf16";
    double flops = 0;
    const double ms_mma = fa::time_ms(
        [&] { flops = wsq::peak::mma_sync(t, 8 * prop.multiProcessorCount, reps, sink.get()); }, warmup, iters);
    std::printf("%-34s %-6s %10.3f %10.1f\n", "mma.sync.m16n8k16 (registers)", name, ms_mma, flops / ms_mma * 1e-9);
#if WSQ_HOPPER
    if (prop.major == 9 && prop.minor == 0) {
      const double ms_wg = fa::time_ms(
          [&] { flops = wsq::peak::wgmma(t, 2 * prop.multiProcessorCount, reps, sink.get()); }, warmup, iters);
      std::printf("%-34s %-6s %10.3f %10.1f\n", "wgmma.m64n128k16 (shared memory)", name, ms_wg, flops / ms_wg * 1e-9);
    }
#endif
  }
  CUDA_CHECK(cudaDeviceSynchronize());
  return 0;
} catch (...) {
  return fa::exit_code_of_current_exception();
}
