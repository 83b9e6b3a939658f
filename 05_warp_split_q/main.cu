// Chapter 05 program: the split-K kernel and the split-Q ladder (fp16 or bf16 in, fp32 accumulation), each
// checked against the fp64 reference with the low-precision error rule and against chapter 04 (fp32, on the
// same rounded inputs), then timed next to chapter 04 in the same run.
//   ./warp_split_q                              B=4 H=16 N=4096 d=64 fp16, every step, then 04
//   ./warp_split_q --kernel v8_two_row_tiles --dtype bf16 --causal --head-dim 128
//   ./warp_split_q --kernel v8_two_row_tiles,v10_pingpong   several steps (v9, v10 exist on sm_90 GPUs only)
//   ./warp_split_q --in DIR --out DIR           your q/k/v.npy; writes o.npy (float16 for fp16 runs, float32
//                                               for bf16: NumPy has no bf16) and lse.npy (float32)
//   ./warp_split_q --backward                   + every backward step, both dQ modes, next to 04's (BACKWARD.md)
//   ./warp_split_q --kernel v8_two_row_tiles --block-mask local:512 --q-len 16384   block-sparse step 8
//   ./warp_split_q --dtype fp8 [--fp8-scale tensor] [--hadamard]   step 11 (sm_90): e4m3 with block (or tensor)
//                                               scales, Q and K rotated with --hadamard; O in bf16 (FP8.md)
//   ./warp_split_q --list-steps [--backward]    the steps this GPU runs, one a line (what the scripts read)
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "device.cuh"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "formulas.hpp"
#include "lowp.hpp"
#include "npy.hpp"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"

#include "backward/bwd_program.cuh"
#include "forward/check.hpp"
#include "forward/warp_split_q.cuh"
#include "hopper/fp8.cuh"
#include "hopper/fp8_model.hpp"

namespace {

struct Flags {
  std::string kernel = "all", dtype = "fp16", bwd_kernel = "all";
  std::string block_mask;  // SPEC (common/block_mask.hpp), empty = dense only
  bool no_previous = false, backward = false, list_steps = false;
  std::string fp8_scale = "block";  // --dtype fp8: block or tensor
  bool hadamard = false;            // --dtype fp8: incoherent processing
};

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 16, o.problem.q_len = 4096, o.problem.head_dim = 64;
  return o;
}

template <class T>
std::vector<float> widen(const std::vector<T>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = fa::to_float(x[i]);
  return y;
}

template <class T>
bool run(const fa::Options& opts, const Flags& f, fa::Dtype t, const fa::Problem& p, const fa::HostTensors& in,
         const fa::BlockMask* mask) {
  fa::DeviceBuffer<T> q(fa::to_dtype<T>(in.q)), k(fa::to_dtype<T>(in.k)), v(fa::to_dtype<T>(in.v)), o(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems());

  // Chapter 04 (fp32) on the same rounded inputs: the other end of the equivalence chain, and the baseline.
  const fa2::ForwardStep& fa2_step = fa2::forward_steps().back();
  fa::DeviceBuffer<float> q32(in.q), k32(in.k), v32(in.v), o32(p.q_elems()), lse32(p.lse_elems());
  auto fa2_run = [&] { fa2_step.launch(p, q32.get(), k32.get(), v32.get(), o32.get(), lse32.get()); };
  o32.poison(), lse32.poison();
  fa2_run();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<double> o04 = fa::to_double(o32.download()), lse04 = fa::to_double(lse32.download());

  const wsq::LowpReference ref = wsq::lowp_reference(t, p, in.q, in.k, in.v);
  bool ok = true;
  std::vector<fa::ResultRow> rows;
  const std::vector<wsq::ForwardStep> steps =
      f.kernel == "none" ? std::vector<wsq::ForwardStep>{} : fa::select_steps(wsq::forward_steps(), f.kernel);
  for (const wsq::ForwardStep& s : steps) {
    const wsq::ForwardFn<T> fn = s.launch.of<T>();
    auto go = [&] { fn(p, q.get(), k.get(), v.get(), o.get(), lse.get()); };
    o.poison(), lse.poison();  // an element a kernel forgets to write stays NaN and fails
    try {
      go();
    } catch (const fa::NotOnThisGpu& e) {  // e.g. a d = 128 tile on a GPU with 99 KB per block: not a failure
      std::printf("skipped: %-12s %s\n", s.name, e.what());
      continue;
    }
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
    fa::ResultRow r = fa::result_row("05", s.name, "fwd", p);
    r.dtype = fa::dtype_name(t), r.model_hbm_bytes = fa::hbm_bytes_min_forward(p, 2), r.max_abs_err = c.o.max_abs;
    if (opts.iters <= 0) continue;
    r = fa::time_kernel(opts, r, go);
    if (!rows.empty()) fa::print_speedup(r, rows.back());
    rows.push_back(r);
  }
  // Block-sparse (--block-mask): step 8 with the mask, checked against the fp64 reference and the plain
  // same-dtype attention with the same mask, and against 04's block-sparse forward (fp32, same rounded inputs);
  // timed next to the dense step 8 if it ran. TFLOP/s counts the visible pairs' FLOPs alone.
  if (mask) {
    const fa::DeviceBuffer<uint8_t> bits(mask->bits);
    auto go = [&] { wsq::forward_block_sparse<T>(p, q.get(), k.get(), v.get(), o.get(), lse.get(), bits.get()); };
    const wsq::LowpReference ref_bs = wsq::lowp_reference(t, p, in.q, in.k, in.v, 2e9, mask);
    o.poison(), lse.poison();
    go();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> o_f = widen(o.download()), lse_f = lse.download();
    const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref_bs, o_f, lse_f);
    std::printf("check:   block-sparse %s: %s\n", ref_bs.what.c_str(), c.summary().c_str());
    o32.poison(), lse32.poison();
    fa2::forward(p, q32.get(), k32.get(), v32.get(), o32.get(), lse32.get(), bits.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    fa::ErrorReport chain = fa::compare(o_f, fa::to_double(o32.download()), {c.bound + fa::kTolFp32Forward.atol, 0});
    chain += fa::compare(lse_f, fa::to_double(lse32.download()), wsq::kTolLse);
    std::printf("chain:   block-sparse %s\n", chain.summary("O and LSE vs 04 block-sparse (fp32)").c_str());
    ok = ok && c.ok() && chain.ok();
    char name[48];
    std::snprintf(name, sizeof name, "bsparse_v8_s%.3f", mask->density());
    fa::ResultRow r = fa::result_row("05", name, "fwd", p);
    r.dtype = fa::dtype_name(t), r.max_abs_err = c.o.max_abs;
    if (opts.iters > 0) {
      r = fa::time_kernel(opts, r, go);
      r.tflops = fa::tflops(fa::flops_forward(p, mask), r.ms);
      for (const fa::ResultRow& dense : rows)
        if (dense.kernel == "v8_two_row_tiles") fa::print_speedup(r, dense);
      rows.push_back(r);
    }
  }
  if (opts.iters > 0 && !f.no_previous && !rows.empty()) {
    fa::ResultRow r04 = fa::result_row("04", fa2_step.name, "fwd", p);  // model bytes: 04's own page counts them
    r04 = fa::time_kernel(opts, r04, fa2_run);
    for (const fa::ResultRow& r : rows) fa::print_speedup(r, r04);
    rows.push_back(r04);
  }
  fa::report_rows(opts, rows);
  return ok;
}

// --dtype fp8 (FP8.md): the bf16-rounded inputs quantised on the GPU (fp8_quant.cu), then each fp8 step;
// O (bf16) and LSE checked with the fp8 rule (fp8_model.hpp: at most 2x the plain fp8 attention's error vs fp64,
// plus the floors). The timed row is the attention alone (as FP8 attention is measured: its inputs arrive
// quantised); the quantisation pass is timed on a row of its own.
bool run_fp8(const fa::Options& opts, const Flags& f, const fa::Problem& p, const fa::HostTensors& in,
             const std::vector<wsq::Fp8Step>& steps) {
  using T = fa::bfloat16_t;
  fa::DeviceBuffer<T> q(fa::to_dtype<T>(in.q)), k(fa::to_dtype<T>(in.k)), v(fa::to_dtype<T>(in.v)), o(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems());
  wsq::fp8::Options o8;
  o8.scaling = f.fp8_scale == "tensor" ? wsq::fp8::Scaling::tensor : wsq::fp8::Scaling::block;
  o8.hadamard = f.hadamard;
  wsq::fp8::Tensors z(p);
  auto quantise = [&] { wsq::fp8::quantise(p, o8, q.get(), k.get(), v.get(), z); };
  const wsq::fp8::Reference ref = wsq::fp8::reference(p, o8, in.q, in.k, in.v);
  bool ok = true;
  std::vector<fa::ResultRow> rows;
  for (const wsq::Fp8Step& s : steps) {
    auto go = [&] { s.launch(p, z.view(), o.get(), lse.get()); };
    o.poison(), lse.poison();
    quantise();
    go();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<T> o_t = o.download();
    const std::vector<float> o_f = widen(o_t), lse_f = lse.download();
    const wsq::LowpCheck c = wsq::fp8::check_forward(p, ref, o_f, lse_f);
    std::printf("check:   %-12s %s: %s\n", s.name, c.what.c_str(), c.summary().c_str());
    ok = ok && c.ok();
    if (!opts.out_dir.empty()) fa::write_forward_outputs(opts.out_dir, p, o_f, lse_f);  // bf16 as float32
    fa::ResultRow r = fa::result_row("05", s.name, "fwd", p);
    r.dtype = "fp8", r.model_hbm_bytes = fa::hbm_bytes_min_forward(p, 1), r.max_abs_err = c.o.max_abs;
    if (opts.iters <= 0) continue;
    rows.push_back(fa::time_kernel(opts, r, go));
    fa::ResultRow rq = fa::result_row("05", "fp8_quantise", "fwd", p);
    rq.dtype = "fp8";
    rq = fa::time_kernel(opts, rq, quantise);
    rq.tflops = 0;  // moves bytes, computes no attention
    std::printf("quantisation pass: %.3f ms (Q, K, V -> e4m3 with %s scales%s)\n", rq.ms, f.fp8_scale.c_str(),
                f.hadamard ? ", Hadamard on Q and K" : "");
    rows.push_back(rq);
  }
  fa::report_rows(opts, rows);
  return ok;
}

// Device bytes: Q, K, V, O in the dtype and LSE; 04's fp32 copies of the same; with --backward dO in the dtype,
// fp32 dQ, dK, dV, and the larger of the two chapters' backward workspaces.
double device_bytes(const fa::Problem& p, bool backward) {
  const double fwd = 2.0 * (2 * p.q_elems() + 2 * p.kv_elems()) + 4.0 * p.lse_elems();
  const double bwd = 2.0 * p.q_elems() + 4.0 * (p.q_elems() + 2 * p.kv_elems()) +
                     double(std::max(wsq::backward_workspace_bytes(p), fa2::backward_workspace_bytes(p)));
  return fwd + fa::device_io_bytes(p, backward) + (backward ? bwd : 0.0);
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage, an unknown --kernel or --dtype: exit 2).
  Flags f;
  fa::Cli cli("warp_split_q",
              "Chapter 05: split-K vs split-Q, then the FA2 forward on tensor cores step by step (fp16/bf16 in, fp32 "
              "accumulation; O written in the dtype, LSE in fp32), checked against the fp64 reference and chapter 04, "
              "timed next to 04. --out writes the last step's o.npy as float16 for fp16 runs and as float32 for bf16 "
              "runs (NumPy has no bf16; the values are the bf16 outputs, exactly widened).",
              defaults());
  cli.add_option("--kernel", &f.kernel,
                 "all, or steps separated by commas: " + fa::step_names(wsq::forward_steps()) +
                     (wsq::hopper_steps_built() ? " (v9_wgmma_tma and v10_pingpong are listed on an sm_90 GPU only)"
                                                : " (built without the Hopper steps)") +
                     ", or none with --backward (time only the backward); default all");
  cli.add_option("--dtype", &f.dtype,
                 "fp16 or bf16: inputs are rounded to it on load (default fp16); fp8: the fp8 steps 11-19 alone (sm_90 GPU): "
                 "inputs rounded to bf16, quantised to e4m3 on the GPU, O written in bf16");
  cli.add_option("--fp8-scale", &f.fp8_scale,
                 "with --dtype fp8: block (one scale per 128-row block of Q, K and V; default) or tensor");
  cli.add_flag("--hadamard", &f.hadamard,
               "with --dtype fp8: incoherent processing, Q and K rotated by D H / sqrt(d) in the quantisation pass");
  cli.add_flag("--no-previous", &f.no_previous, "do not time chapter 04 for comparison");
  cli.add_flag("--backward", &f.backward,
               "also run, check and time the backward steps (both dQ modes) and 04's backward (BACKWARD.md)");
  cli.add_option("--bwd-kernel", &f.bwd_kernel,
                 "with --backward: all, or steps separated by commas: " + fa::step_names(wsq::backward_steps()) +
                     " (default all)");
  cli.add_flag("--list-steps", &f.list_steps,
               "print the forward steps (with --backward the backward steps) this GPU runs, one a line: name, "
               "dtypes, GPUs, idea (tab-separated), and exit");
  cli.add_option("--block-mask", &f.block_mask,
                 "also run step 8 block-sparse (blocks of 128 queries x 64 keys), next to the dense steps: local:W, "
                 "strided:S, random:DENSITY[:SEED], or a uint8/bool .npy [Tr, Tc] (04's README, section 6)");
  cli.extend_help("--head-dim", "this chapter: 64, 128");
  cli.set_help("--dropout", "dropout probability p: this chapter has none, 0 only (README says why)");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();
  if (f.list_steps) {  // before any GPU work: the scripts read the ladders from here
    if (f.backward) {
      fa::print_steps(wsq::backward_steps());
    } else {
      fa::print_steps(wsq::forward_steps());
      fa::print_steps(wsq::fp8_steps());
    }
    return 0;
  }
  const bool fp8 = f.dtype == "fp8";  // O and the rounding of the inputs: bf16
  const fa::Dtype t = fp8 ? fa::Dtype::bf16 : fa::parse_dtype(f.dtype);
  if (f.fp8_scale != "block" && f.fp8_scale != "tensor")
    throw fa::UsageError("--fp8-scale must be block or tensor (got '" + f.fp8_scale + "')");
  if (!fp8 && (f.hadamard || f.fp8_scale != "block"))
    throw fa::UsageError("--fp8-scale and --hadamard go with --dtype fp8");
  if (f.kernel == "none" && !f.backward)
    throw fa::UsageError("--kernel none runs no forward step: it is meant for --backward alone");
  std::vector<wsq::Fp8Step> fp8_steps;
  if (fp8) {
    if (f.backward || !f.block_mask.empty())
      throw fa::UsageError("--dtype fp8 is a forward step: no --backward, no --block-mask");
    fp8_steps = wsq::select_fp8_steps(f.kernel);  // no sm_90 GPU, or a step without an fp8 form: exit 2 here
  } else if (f.kernel != "none") {
    wsq::check_not_fp8_steps(f.kernel);
    fa::select_steps(wsq::forward_steps(), f.kernel);
  }
  fa::select_steps(wsq::backward_steps(), f.bwd_kernel, "--bwd-kernel");

  // 2. The problem, this chapter's limits, the inputs rounded to the dtype (bad input: exit 2).
  const fa::Problem p = fa::input_problem(opts, f.backward);
  wsq::check_supported(p);
  fa::BlockMask mask;
  if (!f.block_mask.empty()) mask = fa::block_mask_from_spec(f.block_mask, p);
  fa::check_outputs_writable(opts);
  fa::HostTensors in = fa::load_inputs(opts, p, f.backward);
  fa::round_inputs(t, in);  // once: every kernel and reference reads these values; beyond fp16's range: exit 2
  std::printf("problem: %s (%s)\n", fa::describe(p).c_str(), f.backward ? "forward + backward" : "forward");
  if (fp8)
    std::printf("dtype:   fp8 e4m3 (inputs rounded to bf16 on load, quantised on the GPU with %s scales%s; O in bf16, "
                "LSE in fp32)\n", f.fp8_scale.c_str(), f.hadamard ? " after the Hadamard rotation of Q and K" : "");
  else
    std::printf("dtype:   %s (inputs rounded on load; O in %s, LSE in fp32)\n", fa::dtype_name(t), fa::dtype_name(t));
  if (!f.block_mask.empty())
    std::printf("mask:    %s, %d x %d blocks of %d queries x %d keys, density %.3f\n", f.block_mask.c_str(), mask.Tr,
                mask.Tc, fa::kMaskRows, fa::kMaskCols, mask.density());

  // 3. The GPU (none: exit 1), and room on it.
  fa::require_gpu();
  fa::require_device_memory(device_bytes(p, f.backward), "inputs and outputs of chapters 05 and 04");

  // 4-6. Run, check, time and print the forward steps, then the backward steps (bwd_program.cuh).
  if (fp8) return fa::verdict(run_fp8(opts, f, p, in, fp8_steps));
  const fa::BlockMask* m = f.block_mask.empty() ? nullptr : &mask;
  bool ok = t == fa::Dtype::fp16 ? run<fa::half_t>(opts, f, t, p, in, m) : run<fa::bfloat16_t>(opts, f, t, p, in, m);
  if (f.backward) {
    std::vector<fa::ResultRow> rows;
    ok = wsq::run_backward_section(opts, t, p, in, f.bwd_kernel, rows) && ok;
    fa::report_rows(opts, rows);
  }
  return fa::verdict(ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
