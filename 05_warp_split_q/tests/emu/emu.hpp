// The CPU emulation of the chapter's sm_80 kernels (steps 1-8, block-sparse, and through emu_bwd.hpp the backward):
// common/emu_warp.hpp (every GPU thread a cooperative context, barriers, shuffles, ldmatrix, mma.sync and cp.async by
// the PTX ISA's rules) with the host's 16-bit types (emu_common.hpp) and the chapter's launch below, which runs the
// grid's blocks one after another.
//
// This header replaces ptx.cuh and launch.cuh (their include guards are defined here) and must be included
// before a kernel file.
#pragma once
#define WSQ_LAUNCH_CUH

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "emu_common.hpp"
#include "emu_warp.hpp"
#include "frag.hpp"
#include "problem.hpp"

struct alignas(16) uint4 {
  uint32_t x, y, z, w;
};
inline uint4 make_uint4(uint32_t x, uint32_t y, uint32_t z, uint32_t w) { return {x, y, z, w}; }

namespace wsq {
using namespace fa::tc;  // the emulated instructions, where forward/tc.cuh finds ptx.cuh's on the GPU
// The kernels' `extern __shared__ unsigned char smem[]` is this array (each kernel file is compiled in its own
// translation unit, with its own copy); blocks run one after another, so one buffer serves them all.
namespace {
alignas(16) unsigned char smem[232 * 1024];

template <class Tc>
using Kernel = void (*)(fa::Problem, const Tc*, const Tc*, const Tc*, Tc*, float*);

// Runs the grid: blocks one after another, each with `threads` GPU threads.
template <class T>
void launch(Kernel<T> kernel, int Br, int threads, size_t smem_bytes, const fa::Problem& p, const T* q, const T* k,
            const T* v, T* o, float* lse) {
  if (smem_bytes > sizeof(smem) || threads > 32 * emu::kMaxWarps || threads % 32)
    throw std::runtime_error("emulated launch: too much shared memory or bad block size");
  const int gx = (p.q_len + Br - 1) / Br;
  for (int bz = 0; bz < p.batch; ++bz)
    for (int by = 0; by < p.heads; ++by)
      for (int bx = 0; bx < gx; ++bx) {
        std::memset(smem, 0xA5, smem_bytes);  // garbage, like real shared memory
        for (auto& g : emu::committed) g.clear();
        for (auto& g : emu::open_group) g.clear();
        static const fa::Problem* pp;
        static Kernel<T> kk;
        static const T *qq, *kp, *vv;
        static T* oo;
        static float* ll;
        pp = &p, kk = kernel, qq = q, kp = k, vv = v, oo = o, ll = lse;
        emu::body = [] { kk(*pp, qq, kp, vv, oo, ll); };
        emu::run_block(threads, {unsigned(bx), unsigned(by), unsigned(bz)});
      }
}

template <class Tc>
using MaskedKernel = void (*)(fa::Problem, const Tc*, const Tc*, const Tc*, Tc*, float*, const uint8_t*);

// launch.cuh's launch_masked: the same grid, a kernel that also takes a block mask.
template <class T>
void launch_masked(MaskedKernel<T> kernel, int Br, int threads, size_t smem_bytes, const fa::Problem& p, const T* q,
                   const T* k, const T* v, T* o, float* lse, const uint8_t* block_mask) {
  static MaskedKernel<T> mk;
  static const uint8_t* mm;
  static Kernel<T> adapter;
  mk = kernel, mm = block_mask;
  adapter = [](fa::Problem pp, const T* qq, const T* kp, const T* vv, T* oo, float* ll) { mk(pp, qq, kp, vv, oo, ll, mm); };
  launch<T>(adapter, Br, threads, smem_bytes, p, q, k, v, o, lse);
}

}  // namespace

}  // namespace wsq
