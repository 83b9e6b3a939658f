// The kernel file v8_two_row_tiles.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../v8_two_row_tiles.cu"
