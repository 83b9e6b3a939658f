// Chapter 03 program: chapter 02's FlashAttention-1 forward, then this chapter's backward
// (seed Algorithm 4), checked against the fp64 reference and against chapter 00's backward, timed
// next to 00's backward at the same size. No N x N buffer: it runs where 00 refuses.
//   ./fa1_backward                      B=4 H=16 N=1024 d=64
//   ./fa1_backward --batch 2 --heads 16 --q-len 32768 --iters 3 --warmup 1   (00 skipped: S, P, dP do not fit)
#include <cstdio>

#include "device_tensors.cuh"
#include "fa1_backward.cuh"
#include "formulas.hpp"
#include "naive.cuh"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"

namespace {

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 16, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

bool run(fa::Options& opts) {
  const fa::HostTensors in = fa::load_inputs(opts, true);
  const fa::Problem& p = opts.problem;

  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  fa1::RngState rng{};
  auto fwd = [&] { rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get()); };
  auto bwd = [&] {
    fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.dout.get(), t.dq.get(),
                  t.dk.get(), t.dv.get());
  };

  t.poison_outputs();
  fwd();
  bwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o = t.o.download(), lse = t.lse.download();
  const std::vector<float> dq = t.dq.download(), dk = t.dk.download(), dv = t.dv.download();
  std::string what;
  const fa::ErrorReport ef = fa::check_forward(p, in, o, lse, fa::kTolFp32Forward, &what);
  std::printf("check:   02 forward, %s: %s\n", what.c_str(), ef.summary("O and LSE vs fp64").c_str());
  const fa::ErrorReport eb = fa::check_backward(p, in, dq, dk, dv, fa::kTolFp32Backward, &what);
  std::printf("check:   03 backward, %s: %s\n", what.c_str(), eb.summary("vs fp64").c_str());
  bool ok = ef.ok() && eb.ok();
  if (!opts.out_dir.empty()) {
    fa::write_forward_outputs(opts.out_dir, p, o, lse);
    fa::write_backward_outputs(opts.out_dir, p, dq, dk, dv);
  }
  const double extra = 2.0 * p.lse_elems() * sizeof(float);  // l and m: O(N), no N x N buffer
  std::printf("memory:  03 keeps %s beyond inputs and outputs (l, m); no N x N buffer\n", fa::human_bytes(extra).c_str());

  // 00 at the same size, if its N x N matrices fit next to ours.
  // 00 needs its N x N workspace plus its own O, LSE, dQ, dK, dV next to ours.
  const size_t ws_bytes = naive::workspace_bytes(p, true), free_bytes = fa::device_free_bytes();
  const size_t naive_io = sizeof(float) * (2 * p.q_elems() + p.lse_elems() + 2 * p.kv_elems());
  const bool run_naive = ws_bytes + naive_io < free_bytes;
  if (!run_naive)
    std::printf("skip:    00 backward needs %s for S, P%s, dP (plus %s for its own outputs) at this size; "
                "the device has %s free\n",
                fa::human_bytes(double(ws_bytes)).c_str(), p.dropout_p > 0 ? ", P~" : "",
                fa::human_bytes(double(naive_io)).c_str(), fa::human_bytes(double(free_bytes)).c_str());
  std::printf("model:   backward %.4g FLOP (2.5 x the forward's %.4g); HBM traffic %s by Algorithm 4's count "
              "(Nd(5 + 5Tc) + 2N Tc elements per head without a mask), %s by the seed's 2Nd(4 + 5Tc) elements, "
              "%s for 00's backward\n",
              fa::flops_backward(p), fa::flops_forward(p), fa::human_bytes(fa1::backward_hbm_bytes(p)).c_str(),
              fa::human_bytes(fa1::backward_seed_formula_bytes(p)).c_str(),
              fa::human_bytes(fa::hbm_bytes_naive_backward(p)).c_str());

  std::vector<fa::ResultRow> rows;
  const std::string gpu = fa::device_name();
  if (run_naive) {
    // Equivalence chain: 00's backward on the same inputs (a check that works at any size).
    naive::Workspace ws(p, true);
    fa::DeviceBuffer<float> o0(p.q_elems()), lse0(p.lse_elems()), dq0(p.q_elems()), dk0(p.kv_elems()), dv0(p.kv_elems());
    auto fwd0 = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), o0.get(), lse0.get(), ws); };
    auto bwd0 = [&] { naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, dq0.get(), dk0.get(), dv0.get()); };
    fwd0();
    bwd0();
    CUDA_CHECK(cudaDeviceSynchronize());
    fa::ErrorReport e0 = fa::compare(dq, fa::to_double(dq0.download()), fa::kTolFp32Backward);
    e0 += fa::compare(dk, fa::to_double(dk0.download()), fa::kTolFp32Backward);
    e0 += fa::compare(dv, fa::to_double(dv0.download()), fa::kTolFp32Backward);
    std::printf("check:   03 backward vs 00 backward, all elements: %s\n", e0.summary("dQ, dK, dV").c_str());
    ok = ok && e0.ok();
    if (opts.iters > 0) {
      const double ms = fa::time_ms(bwd0, opts.warmup, opts.iters).median_ms;
      const double bytes = fa::hbm_bytes_naive_backward(p);
      rows.push_back({gpu, "00", "naive", "bwd", "fp32", p, ms, fa::tflops(fa::flops_backward(p), ms),
                      fa::gbps(bytes, ms), bytes, double(ws_bytes), -1});
    }
  }
  if (opts.iters > 0) {
    const double msf = fa::time_ms(fwd, opts.warmup, opts.iters).median_ms;
    const double bf = fa1::forward_hbm_bytes(p, fa1::block_sizes(p.head_dim, fa1::device_sram_bytes()));
    rows.push_back({gpu, "02", "fa1", "fwd", "fp32", p, msf, fa::tflops(fa::flops_forward(p), msf), fa::gbps(bf, msf),
                    bf, extra, ef.max_abs});
    const double ms = fa::time_ms(bwd, opts.warmup, opts.iters).median_ms;
    const double bytes = fa1::backward_hbm_bytes(p);
    rows.push_back({gpu, "03", "fa1", "bwd", "fp32", p, ms, fa::tflops(fa::flops_backward(p), ms), fa::gbps(bytes, ms),
                    bytes, extra, eb.max_abs});
    fa::report_rows(opts, rows);
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  fa::Cli cli("fa1_backward",
              "Chapter 03: FlashAttention-1 backward (recomputation from m, l), after 02's forward; "
              "compared with 00's backward.",
              defaults());
  cli.add_check(fa1::check_supported);  // the backward supports what 02's forward does
  return fa::run_program(cli, argc, argv, [](fa::Options& o) { return run(o); });
}
