// Chapter 04 program: FlashAttention-2 forward (and with --backward the backward, both dQ modes), checked against
// the fp64 reference, timed side by side with chapters 02 (FA1 forward) and 03 (FA1 backward) on the same inputs.
//   ./fa2                               B=1 H=16 N=4096 d=64, forward, vs 02
//   ./fa2 --backward                    + backward (atomic and deterministic dQ), vs 03
//   ./fa2 --sweep --backward --iters 5  N = 1024, 4096, 16384 x d = 64, 128, causal off and on
//   ./fa2 --batch 1 --heads 2 --q-len 16384   grid size vs SM count when batch*heads is small
//   ./fa2 --in DIR --out DIR            your own q/k/v(/do).npy; writes o/lse(/dq/dk/dv).npy
#include <cstdio>

#include "device_tensors.cuh"
#include "fa1_backward.cuh"
#include "fa2.cuh"
#include "formulas.hpp"
#include "model.hpp"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"

namespace {

struct Flags {
  bool backward = false, sweep = false, no_previous = false;
};

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 1, o.problem.heads = 16, o.problem.q_len = 4096, o.problem.head_dim = 64;
  return o;
}

// HBM bytes of the 04 kernels with their tile sizes (the counts are in model.hpp, tested on the CPU).
double hbm_bytes_fa2_forward(const fa::Problem& p) { return fa2_model::hbm_bytes_forward(p, fa2::forward_tiles().Br); }
double hbm_bytes_fa2_backward(const fa::Problem& p, fa2::DqMode mode) {
  const fa2::Tiles tb = fa2::backward_tiles(), tf = fa2::forward_tiles();
  return fa2_model::hbm_bytes_backward(p, mode == fa2::DqMode::Atomic, tb.Br, tb.Bc, tf.Br);
}

void print_work_notes(const fa::Problem& p) {
  const fa2::Tiles t = fa2::forward_tiles();
  const int sms = fa::device_props().multiProcessorCount;
  const long long tr = (p.q_len + t.Br - 1) / t.Br, tc = (p.kv_len + t.Bc - 1) / t.Bc;
  const long long grid = tr * p.heads * p.batch;
  long long tiles = 0;  // (i, j) tiles the forward visits per head
  for (int i0 = 0; i0 < p.q_len; i0 += t.Br) tiles += (fa2_model::kv_rows_seen(p, i0, t.Br) + t.Bc - 1) / t.Bc;
  std::printf("grid:    forward %lld blocks = %lld Q blocks x %d heads x %d batch on %d SMs (%.1f blocks/SM);\n"
              "         a grid over (batch, head) alone would have %d blocks (%.2f per SM)\n",
              grid, tr, p.heads, p.batch, sms, double(grid) / sms, p.batch * p.heads, double(p.batch * p.heads) / sms);
  std::printf("skip:    forward visits %lld of %lld (Q block, K/V block) tiles per head%s\n", tiles, tr * tc,
              p.causal ? " (causal: blocks above the diagonal skipped)" : "");
  // Per (Q row, K/V block) of Bc keys the FA2 forward does Bc exps for P plus one for exp(m_old - m_new), and
  // d multiplies to rescale O~; FA1 (seed Algorithm 2, line 12) also rescales and divides O_i by l_new and
  // reads and writes O_i, l_i, m_i through HBM in every step.
  const double rows = double(p.batch) * p.heads * p.q_len;
  const double steps = double(p.batch) * p.heads * t.Br * double(tiles);  // row-steps, incl. tail padding
  std::printf("work:    exps %.3g (P) + %.3g (rescale); non-matmul FLOPs on O: FA2 ~%.3g (rescale) + %.3g (final "
              "divide), FA1 ~%.3g (two scalings, add, divide per step) + O, l, m HBM round trips each step\n",
              steps * t.Bc, steps, steps * p.head_dim, rows * p.head_dim, 4.0 * steps * p.head_dim);
}

bool run_size(const fa::Options& opts, const fa::HostTensors& in, const Flags& f, std::vector<fa::ResultRow>& rows) {
  const fa::Problem& p = opts.problem;
  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> ws(f.backward ? fa2::backward_workspace_bytes(p) / sizeof(float) : 0);
  auto fwd = [&] { fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get()); };
  auto bwd = [&](fa2::DqMode mode) {
    fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                  t.dv.get(), mode, ws.get());
  };

  // One checked run on poisoned outputs.
  t.poison_outputs();
  fwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o = t.o.download(), lse = t.lse.download();
  std::string what;
  const fa::ErrorReport ef = fa::check_forward(p, in, o, lse, fa::kTolFp32Forward, &what);
  std::printf("check:   forward, %s: %s\n", what.c_str(), ef.summary("O and LSE vs fp64").c_str());
  bool ok = ef.ok();
  const fa2::DqMode modes[] = {fa2::DqMode::Atomic, fa2::DqMode::Deterministic};
  const char* mode_names[] = {"fa2_atomic_dq", "fa2_determ_dq"};
  double bwd_err[2] = {-1, -1};
  if (f.backward)
    for (int mi = 0; mi < 2; ++mi) {
      t.dq.poison(), t.dk.poison(), t.dv.poison();
      bwd(modes[mi]);
      CUDA_CHECK(cudaDeviceSynchronize());
      const fa::ErrorReport eb =
          fa::check_backward(p, in, t.dq.download(), t.dk.download(), t.dv.download(), fa::kTolFp32Backward, &what);
      std::printf("check:   backward (%s), %s: %s\n", mode_names[mi], what.c_str(), eb.summary("vs fp64").c_str());
      ok = ok && eb.ok(), bwd_err[mi] = eb.max_abs;
    }
  if (!opts.out_dir.empty()) {  // the backward outputs are the deterministic run's (the last one)
    fa::write_forward_outputs(opts.out_dir, p, o, lse);
    if (f.backward) fa::write_backward_outputs(opts.out_dir, p, t.dq.download(), t.dk.download(), t.dv.download());
  }
  print_work_notes(p);
  if (opts.iters <= 0) return ok;

  const std::string gpu = fa::device_name();
  auto row = [&](const char* ch, const char* kernel, const char* pass, double ms, double flops, double bytes,
                 double extra, double err) {
    rows.push_back({gpu, ch, kernel, pass, "fp32", p, ms, fa::tflops(flops, ms), fa::gbps(bytes, ms), bytes, extra, err});
  };
  const double ms_fwd = fa::time_ms(fwd, opts.warmup, opts.iters).median_ms;
  row("04", "fa2", "fwd", ms_fwd, fa::flops_forward(p), hbm_bytes_fa2_forward(p), 0, ef.max_abs);
  double ms_bwd[2] = {0, 0};
  if (f.backward)
    for (int mi = 0; mi < 2; ++mi) {
      ms_bwd[mi] = fa::time_ms([&] { bwd(modes[mi]); }, opts.warmup, opts.iters).median_ms;
      row("04", mode_names[mi], "bwd", ms_bwd[mi], fa::flops_backward(p), hbm_bytes_fa2_backward(p, modes[mi]),
          double(fa2::backward_workspace_bytes(p)), bwd_err[mi]);
    }
  if (f.no_previous) return ok;

  // Chapters 02 and 03 on the same inputs: FA1 also keeps l and m [B,H,Nq] in HBM. Their rows carry the HBM
  // models of chapters 02 and 03 (the same numbers their own programs report).
  fa::DeviceBuffer<float> o1(p.q_elems()), l1(p.lse_elems()), m1(p.lse_elems()), lse1(p.lse_elems());
  fa::DeviceBuffer<float> dq1(f.backward ? p.q_elems() : 0), dk1(f.backward ? p.kv_elems() : 0),
      dv1(f.backward ? p.kv_elems() : 0);
  fa1::RngState rng{};
  auto fwd1 = [&] { rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), o1.get(), l1.get(), m1.get(), lse1.get()); };
  auto bwd1 = [&] {
    fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), o1.get(), l1.get(), m1.get(), t.dout.get(), dq1.get(),
                  dk1.get(), dv1.get());
  };
  o1.poison(), lse1.poison();
  fwd1();
  CUDA_CHECK(cudaDeviceSynchronize());
  const fa::ErrorReport e12 = fa::compare(o, fa::to_double(o1.download()), fa::kTolFp32Forward);
  std::printf("chain:   %s\n", e12.summary("04 O vs 02 O").c_str());
  ok = ok && e12.ok();
  const double ms1 = fa::time_ms(fwd1, opts.warmup, opts.iters).median_ms;
  const double bytes1 = fa1::forward_hbm_bytes(p, fa1::block_sizes(p.head_dim, fa1::device_sram_bytes()));
  row("02", "fa1_forward", "fwd", ms1, fa::flops_forward(p), bytes1, 2.0 * 4 * p.lse_elems(), -1);
  std::printf("speed:   forward 04 is %.2fx 02\n", ms1 / ms_fwd);
  if (f.backward) {
    dq1.poison();
    bwd1();
    CUDA_CHECK(cudaDeviceSynchronize());
    fa::ErrorReport e13 = fa::compare(t.dq.download(), fa::to_double(dq1.download()), fa::kTolFp32Backward);
    e13 += fa::compare(t.dk.download(), fa::to_double(dk1.download()), fa::kTolFp32Backward);
    e13 += fa::compare(t.dv.download(), fa::to_double(dv1.download()), fa::kTolFp32Backward);
    std::printf("chain:   %s\n", e13.summary("04 dQ, dK, dV vs 03").c_str());
    ok = ok && e13.ok();
    const double msb1 = fa::time_ms(bwd1, opts.warmup, opts.iters).median_ms;
    row("03", "fa1_backward", "bwd", msb1, fa::flops_backward(p), fa1::backward_hbm_bytes(p), 2.0 * 4 * p.lse_elems(), -1);
    std::printf("speed:   backward 04 (atomic dQ) is %.2fx 03, 04 (deterministic dQ) is %.2fx 03\n", msb1 / ms_bwd[0],
                msb1 / ms_bwd[1]);
  }
  return ok;
}

bool run(fa::Options& opts, const Flags& f) {
  std::vector<fa::ResultRow> rows;
  if (!f.sweep) {
    const fa::HostTensors in = fa::load_inputs(opts, f.backward);
    const bool ok = run_size(opts, in, f, rows);
    if (!rows.empty()) fa::report_rows(opts, rows);
    return ok;
  }
  if (!opts.in_dir.empty()) throw fa::UsageError("--sweep makes its own inputs; it cannot be combined with --in");
  bool ok = true;
  for (int d : {64, 128})
    for (int n : {1024, 4096, 16384})
      for (bool causal : {false, true}) {
        fa::Options o = opts;
        o.problem.head_dim = d, o.problem.q_len = o.problem.kv_len = n, o.problem.causal = causal;
        std::printf("\n== %s\n", fa::describe(o.problem).c_str());
        const fa::HostTensors in = fa::random_inputs(o.problem, f.backward);
        ok = run_size(o, in, f, rows) && ok;
      }
  std::printf("\n");
  fa::report_rows(opts, rows);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  fa::Cli cli("fa2",
              "Chapter 04: FlashAttention-2 forward (and backward), fp32, checked against the fp64 reference and "
              "timed next to chapters 02 and 03.",
              defaults());
  cli.add_check(fa2::check_supported);
  cli.add_flag("--backward", &f.backward, "also run, check and time the backward pass (both dQ modes) and 03's");
  cli.add_flag("--sweep", &f.sweep,
               "run N = 1024, 4096, 16384 x head_dim 64, 128 x causal off/on (ignores --q-len, --kv-len, --head-dim, "
               "--causal)");
  cli.add_flag("--no-previous", &f.no_previous, "do not run chapters 02/03 for comparison");
  return fa::run_program(cli, argc, argv, [&](fa::Options& o) { return run(o, f); });
}
