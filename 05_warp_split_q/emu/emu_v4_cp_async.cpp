// The kernel file v4_cp_async.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v4_cp_async.cu"
