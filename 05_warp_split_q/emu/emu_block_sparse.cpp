// The kernel file block_sparse.cu (step 8 with a block mask) compiled for the CPU emulation (emu.hpp).
#include "emu.hpp"
#include "../block_sparse.cu"
