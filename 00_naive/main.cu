// Chapter 00 program: standard attention on the GPU, checked against the fp64 reference, timed,
// with the memory it needs for S and P - the O(N^2) wall that FlashAttention removes.
//   ./naive                        B=1 H=16 N=1024 d=64, forward
//   ./naive --q-len 4096 --backward
//   ./naive --in DIR --out DIR     your own q/k/v(/do).npy; writes o/lse(/dq/dk/dv).npy
#include <cstdio>

#include "device_tensors.cuh"
#include "formulas.hpp"
#include "naive.cuh"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"

namespace {

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 1, o.problem.heads = 16, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

bool run(fa::Options& opts, bool backward) {
  const fa::HostTensors in = fa::load_inputs(opts, backward);
  const fa::Problem& p = opts.problem;

  // Refuse up front what cannot fit: S and P are B*H*Nq*Nk floats each.
  const size_t ws_bytes = naive::workspace_bytes(p, backward);
  const size_t io_bytes = 4 * (2 * p.q_elems() + 2 * p.kv_elems() + p.lse_elems()) * (backward ? 2 : 1);
  const size_t free_bytes = fa::device_free_bytes();
  std::printf("memory:  %s for the N x N matrices (S, P%s%s) + %s for inputs and outputs; %s free\n",
              fa::human_bytes(double(ws_bytes)).c_str(), p.dropout_p > 0 ? ", P~" : "", backward ? ", dP" : "",
              fa::human_bytes(double(io_bytes)).c_str(), fa::human_bytes(double(free_bytes)).c_str());
  if (ws_bytes + io_bytes > free_bytes) {
    std::fprintf(stderr,
                 "error: standard attention needs %s at this size but the device has %s free.\n"
                 "       Its memory grows as B*H*Nq*Nk; try a smaller --q-len, or a FlashAttention chapter (02+),\n"
                 "       which needs O(N) extra memory.\n",
                 fa::human_bytes(double(ws_bytes + io_bytes)).c_str(), fa::human_bytes(double(free_bytes)).c_str());
    return false;
  }

  fa::DeviceTensors t(p, in);
  naive::Workspace ws(p, backward);
  auto fwd = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws); };
  auto bwd = [&] {
    naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, t.dq.get(), t.dk.get(), t.dv.get());
  };

  // One checked run on poisoned outputs.
  t.poison_outputs();
  fwd();
  if (backward) bwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o = t.o.download(), lse = t.lse.download();
  std::string what;
  const fa::ErrorReport ef = fa::check_forward(p, in, o, lse, fa::kTolFp32Forward, &what);
  std::printf("check:   forward, %s: %s\n", what.c_str(), ef.summary("O and LSE vs fp64").c_str());
  bool ok = ef.ok();
  fa::ErrorReport eb;
  if (backward) {
    eb = fa::check_backward(p, in, t.dq.download(), t.dk.download(), t.dv.download(), fa::kTolFp32Backward, &what);
    std::printf("check:   backward, %s: %s\n", what.c_str(), eb.summary("vs fp64").c_str());
    ok = ok && eb.ok();
  }
  if (!opts.out_dir.empty()) {
    fa::write_forward_outputs(opts.out_dir, p, o, lse);
    if (backward) fa::write_backward_outputs(opts.out_dir, p, t.dq.download(), t.dk.download(), t.dv.download());
  }

  std::vector<fa::ResultRow> rows;
  const std::string gpu = fa::device_name();
  if (opts.iters > 0) {
    const double ms = fa::time_ms(fwd, opts.warmup, opts.iters).median_ms;
    const double bytes = fa::hbm_bytes_naive_forward(p);
    rows.push_back({gpu, "00", "naive", "fwd", "fp32", p, ms, fa::tflops(fa::flops_forward(p), ms),
                    fa::gbps(bytes, ms), bytes, double(naive::workspace_bytes(p, false)), ef.max_abs});
    if (backward) {
      const double msb = fa::time_ms(bwd, opts.warmup, opts.iters).median_ms;
      const double bb = fa::hbm_bytes_naive_backward(p);
      rows.push_back({gpu, "00", "naive", "bwd", "fp32", p, msb, fa::tflops(fa::flops_backward(p), msb),
                      fa::gbps(bb, msb), bb, double(ws_bytes), eb.max_abs});
    }
    fa::report_rows(opts, rows);
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool backward = false;
  fa::Cli cli("naive", "Chapter 00: standard attention (S and P in HBM), checked against the fp64 reference.",
              defaults());
  cli.add_flag("--backward", &backward, "also run and check the backward pass (dQ, dK, dV)");
  cli.add_check([](const fa::Problem& p) {  // what the issue asks of this chapter; the kernels take any d
    if (p.head_dim > 256) throw fa::UsageError("naive: head_dim must be <= 256 (got " + std::to_string(p.head_dim) + ")");
  });
  return fa::run_program(cli, argc, argv, [&](fa::Options& o) { return run(o, backward); });
}
