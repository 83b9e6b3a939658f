// The kernel file v9_wgmma_tma.cu compiled for the CPU emulation of the Hopper steps (emu_sm90.hpp).
#include "emu_sm90.hpp"
#include "../v9_wgmma_tma.cu"
