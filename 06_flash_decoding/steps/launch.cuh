// The host side every step file shares: the compiled configurations (dtype x head_dim, row bucket) as compile-time
// constants, the kernel's Args from forward()'s arguments, the split grid, and (ready.cuh) the launch itself. Only
// host code: the kernels are the step files' own.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "block.cuh"
#include "flash_decoding.cuh"
#include "ready.cuh"

namespace fdec {

template <class T>
struct Tag {
  using type = T;
};
template <int N>
using Int = std::integral_constant<int, N>;

// f(Tag<T>{}, Int<D>{}) for the dtype and head_dim (check_supported admits 64 and 128 alone).
template <class F>
void with_dtype_dim(fa::Dtype t, int d, F&& f) {
  auto dim = [&](auto tag) {
    if (d == 64) f(tag, Int<64>{});
    else f(tag, Int<128>{});
  };
  if (t == fa::Dtype::fp16) dim(Tag<__half>{});
  else dim(Tag<__nv_bfloat16>{});
}
// f(Tag<T>{}, Int<D>{}, Int<R>{}) for the dtype, head_dim and plan.hpp's row bucket: 1, 4 or 16 rows per block.
template <class F>
void with_config(fa::Dtype t, int d, int bucket, F&& f) {
  with_dtype_dim(t, d, [&](auto tag, auto dim) {
    if (bucket == 1) f(tag, dim, Int<1>{});
    else if (bucket == 4) f(tag, dim, Int<4>{});
    else f(tag, dim, Int<kMaxRows>{});
  });
}

// The kernel's arguments for forward()'s: packed or one head per unit (plan.hpp's Rows), the workspace cut into
// O_s [splits, B*H*q_len, d] and LSE_s [splits, B*H*q_len]. What only some steps use stays zero here: the block
// table (v09 sets it), the fused merge's counters (v05 - v07).
template <class T>
Args<T> make_args(const fa::Problem& p, bool packed, const void* q, const Cache& cache, void* o, float* lse,
                  const Launch& launch, float phi, float* workspace, int* fallbacks) {
  Args<T> a{};
  a.p = p;
  a.rows = rows_of(p, packed);
  a.splits = launch.splits;
  a.phi = phi;
  a.q = static_cast<const T*>(q);
  a.k = static_cast<const T*>(cache.k);
  a.v = static_cast<const T*>(cache.v);
  a.kv_lens = cache.kv_lens;
  a.o = static_cast<T*>(o);
  a.lse = lse;
  a.ws_o = workspace;
  a.ws_lse = workspace ? workspace + size_t(launch.splits) * p.lse_elems() * p.head_dim : nullptr;
  a.fallbacks = fallbacks;
  a.q_rows = p.lse_elems();
  a.evict_first = launch.evict_first;
  return a;
}

// The grid of the split steps: (splits, row chunks, batch entries x units).
inline dim3 split_grid(const fa::Problem& p, bool packed, const Launch& launch) {
  return dim3(launch.splits, launch.row_chunks, p.batch * units_of(p, packed));
}

}  // namespace fdec
