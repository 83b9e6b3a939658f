// The CPU emulation of chapter 06's kernels: common/emu_warp.hpp (every GPU thread a cooperative context, barriers,
// shuffles, ldmatrix, mma.sync and cp.async by the PTX ISA's rules) with CUDA's own 16-bit types (their host
// halves: the conversions the kernels call work on the CPU too), and what the steps write out in PTX or launch
// (steps/async_ptx.cuh, steps/cluster_ptx.cuh, steps/ready.cuh, whose include guards are defined here): the K/V
// copies become emulated cp.async (the L2 policy is a hint and changes no value), the arrival count a plain add
// (blocks run one after another; atomicXor likewise), a launch runs the grid's blocks one after another in the order
// x, then y, then z.
// A cluster launch (steps/ready.cuh's launch_cluster_kernel, steps/cluster_ptx.cuh's PTX) runs the clusters one
// after another and a cluster's blocks together, their threads interleaved in lockstep, each block with shared
// memory of its own (NaN at the start: a read before the peer's store gives NaN), the cluster barrier a barrier of
// all the cluster's threads, and a peer's shared memory read through the cluster's window; a block that has exited
// leaves NaN behind (a read after the owner left gives NaN).
// "Device memory" is host memory: the test passes host pointers where the GPU program passes device ones.
//
// Include it first; then, in each translation unit that compiles a step file, FDEC_EMU_SHARED_MEMORY(namespace) before
// the step file: it defines the step's `extern __shared__` array (each step file in its own translation unit).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "emu_warp.hpp"
#include "plan.hpp"
#define FDEC_ASYNC_PTX_CUH
#define FDEC_CLUSTER_PTX_CUH
#define FDEC_READY_CUH

template <>
struct emu::IsHalf<__half> : std::true_type {};

inline float __ldcg(const float* p) { return *p; }
inline int atomicAdd(int* p, int x) {  // one OS thread: nothing runs in between
  const int old = *p;
  *p = old + x;
  return old;
}
inline unsigned atomicXor(unsigned* p, unsigned x) {
  const unsigned old = *p;
  *p = old ^ x;
  return old;
}

namespace fdec {

// steps/async_ptx.cuh
struct KvPolicy {
  bool evict_first;
  uint64_t first;
};
inline KvPolicy kv_policy(bool evict_first) { return {evict_first, 0}; }
inline void cp_async16(void* dst, const void* src, bool valid, KvPolicy) { fa::tc::cp_async_16(dst, src, valid); }
inline void cp_async_commit() { fa::tc::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  fa::tc::cp_async_wait<N>();
}
inline int atomic_add_acq_rel(int* p, int x) { return atomicAdd(p, x); }

// merge.cuh's counters: zeroed once, left at zero by every launch, as on the GPU.
inline int* merge_counters(size_t n) {
  static std::vector<int> counters;
  if (counters.size() < n) counters.assign(n, 0);
  return counters.data();
}

constexpr size_t kEmuSharedBytes = 232 * 1024;  // sm_90's most per block

namespace {  // each translation unit (one step file) has its own

unsigned char* step_shared = nullptr;  // the step's `extern __shared__` array (FDEC_EMU_SHARED_MEMORY)

// steps/ready.cuh
template <auto Kernel, int Bytes>
auto ready() {
  static_assert(size_t(Bytes) <= kEmuSharedBytes, "more shared memory than any GPU gives a block");
  return Kernel;
}
template <auto Kernel, int Bytes>
int occupancy() {
  return 1;
}
// The grid's blocks one after another, each with kThreads GPU threads and its shared memory filled with garbage, as
// real shared memory is, and no cp.async left over from the block before.
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, int smem_bytes, Args... args) {
  if (smem_bytes > 0 && !step_shared) throw std::logic_error("emulated launch: FDEC_EMU_SHARED_MEMORY missing");
  static void (*k)(Params...);
  static std::tuple<Args...> arguments;
  k = kernel, arguments = std::tuple<Args...>(args...);
  emu::body = [] { std::apply(k, arguments); };
  emu::grid_dim = {grid.x, grid.y, grid.z};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        if (smem_bytes > 0) std::memset(step_shared, 0xA5, size_t(smem_bytes));
        for (auto& g : emu::committed) g.clear();
        for (auto& g : emu::open_group) g.clear();
        emu::run_block(kThreads, {x, y, z});
      }
}

// Clusters (steps/ready.cuh's cluster functions): every GPU has them here. The emulation holds the blocks of one
// cluster at a time.
inline bool cluster_launch_supported() { return true; }
inline void require_cluster_launch(const std::string&) {}
template <auto Kernel, int Bytes>
int cluster_occupancy(int) {
  return 1;
}

// The running cluster's blocks' shared memory: the running block's is the step's `extern __shared__` array itself
// (the kernel's own code addresses it), every other block's is kept in `images` and swapped in when one of its
// threads runs (emu::on_block_switch).
std::vector<std::vector<unsigned char>> images;  // per block of the cluster (rank)
std::vector<bool> exited;                        // per block: its threads have all returned
size_t cluster_smem_bytes = 0;
inline void switch_shared(int from, int to) {
  if (!exited[from]) std::memcpy(images[from].data(), step_shared, cluster_smem_bytes);
  std::memcpy(step_shared, images[to].data(), cluster_smem_bytes);
}
inline void block_exit(int b) {  // its shared memory is gone: NaN for whoever reads it after this
  exited[b] = true;
  std::fill(images[b].begin(), images[b].end(), 0xFF);
}

// The clusters of (1, cluster_y, 1) one after another (x, then y / cluster_y, then z); each one's blocks together.
template <class... Params, class... Args>
void launch_cluster_kernel(void (*kernel)(Params...), dim3 grid, int cluster_y, int smem_bytes, Args... args) {
  if (!step_shared) throw std::logic_error("emulated cluster launch: FDEC_EMU_SHARED_MEMORY missing");
  if (cluster_y < 1 || cluster_y > emu::kMaxClusterBlocks || grid.y % unsigned(cluster_y) != 0)
    throw std::logic_error("emulated cluster launch: grid.y must be a multiple of the cluster's 1 .. 8 blocks");
  static void (*k)(Params...);
  static std::tuple<Args...> arguments;
  k = kernel, arguments = std::tuple<Args...>(args...);
  emu::body = [] { std::apply(k, arguments); };
  emu::grid_dim = {grid.x, grid.y, grid.z};
  emu::on_block_switch = switch_shared, emu::on_block_exit = block_exit;
  cluster_smem_bytes = size_t(smem_bytes);
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y0 = 0; y0 < grid.y; y0 += unsigned(cluster_y))
      for (unsigned x = 0; x < grid.x; ++x) {
        images.assign(size_t(cluster_y), std::vector<unsigned char>(cluster_smem_bytes, 0xFF));  // NaN floats
        exited.assign(size_t(cluster_y), false);
        std::memcpy(step_shared, images[0].data(), cluster_smem_bytes);
        for (auto& g : emu::committed) g.clear();
        for (auto& g : emu::open_group) g.clear();
        std::vector<dim3_> blocks;
        for (int r = 0; r < cluster_y; ++r) blocks.push_back({x, y0 + unsigned(r), z});
        emu::run_blocks(kThreads, blocks);
      }
  emu::on_block_switch = nullptr, emu::on_block_exit = nullptr;
}

// steps/cluster_ptx.cuh. A block's rank: its place among the blocks run together. The barrier: lockstep, the
// arrive is where a thread would let the others pass, the wait hands over to the next thread of the cluster (the
// last one's wait finds every thread arrived and lets thread 0 of block 0 on). Addresses in the cluster's window:
// the rank in the top byte, the offset in the block's shared memory below.
inline unsigned cluster_rank() { return unsigned(emu::block_of(emu::current)); }
std::vector<int> arrivals;  // per thread of the cluster: cluster barriers arrived at and not yet waited for
inline void cluster_arrive() {
  arrivals.resize(size_t(emu::n_threads));
  ++arrivals[size_t(emu::current)];
}
inline void cluster_wait() {
  if (arrivals.size() != size_t(emu::n_threads) || arrivals[size_t(emu::current)] != 1)
    throw std::logic_error("emulated barrier.cluster.wait without one arrive before it");
  emu::cluster_barrier();
  --arrivals[size_t(emu::current)];
}
inline uint32_t cluster_map(const void* p, unsigned rank) {
  const size_t offset = size_t(static_cast<const unsigned char*>(p) - step_shared);
  if (offset >= cluster_smem_bytes || rank >= images.size())
    throw std::logic_error("emulated mapa: not this block's shared memory, or no such block in the cluster");
  return uint32_t(rank) << 24 | uint32_t(offset);
}
inline float cluster_load(uint32_t addr) {
  const int rank = int(addr >> 24);  // the running block's own shared memory is step_shared, the others' their image
  const unsigned char* base = rank == emu::block_of(emu::current) ? step_shared : images[size_t(rank)].data();
  float v;
  std::memcpy(&v, base + (addr & 0xFFFFFF), 4);
  return v;
}

}  // namespace
}  // namespace fdec

#define FDEC_EMU_SHARED_MEMORY(step)                                                                  \
  namespace fdec::step {                                                                              \
  namespace {                                                                                         \
  alignas(16) float4 smem4[kEmuSharedBytes / sizeof(float4)];                                         \
  const bool smem4_bound = (step_shared = reinterpret_cast<unsigned char*>(smem4), true);             \
  }                                                                                                   \
  }
