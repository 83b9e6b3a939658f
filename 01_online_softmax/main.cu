// Chapter 01 program: the softmax from three passes to two, and attention in one pass per query row.
//   ./online_softmax                      softmax sweep (256 MiB per tensor, cols 1024..65536) next
//                                         to a device copy, then attention B=1 H=16 N=1024 d=64: both
//                                         fused forms next to chapter 00
//   ./online_softmax --cols 4096          one softmax shape (rows = 2^26 / cols unless --rows)
//   ./online_softmax --q-len 4096 --causal
// Every result is checked against the fp64 reference (softmax: first, middle and last row).
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "naive.cuh"
#include "online_softmax.cuh"
#include "program.cuh"
#include "random.hpp"
#include "reference.hpp"

namespace {

constexpr size_t kSweepElems = size_t(1) << 26;  // 256 MiB of fp32 per tensor: far beyond L2
const std::vector<int> kSweepCols = {1024, 4096, 16384, 65536};

fa::Options defaults() {
  fa::Options o;
  o.problem.batch = 1, o.problem.heads = 16, o.problem.q_len = 1024, o.problem.head_dim = 64;
  return o;
}

// Rows first, middle, last of y [rows, cols] on the device vs the fp64 softmax of the same rows of x.
fa::ErrorReport check_rows(const std::vector<float>& x, const float* y_dev, int rows, int cols) {
  fa::ErrorReport total;
  for (int r : {0, rows / 2, rows - 1}) {
    std::vector<float> y(cols);
    CUDA_CHECK(cudaMemcpy(y.data(), y_dev + size_t(r) * cols, cols * sizeof(float), cudaMemcpyDeviceToHost));
    std::vector<double> ref(cols);
    fa::reference_softmax(x.data() + size_t(r) * cols, 1, cols, ref.data());
    total += fa::compare(y.data(), ref.data(), cols, fa::kTolFp32Forward);
  }
  return total;
}

// One softmax kernel on x: run once on poisoned y and checked, then timed. GB/s counts each element
// read once and written once (the least any softmax moves); the model bytes count every pass over x.
template <class Fn>
bool softmax_step(const fa::Options& opts, const fa::ResultRow& copy, fa::ResultRow row, int passes,
                  const std::vector<float>& x, fa::DeviceBuffer<float>& y, Fn&& run, std::vector<fa::ResultRow>& rows) {
  const int rows_n = row.problem.q_len, cols = row.problem.kv_len;
  y.poison();
  run();
  CUDA_CHECK(cudaDeviceSynchronize());
  const fa::ErrorReport err = check_rows(x, y.get(), rows_n, cols);
  std::printf("check:   %s rows=%d cols=%d, %s\n", row.kernel.c_str(), rows_n, cols,
              err.summary("rows first/middle/last vs fp64").c_str());
  if (opts.iters > 0) {
    row.model_hbm_bytes = 4.0 * double(x.size()) * (passes + 1), row.max_abs_err = err.max_abs;
    row = fa::time_kernel(opts, row, run);
    row.gbps = fa::gbps(8.0 * double(x.size()), row.ms);
    rows.push_back(row);
    std::printf("         %-22s cols=%-6d %8.1f GB/s = %5.1f%% of the copy (%.1f GB/s)\n", row.kernel.c_str(), cols,
                row.gbps, 100.0 * row.gbps / copy.gbps, copy.gbps);
  }
  return err.ok();
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage: exit 2).
  int rows_opt = 0, cols_opt = 0;
  fa::Cli cli("online_softmax",
              "Chapter 01: 3-pass, online 2-pass and merged softmax next to a device copy; fused one-pass "
              "attention (FA1 and FA2 forms) next to chapter 00. Everything checked against the fp64 reference.",
              defaults());
  cli.add_option("--rows", &rows_opt, "softmax rows (auto = 2^26 / cols)", 0, true);
  cli.add_option("--cols", &cols_opt, "softmax row length (auto = the sweep 1024, 4096, 16384, 65536)", 0, true);
  cli.extend_help("--head-dim", "this chapter: 1 .. 256");
  cli.set_help("--dropout", "dropout probability p: this chapter has none, 0 only");
  const fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();

  // 2. The inputs (bad input: exit 2): the softmax shapes, and the attention problem.
  const std::vector<int> cols_list = cols_opt > 0 ? std::vector<int>{cols_opt} : kSweepCols;
  const fa::Problem p = fa::input_problem(opts, false);
  online_softmax::check_supported(p);
  const fa::HostTensors in = fa::load_inputs(opts, p, false);
  fa::check_outputs_writable(opts);
  std::printf("softmax: cols %s, rows %s\n", cols_opt > 0 ? std::to_string(cols_opt).c_str() : "1024..65536",
              rows_opt > 0 ? std::to_string(rows_opt).c_str() : "2^26 / cols");
  std::printf("problem: %s (forward)\n", fa::describe(p).c_str());

  // 3. The GPU (none: exit 1).
  fa::require_gpu();
  bool ok = true;
  std::vector<fa::ResultRow> rows;

  // 4-5. Softmax over rows: y = softmax(x) per row, x ~ N(0.5, 3^2); each kernel checked, then timed
  // next to a device-to-device copy, the bandwidth ceiling.
  for (int cols : cols_list) {
    const int n_rows = rows_opt > 0 ? rows_opt : int(std::max<size_t>(1, kSweepElems / size_t(cols)));
    const size_t n = size_t(n_rows) * cols;
    fa::require_device_memory(8.0 * double(n) + 4.0 * n_rows, "softmax input, output and LSE");
    const std::vector<float> x = fa::random_normal<float>(n, p.seed * 7 + cols, 0.5, 3.0);
    fa::DeviceBuffer<float> dx(x), dy(n), dlse(n_rows);
    fa::Problem shape;  // how the rows appear in result rows (d = 0: no FLOPs) and to chapter 00's kernel
    shape.q_len = n_rows, shape.kv_len = cols, shape.head_dim = 0;
    fa::ResultRow copy = fa::result_row("01", "copy_d2d", "fwd", shape);
    copy.model_hbm_bytes = 8.0 * double(n);
    if (opts.iters > 0) {
      copy = fa::time_kernel(opts, copy, [&] {
        CUDA_CHECK(cudaMemcpyAsync(dy.get(), dx.get(), dx.bytes(), cudaMemcpyDeviceToDevice));
      });
      rows.push_back(copy);
    }
    ok = softmax_step(opts, copy, fa::result_row("01", "softmax_3pass", "fwd", shape), 3, x, dy,
                      [&] { online_softmax::softmax_3pass(dx.get(), dy.get(), n_rows, cols); }, rows) && ok;
    ok = softmax_step(opts, copy, fa::result_row("01", "softmax_online_2pass", "fwd", shape), 2, x, dy,
                      [&] { online_softmax::softmax_online_2pass(dx.get(), dy.get(), n_rows, cols); }, rows) && ok;
    ok = softmax_step(opts, copy, fa::result_row("01", "softmax_online_merge", "fwd", shape), 2, x, dy,
                      [&] { online_softmax::softmax_online_merge(dx.get(), dy.get(), n_rows, cols); }, rows) && ok;
    ok = softmax_step(opts, copy, fa::result_row("00", "naive_softmax", "fwd", shape), 3, x, dy,
                      [&] { naive::softmax(shape, dx.get(), dy.get(), nullptr, dlse.get()); }, rows) && ok;
  }

  // 4. Attention, one pass per query row: both forms, run once and checked against fp64.
  std::printf("\nattention: %s\n", fa::describe(p).c_str());
  fa::require_device_memory(fa::device_io_bytes(p, false), "Q, K, V, O, LSE");
  fa::DeviceTensors t(p, in);
  using online_softmax::Form;
  auto fused = [&](Form form) {
    return [&, form] { online_softmax::attention_fused(p, form, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get()); };
  };
  const fa::ErrorReport e1 = fa::run_and_check_forward("01 fused_fa1_form", p, in, t, fused(Form::Fa1NormalisedEachStep));
  const fa::ErrorReport e2 = fa::run_and_check_forward("01 fused_fa2_form", p, in, t, fused(Form::Fa2DeferredNormalisation));
  ok = ok && e1.ok() && e2.ok();
  fa::write_outputs(opts, p, t);  // the FA2 form's

  // 5. Time both forms, and chapter 00 on the same inputs where its S and P fit.
  fa::ResultRow r1 = fa::result_row("01", "fused_fa1_form", "fwd", p), r2 = fa::result_row("01", "fused_fa2_form", "fwd", p);
  r1.model_hbm_bytes = r2.model_hbm_bytes = fa::hbm_bytes_min_forward(p);
  r1.max_abs_err = e1.max_abs, r2.max_abs_err = e2.max_abs;
  if (opts.iters > 0) {
    rows.push_back(r1 = fa::time_kernel(opts, r1, fused(Form::Fa1NormalisedEachStep)));
    rows.push_back(r2 = fa::time_kernel(opts, r2, fused(Form::Fa2DeferredNormalisation)));
  }
  const size_t ws_bytes = naive::workspace_bytes(p, false);
  if (double(ws_bytes) + fa::device_io_bytes(p, false) <= double(fa::device_free_bytes())) {
    naive::Workspace ws(p, false);
    auto naive_fwd = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws); };
    ok = fa::compare_with(opts, in, t, r2, fa::naive_row(p, "fwd", double(ws_bytes)), naive_fwd, rows) && ok;
  } else {
    std::printf("00:      skipped, its S and P need %s (this chapter needs none)\n", fa::human_bytes(double(ws_bytes)).c_str());
  }

  // 6. Print.
  fa::report_rows(opts, rows);
  return fa::verdict(ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
