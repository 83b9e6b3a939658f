// The backward's registry, its tiles and workspace, D = rowsum(dO o O), and the host driver every step uses.
#include <string>

#include "bwd_common.cuh"
#include "bwd_steps.hpp"
#include "forward/warp_split_q.cuh"

namespace wsq {

namespace {
constexpr const char* kDtypes = "fp16,bf16";  // every step takes both (--dtype): both instantiations below

std::vector<BackwardStep> portable_steps() {
  constexpr fa::Arch sm80 = fa::Arch::sm80;
  return {
      {"bwd_v1_mma", "five GEMMs on tensor cores, ldmatrix(.trans) per operand; P^T, dS^T through shared memory",
       {backward_v1_mma<fa::half_t>, backward_v1_mma<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v2_regs", "P^T, dS^T stay in registers: C fragments reused as the A operands of dV and dK",
       {backward_v2_regs<fa::half_t>, backward_v2_regs<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v3_cp_async", "cp.async double buffer: the next Q_i, dO_i load while this tile computes",
       {backward_v3_cp_async<fa::half_t>, backward_v3_cp_async<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v4_exp2", "line 6 in fewer instructions: exp2 with tau*log2(e) in one FMA, the mask tested once per tile",
       {backward_v4_exp2<fa::half_t>, backward_v4_exp2<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v5_vec_atomic", "dQ's atomics on float2 (sm_90): half the atomic instructions, full 32-byte sectors",
       {backward_v5_vec_atomic<fa::half_t>, backward_v5_vec_atomic<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v6_bc128", "128 keys per block, 8 warps: each Q_i, dO_i load and dQ_i atomic pass serves twice the keys",
       {backward_v6_bc128<fa::half_t>, backward_v6_bc128<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v7_br64", "64 query rows per tile at d = 128 too: each K_j, V_j fragment load serves twice the mma",
       {backward_v7_br64<fa::half_t>, backward_v7_br64<fa::bfloat16_t>}, kDtypes, sm80},
      {"bwd_v8_kv_frags", "d = 64: K_j, V_j's line-5 fragments loaded once per block, held in registers",
       {backward_v8_kv_frags<fa::half_t>, backward_v8_kv_frags<fa::bfloat16_t>}, kDtypes, sm80},
  };
}

#if WSQ_HOPPER
template <class T>
using HopperKv = void (*)(const fa::Problem&, const T*, const T*, const T*, const float*, const T*, const float*,
                          float*, float*, float*, bool);

// A Hopper step's K/V-block kernel in the driver every step has: D = rowsum(dO o O) (and dq zeroed in the atomic
// mode), the K/V-block kernel (with dQ only in the atomic mode), then in the deterministic mode the dQ kernel.
template <class T, HopperKv<T> kv>
void hopper_step(const fa::Problem& p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                 const T* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace) {
  check_supported(p);
  float* Dv = static_cast<float*>(workspace);
  bwd::prepare<T>(p, o, dout, Dv, dq, mode);
  kv(p, q, k, v, lse, dout, Dv, dq, dk, dv, mode == DqMode::Atomic);
  if (mode == DqMode::Deterministic) bwd::run_dq<T>(p, q, k, v, lse, dout, Dv, dq);
}
#define WSQ_HOPPER_BWD(fn) {hopper_step<fa::half_t, fn<fa::half_t>>, hopper_step<fa::bfloat16_t, fn<fa::bfloat16_t>>}

// Step 14's driver: dq zeroed in both modes (its K/V kernel adds dQ in both), and in the deterministic mode the
// counters after D in the workspace zeroed too (every call: they count one backward's additions). Both head dims
// run step 14's kernel (step 13's tile: Br = 128 at d = 64, 64 at d = 128), with no dQ kernel in either mode.
template <class T>
void hopper_step_ordered(const fa::Problem& p, const T* q, const T* k, const T* v, const T* o, const float* lse,
                         const T* dout, float* dq, float* dk, float* dv, DqMode mode, void* workspace) {
  check_supported(p);
  float* Dv = static_cast<float*>(workspace);
  bwd::prepare<T>(p, o, dout, Dv, dq, DqMode::Atomic);  // (the atomic mode's preparation: D, and dq zeroed)
  int* dq_order = nullptr;
  if (mode == DqMode::Deterministic) {
    dq_order = reinterpret_cast<int*>(Dv + p.lse_elems());
    CUDA_CHECK(cudaMemsetAsync(dq_order, 0, dq_order_ints(p) * sizeof(int)));
  }
  backward_v14_dq_ordered<T>(p, q, k, v, lse, dout, Dv, dq, dk, dv, dq_order);
}

// Whether the current GPU runs sm_90a code (compute capability 9.0 exactly); false without a GPU.
bool gpu_runs_sm90a() {
  int device = 0;
  cudaDeviceProp prop;
  if (cudaGetDevice(&device) != cudaSuccess || cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    cudaGetLastError();  // no GPU: leave no error behind for the program's own check
    return false;
  }
  return fa::arch_runs(fa::Arch::sm90a, prop.major, prop.minor);
}
#endif

// Steps 9-14 (FA_HOPPER): sm_90a code, listed only on a GPU that runs it (H100, H200).
std::vector<BackwardStep> hopper_steps() {
#if WSQ_HOPPER
  constexpr fa::Arch sm90a = fa::Arch::sm90a;
  if (!gpu_runs_sm90a()) return {};
  return {
      {"bwd_v9_wgmma_tma", "Hopper: wgmma from shared memory and registers, TMA ring of Q_i/dO_i, a producer warp",
       WSQ_HOPPER_BWD(backward_v9_wgmma_tma), kDtypes, sm90a},
      {"bwd_v10_dq_bulk_reduce", "Hopper: dQ_i through an fp32 shared tile, added by a writer warp's bulk reduce-add",
       WSQ_HOPPER_BWD(backward_v10_dq_bulk_reduce), kDtypes, sm90a},
      {"bwd_v11_dq_double_buffer", "Hopper: two dQ tiles, so the MMA warpgroups never wait for the writer warp",
       WSQ_HOPPER_BWD(backward_v11_dq_double_buffer), kDtypes, sm90a},
      {"bwd_v12_dq_tile_reduce", "Hopper: dQ in fragment order, one bulk reduce-add per tile region, rows afterwards",
       WSQ_HOPPER_BWD(backward_v12_dq_tile_reduce), kDtypes, sm90a},
      {"bwd_v13_br128", "Hopper, d = 64: Br = 128 (FA3's tile), dQ split by rows, one bulk copy each; d = 128: step 12",
       WSQ_HOPPER_BWD(backward_v13_br128), kDtypes, sm90a},
      {"bwd_v14_dq_ordered", "Hopper: a deterministic dQ in the K/V kernel, the blocks adding each tile in turn",
       {hopper_step_ordered<fa::half_t>, hopper_step_ordered<fa::bfloat16_t>}, kDtypes, sm90a},
  };
#else
  return {};
#endif
}
}  // namespace

const std::vector<BackwardStep>& backward_steps() {
  static const std::vector<BackwardStep> steps = [] {
    std::vector<BackwardStep> all = portable_steps();
    for (const BackwardStep& s : hopper_steps()) all.push_back(s);
    return all;
  }();
  return steps;
}

// D, then step 14's dQ counters.
size_t backward_workspace_bytes(const fa::Problem& p) {
  return p.lse_elems() * sizeof(float) + dq_order_ints(p) * sizeof(int);
}

namespace bwd {
namespace {

constexpr int kRowsumWarps = 8;  // rows per block of the D kernel, one warp each

// D_i = sum_c dO_ic O_ic for every query row (BACKWARD.md Algorithm B, line 0), fp32 accumulation. One warp per
// row, consecutive lanes on consecutive columns. O is the forward's output in the dtype, as a training step keeps it.
template <class T>
__global__ void __launch_bounds__(32 * kRowsumWarps)
    rowsum_do_o_kernel(const T* __restrict__ o, const T* __restrict__ dout, float* __restrict__ Dv, size_t rows,
                       int d) {
  const size_t row = size_t(blockIdx.x) * kRowsumWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  float s = 0.f;
  for (int c = lane; c < d; c += 32) s = fmaf(widen(o[row * d + c]), widen(dout[row * d + c]), s);
  for (int off = 16; off > 0; off /= 2) s += __shfl_xor_sync(0xffffffffu, s, off);
  if (lane == 0) Dv[row] = s;
}

}  // namespace

template <class T>
void prepare(const fa::Problem& p, const T* o, const T* dout, float* Dv, float* dq, DqMode mode) {
  using Tc = typename fa::CudaType<T>::type;
  const size_t rows = p.lse_elems();
  launch(rowsum_do_o_kernel<Tc>, dim3(unsigned((rows + kRowsumWarps - 1) / kRowsumWarps)), 32 * kRowsumWarps, 0,
         fa::cuda_ptr(o), fa::cuda_ptr(dout), Dv, rows, p.head_dim);
  if (mode == DqMode::Atomic) zero_floats(dq, p.q_elems());
}

template <class T>
void run_backward(const fa::Problem& p, const KvKernels<typename fa::CudaType<T>::type>& kv, const T* q, const T* k,
                  const T* v, const T* o, const float* lse, const T* dout, float* dq, float* dk, float* dv, DqMode mode,
                  void* workspace) {
  check_supported(p);
  float* Dv = static_cast<float*>(workspace);
  prepare<T>(p, o, dout, Dv, dq, mode);
  const dim3 grid((p.kv_len + kv.Bc - 1) / kv.Bc, p.kv_heads, p.batch);
  launch(mode == DqMode::Atomic ? kv.atomic_dq : kv.no_dq, grid, kv.threads, kv.smem_bytes, p, fa::cuda_ptr(q),
         fa::cuda_ptr(k), fa::cuda_ptr(v), lse, fa::cuda_ptr(dout), static_cast<const float*>(Dv), dq, dk, dv);
  if (mode == DqMode::Deterministic) run_dq<T>(p, q, k, v, lse, dout, Dv, dq);
}

#define WSQ_RUN_BACKWARD(T)                                                                                          \
  template void prepare<T>(const fa::Problem&, const T*, const T*, float*, float*, DqMode);                          \
  template void run_backward<T>(const fa::Problem&, const KvKernels<fa::CudaType<T>::type>&, const T*, const T*,     \
                                const T*, const T*, const float*, const T*, float*, float*, float*, DqMode, void*);
WSQ_RUN_BACKWARD(fa::half_t)
WSQ_RUN_BACKWARD(fa::bfloat16_t)
#undef WSQ_RUN_BACKWARD

}  // namespace bwd
}  // namespace wsq
