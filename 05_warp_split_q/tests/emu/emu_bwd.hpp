// The CPU emulation (emu.hpp) extended to what the backward's files use besides the forward's: a generic grid
// launch for any kernel signature, dQ zeroing, the 16-bit -> fp32 widening, float2. It replaces bwd_launch.cuh
// (its guard is defined here) and must be included before a backward file.
#pragma once
#include "emu.hpp"
#define WSQ_BWD_LAUNCH_CUH

#include <functional>
#include <stdexcept>

struct float2 {
  float x, y;
};
inline float2 make_float2(float x, float y) { return {x, y}; }
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#include "backward/bwd_host.hpp"

namespace wsq {
namespace bwd {
namespace {
// The dQ kernel lives in namespace wsq::bwd, so its `extern __shared__ smem` names this array (the K/V-block
// kernels, in namespace wsq, name emu.hpp's).
alignas(16) unsigned char smem[232 * 1024];
}  // namespace

// Runs the grid: blocks one after another, each with `threads` GPU threads, shared memory filled with garbage.
template <class... Params, class... Args>
void launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem_bytes, Args... args) {
  if (smem_bytes > sizeof(smem) || threads > 32 * emu::kMaxWarps || threads % 32)
    throw std::runtime_error("emulated launch: too much shared memory or bad block size");
  static std::function<void()> run;  // emu::body is a plain function pointer: the call goes through this
  run = [=] { kernel(args...); };
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        std::memset(smem, 0xA5, smem_bytes);
        std::memset(::wsq::smem, 0xA5, smem_bytes);
        emu::body = [] { run(); };
        emu::run_block(threads, {bx, by, bz});
      }
}

inline void zero_floats(float* p, size_t n) { std::memset(p, 0, n * sizeof(float)); }

inline float widen(fa::half_t x) { return fa::to_float(x); }
inline float widen(fa::bfloat16_t x) { return fa::to_float(x); }

}  // namespace bwd
}  // namespace wsq
