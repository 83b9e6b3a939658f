// Chapter 05 calls common/'s tensor-core helpers by their short names: the PTX wrappers of ptx.cuh (namespace
// fa::tc: mma_16816, ldmatrix_x4, cp_async_16, pack2, ...) and the fragment maps of frag.hpp (fa::frag), seen from
// the chapter's namespace. The CPU emulation leaves ptx.cuh out: common/emu_warp.hpp declares the same functions in
// fa::tc (tests/emu/emu.hpp), tests/emu/emu_sm90.hpp its own in wsq, where the step files find them first.
#pragma once
#include "frag.hpp"
#include "ptx.cuh"

namespace fa::tc {}  // empty under the emulation
namespace wsq {
using namespace fa::tc;
namespace frag = fa::frag;
}  // namespace wsq
