// Chapter 06 host API: attention for decoding (q_len 1..8 new tokens against a long K/V cache), fp16/bf16 K/V,
// fp32 accumulation. Seeds: Flash-Decoding (split the keys across blocks, merge the partials by their LSE) and
// FlashDecoding++ (a unified max instead of the running max, with a fallback).
//
// Layouts (plan.hpp): Q, O [B, H, q_len, d] in the dtype; LSE [B, H, q_len] fp32 (natural log; -inf and O = 0 for a
// row that sees no key); K, V [B, Hkv, N, d] with N = p.kv_len the cache capacity, or, for the paged kernel, page
// pools [num_pages, Hkv, page_size, d] and a block table [B, pages_per_seq]; kv_lens [B] the context length of
// each batch entry (0 .. N). Causal (q_len > 1) is bottom-right relative to each entry's own length.
// Supported: head_dim 64 and 128 (anything else is a fa::UsageError naming these), q_len 1..8, page sizes that are
// powers of two from 16 to 256.
#pragma once
#include <string>
#include <vector>

#include "lowp.hpp"
#include "plan.hpp"
#include "problem.hpp"
#include "step.hpp"

namespace fdec {

// Throws fa::UsageError naming what this chapter supports (head_dim, q_len, grid limits).
void check_supported(const fa::Problem& p);

// The K/V cache as the kernels read it (device pointers).
struct Cache {
  const void* k = nullptr;  // [B, Hkv, N, d], or the K page pool [num_pages, Hkv, page_size, d]
  const void* v = nullptr;
  const int* kv_lens = nullptr;      // [B]
  const int* block_table = nullptr;  // paged only: [B, pages_per_seq], entries in 0 .. num_pages - 1
  int pages_per_seq = 0, page_size = 0;
};
// Throws fa::UsageError unless page_size is a power of two in 16 .. 256.
void check_page_size(int page_size);

// How a kernel will be launched for a problem: the split count (the heuristic's unless overridden) and the grid.
struct Launch {
  int splits = 1;                      // split_kv_even: its blocks (one per SM unless overridden; README §4.5)
  int row_bucket = 1, row_chunks = 1;  // rows per block (1, 4 or 16; 16 on tensor cores, 8 flat), blocks per unit
  long long blocks_unsplit = 0;        // batch x units x row chunks
  int sms = 0, blocks_per_sm = 0;      // the device's SMs and how many of these blocks one SM holds
  int max_splits = 1;                  // the largest split count worth trying for this max_len
  bool evict_first = false;            // the K/V stream's L2 policy: kv_evict_first_here (README §4.6)
};

// One step of the ladder as the host runs it: the `launch` of its fa::Step (common/step.hpp). What plan() and the
// program read about the step's kernel, one named property per field (a step sets the ones it turns on: its file
// under steps/ says which), and the step's host functions, which launch its kernel and size it.
struct Kernel {
  bool packed = false;       // the query heads of a kv group share one read of K/V (else one query head per block)
  bool splits = false;       // the keys are split across blocks (else one block walks them all, as FA2's grid does)
  bool unified = false;      // FlashDecoding++'s fixed phi instead of the running max, with the fallback
  bool paged = false;        // K/V come through a block table
  int stages = 1;            // K/V chunk buffers per warp: 2 = the next chunk is copied while this one is computed
  bool fused_merge = false;  // the last split block of a row chunk merges the partials: no merge kernel
  bool mma = false;          // S = Q K_j^T and P V_j on tensor cores (mma.sync), the block's rows padded to 16
  bool even = false;         // one block per SM, each taking an equal share of all the chunks; splits = blocks
  bool flat = false;         // mma with the keys as M and the rows as N (S^T = K_j Q^T): the rows padded to 8, not 16
  // forward() below, for this step: its kernel (and the merge kernel after it, where it has one).
  void (*forward)(const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o, float* lse,
                  const Launch& launch, float phi, float* workspace, int* fallbacks) = nullptr;
  // The shared memory one block of the step's kernel takes, and how many such blocks one SM holds (the occupancy
  // API, for plan(); call it only once the bytes fit the GPU), at head_dim and a row bucket (plan.hpp).
  int (*smem_bytes)(int head_dim, int row_bucket) = nullptr;
  int (*blocks_per_sm)(fa::Dtype t, int head_dim, int row_bucket) = nullptr;
};
// name (what --kernel selects, the `kernel` column of the results), idea, Kernel, dtypes "fp16,bf16", sm_80+.
using Step = fa::Step<Kernel>;

// The chapter's steps, in the order the README builds them up (steps/v01_fa2_grid.cu .. v10_flat_gemm.cu). Every loop
// (program, tests, sanitizer runs, --list-steps) goes over this one list.
const std::vector<Step>& kernels();
// The step called `name`; throws fa::UsageError listing the names.
const Step& kernel_named(const std::string& name);

// How `kernel` runs this problem. max_len: the longest context of the batch. splits_override > 0 forces that split
// count (kernels without splits always use 1). Queries the device (SM count, occupancy); throws fa::NotOnThisGpu
// (device.cuh) when the kernel's shared memory exceeds what this GPU gives one block (the double-buffered kernels at
// head_dim 128 need sm_80's or sm_90's 163+ KB): the program reports that kernel as skipped.
Launch plan(const Step& kernel, const fa::Problem& p, fa::Dtype t, int max_len, int splits_override);

// Device memory forward() needs with `splits` > 1: O_s [splits, B*H*q_len, d] and LSE_s [splits, B*H*q_len], fp32.
inline size_t workspace_floats(const fa::Problem& p, int splits) {
  return splits > 1 ? size_t(splits) * p.lse_elems() * (p.head_dim + 1) : 0;
}

// One decode step: O (dtype) and LSE (fp32). q, o: 16-bit device arrays of the dtype. fallbacks: a device int the
// unified-max kernel adds 1 to for every split block that fell back to the running max (other kernels leave it).
// The fused-merge kernels (split_kv_fused, split_kv_mma, split_kv_even) count arriving split blocks in counters the
// library owns (zeroed once, left at zero by every launch): one stream at a time.
void forward(const Step& kernel, const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache,
             void* o, float* lse, const Launch& launch, float phi, float* workspace, int* fallbacks);

// Whether a step streams K and V evict-first in L2 (README §4.6): plan.hpp's kv_evict_first for the step's K/V
// bytes at max_len and this GPU's L2. plan() asks it; pass the same to read_kv, so the ceiling reads as the kernels do.
bool kv_evict_first_here(const fa::Problem& p, int max_len);

// The ceiling: a read-only kernel that reads exactly the K and V rows a decode step must read (every visible key
// of every kv head, contiguous cache) and writes nothing but an unlikely sentinel. max_len: the longest context;
// sms: the device's SM count (the grid is sized to keep every SM busy); evict_first: the L2 policy of its loads,
// the kernels' (Launch::evict_first).
void read_kv(const fa::Problem& p, const Cache& cache, int max_len, int sms, bool evict_first, unsigned* sink);

// n elements of tensor `which` (plan.hpp's input_value(seed, which, index)), rounded to the dtype, on the device.
void fill_random(fa::Dtype t, size_t n, uint64_t seed, Tensor which, void* x);

}  // namespace fdec
