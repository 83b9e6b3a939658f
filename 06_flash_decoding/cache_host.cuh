// Host side of a decode step's inputs, shared by the program and the GPU tests: the 16-bit device tensors, the
// per-batch context lengths, and the paged copy of the cache (a page pool and a block table, as vLLM and
// FlashInfer users have them) built from the contiguous one.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "device_buffer.cuh"
#include "flash_decoding.cuh"
#include "random.hpp"

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

  // Copies each sequence's pages (ceil(n_b / page_size) of them) into a pool in a shuffled order (seed), so the block
  // table is a real indirection. The tail of a last page past n_b is zero and never read.
  void build_pages(const fa::Problem& p, const std::vector<int>& lens, int page, uint64_t seed) {
    check_page_size(page);
    page_size = page, pages_per_seq = (p.kv_len + page - 1) / page;
    std::vector<int> used(p.batch);
    for (int b = 0; b < p.batch; ++b) used[b] = (lens[b] + page - 1) / page;
    num_pages = std::max(1, std::accumulate(used.begin(), used.end(), 0));  // one spare page keeps the pool non-empty
    std::vector<int> ids(num_pages);
    std::iota(ids.begin(), ids.end(), 0);
    fa::Rng rng(seed);
    for (int i = num_pages - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % uint64_t(i + 1)]);
    std::vector<int> table(size_t(p.batch) * pages_per_seq, -1);
    const size_t page_elems = size_t(p.kv_heads) * page * p.head_dim;
    k_pages = fa::DeviceBuffer<uint16_t>(num_pages * page_elems);
    v_pages = fa::DeviceBuffer<uint16_t>(num_pages * page_elems);
    k_pages.zero(), v_pages.zero();
    int next = 0;
    for (int b = 0; b < p.batch; ++b)
      for (int pg = 0; pg < used[b]; ++pg) {
        const int id = ids[next++], rows = std::min(page, lens[b] - pg * page);
        table[size_t(b) * pages_per_seq + pg] = id;
        // Hkv strided blocks of `rows` key rows: cache [b, hk, pg*page .. , :] -> pool [id, hk, 0 .., :]
        const size_t row_bytes = size_t(p.head_dim) * 2;
        for (auto [src, dst] : {std::pair{k.get(), k_pages.get()}, std::pair{v.get(), v_pages.get()}})
          CUDA_CHECK(cudaMemcpy2D(dst + id * page_elems, size_t(page) * row_bytes,
                                  src + p.kv_offset(b, 0) + size_t(pg) * page * p.head_dim, size_t(p.kv_len) * row_bytes,
                                  size_t(rows) * row_bytes, p.kv_heads, cudaMemcpyDeviceToDevice));
      }
    block_table = fa::DeviceBuffer<int>(table);
  }
};

}  // namespace fdec
