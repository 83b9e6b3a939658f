// The backward file bwd_v2_regs.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../bwd_v2_regs.cu"
