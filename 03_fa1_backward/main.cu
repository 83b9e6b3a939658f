// Chapter 03 program: chapter 02's FlashAttention-1 forward, then this chapter's backward
// (FA1 paper, Algorithm 4), checked against the fp64 reference, timed next to chapter 00's backward at the
// same size. No N x N buffer: it runs where 00 refuses.
//   ./fa1_backward                      B=4 H=16 N=1024 d=64
//   ./fa1_backward --batch 2 --heads 16 --q-len 32768 --iters 3 --warmup 1   (00 skipped: S, P, dP do not fit)
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <cstdio>

#include "fa1_backward.cuh"
#include "naive.cuh"
#include "program.cuh"

namespace {

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 16, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage: exit 2).
  fa::Cli cli("fa1_backward",
              "Chapter 03: FlashAttention-1 backward (recomputation from m, l), after 02's forward; "
              "compared with 00's backward.",
              defaults());
  cli.extend_help("--head-dim", "this chapter: 16, 32, 64, 128");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();

  // 2. The inputs: shape, this chapter's limits, the tensors, writable outputs (bad input: exit 2).
  const fa::Problem p = fa::input_problem(opts, true);
  fa1::check_supported(p);  // the backward supports what 02's forward does
  const fa::HostTensors in = fa::load_inputs(opts, p, true);
  fa::check_outputs_writable(opts);
  std::printf("problem: %s (forward + backward)\n", fa::describe(p).c_str());

  // 3. The GPU (none: exit 1), and the memory: inputs, outputs, and l, m - no N x N buffer.
  fa::require_gpu();
  const double lm_bytes = 2.0 * 4 * p.lse_elems();
  fa::require_device_memory(fa::device_io_bytes(p, true) + lm_bytes, "Q, K, V, dO, O, LSE, dQ, dK, dV, l, m");
  std::printf("memory:  03 keeps %s beyond inputs and outputs (l, m); no N x N buffer\n", fa::human_bytes(lm_bytes).c_str());

  // 4. Run once on NaN-poisoned outputs (02's forward, then 03's backward) and check against fp64.
  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  fa1::RngState rng{};
  auto fwd = [&] { rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get()); };
  auto bwd = [&] {
    fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.dout.get(), t.dq.get(),
                  t.dk.get(), t.dv.get());
  };
  l.poison(), m.poison();
  const fa::ErrorReport ef = fa::run_and_check_forward("02 forward", p, in, t, fwd);
  const fa::ErrorReport eb = fa::run_and_check_backward("03 backward", p, in, t, bwd);
  fa::write_outputs(opts, p, t);

  // 5. Time both passes, with Algorithm 4's HBM traffic, next to chapter 00's backward.
  fa::ResultRow rf = fa::result_row("02", "fa1_forward", "fwd", p), rb = fa::result_row("03", "fa1_backward", "bwd", p);
  rf.model_hbm_bytes = fa1::forward_hbm_bytes(p, fa1::block_sizes(p.head_dim, fa1::device_sram_bytes()));
  rb.model_hbm_bytes = fa1::backward_hbm_bytes(p);
  rf.extra_bytes = rb.extra_bytes = lm_bytes;
  rf.max_abs_err = ef.max_abs, rb.max_abs_err = eb.max_abs;
  std::vector<fa::ResultRow> rows;
  if (opts.iters > 0) {
    rows.push_back(rf = fa::time_kernel(opts, rf, fwd));
    rows.push_back(rb = fa::time_kernel(opts, rb, bwd));
  }
  std::printf("model:   backward %.4g FLOP (2.5 x the forward's %.4g); HBM traffic %s by Algorithm 4's count "
              "(Nd(5 + 5Tc) + 2N Tc elements per head without a mask), %s by the paper's 2Nd(4 + 5Tc) bytes at 2 bytes "
              "an element (= d (4 Nk + 5 Nq Tc) elements, here x 4 bytes), "
              "%s for 00's backward\n",
              fa::flops_backward(p), fa::flops_forward(p), fa::human_bytes(rb.model_hbm_bytes).c_str(),
              fa::human_bytes(fa1::backward_paper_formula_bytes(p)).c_str(),
              fa::human_bytes(fa::hbm_bytes_naive_backward(p)).c_str());
  bool ok = ef.ok() && eb.ok();
  // 00 needs its N x N workspace (S, P, dP) next to our tensors.
  const size_t naive_ws = naive::workspace_bytes(p, true);
  if (double(naive_ws) + fa::device_io_bytes(p, true) + lm_bytes <= double(fa::device_free_bytes())) {
    naive::Workspace ws(p, true);
    naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws);  // P for 00's backward
    auto naive_bwd = [&] {
      naive::backward(p, t.q.get(), t.k.get(), t.v.get(), t.dout.get(), ws, t.dq.get(), t.dk.get(), t.dv.get());
    };
    ok = fa::compare_with(opts, in, t, rb, fa::naive_row(p, "bwd", double(naive_ws)), naive_bwd, rows) && ok;
  } else {
    std::printf("00:      skipped: its backward needs %s for S, P%s, dP at this size, more than the device has free\n",
                fa::human_bytes(double(naive_ws)).c_str(), p.dropout_p > 0 ? ", P^drop" : "");
  }

  // 6. Print.
  fa::report_rows(opts, rows);
  return fa::verdict(ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
