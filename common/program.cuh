// The device side of every chapter program, one job per function:
//   require_gpu            step 3: "no CUDA device" (exit 1) or the device's name
//   require_device_memory  a size the device cannot hold is refused before allocating (exit 2)
//   run_and_check_*        one run on NaN-poisoned outputs, checked against the fp64 reference
//   write_outputs          --out: o.npy, lse.npy (and dq/dk/dv.npy) from the device tensors
//   result_row, time_kernel  the one way to build a result row and to time a kernel for it
//   naive_row              chapter 00's row, the baseline of chapters 01-03
//   compare_with           the previous chapter's kernel on the same inputs, in one call
#pragma once
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_check.cuh"
#include "device.cuh"
#include "device_tensors.cuh"
#include "formulas.hpp"
#include "program.hpp"
#include "testing.hpp"
#include "timer.cuh"

namespace fa {

inline void require_gpu() {
  if (!has_cuda_device()) throw std::runtime_error("no CUDA device (this program runs its kernels on an NVIDIA GPU)");
  std::printf("device:  %s\n", device_name().c_str());
}

// what: "inputs, outputs and S, P" - said in the message with the amounts.
inline void require_device_memory(double bytes, const std::string& what) {
  const double free_b = double(device_free_bytes());
  if (bytes > free_b)
    throw UsageError("this problem needs " + human_bytes(bytes) + " of device memory (" + what + "); the device has " +
                     human_bytes(free_b) + " free: use a smaller batch, heads or length");
}
// Device bytes of the inputs and outputs of `p` (DeviceTensors), fp32.
inline double device_io_bytes(const Problem& p, bool backward) {
  const double fwd = 2.0 * p.q_elems() + 2.0 * p.kv_elems() + p.lse_elems();  // Q, K, V, O, LSE
  return 4.0 * (fwd + (backward ? 2.0 * p.q_elems() + 2.0 * p.kv_elems() : 0.0));  // + dO, dQ, dK, dV
}

// Poisons t's forward outputs, runs `run` once, and checks O and LSE against the fp64 reference (with the
// block mask `mask`, if given, for a block-sparse run); prints "check:   <label>, <what was checked>: <errors>".
template <class Fn>
ErrorReport run_and_check_forward(const std::string& label, const Problem& p, const HostTensors& in, DeviceTensors& t,
                                  Fn&& run, const BlockMask* mask = nullptr) {
  t.o.poison(), t.lse.poison();
  run();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::string what;
  const ErrorReport e = check_forward(p, in, t.o.download(), t.lse.download(), kTolFp32Forward, &what, mask);
  std::printf("check:   %s, %s: %s\n", label.c_str(), what.c_str(), e.summary("O and LSE vs fp64").c_str());
  return e;
}
// The same for a backward pass: dQ, dK, dV (run after a forward that left O and LSE in t).
template <class Fn>
ErrorReport run_and_check_backward(const std::string& label, const Problem& p, const HostTensors& in, DeviceTensors& t,
                                   Fn&& run, const BlockMask* mask = nullptr) {
  t.dq.poison(), t.dk.poison(), t.dv.poison();
  run();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::string what;
  const ErrorReport e =
      check_backward(p, in, t.dq.download(), t.dk.download(), t.dv.download(), kTolFp32Backward, &what, mask);
  std::printf("check:   %s, %s: %s\n", label.c_str(), what.c_str(), e.summary("dQ, dK, dV vs fp64").c_str());
  return e;
}

// --out DIR: the forward outputs in t, and the backward ones if t has them.
inline void write_outputs(const Options& opts, const Problem& p, const DeviceTensors& t) {
  if (opts.out_dir.empty()) return;
  write_forward_outputs(opts.out_dir, p, t.o.download(), t.lse.download());
  if (t.dq.size()) write_backward_outputs(opts.out_dir, p, t.dq.download(), t.dk.download(), t.dv.download());
}

// A row for `kernel` of `chapter` on `p` (pass "fwd" or "bwd"), on this device; the caller sets the
// fields it knows by name (model_hbm_bytes, extra_bytes, max_abs_err) and time_kernel the rest.
inline ResultRow result_row(const std::string& chapter, const std::string& kernel, const std::string& pass,
                            const Problem& p) {
  ResultRow r;
  r.gpu = device_name(), r.chapter = chapter, r.kernel = kernel, r.pass = pass, r.problem = p;
  return r;
}

// The row of chapter 00's standard attention (pass "fwd" or "bwd"), the baseline that chapters 01-03
// time next to their own: its model HBM bytes count S and P (formulas.hpp), extra_bytes its N x N workspace.
inline ResultRow naive_row(const Problem& p, const std::string& pass, double workspace_bytes) {
  ResultRow r = result_row("00", "naive", pass, p);
  r.model_hbm_bytes = pass == "bwd" ? hbm_bytes_naive_backward(p) : hbm_bytes_naive_forward(p);
  r.extra_bytes = workspace_bytes;
  return r;
}

// Times `run` (timer.cuh: opts.warmup untimed runs, then the median of opts.iters with the L2 flushed
// before each) and fills row.ms, row.tflops (the pass's FLOPs, formulas.hpp) and row.gbps (the row's
// model_hbm_bytes over the time).
template <class Fn>
ResultRow time_kernel(const Options& opts, ResultRow row, Fn&& run) {
  row.ms = time_ms(run, opts.warmup, opts.iters);
  row.tflops = tflops(row.pass == "bwd" ? flops_backward(row.problem) : flops_forward(row.problem), row.ms);
  row.gbps = gbps(row.model_hbm_bytes, row.ms);
  return row;
}

// Another chapter's kernel next to this one, in one call: run once on t's poisoned outputs and
// checked against fp64 (the forward or backward check, by row.pass; a backward `run` needs its
// forward's results in place), then, if opts.iters > 0, timed into `row`, appended to rows, and this
// chapter's row `mine` printed as a speed-up over it. Returns whether the check passed.
template <class Fn>
bool compare_with(const Options& opts, const HostTensors& in, DeviceTensors& t, const ResultRow& mine, ResultRow row,
                  Fn&& run, std::vector<ResultRow>& rows) {
  const std::string label = row.chapter + " " + row.kernel;
  const ErrorReport e = row.pass == "bwd" ? run_and_check_backward(label, row.problem, in, t, run)
                                          : run_and_check_forward(label, row.problem, in, t, run);
  row.max_abs_err = e.max_abs;
  if (opts.iters > 0) {
    rows.push_back(time_kernel(opts, row, run));
    print_speedup(mine, rows.back());
  }
  return e.ok();
}

}  // namespace fa
