// The backward file bwd_dq.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../bwd_dq.cu"
