// The backward file backward.cu compiled for the CPU emulation (emu_bwd.hpp).
#include "emu_bwd.hpp"
#include "../backward.cu"
