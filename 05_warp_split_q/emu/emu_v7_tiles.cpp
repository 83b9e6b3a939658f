// The kernel file v7_tiles.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v7_tiles.cu"
