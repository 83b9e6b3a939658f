// Chapter 05 program: the split-K kernel and the split-Q ladder (fp16 or bf16 in, fp32 accumulation), each
// checked against the fp64 reference with the low-precision error rule and against chapter 04 (fp32, on the
// same rounded inputs), then timed next to chapter 04 in the same run.
//   ./warp_split_q                              B=4 H=16 N=4096 d=64 fp16, every step, then 04
//   ./warp_split_q --kernel v7_tiles --dtype bf16 --causal --head-dim 128
//   ./warp_split_q --in DIR --out DIR           your q/k/v.npy; writes o.npy (float16 for fp16 runs, float32
//                                               for bf16: NumPy has no bf16) and lse.npy (float32)
//   ./warp_split_q --backward                   + every backward step, both dQ modes, next to 04's (BACKWARD.md)
#include <cstdio>

#include "bwd_program.cuh"
#include "check.hpp"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "formulas.hpp"
#include "lowp.hpp"
#include "npy.hpp"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"
#include "warp_split_q.cuh"

namespace {

struct Flags {
  std::string kernel = "all", dtype = "fp16";
  bool no_previous = false;
};

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 16, o.problem.q_len = 4096, o.problem.head_dim = 64;
  return o;
}

std::vector<wsq::Step> selected(const std::string& name) {
  if (name == "all") return wsq::forward_steps();
  return {wsq::find_step(name)};
}

// Inputs rounded to the dtype once; every kernel and the references read these values.
void round_inputs(fa::Dtype t, fa::HostTensors& in) {
  for (std::vector<float>* x : {&in.q, &in.k, &in.v}) {
    *x = fa::rounded(t, std::move(*x));
    for (float e : *x)
      if (!std::isfinite(e))
        throw fa::UsageError(std::string("an input is not finite in ") + fa::dtype_name(t) +
                             " (NaN, or beyond the dtype's range)");
  }
}

template <class T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = fa::to_float(x[i]);
  return y;
}

template <class T>
bool run(const fa::Options& opts, const Flags& f, fa::Dtype t, const fa::HostTensors& in) {
  const fa::Problem& p = opts.problem;
  fa::DeviceBuffer<T> q(fa::to_dtype<T>(in.q)), k(fa::to_dtype<T>(in.k)), v(fa::to_dtype<T>(in.v)), o(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems());

  // Chapter 04 (fp32) on the same rounded inputs: the other end of the equivalence chain, and the baseline.
  fa::DeviceBuffer<float> q32(in.q), k32(in.k), v32(in.v), o32(p.q_elems()), lse32(p.lse_elems());
  auto fa2_run = [&] { fa2::forward(p, q32.get(), k32.get(), v32.get(), o32.get(), lse32.get()); };
  o32.poison(), lse32.poison();
  fa2_run();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> o04 = fa::to_double(o32.download()), lse04 = fa::to_double(lse32.download());

  const wsq::LowpReference ref = wsq::lowp_reference(t, p, in.q, in.k, in.v);
  bool ok = true;
  const std::string gpu = fa::device_name();
  std::vector<fa::ResultRow> rows;
  std::vector<double> ms;
  for (const wsq::Step& s : selected(f.kernel)) {
    const wsq::ForwardFn<T> fn = wsq::fn<T>(s);
    auto go = [&] { fn(p, q.get(), k.get(), v.get(), o.get(), lse.get()); };
    o.poison(), lse.poison();  // an element a kernel forgets to write stays NaN and fails
    go();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<T> o_t = o.download();
    const std::vector<float> o_f = widen(o_t), lse_f = lse.download();
    const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse_f);
    std::printf("check:   %-12s %s: %s\n", s.name, c.what.c_str(), c.summary().c_str());
    fa::ErrorReport chain = fa::compare(o_f, o04, {c.bound + fa::kTolFp32Forward.atol, 0});
    chain += fa::compare(lse_f, lse04, wsq::kTolLse);
    std::printf("chain:   %-12s %s\n", s.name, chain.summary("O and LSE vs 04 (fp32, same rounded inputs)").c_str());
    ok = ok && c.ok() && chain.ok();
    if (!opts.out_dir.empty()) {  // each step overwrites: the files hold the last step's outputs
      fa::write_forward_outputs(opts.out_dir, p, o_f, lse_f);
      if constexpr (std::is_same_v<T, fa::half_t>)  // fp16 as is; bf16 stays float32 (exactly widened)
        fa::npy_write(opts.out_dir + "/o.npy", {size_t(p.batch), size_t(p.heads), size_t(p.q_len), size_t(p.head_dim)},
                      o_t.data());
    }
    if (opts.iters > 0) {
      ms.push_back(fa::time_ms(go, opts.warmup, opts.iters).median_ms);
      rows.push_back({gpu, "05", s.name, "fwd", fa::dtype_name(t), p, ms.back(), fa::tflops(fa::flops_forward(p), ms.back()),
                      fa::gbps(fa::hbm_bytes_min_forward(p, 2), ms.back()), fa::hbm_bytes_min_forward(p, 2), 0,
                      c.o.max_abs});
    }
  }
  if (opts.iters <= 0) return ok;
  if (!f.no_previous) {
    const double ms04 = fa::time_ms(fa2_run, opts.warmup, opts.iters).median_ms;
    rows.push_back({gpu, "04", "fa2", "fwd", "fp32", p, ms04, fa::tflops(fa::flops_forward(p), ms04),
                    fa::gbps(fa::hbm_bytes_min_forward(p, 4), ms04), fa::hbm_bytes_min_forward(p, 4), 0, -1});
    for (size_t x = 0; x < ms.size(); ++x)
      std::printf("speed:   %-12s %.2fx the previous step, %.2fx 04 (fp32)\n", rows[x].kernel.c_str(),
                  x ? ms[x - 1] / ms[x] : 1.0, ms04 / ms[x]);
  }
  fa::report_rows(opts, rows);
  return ok;
}

// --backward: every backward step in both dQ modes, checked and timed next to 04's backward (bwd_program.cuh).
struct BackwardFlags {
  bool on = false;
  std::string kernel = "all";
};
bool run_backward(const fa::Options& opts, const BackwardFlags& b, fa::Dtype t, const fa::HostTensors& in) {
  if (!b.on) return true;
  std::vector<fa::ResultRow> rows;
  const bool ok = wsq::run_backward_section(opts, t, in, b.kernel, rows);
  if (!rows.empty()) fa::report_rows(opts, rows);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  BackwardFlags bwd;
  fa::Cli cli("warp_split_q",
              "Chapter 05: split-K vs split-Q, then the FA2 forward on tensor cores step by step (fp16/bf16 in, fp32 "
              "accumulation; O written in the dtype, LSE in fp32), checked against the fp64 reference and chapter 04, "
              "timed next to 04. --out writes the last step's o.npy as float16 for fp16 runs and as float32 for bf16 runs (NumPy has "
              "no bf16; the values are the bf16 outputs, exactly widened).",
              defaults());
  cli.add_option("--kernel", &f.kernel, "all, or one step: split_k, v1_mma, ..., v7_tiles (default all)");
  cli.add_option("--dtype", &f.dtype, "fp16 or bf16: inputs are rounded to it on load (default fp16)");
  cli.add_flag("--no-previous", &f.no_previous, "do not time chapter 04 for comparison");
  cli.add_check(wsq::check_supported);
  cli.add_check([&](const fa::Problem&) {  // names checked before any device work (exit 2)
    fa::parse_dtype(f.dtype);
    selected(f.kernel);
  });
  cli.add_flag("--backward", &bwd.on, "also run, check and time the backward steps (both dQ modes) and 04's backward");
  cli.add_option("--bwd-kernel", &bwd.kernel,
                 "with --backward: all, or one step: bwd_v1_mma, bwd_v2_regs, bwd_v3_cp_async (default all)");
  cli.add_check([&](const fa::Problem&) {
    if (bwd.kernel != "all") wsq::find_backward_step(bwd.kernel);
  });
  return fa::run_program(cli, argc, argv, [&](fa::Options& opts) {
    const fa::Dtype t = fa::parse_dtype(f.dtype);
    fa::HostTensors in = fa::load_inputs(opts, bwd.on);
    round_inputs(t, in);
    std::printf("dtype:   %s (inputs rounded on load; O in %s, LSE in fp32)\n", fa::dtype_name(t), fa::dtype_name(t));
    const bool ok = t == fa::Dtype::fp16 ? run<fa::half_t>(opts, f, t, in) : run<fa::bfloat16_t>(opts, f, t, in);
    return run_backward(opts, bwd, t, in) && ok;
  });
}
