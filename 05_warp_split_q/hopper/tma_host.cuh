// Host side of steps 9 and 10: the TMA "tensor map" of a Q, K or V tensor. The map tells the copy engine the
// tensor's shape and strides in global memory and the box one copy moves; the kernel then names a box by its
// coordinates. The driver function that builds it (cuTensorMapEncodeTiled) is fetched through the runtime, so
// the program needs no extra library at link time.
#ifndef WSQ_TMA_HOST_CUH  // a guard, not #pragma once: tests/emu/emu_sm90.hpp provides a CPU version of this header
#define WSQ_TMA_HOST_CUH
#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <stdexcept>
#include <string>
#include <type_traits>

#include "cuda_check.cuh"
#include "device.cuh"
#include "lowp.cuh"
#include "problem.hpp"
#include "sm90_layout.hpp"
#include "fp8.hpp"

namespace wsq::sm90 {

// Map of a [planes][rows][head_dim] 16-bit tensor (planes = batch x heads), read in boxes of kPanelCols columns x
// box_rows rows of one plane, written to shared memory with the 128-byte swizzle that the wgmma descriptors of
// wgmma.cuh expect. Rows past `rows` (a tail tile) arrive as zeros. A TMA store (step 18's O) reads a box laid out
// the same way, and writes none of the rows past `rows`.
template <class T>
CUtensorMap tensor_map(const T* base, int head_dim, int rows, int planes, int box_rows) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found));
    if (found != cudaDriverEntryPointSuccess || fn == nullptr)
      throw std::runtime_error("the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a CUDA 12+ driver)");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  constexpr CUtensorMapDataType kType =
      std::is_same_v<T, fa::half_t> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[3] = {cuuint64_t(head_dim), cuuint64_t(rows), cuuint64_t(planes)};
  const cuuint64_t strides[2] = {cuuint64_t(head_dim) * 2, cuuint64_t(rows) * head_dim * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {kPanelCols, cuuint32_t(box_rows), 1};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode(&map, kType, 3, const_cast<T*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    throw std::runtime_error("cuTensorMapEncodeTiled failed (CUresult " + std::to_string(int(r)) + ") for a [" +
                             std::to_string(planes) + "][" + std::to_string(rows) + "][" + std::to_string(head_dim) +
                             "] tensor");
  return map;
}

// The launch of steps 9 and 10: a kernel taking the three tensor maps, the problem and the outputs, with more
// than 48 KiB of dynamic shared memory (the per-kernel opt-in).
template <class Tc>
using TmaKernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, fa::Problem, Tc*, float*);
// Any sm_90a kernel: the shared-memory opt-in (`what` names it in the error), the launch, its check. The steps
// launch through launch_tma below; chapter 06's decode GEMM (gemm/flat_wgmma.cu) through this directly.
template <class... Params, class... Args>
void launch_sm90(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, const char* what,
                 Args... args) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, what);
  kernel<<<grid, threads, smem_bytes>>>(args...);
  CHECK_LAUNCH();
}
template <class Tc>
void launch_tma(TmaKernel<Tc> kernel, dim3 grid, int threads, size_t smem_bytes, const CUtensorMap& q,
                const CUtensorMap& k, const CUtensorMap& v, const fa::Problem& p, Tc* o, float* lse) {
  launch_sm90(kernel, grid, threads, smem_bytes, "this Hopper step", q, k, v, p, o, lse);
}

// The same, the blocks grouped in thread block clusters of (1, cluster_y, 1): blocks (x, y, z) with the same x, z
// and y / cluster_y form one cluster (grid.y a multiple of cluster_y), all resident at once on one GPC.
template <class... Params, class... Args>
void launch_sm90_cluster(void (*kernel)(Params...), dim3 grid, int cluster_y, int threads, size_t smem_bytes,
                         const char* what, Args... args) {
  fa::opt_in_shared_memory(reinterpret_cast<const void*>(kernel), smem_bytes, what);
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 1, cluster.val.clusterDim.y = unsigned(cluster_y), cluster.val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid, config.blockDim = dim3(unsigned(threads)), config.dynamicSmemBytes = smem_bytes;
  config.attrs = &cluster, config.numAttrs = 1;
  CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, args...));
  CHECK_LAUNCH();
}

// The SMs of this GPU: a persistent kernel (step 14) launches one block per SM.
inline int sm_count() {
  int n = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, fa::current_device()));
  return n;
}

// ---- step 11 (FP8): the same launch with the scales of the quantised tensors (hopper/fp8.hpp) as one more
// argument. ----
template <class Tc>
using TmaFp8Kernel = void (*)(CUtensorMap, CUtensorMap, CUtensorMap, fa::Problem, fp8::Scales, Tc*, float*);
template <class Tc>
void launch_tma_fp8(TmaFp8Kernel<Tc> kernel, dim3 grid, int threads, size_t smem_bytes, const CUtensorMap& q,
                    const CUtensorMap& k, const CUtensorMap& v, const fa::Problem& p, const fp8::Scales& scales, Tc* o,
                    float* lse) {
  launch_sm90(kernel, grid, threads, smem_bytes, "the FP8 step", q, k, v, p, scales, o, lse);
}

}  // namespace wsq::sm90
#endif  // WSQ_TMA_HOST_CUH
