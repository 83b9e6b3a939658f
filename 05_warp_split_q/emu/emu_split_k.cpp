// The kernel file split_k.cu compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../split_k.cu"
