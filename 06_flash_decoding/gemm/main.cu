// decode_gemm: the linear layers of a decode step, Y[M, N] = X[M, K] W^T in fp16 (fp32 accumulation), on 7B-class
// shapes for M = 1 .. 256: the four kernels of gemm.cuh, cuBLAS (cublasGemmEx, fp32 compute) and `auto` (what the
// heuristic dataflow of dataflow.hpp picks from the table), each checked against fp64 on sampled entries (check.hpp)
// and timed (common/timer.cuh: warm-up, median of CUDA events, L2 flushed before each run), next to read_w: W's
// bytes read and nothing else (read_w.cu), the ceiling each kernel's time is a share of.
//   decode_gemm                                 the default sweep, every kernel
//   decode_gemm --shapes 4096x4096 --m 1,8 --kernel read_w,flat,cublas
//   decode_gemm --tune gemm/dataflow.tsv        this GPU's inflection points written into the table
// Exit codes: 0 ok, 1 a failed check or no GPU, 2 bad usage (before any GPU work).
#include <cublas_v2.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "check.hpp"
#include "dataflow.hpp"
#include "device_buffer.cuh"
#include "flash_decoding.cuh"
#include "gemm.cuh"
#include "program.cuh"
#include "timer.cuh"

using namespace fdec::gemm;

namespace {

struct Flags {
  std::string m = "1,2,4,8,16,32,64,128,256";
  std::string shapes = "4096x4096,12288x4096,11008x4096,4096x11008";
  std::string kernel;  // empty: read_w, every kernel of the registry, cublas, auto
  std::string table, tune, csv;
  int iters = 20, warmup = 3;
  uint64_t seed = 1;
  bool help = false, check_table = false;
};
struct Shape {
  int n, k;
};

const char* kUsage =
    "usage: decode_gemm [options]\n"
    "Y[M, N] = X[M, K] W^T, fp16 in and out, fp32 accumulation: gemv, flat, tile, flat_cluster, flat_wgmma\n"
    "(gemm.cuh), cuBLAS and auto, next to read_w (W's bytes read and nothing else: the ceiling). flat_cluster and\n"
    "flat_wgmma need an sm_90 GPU (elsewhere their rows say skipped); flat_wgmma is built with chapter 05's Hopper\n"
    "steps (FA_HOPPER, CUDA 12.5 or later).\n"
    "  --m LIST          values of M [1,2,4,8,16,32,64,128,256]\n"
    "  --shapes LIST     NxK shapes of W, K a multiple of 8 [4096x4096,12288x4096,11008x4096,4096x11008]\n"
    "  --kernel LIST     of read_w, gemv, flat, tile, flat_cluster, flat_wgmma, cublas, auto [all of them]\n"
    "  --table FILE      the dataflow table auto reads (dataflow.hpp's format) [built-in default]\n"
    "  --tune FILE       time each path's kernels, and split_kv_fused against the tensor-core decode kernel over\n"
    "                    1..16 packed rows, and write this GPU's inflection points into FILE (other rows kept)\n"
    "  --check-table     only parse --table and exit (0: it is well formed)\n"
    "  --iters N         timed runs, the median is reported [20]\n"
    "  --warmup N        untimed runs first [3]\n"
    "  --seed N          the inputs' seed [1]\n"
    "  --csv FILE        append one row per run:\n"
    "                    gpu,kernel,m,n,k,ms,tflops,gbps_w,vs_cublas,vs_read_w,max_abs_err,bound,auto\n"
    "  --help, -h        this text\n";

int to_int(const std::string& s, const std::string& flag, int min) {
  char* end = nullptr;
  const long v = s.empty() ? min - 1 : std::strtol(s.c_str(), &end, 10);
  if (s.empty() || *end || v < min || v > (1 << 20))
    throw fa::UsageError("bad value '" + s + "' for " + flag + ": expected an integer >= " + std::to_string(min));
  return int(v);
}
std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t at; (at = s.find(sep, start)) != std::string::npos; start = at + 1)
    out.push_back(s.substr(start, at - start));
  out.push_back(s.substr(start));
  return out;
}

Flags parse(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw fa::UsageError(a + " needs a value");
      return argv[++i];
    };
    if (a == "--help" || a == "-h") f.help = true;
    else if (a == "--check-table") f.check_table = true;
    else if (a == "--m") f.m = value();
    else if (a == "--shapes") f.shapes = value();
    else if (a == "--kernel") f.kernel = value();
    else if (a == "--table") f.table = value();
    else if (a == "--tune") f.tune = value();
    else if (a == "--csv") f.csv = value();
    else if (a == "--iters") f.iters = to_int(value(), a, 1);
    else if (a == "--warmup") f.warmup = to_int(value(), a, 0);
    else if (a == "--seed") f.seed = uint64_t(to_int(value(), a, 0));
    else throw fa::UsageError("unknown option " + a + " (--help lists them)");
  }
  return f;
}

// A file we may append to (or create), checked before any GPU work.
void require_writable(const std::string& path, const std::string& flag) {
  std::ofstream f(path, std::ios::app);
  if (!f) throw fa::UsageError(flag + " " + path + ": cannot write there");
}

// The registry's kernels by name, "gemv,flat,tile,flat_cluster[,flat_wgmma]". --tune runs them all, cuBLAS and auto:
// the flat path's kernel is flat_cluster where the GPU has clusters, flat elsewhere, the tile path's flat_wgmma on an
// sm_90 GPU, tile elsewhere; the one kernel_of picks is the one timed for the table.
std::string registry_names() {
  std::string names;
  for (const Kernel& k : kernels()) names += (names.empty() ? "" : ",") + std::string(k.name);
  return names;
}

// One kernel of the sweep: a registry kernel, read_w, cuBLAS, or auto (resolved per shape and M).
struct Entry {
  std::string name;
  const Kernel* kernel;  // nullptr: read_w, cuBLAS or auto
};
// One timed run of the sweep, for the ratios and the CSV once every entry of (shape, M) has run.
struct Timed {
  std::string name, csv_head, csv_tail;  // the CSV row around vs_cublas and vs_read_w
  double ms;
};

void cublas_check(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(std::string(what) + ": cuBLAS status " + std::to_string(int(s)));
}
// Y[M, N] = X W^T as cuBLAS sees it (column-major): Y^T [N, M] = (W [K, N] col-major)^T X^T [K, M].
void cublas_gemm(cublasHandle_t h, const Args& a) {
  const float one = 1.f, zero = 0.f;
  cublas_check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, a.n, a.m, a.k, &one, a.w, CUDA_R_16F, a.k, a.x, CUDA_R_16F,
                            a.k, &zero, a.y, CUDA_R_16F, a.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

// --tune's attention half: one decode token at B = 1, H = 32, 32k keys, d = 128, fp16, with G = 1, 2, 4, 8, 16
// packed rows (Hkv = 32 / G): the CUDA-core kernel (split_kv_fused) against the tensor-core one for G rows
// (attention_kernel), each as flash_decoding plans it. The kernels' answers are checked by flash_decoding and its
// tests; here they are only timed.
Row attention_sweep(const std::string& gpu, int warmup, int iters) {
  std::vector<AttentionPoint> sweep;
  for (int rows : {1, 2, 4, 8, 16}) {
    fa::Problem p;
    p.batch = 1, p.heads = 32, p.kv_heads = 32 / rows, p.q_len = 1, p.kv_len = 32768, p.head_dim = 128;
    fa::DeviceBuffer<uint16_t> q(p.q_elems()), o(p.q_elems()), k(p.kv_elems()), v(p.kv_elems());
    fa::DeviceBuffer<float> lse(p.lse_elems());
    fa::DeviceBuffer<int> lens(std::vector<int>{p.kv_len}), fallbacks(1);
    fdec::fill_random(fa::Dtype::fp16, p.q_elems(), 1, fdec::Tensor::q, q.get());
    fdec::fill_random(fa::Dtype::fp16, p.kv_elems(), 1, fdec::Tensor::k, k.get());
    fdec::fill_random(fa::Dtype::fp16, p.kv_elems(), 1, fdec::Tensor::v, v.get());
    const fdec::Cache cache{k.get(), v.get(), lens.get(), nullptr, 0, 0};
    const char* names[2] = {attention_kernel(AttentionPath::cuda_cores, rows),
                            attention_kernel(AttentionPath::tensor_cores, rows)};
    double ms[2];
    for (int i = 0; i < 2; ++i) {
      const fdec::Step& step = fdec::kernel_named(names[i]);
      const fdec::Launch l = fdec::plan(step, p, fa::Dtype::fp16, p.kv_len, 0);
      fa::DeviceBuffer<float> ws(std::max<size_t>(1, fdec::workspace_floats(p, l.splits)));
      ms[i] = fa::time_ms([&] { fdec::forward(step, p, fa::Dtype::fp16, q.get(), cache, o.get(), lse.get(), l, 0.f,
                                              ws.get(), fallbacks.get()); },
                          warmup, iters);
    }
    std::printf("tune:    attention, %2d packed rows: %s %.4f ms, %s %.4f ms\n", rows, names[0], ms[0], names[1],
                ms[1]);
    sweep.push_back({rows, ms[0], ms[1]});
  }
  return attention_row(gpu, sweep);
}

}  // namespace

int main(int argc, char** argv) try {
  const Flags f = parse(argc, argv);
  if (f.help) return std::printf("%s", kUsage), 0;
  // ---- everything checked before the GPU is looked for ----
  std::vector<int> ms;
  for (const std::string& s : split(f.m, ',')) ms.push_back(to_int(s, "--m", 1));
  std::vector<Shape> shapes;
  for (const std::string& s : split(f.shapes, ',')) {
    const std::vector<std::string> nk = split(s, 'x');
    if (nk.size() != 2) throw fa::UsageError("--shapes: '" + s + "' is not NxK");
    shapes.push_back({to_int(nk[0], "--shapes N", 1), to_int(nk[1], "--shapes K", 1)});
    check_shape(1, shapes.back().n, shapes.back().k);
  }
  const std::string kernel_list = !f.tune.empty()     ? registry_names() + ",cublas,auto"
                                  : f.kernel.empty() ? "read_w," + registry_names() + ",cublas,auto"
                                                     : f.kernel;
  std::vector<Entry> entries;
  for (const std::string& name : split(kernel_list, ',')) {
    const Kernel* k = nullptr;
    for (const Kernel& r : kernels())
      if (name == r.name) k = &r;
    if (!k && name != "read_w" && name != "cublas" && name != "auto")
      throw fa::UsageError("--kernel " + name +
                           ": no such kernel (read_w, " + registry_names() + ", cublas, auto)");
    entries.push_back({name, k});
  }
  const Table table = f.table.empty() ? Table{} : read_table(f.table);
  if (f.check_table) return std::printf("%s: %zu rows, well formed\n", f.table.c_str(), table.rows.size()), 0;
  if (!f.csv.empty()) require_writable(f.csv, "--csv");
  Table tuned_file;  // the --tune file's rows as they are now (an absent file: none)
  if (!f.tune.empty()) {
    if (std::ifstream(f.tune)) tuned_file = read_table(f.tune);
    require_writable(f.tune, "--tune");
  }
  std::printf("decode_gemm: %zu shapes x %zu values of M, kernels %s, table %s\n", shapes.size(), ms.size(),
              kernel_list.c_str(),
              f.table.empty() ? "built-in" : f.table.c_str());
  fa::require_gpu();

  const std::string gpu = fa::device_name();
  const int sms = fa::device_props().multiProcessorCount;
  const int m_max = *std::max_element(ms.begin(), ms.end());
  cublasHandle_t handle;
  cublas_check(cublasCreate(&handle), "cublasCreate");
  std::vector<Row> tuned;
  std::vector<std::string> csv;
  bool all_ok = true;
  std::printf("%6s %6s %5s %-12s %-6s %10s %9s %9s %9s  %s\n", "N", "K", "M", "kernel", "auto", "ms", "GB/s(W)",
              "TFLOP/s", "x cuBLAS", "check");
  for (const Shape& s : shapes) {
    size_t ws_floats = 1;
    for (int m : ms)  // the split-K kernels' workspace (flat_cluster needs none, but the largest is kept)
      for (const Kernel& k : kernels())
        if (k.splits) ws_floats = std::max(ws_floats, size_t(k.splits(m, s.n, s.k, sms)) * m * s.n);
    const HostGemm h = make_inputs(m_max, s.n, s.k, f.seed);
    fa::DeviceBuffer<__half> x(h.x.size()), w(h.w.size()), y(size_t(m_max) * s.n);
    fa::DeviceBuffer<float> ws(ws_floats);
    fa::DeviceBuffer<unsigned> checksum(1);  // read_w's XOR of W (XORed in: zeroed once, as initcheck asks)
    checksum.zero();
    CUDA_CHECK(cudaMemcpy(x.get(), h.x.data(), h.x.size() * 2, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(w.get(), h.w.data(), h.w.size() * 2, cudaMemcpyHostToDevice));
    std::vector<SweepPoint> sweep;
    for (int m : ms) {
      HostGemm hm{m, s.n, s.k, std::vector<fa::half_t>(h.x.begin(), h.x.begin() + size_t(m) * s.k), h.w};
      const Path pick = choose_gemm(table, gpu, m, s.n, s.k);
      SweepPoint point{m, 0, 0, 0};
      double cublas_ms = 0, read_w_ms = 0;
      std::vector<Timed> times;
      for (const Entry& e : entries) {
        const double gbps_of_ms = 2.0 * s.n * s.k / 1e6;  // GB/s of W = this / ms
        if (e.name == "read_w") {  // no Y: nothing to check
          read_w_ms = fa::time_ms([&] { read_w::launch(w.get(), s.n, s.k, sms, checksum.get()); }, f.warmup,
                                  f.iters);
          std::printf("%6d %6d %5d %-12s %-6s %10.4f %9.1f %9s %9s  %s\n", s.n, s.k, m, "read_w", kernel_of(pick).name,
                      read_w_ms, gbps_of_ms / read_w_ms, "-", "", "reads W only");
          times.push_back({"read_w", gpu + ",read_w," + std::to_string(m) + "," + std::to_string(s.n) + "," +
                                         std::to_string(s.k) + "," + std::to_string(read_w_ms) + ",0," +
                                         std::to_string(gbps_of_ms / read_w_ms),
                           ",,," + std::string(kernel_of(pick).name), read_w_ms});
          continue;
        }
        const Kernel* k = e.name == "auto" ? &kernel_of(pick) : e.kernel;
        Args a;
        a.m = m, a.n = s.n, a.k = s.k, a.x = x.get(), a.w = w.get(), a.y = y.get(), a.workspace = ws.get();
        a.splits = k && k->splits ? k->splits(m, s.n, s.k, sms) : 1;
        auto run = [&] { k ? k->launch(a) : cublas_gemm(handle, a); };
        y.poison();
        try {
          run();
        } catch (const fa::NotOnThisGpu& skip) {  // flat_cluster, flat_wgmma elsewhere than on sm_90: not a failure
          std::printf("%6d %6d %5d %-12s skipped: %s\n", s.n, s.k, m, e.name.c_str(), skip.what());
          continue;
        }
        CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<fa::half_t> out(size_t(m) * s.n);
        CUDA_CHECK(cudaMemcpy(out.data(), y.get(), out.size() * 2, cudaMemcpyDeviceToHost));
        const GemmError err = check(hm, out, sample(m, 8), sample(s.n, 64));
        all_ok = all_ok && err.ok();
        const double t = fa::time_ms(run, f.warmup, f.iters);
        if (e.name == "cublas") cublas_ms = t;
        if (e.name == "gemv") point.gemv_ms = t;
        if (e.name != "auto" && k == &kernel_of(Path::flat)) point.flat_ms = t;  // the flat path's kernel
        if (e.name != "auto" && k == &kernel_of(Path::tile)) point.tile_ms = t;  // the tile path's kernel
        const double gbps = gbps_of_ms / t, tflops = 2.0 * m * s.n * s.k / (t * 1e9);
        std::printf("%6d %6d %5d %-12s %-6s %10.4f %9.1f %9.2f %9s  %s\n", s.n, s.k, m, e.name.c_str(),
                    kernel_of(pick).name, t, gbps, tflops, "", err.summary().c_str());
        times.push_back({e.name == "auto" ? std::string("auto:") + k->name : e.name,
                         gpu + "," + e.name + "," + std::to_string(m) + "," + std::to_string(s.n) + "," +
                             std::to_string(s.k) + "," + std::to_string(t) + "," + std::to_string(tflops) + "," +
                             std::to_string(gbps),
                         "," + std::to_string(err.max_abs) + "," + std::to_string(err.bound) + "," +
                             kernel_of(pick).name,
                         t});
      }
      // The ratios, once cuBLAS and read_w of the same (shape, M) are timed: speed as a multiple of cuBLAS's, and
      // time as a share of the ceiling's (read_w's time over the kernel's: 100% = W streamed as fast as read_w).
      if (cublas_ms > 0) {
        std::printf("%25s x cuBLAS:", "");
        for (const Timed& r : times) std::printf(" %s %.2f", r.name.c_str(), cublas_ms / r.ms);
        std::printf("\n");
      }
      if (read_w_ms > 0) {
        std::printf("%25s %% of read_w:", "");
        for (const Timed& r : times) std::printf(" %s %.0f", r.name.c_str(), 100 * read_w_ms / r.ms);
        std::printf("\n");
      }
      for (const Timed& r : times)
        csv.push_back(r.csv_head + "," + (cublas_ms > 0 ? std::to_string(cublas_ms / r.ms) : "") + "," +
                      (read_w_ms > 0 ? std::to_string(read_w_ms / r.ms) : "") + r.csv_tail);
      sweep.push_back(point);
    }
    if (!f.tune.empty()) tuned.push_back(inflection_row(gpu, s.n, s.k, sweep));
  }
  cublasDestroy(handle);

  if (!f.csv.empty()) {
    const bool fresh = !std::ifstream(f.csv) || std::ifstream(f.csv).peek() == EOF;
    std::ofstream out(f.csv, std::ios::app);
    if (fresh) out << "gpu,kernel,m,n,k,ms,tflops,gbps_w,vs_cublas,vs_read_w,max_abs_err,bound,auto\n";
    for (const std::string& line : csv) out << line << "\n";
    if (!out) throw std::runtime_error("--csv " + f.csv + ": write failed");
  }
  if (!f.tune.empty()) {
    std::vector<Row> rows;
    for (const Row& r : tuned_file.rows)
      if (r.gpu != gpu) rows.push_back(r);  // the defaults and other GPUs' rows, kept
    rows.insert(rows.end(), tuned.begin(), tuned.end());
    rows.push_back(attention_sweep(gpu, f.warmup, f.iters));
    std::ofstream out(f.tune, std::ios::trunc);
    out << "# FlashDecoding++'s heuristic dataflow (gemm/dataflow.hpp: the format). A GPU's rows are written by\n"
           "# decode_gemm --tune on it: gemm rows from the sweep of M (" << f.m << ") on each shape, the attention\n"
           "# row from split_kv_fused against the tensor-core kernel over 1..16 packed rows (B 1, 32k keys, d 128).\n"
        << format_rows(rows);
    if (!out) throw std::runtime_error("--tune " + f.tune + ": write failed");
    std::printf("tune:    %zu rows for %s written to %s\n", tuned.size() + 1, gpu.c_str(), f.tune.c_str());
  }
  return fa::verdict(all_ok);
} catch (...) {
  return fa::exit_code_of_current_exception();
}
