// The kernel file v5_regs_p.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v5_regs_p.cu"
