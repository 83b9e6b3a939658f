// The ladder's registry and the chapter's limits.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "steps.hpp"
#include "warp_split_q.cuh"

namespace wsq {

// Every step takes fp16 and bf16 inputs (--dtype): its registry entry holds both instantiations of its host function.
constexpr const char* kDtypes = "fp16,bf16";

// The steps every GPU of sm_80 or newer runs.
static std::vector<ForwardStep> portable_steps() {
  constexpr fa::Arch sm80 = fa::Arch::sm80;
  return {
      {"split_k", "Part A: warps split K_j/V_j; m, l, O~ combined through shared memory",
       {forward_split_k<fa::half_t>, forward_split_k<fa::bfloat16_t>}, kDtypes, sm80},
      {"v1_mma", "Part A/B: warps split Q_i; mma.sync m16n8k16, plain shared loads",
       {forward_v1_mma<fa::half_t>, forward_v1_mma<fa::bfloat16_t>}, kDtypes, sm80},
      {"v2_ldmatrix", "ldmatrix x4 for Q, K, P; ldmatrix .trans for V",
       {forward_v2_ldmatrix<fa::half_t>, forward_v2_ldmatrix<fa::bfloat16_t>}, kDtypes, sm80},
      {"v3_swizzle", "XOR-swizzled shared tiles: no bank conflicts",
       {forward_v3_swizzle<fa::half_t>, forward_v3_swizzle<fa::bfloat16_t>}, kDtypes, sm80},
      {"v4_cp_async", "cp.async double-buffered K/V: load j+1 while computing j",
       {forward_v4_cp_async<fa::half_t>, forward_v4_cp_async<fa::bfloat16_t>}, kDtypes, sm80},
      {"v5_regs_p", "P stays in registers: C fragment of S = A fragment of P",
       {forward_v5_regs_p<fa::half_t>, forward_v5_regs_p<fa::bfloat16_t>}, kDtypes, sm80},
      {"v6_exp2", "exp2 with scale*log2(e) folded into one FMA",
       {forward_v6_exp2<fa::half_t>, forward_v6_exp2<fa::bfloat16_t>}, kDtypes, sm80},
      {"v7_tiles", "tile shapes per head_dim (Br = 128: 8 warps share each K/V tile)",
       {forward_v7_tiles<fa::half_t>, forward_v7_tiles<fa::bfloat16_t>}, kDtypes, sm80},
      {"v8_two_row_tiles", "32 rows per warp: each K/V fragment read from shared memory feeds two mma",
       {forward_v8_two_row_tiles<fa::half_t>, forward_v8_two_row_tiles<fa::bfloat16_t>}, kDtypes, sm80},
  };
}

// Steps 9 and 10, in a build with them (FA_HOPPER): sm_90a code, which runs on compute capability 9.0 alone (H100,
// H200; no PTX fallback).
static std::vector<ForwardStep> hopper_steps() {
#if WSQ_HOPPER
  constexpr fa::Arch sm90a = fa::Arch::sm90a;
  return {
      {"v9_wgmma_tma", "Hopper: wgmma from shared memory, TMA copies, a producer warp + 2 consumer warpgroups",
       {forward_v9_wgmma_tma<fa::half_t>, forward_v9_wgmma_tma<fa::bfloat16_t>}, kDtypes, sm90a},
      {"v10_pingpong", "Hopper: GEMMs of one warpgroup overlap the other's softmax (and its own next S)",
       {forward_v10_pingpong<fa::half_t>, forward_v10_pingpong<fa::bfloat16_t>}, kDtypes, sm90a},
  };
#else
  return {};
#endif
}

bool hopper_steps_built() { return !hopper_steps().empty(); }

namespace {
// The compute capability of the current GPU; 0.0 where there is none.
void gpu_capability(int& major, int& minor) {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // no GPU: leave no error behind for the program's own check
    major = minor = 0;
    return;
  }
  major = prop.major, minor = prop.minor;
}
}  // namespace

// The portable steps are listed on every machine (the CPU tests and --help run without a GPU); the Hopper steps
// only on a GPU that runs them.
const std::vector<ForwardStep>& forward_steps() {
  static const std::vector<ForwardStep> steps = [] {
    std::vector<ForwardStep> all = portable_steps();
    int major = 0, minor = 0;
    if (hopper_steps_built()) gpu_capability(major, minor);  // the CPU tests' builds have none: no GPU query
    for (const ForwardStep& s : hopper_steps())
      if (fa::arch_runs(s.arch, major, minor)) all.push_back(s);
    return all;
  }();
  return steps;
}

const ForwardStep& find_step(const std::string& name) {
  std::string names;
  for (const ForwardStep& s : forward_steps()) {
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

// ---- steps 11-19 (FP8) ----
static constexpr const char* kFp8StepNames[] = {"v11_fp8", "v12_fp8_lean", "v13_fp8_scales_ahead", "v14_fp8_persistent",
                                                "v15_fp8_three_warpgroups", "v16_fp8_row_sums",
                                                "v17_fp8_no_turns", "v18_fp8_tma_store",
                                                "v19_fp8_producer_coords"};
static constexpr const char* kFp8StepList =
    "v11_fp8, v12_fp8_lean, v13_fp8_scales_ahead, v14_fp8_persistent, v15_fp8_three_warpgroups, v16_fp8_row_sums, "
    "v17_fp8_no_turns, v18_fp8_tma_store, v19_fp8_producer_coords";

const std::vector<Fp8Step>& fp8_steps() {
  static const std::vector<Fp8Step> steps = [] {
    std::vector<Fp8Step> all;
#if WSQ_HOPPER
    int major = 0, minor = 0;
    gpu_capability(major, minor);
    if (fa::arch_runs(fa::Arch::sm90a, major, minor)) {
      all.push_back({kFp8StepNames[0], "FP8: e4m3 wgmma (k32) with block scales, Vt from the quantisation pass, P in e4m3",
                     forward_v11_fp8, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[1], "FP8, leaner softmax: scale and max in one FFMA, ex2.ftz, kPScale in the exponent, 3 K/V buffers",
                     forward_v12_fp8_lean, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[2], "FP8, the descales of K and V loaded one tile ahead: the products no longer wait for them",
                     forward_v13_fp8_scales_ahead, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[3], "FP8, persistent blocks: one per SM, the next Q block loaded while this one computes",
                     forward_v14_fp8_persistent, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[4], "FP8, three consumer warpgroups at d = 64 (Br = 192): a third warp a scheduler to feed the MUFU",
                     forward_v15_fp8_three_warpgroups, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[5], "FP8, the row sums l_i on the tensor cores: a column of ones after V in P V",
                     forward_v16_fp8_row_sums, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[6], "FP8, no turn barriers at d = 128 either: the tensor cores' order keeps the softmaxes apart",
                     forward_v17_fp8_no_turns, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[7], "FP8, O_i through shared memory and a TMA store: the warpgroup does not wait for its stores",
                     forward_v18_fp8_tma_store, "fp8", fa::Arch::sm90a});
      all.push_back({kFp8StepNames[8], "FP8, each item's Q block, head and batch from the producer: fewer integer divisions per item",
                     forward_v19_fp8_producer_coords, "fp8", fa::Arch::sm90a});
    }
#endif
    return all;
  }();
  return steps;
}

namespace {
std::vector<std::string> split_names(const std::string& list) {
  std::vector<std::string> names;
  for (size_t a = 0; a <= list.size();) {
    const size_t b = std::min(list.find(',', a), list.size());
    names.push_back(list.substr(a, b - a));
    a = b + 1;
  }
  return names;
}
}  // namespace

std::vector<Fp8Step> select_fp8_steps(const std::string& kernel) {
  const std::vector<Fp8Step>& steps = fp8_steps();
  if (steps.empty()) {
    int major = 0, minor = 0;
    gpu_capability(major, minor);
    const std::string gpu = major == 0 ? "no CUDA GPU here" : "this GPU is sm_" + std::to_string(10 * major + minor);
    throw fa::UsageError(std::string("the fp8 steps ") + kFp8StepList +
                         " (--dtype fp8, fp8_lab --gpu; e4m3 wgmma) need an sm_90 GPU (H100, H200) and a build with "
                         "the Hopper steps (FA_HOPPER): " + (hopper_steps_built() ? gpu : "this build has no Hopper steps"));
  }
  if (kernel == "all") return steps;
  std::vector<Fp8Step> chosen;
  for (const std::string& name : split_names(kernel)) {
    bool found = false;
    for (const Fp8Step& s : steps)
      if (name == s.name) chosen.push_back(s), found = true;
    if (!found)
      throw fa::UsageError("--dtype fp8: step '" + name + "' has no fp8 form; the fp8 steps: " + kFp8StepList);
  }
  return chosen;
}

void check_not_fp8_steps(const std::string& kernel) {
  for (const std::string& name : split_names(kernel))
    for (const char* fp8_name : kFp8StepNames)
      if (name == fp8_name)
        throw fa::UsageError(std::string(fp8_name) + " takes --dtype fp8 only (e4m3 inputs; FP8.md)");
}

}  // namespace wsq
