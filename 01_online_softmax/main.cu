// Chapter 01 program: the softmax from three passes to two, and attention in one pass per query row.
//   ./online_softmax                      softmax sweep (256 MiB per tensor, cols 1024..65536) next
//                                         to a device copy, then attention B=1 H=16 N=1024 d=64: both
//                                         fused forms vs chapter 00
//   ./online_softmax --cols 4096          one softmax shape (rows = 2^26 / cols unless --rows)
//   ./online_softmax --q-len 4096 --causal
// Every result is checked against the fp64 reference (softmax: first, middle and last row).
#include <algorithm>
#include <cstdio>
#include <functional>
#include <iterator>
#include <string>

#include "device_tensors.cuh"
#include "formulas.hpp"
#include "naive.cuh"
#include "online_softmax.cuh"
#include "program.cuh"
#include "random.hpp"
#include "reference.hpp"
#include "testing.hpp"
#include "timer.cuh"

namespace {

constexpr size_t kSweepElems = size_t(1) << 26;  // 256 MiB of fp32 per tensor: far beyond L2
const int kSweepCols[] = {1024, 4096, 16384, 65536};

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

bool run_softmax(const fa::Options& opts, int rows_opt, int cols_opt, std::vector<fa::ResultRow>& out) {
  std::vector<int> cols_list;
  if (cols_opt > 0)
    cols_list = {cols_opt};
  else
    cols_list.assign(std::begin(kSweepCols), std::end(kSweepCols));
  const std::string gpu = fa::device_name();
  bool ok = true;
  std::printf("\nsoftmax over rows: y = softmax(x) per row, x ~ N(0.5, 3^2). GB/s counts each element once\n"
              "read and once written (8 B), the least any softmax moves, so it compares with the copy.\n");
  for (int cols : cols_list) {
    const int rows = rows_opt > 0 ? rows_opt : int(std::max<size_t>(1, kSweepElems / size_t(cols)));
    const size_t n = size_t(rows) * cols;
    const std::vector<float> x = fa::random_normal<float>(n, opts.problem.seed * 7 + cols, 0.5, 3.0);
    fa::DeviceBuffer<float> dx(x), dy(n), dlse(rows);
    fa::Problem shape;  // how the rows appear in the result rows and to chapter 00's kernel
    shape.q_len = rows, shape.kv_len = cols, shape.head_dim = 0;
    const double elems = double(n), min_bytes = 8.0 * elems;

    struct Entry {
      const char* chapter;
      const char* kernel;
      int reads;  // passes over x
      std::function<void()> fn;
    };
    const std::vector<Entry> entries = {
        {"01", "softmax_3pass", 3, [&] { online_softmax::softmax_3pass(dx.get(), dy.get(), rows, cols); }},
        {"01", "softmax_online_2pass", 2, [&] { online_softmax::softmax_online_2pass(dx.get(), dy.get(), rows, cols); }},
        {"01", "softmax_online_merge", 2, [&] { online_softmax::softmax_online_merge(dx.get(), dy.get(), rows, cols); }},
        {"00", "naive_softmax", 3, [&] { naive::softmax(shape, dx.get(), dy.get(), nullptr, dlse.get()); }},
    };
    double copy_gbps = 0;
    if (opts.iters > 0) {
      const double ms = fa::time_ms([&] { CUDA_CHECK(cudaMemcpyAsync(dy.get(), dx.get(), dx.bytes(), cudaMemcpyDeviceToDevice)); },
                                    opts.warmup, opts.iters).median_ms;
      copy_gbps = fa::gbps(min_bytes, ms);
      out.push_back({gpu, "01", "copy_d2d", "fwd", "fp32", shape, ms, 0, copy_gbps, min_bytes, 0, -1});
    }
    for (const Entry& e : entries) {
      dy.poison();
      e.fn();
      CUDA_CHECK(cudaDeviceSynchronize());
      const fa::ErrorReport err = check_rows(x, dy.get(), rows, cols);
      std::printf("check:   %s rows=%d cols=%d, %s\n", e.kernel, rows, cols,
                  err.summary("rows first/middle/last vs fp64").c_str());
      ok = ok && err.ok();
      if (opts.iters > 0) {
        const double ms = fa::time_ms(e.fn, opts.warmup, opts.iters).median_ms;
        const double g = fa::gbps(min_bytes, ms);
        // model bytes: every pass over x from HBM (an upper bound; the later passes may hit L2)
        out.push_back({gpu, e.chapter, e.kernel, "fwd", "fp32", shape, ms, 0, g, 4.0 * elems * (e.reads + 1), 0,
                       err.max_abs});
        std::printf("         %-22s cols=%-6d %8.1f GB/s = %5.1f%% of the copy (%.1f GB/s)\n", e.kernel, cols, g,
                    100.0 * g / copy_gbps, copy_gbps);
      }
    }
  }
  return ok;
}

bool run_attention(fa::Options& opts, std::vector<fa::ResultRow>& out) {
  const fa::HostTensors in = fa::load_inputs(opts, false);
  const fa::Problem& p = opts.problem;
  const std::string gpu = fa::device_name();
  fa::DeviceTensors t(p, in);
  bool ok = true;
  std::printf("\nattention: %s\n", fa::describe(p).c_str());

  using online_softmax::Form;
  struct Entry {
    const char* kernel;
    Form form;
  };
  for (const Entry& e : {Entry{"fused_fa1_form", Form::Fa1NormalisedEachStep},
                         Entry{"fused_fa2_form", Form::Fa2DeferredNormalisation}}) {
    auto fn = [&] { online_softmax::attention_fused(p, e.form, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get()); };
    t.poison_outputs();
    fn();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<float> o = t.o.download(), lse = t.lse.download();
    std::string what;
    const fa::ErrorReport err = fa::check_forward(p, in, o, lse, fa::kTolFp32Forward, &what);
    std::printf("check:   %s, %s: %s\n", e.kernel, what.c_str(), err.summary("O and LSE vs fp64").c_str());
    ok = ok && err.ok();
    if (!opts.out_dir.empty() && e.form == Form::Fa2DeferredNormalisation) fa::write_forward_outputs(opts.out_dir, p, o, lse);
    if (opts.iters > 0) {
      const double ms = fa::time_ms(fn, opts.warmup, opts.iters).median_ms;
      const double bytes = fa::hbm_bytes_min_forward(p);
      out.push_back({gpu, "01", e.kernel, "fwd", "fp32", p, ms, fa::tflops(fa::flops_forward(p), ms),
                     fa::gbps(bytes, ms), bytes, 0, err.max_abs});
    }
  }

  // Chapter 00 at the same size, if its N x N matrices fit.
  const size_t ws_bytes = naive::workspace_bytes(p, false);
  if (ws_bytes + size_t(fa::hbm_bytes_min_forward(p)) > fa::device_free_bytes()) {
    std::printf("00 naive: skipped, its S and P need %s (this chapter needs none)\n", fa::human_bytes(double(ws_bytes)).c_str());
    return ok;
  }
  naive::Workspace ws(p, false);
  auto fn = [&] { naive::forward(p, t.q.get(), t.k.get(), t.v.get(), t.o.get(), t.lse.get(), ws); };
  t.poison_outputs();
  fn();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::string what;
  const fa::ErrorReport err = fa::check_forward(p, in, t.o.download(), t.lse.download(), fa::kTolFp32Forward, &what);
  std::printf("check:   00 naive, %s: %s\n", what.c_str(), err.summary("O and LSE vs fp64").c_str());
  ok = ok && err.ok();
  if (opts.iters > 0) {
    const double ms = fa::time_ms(fn, opts.warmup, opts.iters).median_ms;
    const double bytes = fa::hbm_bytes_naive_forward(p);
    out.push_back({gpu, "00", "naive", "fwd", "fp32", p, ms, fa::tflops(fa::flops_forward(p), ms), fa::gbps(bytes, ms),
                   bytes, double(ws_bytes), err.max_abs});
  }
  std::printf("memory:  fused kernels need no memory beyond Q, K, V, O, LSE; 00 needs %s for S and P\n",
              fa::human_bytes(double(ws_bytes)).c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int rows = 0, cols = 0;
  fa::Cli cli("online_softmax",
              "Chapter 01: 3-pass, online 2-pass and merged softmax next to a device copy; fused one-pass "
              "attention (FA1 and FA2 forms) next to chapter 00. Everything checked against the fp64 reference.",
              defaults());
  cli.add_option("--rows", &rows, "softmax rows (default 2^26 / cols)");
  cli.add_option("--cols", &cols, "softmax row length (default: the sweep 1024, 4096, 16384, 65536)");
  cli.add_check([&](const fa::Problem& p) {
    online_softmax::check_supported(p);
    if (rows < 0 || cols < 0) throw fa::UsageError("--rows and --cols must be >= 1 (0 = default)");
  });
  return fa::run_program(cli, argc, argv, [&](fa::Options& o) {
    std::vector<fa::ResultRow> results;
    bool ok = run_softmax(o, rows, cols, results);
    ok = run_attention(o, results) && ok;
    if (!results.empty()) fa::report_rows(o, results);
    return ok;
  });
}
