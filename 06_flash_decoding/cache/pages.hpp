// The paged copy of a K/V cache, as vLLM and FlashInfer users have it: which page of the pool holds which pages of
// each sequence. Plain C++, shared by the device cache (cache_host.cuh) and the CPU emulation's tests.
#pragma once
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "problem.hpp"
#include "random.hpp"

namespace fdec {

struct PageTable {
  int page_size = 0, pages_per_seq = 0, num_pages = 0;
  std::vector<int> used;   // [B]: ceil(n_b / page_size) pages of sequence b hold keys
  std::vector<int> table;  // [B, pages_per_seq]: the pool page of each; -1 past a sequence's last page
  size_t page_elems(const fa::Problem& p) const { return size_t(p.kv_heads) * page_size * p.head_dim; }
};
// Each sequence's pages in a pool of all of them, in a shuffled order (seed), so the block table is a real
// indirection. One spare page keeps the pool non-empty. page: a size check_page_size admits.
inline PageTable page_table(const fa::Problem& p, const std::vector<int>& lens, int page, uint64_t seed) {
  PageTable t;
  t.page_size = page, t.pages_per_seq = (p.kv_len + page - 1) / page;
  t.used.resize(p.batch);
  for (int b = 0; b < p.batch; ++b) t.used[b] = (lens[b] + page - 1) / page;
  t.num_pages = std::max(1, std::accumulate(t.used.begin(), t.used.end(), 0));
  std::vector<int> ids(t.num_pages);
  std::iota(ids.begin(), ids.end(), 0);
  fa::Rng rng(seed);
  for (int i = t.num_pages - 1; i > 0; --i) std::swap(ids[i], ids[rng.next() % uint64_t(i + 1)]);
  t.table.assign(size_t(p.batch) * t.pages_per_seq, -1);
  int next = 0;
  for (int b = 0; b < p.batch; ++b)
    for (int pg = 0; pg < t.used[b]; ++pg) t.table[size_t(b) * t.pages_per_seq + pg] = ids[next++];
  return t;
}

}  // namespace fdec
