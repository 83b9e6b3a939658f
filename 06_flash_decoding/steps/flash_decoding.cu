// Chapter 06's host side: the ladder's registry (one row per step; the kernels are steps/v01_fa2_grid.cu ..
// v10_flat_gemm.cu, one complete kernel per file), the planner (row bucket, split count, L2 policy, occupancy) and
// forward(), which checks a launch and hands it to the step. README §1-§6 derive the steps; `--list-steps` prints
// this list.
#include "flash_decoding.cuh"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <string>

#include "device.cuh"
#include "device_buffer.cuh"
#include "model.hpp"
#include "plan.hpp"
#include "steps/steps.hpp"

namespace fdec {

const std::vector<Step>& kernels() {
  // name (--kernel, the `kernel` column of the results), the idea it adds, the step's Kernel (its file's kernel():
  // the properties it turns on, one per line, and its host functions), dtypes, GPUs.
  static const std::vector<Step> list = {
      {"fa2_grid",
       "FA2's grid at decode time: one block per (query head, batch), walking all N keys",
       v01_fa2_grid::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv",
       "Flash-Decoding: the keys split across blocks, partials merged by LSE; one query head per block",
       v02_split_kv::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv_gqa",
       "split_kv with the query heads of a kv group packed into one block: K/V read once per group",
       v03_split_kv_gqa::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv_pipelined",
       "split_kv_gqa with two K/V buffers per warp: the next chunk is copied while this one is computed",
       v04_split_kv_pipelined::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv_fused",
       "split_kv_pipelined whose last block per row chunk merges the splits: no second kernel launch",
       v05_split_kv_fused::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv_mma",
       "split_kv_fused with S = Q K^T and P V on tensor cores (mma.sync), the rows padded to a 16-row tile",
       v06_split_kv_mma::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"split_kv_even",
       "split_kv_mma with the keys of all kv groups dealt evenly to one block per SM, a block crossing groups",
       v07_split_kv_even::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"unified_max",
       "split_kv_gqa with FlashDecoding++'s fixed phi instead of the running max, falling back when unsafe",
       v08_unified_max::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"paged",
       "split_kv_gqa reading K/V through a block table into a page pool",
       v09_paged::kernel(), "fp16,bf16", fa::Arch::sm80},
      {"flat_gemm",
       "split_kv_mma with FlashDecoding++'s flat GEMM: keys as the mma's M, the rows padded to its N = 8, not 16",
       v10_flat_gemm::kernel(), "fp16,bf16", fa::Arch::sm80},
  };
  return list;
}

const Step& kernel_named(const std::string& name) {
  std::string names;
  for (const Step& k : kernels()) {
    if (name == k.name) return k;
    names += std::string(names.empty() ? "" : ", ") + k.name;
  }
  throw fa::UsageError("unknown kernel '" + name + "' (kernels: " + names + ", all)");
}

void check_supported(const fa::Problem& p) {
  if (p.head_dim != 64 && p.head_dim != 128)
    throw fa::UsageError("head_dim " + std::to_string(p.head_dim) + " is not supported here (supported: 64, 128)");
  if (p.q_len > kMaxQLen)
    throw fa::UsageError("q_len " + std::to_string(p.q_len) + " is not a decode step (supported: 1 .. " +
                         std::to_string(kMaxQLen) + ")");
  if (p.dropout_p != 0.f)
    throw fa::UsageError("decoding has no dropout (got --dropout " + std::to_string(p.dropout_p) + ")");
  if ((long long)p.batch * p.heads > 65535) throw fa::UsageError("batch x heads must be <= 65535 (the grid's z limit)");
}

void check_page_size(int page_size) {
  if (page_size < 16 || page_size > 256 || (page_size & (page_size - 1)))
    throw fa::UsageError("page size " + std::to_string(page_size) +
                         " is not supported (supported: 16, 32, 64, 128, 256)");
}

Launch plan(const Step& step, const fa::Problem& p, fa::Dtype t, int max_len, int splits_override) {
  const Kernel& kernel = step.launch;
  Launch l;
  const int rows = rows_of(p, kernel.packed).per_unit();
  l.row_bucket = row_bucket(rows, kernel.mma, kernel.flat), l.row_chunks = row_chunks(rows, l.row_bucket);
  l.blocks_unsplit = (long long)p.batch * units_of(p, kernel.packed) * l.row_chunks;
  l.sms = fa::device_props().multiProcessorCount;
  const int bytes = kernel.smem_bytes(p.head_dim, l.row_bucket);
  const int limit = int(fa::device_props().sharedMemPerBlockOptin);
  if (bytes > limit)
    throw fa::NotOnThisGpu(std::string(step.name) + " needs " + std::to_string(bytes) +
                             " bytes of shared memory per block at head_dim " + std::to_string(p.head_dim) +
                             "; this GPU allows " + std::to_string(limit) + " (sm_80 and sm_90 allow enough)");
  l.blocks_per_sm = kernel.blocks_per_sm(t, p.head_dim, l.row_bucket);
  l.max_splits = kernel.splits ? fdec_model::max_splits(max_len) : 1;
  // The slots are the SMs, not SMs x resident blocks (README §4): a second block on an SM shares that SM's bandwidth.
  // split_kv_even: splits counts its blocks, one per SM (README §4.5), or --splits of them; sweeps go to 2 per SM.
  if (kernel.even) l.max_splits = std::min(2 * l.sms, kMaxEvenBlocks);
  if (!kernel.splits) l.splits = 1;
  else if (splits_override > 0) l.splits = splits_override;
  else if (kernel.even) l.splits = std::min(l.sms, kMaxEvenBlocks);
  else l.splits = fdec_model::choose_splits(l.blocks_unsplit, max_len, l.sms);
  l.evict_first = kv_evict_first_here(p, max_len);
  return l;
}

void forward(const Step& step, const fa::Problem& p, fa::Dtype t, const void* q, const Cache& cache, void* o,
             float* lse, const Launch& launch, float phi, float* workspace, int* fallbacks) {
  const Kernel& kernel = step.launch;
  const int most = kernel.even ? kMaxEvenBlocks : kMaxSplits;
  if (launch.splits < 1 || launch.splits > most) throw fa::UsageError("splits must be in 1 .. " + std::to_string(most));
  if (launch.splits > 1 && !workspace)
    throw std::invalid_argument("forward: splits > 1 needs workspace_floats() floats");
  if (kernel.paged) check_page_size(cache.page_size);
  kernel.forward(p, t, q, cache, o, lse, launch, phi, workspace, fallbacks);
}

// merge.cuh: the fused merge's arrival counters, zeroed once per device and left at zero by every launch.
int* merge_counters(size_t n) {
  static std::map<int, fa::DeviceBuffer<int>> per_device;  // each device's own, in its own memory
  fa::DeviceBuffer<int>& counters = per_device[fa::current_device()];
  if (counters.size() < n) {
    counters = fa::DeviceBuffer<int>(n);
    counters.zero();
  }
  return counters.get();
}

bool kv_evict_first_here(const fa::Problem& p, int max_len) {
  return kv_evict_first(kv_step_bytes(p, max_len), double(fa::device_props().l2CacheSize));
}

}  // namespace fdec
