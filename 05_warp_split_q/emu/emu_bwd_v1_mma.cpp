// The backward file bwd_v1_mma.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../bwd_v1_mma.cu"
