// Chapter 02 program: the FlashAttention-1 forward (seed Algorithm 2) on the GPU, checked against the
// fp64 reference, timed next to chapter 00 at the same size, with the HBM traffic Algorithm 2 implies
// and the extra memory it needs (O(N) for l, m instead of 00's O(N^2) for S and P).
//   ./fa1_forward                          B=4 H=32 N=1024 d=64 (128 blocks on a 132-SM H100)
//   ./fa1_forward --q-len 4096
//   ./fa1_forward --q-len 65536 --batch 1 --heads 16 --warmup 1 --iters 3   00 cannot: it is skipped, 02 runs
//   ./fa1_forward --sram-kb 48             the tiling a 48 KiB device would get (more passes over O)
#include <cstdio>

#include "device_tensors.cuh"
#include "fa1_forward.cuh"
#include "formulas.hpp"
#include "model.hpp"
#include "naive.cuh"
#include "program.cuh"
#include "testing.hpp"
#include "timer.cuh"

namespace {

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 4, o.problem.heads = 32, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

// Chapter 00 at the same size, if its S and P fit in free memory: checks it and appends its row.
void run_naive(const fa::Options& opts, const fa::HostTensors& in, fa::DeviceTensors& t, bool* ok,
               std::vector<fa::ResultRow>& rows) {
  const fa::Problem& p = opts.problem;
  const size_t ws = naive::workspace_bytes(p, false), free_b = fa::device_free_bytes();
  if (ws > free_b) {
    std::printf("00:      skipped: standard attention needs %s for S and P at this size, the device has %s free\n",
                fa::human_bytes(double(ws)).c_str(), fa::human_bytes(double(free_b)).c_str());
    return;
  }
  naive::Workspace w(p, false);
  auto fwd = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), w); };
  t.poison_outputs();
  fwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::string what;
  const fa::ErrorReport e = fa::check_forward(p, in, t.o.download(), t.lse.download(), fa::kTolFp32Forward, &what);
  std::printf("check:   00 forward, %s: %s\n", what.c_str(), e.summary("O and LSE vs fp64").c_str());
  *ok = *ok && e.ok();
  if (opts.iters <= 0) return;
  const double ms = fa::time_ms(fwd, opts.warmup, opts.iters).median_ms;
  const double bytes = fa::hbm_bytes_naive_forward(p);
  rows.push_back({fa::device_name(), "00", "naive", "fwd", "fp32", p, ms, fa::tflops(fa::flops_forward(p), ms),
                  fa::gbps(bytes, ms), bytes, double(ws), e.max_abs});
}

bool run(fa::Options& opts, int sram_kb, bool skip_naive) {
  const fa::HostTensors in = fa::load_inputs(opts, false);
  const fa::Problem& p = opts.problem;
  const size_t M = sram_kb > 0 ? size_t(sram_kb) * 1024 : fa1::device_sram_bytes();
  const fa1::BlockSizes bs = fa1::block_sizes(p.head_dim, M);  // UsageError for an unsupported head_dim
  const auto seed_bs = fa1_model::seed_block_sizes(p.head_dim, M / sizeof(float));
  const int Tr = fa1_model::ceil_div(p.q_len, bs.Br), Tc = fa1_model::ceil_div(p.kv_len, bs.Bc);
  std::printf("tiles:   M = %s (%zu floats): seed Br = %d, Bc = %d; kernel (clamped to Br <= %d, Bc <= %d) "
              "Br = %d, Bc = %d; Tr = %d, Tc = %d\n",
              fa::human_bytes(double(M)).c_str(), M / sizeof(float), seed_bs.Br, seed_bs.Bc, fa1::max_br(p.head_dim),
              fa1::max_bc(), bs.Br, bs.Bc, Tr, Tc);
  std::printf("grid:    %d blocks, one per (batch, head), on %d SMs\n", p.batch * p.heads,
              fa::device_props().multiProcessorCount);

  fa::DeviceTensors t(p, in);
  fa::DeviceBuffer<float> l(p.lse_elems()), m(p.lse_elems());
  auto fwd = [&] {
    return fa1::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), l.get(), m.get(), t.lse.get(), bs);
  };

  t.poison_outputs(), l.poison(), m.poison();
  const fa1::RngState rng = fwd();
  CUDA_CHECK(cudaDeviceSynchronize());
  const std::vector<float> o = t.o.download(), lse = t.lse.download();
  std::string what;
  const fa::ErrorReport e = fa::check_forward(p, in, o, lse, fa::kTolFp32Forward, &what);
  std::printf("check:   02 forward, %s: %s\n", what.c_str(), e.summary("O and LSE vs fp64").c_str());
  std::printf("rng:     seed %llu, offset %llu (kept for the backward, chapter 03)\n", (unsigned long long)rng.seed,
              (unsigned long long)rng.offset);
  bool ok = e.ok();
  if (!opts.out_dir.empty()) fa::write_forward_outputs(opts.out_dir, p, o, lse);

  std::vector<fa::ResultRow> rows;
  if (opts.iters > 0) {
    const double ms = fa::time_ms(fwd, opts.warmup, opts.iters).median_ms;
    const double bytes = fa1::forward_hbm_bytes(p, bs);
    const double seed_bytes = 4.0 * p.batch * p.heads * fa1_model::seed_formula_elements_per_head(p, bs.Bc);
    const double extra = double(l.bytes() + m.bytes());  // l and m: O(N) per head
    rows.push_back({fa::device_name(), "02", "fa1_forward", "fwd", "fp32", p, ms,
                    fa::tflops(fa::flops_forward(p), ms), fa::gbps(bytes, ms), bytes, extra, e.max_abs});
    std::printf("hbm:     Algorithm 2, line by line (model.hpp, x 4 bytes, all heads): %s; leading term "
                "3 Nq d Tc per head, Tc = %d passes over Q and O%s\n",
                fa::human_bytes(bytes).c_str(), Tc, p.causal ? " (causal: the skipped blocks subtracted)" : "");
    std::printf("hbm:     seed formula 2 d (2 Nk + 3 Nq Tc) elements per head x 4 bytes: %s\n",
                fa::human_bytes(seed_bytes).c_str());
    std::printf("extra:   02 keeps l, m: %s (O(N)); 00 needs %s for S, P%s (O(N^2))\n",
                fa::human_bytes(extra).c_str(), fa::human_bytes(double(naive::workspace_bytes(p, false))).c_str(),
                p.dropout_p > 0 ? ", P~" : "");
  }
  if (!skip_naive) run_naive(opts, in, t, &ok, rows);
  if (rows.size() == 2 && rows[0].ms > 0)
    std::printf("speedup: 02 vs 00 at this size: %.2fx\n", rows[1].ms / rows[0].ms);
  if (!rows.empty()) fa::report_rows(opts, rows);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int sram_kb = 0;
  bool skip_naive = false;
  fa::Cli cli("fa1_forward",
              "Chapter 02: FlashAttention-1 forward (seed Algorithm 2), next to chapter 00, checked against fp64.",
              defaults());
  cli.add_option("--sram-kb", &sram_kb, "pretend the on-chip memory M is this many KiB (default: the device's)");
  cli.add_check(fa1::check_supported);
  cli.add_flag("--no-naive", &skip_naive, "do not run chapter 00 for comparison");
  return fa::run_program(cli, argc, argv, [&](fa::Options& o) { return run(o, sram_kb, skip_naive); });
}
