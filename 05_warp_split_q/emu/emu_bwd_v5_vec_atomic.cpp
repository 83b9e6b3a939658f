// The backward file bwd_v5_vec_atomic.cu compiled for the CPU emulation (emu_bwd.hpp: no __CUDA_ARCH__, so the
// sm_80 path of its dQ atomics, two scalar adds).
#include "emu_bwd.hpp"
#include "../bwd_v5_vec_atomic.cu"
