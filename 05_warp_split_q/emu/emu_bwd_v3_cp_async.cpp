// The backward file bwd_v3_cp_async.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../bwd_v3_cp_async.cu"
