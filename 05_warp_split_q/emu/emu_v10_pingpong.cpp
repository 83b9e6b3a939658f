// The kernel file v10_pingpong.cu compiled for the CPU emulation of the Hopper steps (emu_sm90.hpp).
#include "emu_sm90.hpp"
#include "../v10_pingpong.cu"
