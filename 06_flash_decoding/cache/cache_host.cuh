// Host side of a decode step's inputs, shared by the program and the GPU tests: the 16-bit device tensors, the
// per-batch context lengths, and the paged copy of the cache (a page pool and a block table, as vLLM and
// FlashInfer users have them) built from the contiguous one.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "device_buffer.cuh"
#include "flash_decoding.cuh"
#include "pages.hpp"

namespace fdec {

// A 16-bit value of the dtype, widened exactly.
inline float widen(fa::Dtype t, uint16_t bits) {
  return t == fa::Dtype::fp16 ? fa::to_float(fa::half_t{bits}) : fa::to_float(fa::bfloat16_t{bits});
}
inline std::vector<float> widen(fa::Dtype t, const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = widen(t, x[i]);
  return y;
}
// Float values (already rounded to the dtype) as the dtype's 16-bit patterns, for upload.
inline std::vector<uint16_t> narrow(fa::Dtype t, const std::vector<float>& x) {
  std::vector<uint16_t> y(x.size());
  for (size_t i = 0; i < x.size(); ++i)
    y[i] = t == fa::Dtype::fp16 ? fa::from_float<fa::half_t>(x[i]).bits : fa::from_float<fa::bfloat16_t>(x[i]).bits;
  return y;
}

// The K/V cache on the device: contiguous [B, Hkv, N, d], and on request its paged copy.
struct DeviceCache {
  fa::DeviceBuffer<uint16_t> k, v;
  fa::DeviceBuffer<int> kv_lens;
  fa::DeviceBuffer<uint16_t> k_pages, v_pages;  // [num_pages, Hkv, page_size, d]
  fa::DeviceBuffer<int> block_table;            // [B, pages_per_seq]; -1 past a sequence's last page
  int pages_per_seq = 0, page_size = 0, num_pages = 0;

  Cache contiguous() const { return Cache{k.get(), v.get(), kv_lens.get(), nullptr, 0, 0}; }
  Cache paged() const {
    return Cache{k_pages.get(), v_pages.get(), kv_lens.get(), block_table.get(), pages_per_seq, page_size};
  }

  // Copies each sequence's pages into a pool in pages.hpp's shuffled order, so the block table is a real
  // indirection. The tail of a last page past n_b is zero and never read.
  void build_pages(const fa::Problem& p, const std::vector<int>& lens, int page, uint64_t seed) {
    check_page_size(page);
    const PageTable t = page_table(p, lens, page, seed);
    page_size = page, pages_per_seq = t.pages_per_seq, num_pages = t.num_pages;
    const size_t page_elems = t.page_elems(p);
    k_pages = fa::DeviceBuffer<uint16_t>(num_pages * page_elems);
    v_pages = fa::DeviceBuffer<uint16_t>(num_pages * page_elems);
    k_pages.zero(), v_pages.zero();
    for (int b = 0; b < p.batch; ++b)
      for (int pg = 0; pg < t.used[b]; ++pg) {
        const int id = t.table[size_t(b) * pages_per_seq + pg], rows = std::min(page, lens[b] - pg * page);
        // Hkv strided blocks of `rows` key rows: cache [b, hk, pg*page .. , :] -> pool [id, hk, 0 .., :]
        const size_t row_bytes = size_t(p.head_dim) * 2;
        for (auto [src, dst] : {std::pair{k.get(), k_pages.get()}, std::pair{v.get(), v_pages.get()}})
          CUDA_CHECK(cudaMemcpy2D(dst + id * page_elems, size_t(page) * row_bytes,
                                  src + p.kv_offset(b, 0) + size_t(pg) * page * p.head_dim, size_t(p.kv_len) * row_bytes,
                                  size_t(rows) * row_bytes, p.kv_heads, cudaMemcpyDeviceToDevice));
      }
    block_table = fa::DeviceBuffer<int>(t.table);
  }
};

}  // namespace fdec
