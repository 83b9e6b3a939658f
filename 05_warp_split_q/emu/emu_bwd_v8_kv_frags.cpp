// The backward file bwd_v8_kv_frags.cu compiled for the CPU emulation (emu_bwd.hpp: no __CUDA_ARCH__, so the sm_80
// path of its dQ atomics, two scalar adds; 8 warps, emu.hpp's maximum).
#include "emu_bwd.hpp"
#include "../bwd_v8_kv_frags.cu"
