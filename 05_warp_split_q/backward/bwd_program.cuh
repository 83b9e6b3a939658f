// The chapter program's --backward section, self-contained so that main.cu calls it in one line:
//   1. the inputs rounded to the dtype (as the forward's check uses them), uploaded; the chapter's last forward
//      step makes O (dtype) and LSE, exactly what a training step keeps for its backward;
//   2. every backward step (or the one --bwd-kernel names), both dQ modes: one run on NaN-poisoned outputs
//      checked against the fp64 reference (common/program.hpp's check_backward: whole kv groups where cheap,
//      sampled dQ rows beyond), then timed (common/timer.cuh: warm-up, L2 flushed, median);
//   3. with --out, dq.npy, dk.npy, dv.npy (float32) of the last step's deterministic run;
//   4. chapter 04's fp32 backward on the same rounded inputs, O and LSE, timed in the same run as the baseline.
// FLOPs are the project's backward count (2.5 x forward); bytes the minimal HBM traffic at 2 bytes per element
// (fp32 gradients written: 4), so GB/s shows how far a step is from streaming its tensors once.
#pragma once
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "device.cuh"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "formulas.hpp"
#include "lowp.hpp"
#include "program.cuh"

#include "backward.cuh"
#include "bwd_model.hpp"
#include "forward/warp_split_q.cuh"

namespace wsq {

// The program's verdict is the error rule (docs/numerics.md): at most twice the error of the plain same-dtype backward
// (bwd_model.hpp) on the same kv groups or dQ rows, plus this floor: 8 units in the last place at magnitude 1 plus 2
// relative (the GPU tests' floor is the dtype's ulp alone; the program's covers the sampled rows of a large problem,
// whose sums are longer than the tests').
inline fa::Tolerance backward_program_tolerance(fa::Dtype t) {
  return {8 * fa::lowp_floor(t), 2 * fa::lowp_floor(t)};
}

// The plain fp16/bf16 backward of bwd_model.hpp on the rounded inputs `in`, as check_backward calls it.
inline fa::PlainBackward plain_backward(fa::Dtype t, const fa::Problem& p, const fa::HostTensors& in) {
  fa::PlainBackward plain;
  plain.group = [&, t, p](int b, int hk, float* dq, float* dk, float* dv) {
    wsq_bwd_model::plain_lowp_backward_group(t, p, b, hk, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq,
                                             dk, dv);
  };
  plain.dq_rows = [&, t, p](int b, int h, int i0, int i1, float* dq) {
    wsq_bwd_model::plain_lowp_dq_rows(t, p, b, h, i0, i1, in.q.data(), in.k.data(), in.v.data(), in.dout.data(), dq);
  };
  return plain;
}

// HBM bytes a backward cannot avoid: read Q, K, V, O, dO (dtype) and LSE; write dQ, dK, dV (fp32).
inline double backward_min_bytes(const fa::Problem& p) {
  return 2.0 * (3.0 * p.q_elems() + 2.0 * p.kv_elems()) + 4.0 * p.lse_elems() +
         4.0 * (p.q_elems() + 2.0 * p.kv_elems());
}

template <class T>
bool run_backward_section_t(const fa::Options& opts, fa::Dtype t, const fa::Problem& p, const fa::HostTensors& in_any,
                            const std::string& only_step, std::vector<fa::ResultRow>& rows) {
  fa::HostTensors in = in_any;  // the values the kernels read, widened: what the fp64 reference is fed
  in.q = fa::rounded(t, in.q), in.k = fa::rounded(t, in.k), in.v = fa::rounded(t, in.v);
  in.dout = fa::rounded(t, in.dout);
  fa::DeviceBuffer<T> q(fa::to_dtype<T>(in.q)), k(fa::to_dtype<T>(in.k)), v(fa::to_dtype<T>(in.v)),
      dout(fa::to_dtype<T>(in.dout)), o(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems()), dq(p.q_elems()), dk(p.kv_elems()), dv(p.kv_elems());
  fa::DeviceBuffer<float> ws(backward_workspace_bytes(p) / sizeof(float));
  forward_steps().back().launch.of<T>()(p, q.get(), k.get(), v.get(), o.get(), lse.get());
  CUDA_CHECK(cudaDeviceSynchronize());

  const fa::PlainBackward plain = plain_backward(t, p, in);
  bool ok = true;
  double best_ms = 0;
  for (const BackwardStep& s : fa::select_steps(backward_steps(), only_step, "--bwd-kernel")) {
    for (DqMode mode : {DqMode::Atomic, DqMode::Deterministic}) {
      const std::string name = std::string(s.name) + (mode == DqMode::Atomic ? "_atomic_dq" : "_determ_dq");
      auto run = [&] {
        s.launch.of<T>()(p, q.get(), k.get(), v.get(), o.get(), lse.get(), dout.get(), dq.get(), dk.get(), dv.get(),
                         mode, ws.get());
      };
      dq.poison(), dk.poison(), dv.poison(), ws.poison();
      try {
        run();
      } catch (const fa::NotOnThisGpu& e) {  // e.g. a d = 128 tile on a GPU with 99 KB per block: not a failure
        std::printf("skipped: backward %s: %s\n", name.c_str(), e.what());
        continue;
      }
      CUDA_CHECK(cudaDeviceSynchronize());
      std::string what;
      const fa::ErrorReport e = fa::check_backward(p, in, dq.download(), dk.download(), dv.download(),
                                                   backward_program_tolerance(t), &what, nullptr, &plain);
      std::printf("check:   backward %s, %s: %s\n", name.c_str(), what.c_str(), e.summary("vs fp64").c_str());
      ok = ok && e.ok();
      if (opts.iters <= 0) continue;
      fa::ResultRow r = fa::result_row("05", name, "bwd", p);
      r.dtype = fa::dtype_name(t), r.model_hbm_bytes = backward_min_bytes(p);
      r.extra_bytes = double(backward_workspace_bytes(p)), r.max_abs_err = e.max_abs;
      rows.push_back(r = fa::time_kernel(opts, r, run));
      best_ms = best_ms == 0 ? r.ms : std::min(best_ms, r.ms);
    }
  }
  if (!opts.out_dir.empty())  // the last step's deterministic-mode gradients, float32 (BACKWARD.md section 6)
    fa::write_backward_outputs(opts.out_dir, p, dq.download(), dk.download(), dv.download());
  if (opts.iters <= 0) return ok;

  // Chapter 04's fp32 backward on the same rounded inputs and the same O (widened) and LSE: the baseline.
  fa::DeviceBuffer<float> q4(in.q), k4(in.k), v4(in.v), dout4(in.dout), o4(p.q_elems());
  {
    const std::vector<T> o16 = o.download();
    std::vector<float> ow(o16.size());
    for (size_t e = 0; e < o16.size(); ++e) ow[e] = fa::to_float(o16[e]);
    o4.upload(ow);
  }
  fa::DeviceBuffer<float> ws4(fa2::backward_workspace_bytes(p) / sizeof(float));
  fa::ResultRow r4 = fa::result_row("04", "fa2_atomic_dq", "bwd", p);
  r4.extra_bytes = double(fa2::backward_workspace_bytes(p));  // model bytes: 04's own page counts them
  rows.push_back(r4 = fa::time_kernel(opts, r4, [&] {
    fa2::backward(p, q4.get(), k4.get(), v4.get(), o4.get(), lse.get(), dout4.get(), dq.get(), dk.get(), dv.get(),
                  fa2::DqMode::Atomic, ws4.get());
  }));
  if (best_ms > 0) std::printf("speed:   fastest 05 backward is %.2fx 04's (atomic dQ)\n", r4.ms / best_ms);
  return ok;
}

// The section for the run's dtype. `in` holds the program's inputs (fp32 or already rounded; rounded here).
inline bool run_backward_section(const fa::Options& opts, fa::Dtype t, const fa::Problem& p, const fa::HostTensors& in,
                                 const std::string& only_step, std::vector<fa::ResultRow>& rows) {
  if (in.dout.empty()) throw fa::UsageError("the backward needs dO: load the inputs with backward = true");
  fa::select_steps(backward_steps(), only_step, "--bwd-kernel");  // a UsageError naming the steps, before GPU work
  return t == fa::Dtype::fp16 ? run_backward_section_t<fa::half_t>(opts, t, p, in, only_step, rows)
                              : run_backward_section_t<fa::bfloat16_t>(opts, t, p, in, only_step, rows);
}

}  // namespace wsq
