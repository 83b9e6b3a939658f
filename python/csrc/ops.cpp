// Chapter 05's kernels as PyTorch operators (torch.library): flash_by_steps::forward and ::backward on CUDA
// tensors in PyTorch's SDPA layout, which is the chapters' own: Q, O [B, H, Nq, d], K, V [B, Hkv, Nk, d], contiguous,
// fp16 or bf16; LSE [B, H, Nq] fp32. The kernels are the chapter's (its library, linked here): no second copy.
// The Python package (flash_by_steps/__init__.py) checks the arguments first, registers the autograd formula and
// the fake (meta) implementations, and is what a model calls; these functions check again (TORCH_CHECK) so that a
// direct call of torch.ops.flash_by_steps.* cannot launch on bad input either.
//
// Streams: the chapters launch on the default (legacy) stream. When PyTorch's current stream is another one, the
// default stream first waits for the current one and the current one then waits for the kernels (two events), so
// the operators order with the rest of the model whatever stream it runs on.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <string>
#include <tuple>
#include <vector>

#include "backward/backward.cuh"
#include "forward/warp_split_q.cuh"

namespace {

// The problem of q [B, H, Nq, d] against k [B, Hkv, Nk, d]. scale 0: 1/sqrt(d), as the chapters read it.
fa::Problem problem_of(const at::Tensor& q, const at::Tensor& k, bool causal, double scale) {
  fa::Problem p;
  p.batch = int(q.size(0)), p.heads = int(q.size(1)), p.q_len = int(q.size(2)), p.head_dim = int(q.size(3));
  p.kv_heads = int(k.size(1)), p.kv_len = int(k.size(2));
  p.causal = causal, p.scale = float(scale);
  wsq::check_supported(p);  // head_dim 64 or 128, grid limits: a UsageError (RuntimeError in Python) otherwise
  return p;
}

void check_inputs(const std::vector<at::Tensor>& ts, at::ScalarType dtype) {
  for (const at::Tensor& t : ts) {
    TORCH_CHECK(t.is_cuda(), "flash_by_steps: every tensor must be on a CUDA device");
    TORCH_CHECK(t.device() == ts[0].device(), "flash_by_steps: every tensor must be on the same device");
    TORCH_CHECK(t.is_contiguous(), "flash_by_steps: tensors must be contiguous");
    TORCH_CHECK(t.scalar_type() == dtype, "flash_by_steps: expected ", dtype, ", got ", t.scalar_type());
  }
}

// The step called `name`, or the last one of `steps` this GPU runs ("": the default).
template <class S>
const S& pick(const std::vector<S>& steps, const std::string& name, const char* what) {
  int dev = 0, major = 0, minor = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  const S* last = nullptr;
  for (const S& s : steps) {
    const bool runs = fa::arch_runs(s.arch, major, minor);
    if (!name.empty() && name == s.name) {
      TORCH_CHECK(runs, "flash_by_steps: ", what, " step ", name, " needs ", fa::arch_name(s.arch),
                  "; this GPU is sm_", major, minor);
      return s;
    }
    if (runs) last = &s;
  }
  TORCH_CHECK(name.empty(), "flash_by_steps: no ", what, " step called '", name, "'");
  TORCH_CHECK(last, "flash_by_steps: no ", what, " step runs on sm_", major, minor);
  return *last;
}

// Runs `launch` on the default stream, ordered after and before PyTorch's current stream.
template <class F>
void on_default_stream(F&& launch) {
  const cudaStream_t current = c10::cuda::getCurrentCUDAStream().stream();
  if (current == nullptr) return launch();
  cudaEvent_t before, after;
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
  C10_CUDA_CHECK(cudaEventRecord(before, current));
  C10_CUDA_CHECK(cudaStreamWaitEvent(nullptr, before, 0));
  launch();
  C10_CUDA_CHECK(cudaEventRecord(after, nullptr));
  C10_CUDA_CHECK(cudaStreamWaitEvent(current, after, 0));
  C10_CUDA_CHECK(cudaEventDestroy(before));
  C10_CUDA_CHECK(cudaEventDestroy(after));
}

template <class T>
const T* in(const at::Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}

// O and LSE of softmax(scale Q K^T) V. bwd_step, deterministic: unused here; they are the forward's arguments so
// that autograd (which sees only these) knows the backward the caller chose.
std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, bool causal,
                                           double scale, std::string step, std::string bwd_step, bool deterministic) {
  (void)bwd_step, (void)deterministic;
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "flash_by_steps: q, k, v must be 4-D [B, H, N, d]");
  check_inputs({q, k, v}, q.scalar_type());
  TORCH_CHECK(k.sizes() == v.sizes(), "flash_by_steps: k and v must have the same shape");
  const c10::cuda::CUDAGuard guard(q.device());
  const fa::Problem p = problem_of(q, k, causal, scale);
  at::Tensor o = at::empty_like(q);
  at::Tensor lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
  const wsq::ForwardStep& s = pick(wsq::forward_steps(), step, "forward");
  on_default_stream([&] {
    if (q.scalar_type() == at::kHalf)
      s.launch.of<fa::half_t>()(p, in<fa::half_t>(q), in<fa::half_t>(k), in<fa::half_t>(v),
                                static_cast<fa::half_t*>(o.data_ptr()), lse.data_ptr<float>());
    else
      s.launch.of<fa::bfloat16_t>()(p, in<fa::bfloat16_t>(q), in<fa::bfloat16_t>(k), in<fa::bfloat16_t>(v),
                                    static_cast<fa::bfloat16_t*>(o.data_ptr()), lse.data_ptr<float>());
  });
  return {o, lse};
}

// dQ, dK, dV (fp32) from dO, the inputs and the forward's O and LSE.
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const at::Tensor& dout, const at::Tensor& q,
                                                        const at::Tensor& k, const at::Tensor& v, const at::Tensor& o,
                                                        const at::Tensor& lse, bool causal, double scale,
                                                        std::string step, bool deterministic) {
  check_inputs({q, k, v, o, dout}, q.scalar_type());
  check_inputs({lse}, at::kFloat);
  TORCH_CHECK(dout.sizes() == q.sizes() && o.sizes() == q.sizes(), "flash_by_steps: dO and O must have q's shape");
  const c10::cuda::CUDAGuard guard(q.device());
  const fa::Problem p = problem_of(q, k, causal, scale);
  at::Tensor dq = at::empty(q.sizes(), q.options().dtype(at::kFloat));
  at::Tensor dk = at::empty(k.sizes(), k.options().dtype(at::kFloat));
  at::Tensor dv = at::empty(v.sizes(), v.options().dtype(at::kFloat));
  at::Tensor workspace = at::empty({int64_t(wsq::backward_workspace_bytes(p))}, q.options().dtype(at::kByte));
  const wsq::BackwardStep& s = pick(wsq::backward_steps(), step, "backward");
  const wsq::DqMode mode = deterministic ? wsq::DqMode::Deterministic : wsq::DqMode::Atomic;
  on_default_stream([&] {
    if (q.scalar_type() == at::kHalf)
      s.launch.of<fa::half_t>()(p, in<fa::half_t>(q), in<fa::half_t>(k), in<fa::half_t>(v), in<fa::half_t>(o),
                                lse.data_ptr<float>(), in<fa::half_t>(dout), dq.data_ptr<float>(),
                                dk.data_ptr<float>(), dv.data_ptr<float>(), mode, workspace.data_ptr());
    else
      s.launch.of<fa::bfloat16_t>()(p, in<fa::bfloat16_t>(q), in<fa::bfloat16_t>(k), in<fa::bfloat16_t>(v),
                                    in<fa::bfloat16_t>(o), lse.data_ptr<float>(), in<fa::bfloat16_t>(dout),
                                    dq.data_ptr<float>(), dk.data_ptr<float>(), dv.data_ptr<float>(), mode,
                                    workspace.data_ptr());
  });
  return {dq, dk, dv};
}

// Every step, a line each: pass (forward | backward), name, arch (as --list-steps names it), idea.
std::string list_steps() {
  std::string out;
  for (const auto& s : wsq::forward_steps())
    out += std::string("forward\t") + s.name + "\t" + fa::arch_name(s.arch) + "\t" + s.idea + "\n";
  for (const auto& s : wsq::backward_steps())
    out += std::string("backward\t") + s.name + "\t" + fa::arch_name(s.arch) + "\t" + s.idea + "\n";
  return out;
}

}  // namespace

TORCH_LIBRARY(flash_by_steps, m) {
  m.def("forward(Tensor q, Tensor k, Tensor v, bool causal, float scale, str step, str bwd_step, bool deterministic)"
        " -> (Tensor, Tensor)");
  m.def("backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor o, Tensor lse, bool causal, float scale, str step,"
        " bool deterministic) -> (Tensor, Tensor, Tensor)");
  m.def("list_steps() -> str", &list_steps);
}

TORCH_LIBRARY_IMPL(flash_by_steps, CUDA, m) {
  m.impl("forward", &forward);
  m.impl("backward", &backward);
}
