// The kernel file v2_ldmatrix.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v2_ldmatrix.cu"
