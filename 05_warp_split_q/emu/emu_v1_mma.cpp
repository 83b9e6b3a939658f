// The kernel file v1_mma.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v1_mma.cu"
