// The kernel file v3_swizzle.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v3_swizzle.cu"
