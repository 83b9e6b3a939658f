// Host API of the tensor-core peak benchmark (tc_peak.cu, tc_peak_sm90.cu): each function launches a kernel that
// does nothing but back-to-back products on operands already on chip, for `reps` rounds, and returns the FLOPs
// it performed (the caller times it).
#pragma once
#include <cstdint>

namespace wsq::peak {

enum class Type { fp16, bf16 };

// mma.sync m16n8k16, fp32 accumulation, register operands: blocks x 4 warps, 8 independent accumulators per warp.
double mma_sync(Type t, int blocks, int reps, float* sink);
// wgmma m64n128k16, fp32 accumulation, both operands from one shared-memory tile: blocks x 1 warpgroup. Built only
// with the Hopper steps (WSQ_HOPPER), runs only on an sm_90 GPU.
double wgmma(Type t, int blocks, int reps, float* sink);

}  // namespace wsq::peak
