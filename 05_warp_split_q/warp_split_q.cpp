// The ladder's registry and the chapter's limits.
#include <string>

#include "steps.hpp"
#if WSQ_HOPPER
#include <cuda_runtime.h>
#endif
#include "warp_split_q.cuh"

namespace wsq {

// The steps every GPU of sm_80 or newer runs.
static std::vector<Step> portable_steps() {
  return {
      {"split_k", "Part A: warps split K_j/V_j; m, l, O~ combined through shared memory", forward_split_k<fa::half_t>,
       forward_split_k<fa::bfloat16_t>},
      {"v1_mma", "Part A/B: warps split Q_i; mma.sync m16n8k16, plain shared loads", forward_v1_mma<fa::half_t>,
       forward_v1_mma<fa::bfloat16_t>},
      {"v2_ldmatrix", "ldmatrix x4 for Q, K, P; ldmatrix .trans for V", forward_v2_ldmatrix<fa::half_t>,
       forward_v2_ldmatrix<fa::bfloat16_t>},
      {"v3_swizzle", "XOR-swizzled shared tiles: no bank conflicts", forward_v3_swizzle<fa::half_t>,
       forward_v3_swizzle<fa::bfloat16_t>},
      {"v4_cp_async", "cp.async double-buffered K/V: load j+1 while computing j", forward_v4_cp_async<fa::half_t>,
       forward_v4_cp_async<fa::bfloat16_t>},
      {"v5_regs_p", "P stays in registers: C fragment of S = A fragment of P", forward_v5_regs_p<fa::half_t>,
       forward_v5_regs_p<fa::bfloat16_t>},
      {"v6_exp2", "exp2 with scale*log2(e) folded into one FMA", forward_v6_exp2<fa::half_t>,
       forward_v6_exp2<fa::bfloat16_t>},
      {"v7_tiles", "tile shapes per head_dim (Br = 128: 8 warps share each K/V tile)", forward_v7_tiles<fa::half_t>,
       forward_v7_tiles<fa::bfloat16_t>},
      {"v8_two_row_tiles", "32 rows per warp: each K/V fragment read from shared memory feeds two mma",
       forward_v8_two_row_tiles<fa::half_t>, forward_v8_two_row_tiles<fa::bfloat16_t>},
  };
}

#if WSQ_HOPPER
namespace {
// Steps 9 and 10 run only on compute capability 9.0 (H100, H200): sm_90a code has no PTX fallback.
bool hopper_gpu() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // no GPU: leave no error behind for the program's own check
    return false;
  }
  return prop.major == 9 && prop.minor == 0;
}
}  // namespace
#endif

const std::vector<Step>& forward_steps() {
  static const std::vector<Step> steps = [] {
    std::vector<Step> all = portable_steps();
#if WSQ_HOPPER
    if (hopper_gpu()) {
      all.push_back({"v9_wgmma_tma", "Hopper: wgmma from shared memory, TMA copies, a producer warp + 2 consumer warpgroups",
                     forward_v9_wgmma_tma<fa::half_t>, forward_v9_wgmma_tma<fa::bfloat16_t>});
      all.push_back({"v10_pingpong", "Hopper: GEMMs of one warpgroup overlap the other's softmax (and its own next S)",
                     forward_v10_pingpong<fa::half_t>, forward_v10_pingpong<fa::bfloat16_t>});
    }
#endif
    return all;
  }();
  return steps;
}

const Step& find_step(const std::string& name) {
  std::string names;
  for (const Step& s : forward_steps()) {
    if (name == s.name) return s;
    names += std::string(names.empty() ? "" : ", ") + s.name;
  }
  std::string why;
  if (name.rfind("v9", 0) == 0 || name.rfind("v10", 0) == 0)
    why = " (steps 9 and 10 need a build with -DFA_HOPPER=ON, the default with nvcc >= 12.3, and an sm_90 GPU)";
  throw fa::UsageError("--kernel must be all or one of " + names + " (got '" + name + "')" + why);
}

void check_supported(const fa::Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    throw fa::UsageError("head_dim must be 64 or 128 in chapter 05 (got " + std::to_string(p.head_dim) + ")");
  if (p.dropout_p != 0.f)
    throw fa::UsageError("chapter 05 has no dropout (--dropout 0); chapters 02-04 show it, see the README");
  constexpr int kMaxGridYZ = 65535;  // heads -> gridDim.y, batch -> gridDim.z
  if (p.heads > kMaxGridYZ || p.batch > kMaxGridYZ)
    throw fa::UsageError("heads and batch must be <= 65535 (the grid's y and z limits)");
}

}  // namespace wsq
