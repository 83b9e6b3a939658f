// The backward file bwd_v4_exp2.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../bwd_v4_exp2.cu"
