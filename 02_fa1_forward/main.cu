// Chapter 02 program: the FlashAttention-1 forward (FA1 paper, Algorithm 2) on the GPU, checked against the
// fp64 reference, timed next to chapter 00 at the same size, with the HBM traffic Algorithm 2 implies
// and the extra memory it needs (O(N) for l, m instead of 00's O(N^2) for S and P).
//   ./fa1_forward                          B=4 H=32 N=1024 d=64 (128 blocks on a 132-SM H100)
//   ./fa1_forward --q-len 4096
//   ./fa1_forward --q-len 65536 --batch 1 --heads 16 --warmup 1 --iters 3   00 cannot: it is skipped, 02 runs
//   ./fa1_forward --sram-kb 48             the tiling a 48 KiB device would get (more passes over O)
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <cstdio>

#include "fa1_forward.cuh"
#include "model.hpp"
#include "naive.cuh"
#include "program.cuh"

namespace {

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 32, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage: exit 2).
  int sram_kb = 0;
  bool skip_naive = false;
  fa::Cli cli("fa1_forward",
              "Chapter 02: FlashAttention-1 forward (FA1 paper, Algorithm 2), next to chapter 00, checked against fp64.",
              defaults());
  cli.add_option("--sram-kb", &sram_kb, "pretend the on-chip memory M is this many KiB (auto = the device's)", 0, true);
  cli.add_flag("--no-naive", &skip_naive, "do not run chapter 00 for comparison");
  cli.extend_help("--head-dim", "this chapter: 16, 32, 64, 128");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();

  // 2. The inputs: shape, this chapter's limits, the tensors, writable outputs (bad input: exit 2).
  const fa::Problem p = fa::input_problem(opts, false);
  fa1::check_supported(p);
  const fa::HostTensors in = fa::load_inputs(opts, p, false);
  fa::check_outputs_writable(opts);
  std::printf("problem: %s (forward)\n", fa::describe(p).c_str());

  // 3. The GPU (none: exit 1): its shared memory sets the tiles (Algorithm 2, line 1).
  fa::require_gpu();
  const size_t M = sram_kb > 0 ? size_t(sram_kb) * 1024 : fa1::device_sram_bytes();
  const fa1::BlockSizes bs = fa1::block_sizes(p.head_dim, M);
  const auto paper_bs = fa1_model::paper_block_sizes(p.head_dim, M / sizeof(float));
  const int Tr = fa1_model::ceil_div(p.q_len, bs.Br), Tc = fa1_model::ceil_div(p.kv_len, bs.Bc);
  std::printf("tiles:   M = %s (%zu floats): seed Br = %d, Bc = %d; kernel (clamped to Br <= %d, Bc <= %d) "
              "Br = %d, Bc = %d; Tr = %d, Tc = %d\n",
              fa::human_bytes(double(M)).c_str(), M / sizeof(float), paper_bs.Br, paper_bs.Bc, fa1::max_br(p.head_dim),
              fa1::max_bc(), bs.Br, bs.Bc, Tr, Tc);
  std::printf("grid:    %d blocks, one per (batch, head), on %d SMs\n", p.batch * p.heads,
              fa::device_props().multiProcessorCount);
  const double lm_bytes = 2.0 * 4 * p.lse_elems();  // l and m: O(N) per head
  fa::require_device_memory(fa::device_io_bytes(p, false) + lm_bytes, "Q, K, V, O, LSE, l, m");

  // 4. Run once on NaN-poisoned outputs and check against the fp64 reference.
  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  fa1::RngState rng{};
  auto fwd = [&] { rng = fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get(), bs); };
  l.poison(), m.poison();
  const fa::ErrorReport e = fa::run_and_check_forward("02 forward", p, in, t, fwd);
  std::printf("rng:     seed %llu, offset %llu (kept for the backward, chapter 03)\n", (unsigned long long)rng.seed,
              (unsigned long long)rng.offset);
  fa::write_outputs(opts, p, t);

  // 5. Time it, with Algorithm 2's HBM traffic, next to chapter 00 on the same inputs.
  fa::ResultRow r = fa::result_row("02", "fa1_forward", "fwd", p);
  r.model_hbm_bytes = fa1::forward_hbm_bytes(p, bs), r.extra_bytes = lm_bytes, r.max_abs_err = e.max_abs;
  std::vector<fa::ResultRow> rows;
  if (opts.iters > 0) rows.push_back(r = fa::time_kernel(opts, r, fwd));
  const double paper_bytes = 4.0 * p.batch * p.heads * fa1_model::paper_formula_elements_per_head(p, bs.Bc);
  const size_t naive_ws = naive::workspace_bytes(p, false);
  std::printf("hbm:     Algorithm 2, line by line (model.hpp, x 4 bytes, all heads): %s; leading term "
              "3 Nq d Tc per head, Tc = %d passes over Q and O%s\n",
              fa::human_bytes(r.model_hbm_bytes).c_str(), Tc, p.causal ? " (causal: the skipped blocks subtracted)" : "");
  std::printf("hbm:     the paper's 2Nd(2 + 3Tc) bytes at 2 bytes an element = d (2 Nk + 3 Nq Tc) elements per head, "
              "x 4 bytes: %s\n",
              fa::human_bytes(paper_bytes).c_str());
  std::printf("extra:   02 keeps l, m: %s (O(N)); 00 needs %s for S, P%s (O(N^2))\n", fa::human_bytes(lm_bytes).c_str(),
              fa::human_bytes(double(naive_ws)).c_str(), p.dropout_p > 0 ? ", P^drop" : "");
  bool ok = e.ok();
  const bool naive_fits = double(naive_ws) + fa::device_io_bytes(p, false) + lm_bytes <= double(fa::device_free_bytes());
  if (!skip_naive && !naive_fits)
    std::printf("00:      skipped: standard attention needs %s for S and P at this size, more than the device has free\n",
                fa::human_bytes(double(naive_ws)).c_str());
  if (!skip_naive && naive_fits) {
    naive::Workspace ws(p, false);
    auto naive_fwd = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws); };
    ok = fa::compare_with(opts, in, t, r, fa::naive_row(p, "fwd", double(naive_ws)), naive_fwd, rows) && ok;
  }

  // 6. Print.
  fa::report_rows(opts, rows);
  return fa::verdict(ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
