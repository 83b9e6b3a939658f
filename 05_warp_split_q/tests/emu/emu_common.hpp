// What both of the chapter's CPU emulations (emu.hpp for steps 1-8, emu_sm90.hpp for the Hopper steps) need
// besides their schedulers: common/emu_base.hpp (CUDA's keywords as nothing, the 16-bit values) and the host's
// 16-bit types as the kernels' types.
#pragma once
#include <cstdint>
#include <type_traits>

#include "dtype.hpp"
#include "emu_base.hpp"

namespace fa {  // the kernels' 16-bit type is the host's own here
template <class T>
struct CudaType {
  using type = T;
};
template <class T>
T* cuda_ptr(T* p) {
  return p;
}
}  // namespace fa

namespace wsq {
using emu::bits16;
using emu::value16;
using fa::tc::pack2;
using fa::tc::quad_max;
using fa::tc::quad_sum;
}  // namespace wsq
