// The kernel file v6_exp2.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v6_exp2.cu"
