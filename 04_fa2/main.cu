// Chapter 04 program: FlashAttention-2 forward, step by step up the ladder (--kernel), and with
// --backward the backward in both dQ modes; everything checked against the fp64 reference and timed
// next to chapters 02 (FA1 forward) and 03 (FA1 backward) on the same inputs.
//   ./fa2                               B=1 H=16 N=4096 d=64, the fastest forward step, vs 02
//   ./fa2 --kernel all                  every forward step: its speed-up over the step before and over 02
//   ./fa2 --backward                    + backward (atomic and deterministic dQ), vs 03
//   ./fa2 --sweep --backward --iters 5  N = 1024, 4096, 16384 x d = 64, 128, causal off and on
//   ./fa2 --batch 1 --heads 2 --q-len 16384   grid size vs SM count when batch*heads is small
//   ./fa2 --in DIR --out DIR            your own q/k/v(/do).npy; writes o/lse(/dq/dk/dv).npy
//   ./fa2 --q-len 16384 --block-mask local:512 --backward   block-sparse, timed next to the dense kernels
//   ./fa2 --list-steps                  the forward ladder, one step a line (what the scripts read)
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <cstdio>
#include <string>
#include <vector>

#include "fa1_backward.cuh"
#include "fa2.cuh"
#include "model.hpp"
#include "program.cuh"

namespace {

struct Flags {
  bool backward = false, sweep = false, no_previous = false, list_steps = false;
  std::string kernel;      // a forward step's name, or "all"
  std::string block_mask;  // SPEC (common/block_mask.hpp), empty = dense only
};

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 1, o.problem.heads = 16, o.problem.q_len = 4096, o.problem.head_dim = 64;
  return o;
}

// HBM bytes of the 04 kernels with their tile sizes (the counts are in model.hpp, tested on the CPU).
// With a block mask, only its visible tiles count.
double hbm_bytes_fa2_forward(const fa::Problem& p, const fa::BlockMask* mask = nullptr) {
  return fa2_model::hbm_bytes_forward(p, fa2::forward_tiles().Br, mask);
}
double hbm_bytes_fa2_backward(const fa::Problem& p, fa2::DqMode mode, const fa::BlockMask* mask = nullptr) {
  const fa2::Tiles tb = fa2::backward_tiles(), tf = fa2::forward_tiles();
  return fa2_model::hbm_bytes_backward(p, mode == fa2::DqMode::Atomic, tb.Br, tb.Bc, tf.Br, mask);
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
  // d multiplies to rescale O~; FA1 (its paper's Algorithm 2, line 12) also rescales and divides O_i by l_new and
  // reads and writes O_i, l_i, m_i through HBM in every step.
  const double rows = double(p.batch) * p.heads * p.q_len;
  const double steps = double(p.batch) * p.heads * t.Br * double(tiles);  // row-steps, incl. tail padding
  std::printf("work:    exps %.3g (P) + %.3g (rescale); non-matmul FLOPs on O: FA2 ~%.3g (rescale) + %.3g (final "
              "divide), FA1 ~%.3g (two scalings, add, divide per step) + O, l, m HBM round trips each step\n",
              steps * t.Bc, steps, steps * p.head_dim, rows * p.head_dim, 4.0 * steps * p.head_dim);
}

const fa2::DqMode kModes[] = {fa2::DqMode::Atomic, fa2::DqMode::Deterministic};
const char* const kModeNames[] = {"fa2_atomic_dq", "fa2_determ_dq"};

// Block-sparse: fa2::forward and both backward modes with the block mask, on the inputs (and device tensors)
// of the dense runs, each checked against the fp64 reference with the same mask and timed next to its dense
// row. A row's TFLOP/s counts the FLOPs of the visible pairs alone (formulas.hpp): the rate of work done.
bool run_block_sparse(const fa::Options& opts, const Flags& f, const fa::Problem& p, const fa::HostTensors& in,
                      const fa::BlockMask& mask, fa::DeviceTensors& t, float* ws, const fa::ResultRow& dense_fwd,
                      const std::vector<fa::ResultRow>& dense_bwd, std::vector<fa::ResultRow>& rows) {
  const fa::DeviceBuffer<uint8_t> bits(mask.bits);
  char density[32];
  std::snprintf(density, sizeof density, "_s%.3f", mask.density());
  bool ok = true;
  auto fwd = [&] { fa2::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), bits.get()); };
  fa::ErrorReport e = fa::run_and_check_forward("04 block-sparse forward (" + f.block_mask + ")", p, in, t, fwd, &mask);
  ok = ok && e.ok();
  fa::ResultRow r = fa::result_row("04", std::string("bsparse_fwd") + density, "fwd", p);
  r.model_hbm_bytes = hbm_bytes_fa2_forward(p, &mask), r.max_abs_err = e.max_abs;
  if (opts.iters > 0) {
    r = fa::time_kernel(opts, r, fwd);
    r.tflops = fa::tflops(fa::flops_forward(p, &mask), r.ms);
    rows.push_back(r);
    fa::print_speedup(r, dense_fwd);
  }
  for (int mi = 0; f.backward && mi < 2; ++mi) {
    auto bwd = [&] {
      fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                    t.dv.get(), kModes[mi], ws, bits.get());
    };
    e = fa::run_and_check_backward(std::string("04 block-sparse backward ") + kModeNames[mi], p, in, t, bwd, &mask);
    ok = ok && e.ok();
    r = fa::result_row("04", std::string("bsparse_") + (mi == 0 ? "atomic_dq" : "determ_dq") + density, "bwd", p);
    r.model_hbm_bytes = hbm_bytes_fa2_backward(p, kModes[mi], &mask), r.max_abs_err = e.max_abs;
    r.extra_bytes = double(fa2::backward_workspace_bytes(p));
    if (opts.iters > 0) {
      r = fa::time_kernel(opts, r, bwd);
      r.tflops = fa::tflops(fa::flops_backward(p, &mask), r.ms);
      rows.push_back(r);
      fa::print_speedup(r, dense_bwd[mi]);
    }
  }
  return ok;
}

// Steps 3-5 for one problem: memory, then each selected forward step run, checked and timed, the
// backward in both dQ modes, the block-sparse runs (with a mask), then chapters 02 and 03 on the same inputs.
bool run_problem(const fa::Options& opts, const Flags& f, const std::vector<fa2::ForwardStep>& steps,
                 const fa::Problem& p, const fa::BlockMask* mask, const fa::HostTensors& in,
                 std::vector<fa::ResultRow>& rows) {
  const double ws_bytes = f.backward ? double(fa2::backward_workspace_bytes(p)) : 0.0;
  const double lm_bytes = f.no_previous ? 0.0 : 2.0 * 4 * p.lse_elems();  // 02's l and m
  fa::require_device_memory(fa::device_io_bytes(p, f.backward) + ws_bytes + lm_bytes,
                            "inputs, outputs, the backward's D and 02's l, m");
  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> ws(size_t(ws_bytes) / sizeof(float));
  bool ok = true;

  // 4-5. Each forward step: run once on poisoned outputs, check against fp64, time; the ratio to the step before.
  std::vector<fa::ResultRow> step_rows;
  for (const fa2::ForwardStep& s : steps) {
    auto run = [&] { s.launch(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get()); };
    const fa::ErrorReport e = fa::run_and_check_forward(std::string("04 ") + s.name + " (" + s.idea + ")", p, in, t, run);
    ok = ok && e.ok();
    fa::ResultRow r = fa::result_row("04", s.name, "fwd", p);
    r.model_hbm_bytes = hbm_bytes_fa2_forward(p), r.max_abs_err = e.max_abs;
    if (opts.iters > 0) r = fa::time_kernel(opts, r, run);
    if (!step_rows.empty()) fa::print_speedup(r, step_rows.back());
    step_rows.push_back(r);
  }
  if (opts.iters > 0) rows.insert(rows.end(), step_rows.begin(), step_rows.end());

  // The backward in both dQ modes, from the last step's O and LSE.
  std::vector<fa::ResultRow> bwd_rows;
  for (int mi = 0; f.backward && mi < 2; ++mi) {
    auto run = [&] {
      fa2::backward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), t.dout.get(), t.dq.get(), t.dk.get(),
                    t.dv.get(), kModes[mi], ws.get());
    };
    const fa::ErrorReport e = fa::run_and_check_backward(std::string("04 backward ") + kModeNames[mi], p, in, t, run);
    ok = ok && e.ok();
    fa::ResultRow r = fa::result_row("04", kModeNames[mi], "bwd", p);
    r.model_hbm_bytes = hbm_bytes_fa2_backward(p, kModes[mi]), r.extra_bytes = ws_bytes, r.max_abs_err = e.max_abs;
    if (opts.iters > 0) rows.push_back(r = fa::time_kernel(opts, r, run));
    bwd_rows.push_back(r);
  }
  if (mask) ok = run_block_sparse(opts, f, p, in, *mask, t, ws.get(), step_rows.back(), bwd_rows, rows) && ok;
  fa::write_outputs(opts, p, t);  // the last run's: block-sparse if a mask is given, else the last forward step's
                                  // and the deterministic dQ mode's
  print_work_notes(p);
  if (f.no_previous) return ok;

  // Chapters 02 and 03 on the same inputs (they overwrite t's outputs; ours are checked and written).
  fa::DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  fa1::RngState rng{};
  fa::ResultRow r02 = fa::result_row("02", "fa1_forward", "fwd", p);
  r02.model_hbm_bytes = fa1::forward_hbm_bytes(p, fa1::block_sizes(p.head_dim, fa1::device_sram_bytes()));
  r02.extra_bytes = 2.0 * 4 * p.lse_elems();
  ok = fa::compare_with(opts, in, t, step_rows.back(), r02, [&] {
    rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get());
  }, rows) && ok;
  for (size_t i = 0; i + 1 < step_rows.size() && opts.iters > 0; ++i) fa::print_speedup(step_rows[i], rows.back());
  if (f.backward) {
    fa::ResultRow r03 = fa::result_row("03", "fa1_backward", "bwd", p);
    r03.model_hbm_bytes = fa1::backward_hbm_bytes(p), r03.extra_bytes = 2.0 * 4 * p.lse_elems();
    ok = fa::compare_with(opts, in, t, bwd_rows[0], r03, [&] {
      fa1::backward(p, rng, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.dout.get(), t.dq.get(),
                    t.dk.get(), t.dv.get());
    }, rows) && ok;
    if (opts.iters > 0) fa::print_speedup(bwd_rows[1], rows.back());
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage, an unknown --kernel: exit 2).
  Flags f;
  f.kernel = fa2::forward_steps().back().name;
  fa::Cli cli("fa2",
              "Chapter 04: FlashAttention-2 forward (a ladder of steps) and backward, fp32, checked against the fp64 "
              "reference and timed next to chapters 02 and 03.",
              defaults());
  cli.add_option("--kernel", &f.kernel, "forward step to run: " + fa::step_names(fa2::forward_steps()) + ", or all (in ladder order)");
  cli.add_flag("--list-steps", &f.list_steps,
               "print the forward steps, one a line: name, dtypes, GPUs, idea (tab-separated), and exit");
  cli.add_flag("--backward", &f.backward, "also run, check and time the backward pass (both dQ modes) and 03's");
  cli.add_flag("--sweep", &f.sweep,
               "run N = 1024, 4096, 16384 x head_dim 64, 128 x causal off/on (ignores --q-len, --kv-len, --head-dim, "
               "--causal)");
  cli.add_flag("--no-previous", &f.no_previous, "do not run chapters 02/03 for comparison");
  cli.add_option("--block-mask", &f.block_mask,
                 "also run block-sparse (blocks of 128 queries x 64 keys), next to the dense kernels: local:W "
                 "(keys within W of the diagonal), strided:S (every S-th key block + the diagonal), "
                 "random:DENSITY[:SEED], or a uint8/bool .npy [Tr, Tc]");
  cli.extend_help("--head-dim", "this chapter: 16, 32, 64, 128");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();
  if (f.list_steps) {  // before any GPU work: the scripts read the ladder from here
    fa::print_steps(fa2::forward_steps());
    return 0;
  }
  const std::vector<fa2::ForwardStep> steps = fa::select_steps(fa2::forward_steps(), f.kernel);
  if (f.sweep && !opts.in_dir.empty()) throw fa::UsageError("--sweep makes its own inputs; it cannot be combined with --in");

  // 2. The problems (one, or the sweep's twelve) and this chapter's limits (bad input: exit 2).
  std::vector<fa::Problem> problems = {fa::input_problem(opts, f.backward)};
  if (f.sweep) {
    problems.clear();
    for (int d : {64, 128})
      for (int n : {1024, 4096, 16384})
        for (bool causal : {false, true}) {
          fa::Problem p = opts.problem;
          p.head_dim = d, p.q_len = p.kv_len = n, p.causal = causal;
          problems.push_back(p);
        }
  }
  for (const fa::Problem& p : problems) fa2::check_supported(p);
  std::vector<fa::BlockMask> masks;  // one per problem (its shape depends on the lengths)
  for (const fa::Problem& p : problems)
    if (!f.block_mask.empty()) masks.push_back(fa::block_mask_from_spec(f.block_mask, p));
  fa::check_outputs_writable(opts);
  // The inputs of a single problem are read now (a bad file stops here); the sweep makes each in turn.
  fa::HostTensors in = fa::load_inputs(opts, problems[0], f.backward);
  for (const fa::Problem& p : problems)
    std::printf("problem: %s (%s)\n", fa::describe(p).c_str(), f.backward ? "forward + backward" : "forward");
  if (!masks.empty())
    std::printf("mask:    %s, %d x %d blocks of %d queries x %d keys, density %.3f\n", f.block_mask.c_str(),
                masks[0].Tr, masks[0].Tc, fa::kMaskRows, fa::kMaskCols, masks[0].density());

  // 3. The GPU (none: exit 1).
  fa::require_gpu();

  // 4-5. Run, check and time each problem.
  bool ok = true;
  std::vector<fa::ResultRow> rows;
  for (size_t i = 0; i < problems.size(); ++i) {
    if (f.sweep) std::printf("\n== %s\n", fa::describe(problems[i]).c_str());
    if (i > 0) in = fa::load_inputs(opts, problems[i], f.backward);
    if (f.sweep && !masks.empty()) std::printf("mask:    density %.3f\n", masks[i].density());
    ok = run_problem(opts, f, steps, problems[i], masks.empty() ? nullptr : &masks[i], in, rows) && ok;
  }

  // 6. Print.
  fa::report_rows(opts, rows);
  return fa::verdict(ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
