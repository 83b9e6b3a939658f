// Chapter 06 program: one decode step (q_len 1..8 new tokens against a K/V cache) by every kernel of the chapter,
// each checked against the fp64 reference on the rounded inputs (FlashAttention's 2x rule), timed, and reported
// as K/V bandwidth next to the chapter's read-only ceiling.
//   ./flash_decoding                                        B=1 H=32 Hkv=32 q_len=1 N=4096 d=128 fp16, all kernels
//   ./flash_decoding --kv-heads 8 --kv-len 131072           GQA 32/8 at a 128k context
//   ./flash_decoding --batch 4 --kv-lens 4096,17,0,1        ragged context lengths (0: O = 0, LSE = -inf)
//   ./flash_decoding --batch 8 --kv-len 32768 --ragged      lengths drawn uniformly from 0..N (entry 0 keeps N)
//   ./flash_decoding --kernel split_kv_gqa --sweep-splits   every split count 1..max, the heuristic's marked
//   ./flash_decoding --kv-heads 8 --kernel split_kv_fused,split_kv_mma   CUDA cores vs tensor cores, same run
//   ./flash_decoding --kv-heads 8 --kv-len 32768 --kernel split_kv_mma,split_kv_even   the grid vs one block per SM
//   ./flash_decoding --kernel unified_max --scale 30        large logits: the unified max falls back
//   ./flash_decoding --q-len 4 --causal --dtype bf16        speculative decoding, bottom-right causal, bf16
//   ./flash_decoding --list-steps                           the ladder, one step a line (what the scripts read)
// Every chapter program reads the same way: parse -> inputs -> GPU -> run + check -> time -> print.
#include <sys/stat.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "cache_host.cuh"
#include "device.cuh"
#include "flash_decoding.cuh"
#include "formulas.hpp"
#include "gemm/dataflow.hpp"
#include "model.hpp"
#include "npy.hpp"
#include "program.cuh"
#include "testing.hpp"

namespace {

constexpr int kDefaultContext = 4096;  // --kv-len when neither it nor --kv-lens is given
constexpr double kCheckBudget = 2e9;   // fp64 multiply-adds the check may spend before it samples kv groups
constexpr fa::Tolerance kTolLse = fa::kTolFp32Forward;  // LSE is fp32 from exact (rounded) inputs, as in chapter 04

struct Flags {
  std::string kernel = "all", dtype = "fp16", kv_lens, phi = "0", l2_policy = "auto", table;
  bool ragged = false, sweep_splits = false, list_steps = false;
  int splits = 0, page_size = 16;
};

// ---- parse: everything the command line asks for, checked before any device work (exit 2) ----
struct Setup {
  fa::Dtype t = fa::Dtype::fp16;
  std::vector<const fdec::Step*> kernels;
  bool auto_kernel = false;  // --kernel auto: the heuristic dataflow's choice (gemm/dataflow.hpp), with the GPU known
  fdec::gemm::Table table;   // --table: the dataflow's table (none: its built-in default)
  std::vector<int> lens;  // per batch entry; filled once the shape is final (after --in)
  float phi = 0.f;
  int evict_first = -1;  // --l2-policy: -1 auto (plan's choice), 1 evict-first, 0 evict-normal
};

std::vector<int> parse_int_list(const std::string& s, const char* flag) {
  std::vector<int> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    char* end = nullptr;
    errno = 0;
    const long x = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end || errno || x < 0 || x > INT32_MAX)
      throw fa::UsageError(std::string("bad value '") + item + "' in " + flag + ": expected non-negative integers");
    v.push_back(int(x));
  }
  return v;
}

// Before the shape is final: the names and values of this chapter's flags, and the cache capacity (the Cli's
// default kv-len = q-len is not a cache).
Setup parse_setup(fa::Options& opts, const Flags& f) {
  Setup s;
  s.t = fa::parse_dtype(f.dtype);
  std::string names;  // --kernel without "auto", which is not a step of the registry
  std::stringstream list(f.kernel);
  for (std::string item; std::getline(list, item, ',');)
    if (item == "auto") s.auto_kernel = true;
    else names += (names.empty() ? "" : ",") + item;
  if (!names.empty() || !s.auto_kernel)
    for (const fdec::Step& k : fa::select_steps(fdec::kernels(), names))  // "all", a name, or "a,b"
      s.kernels.push_back(&fdec::kernel_named(k.name));
  if (!f.table.empty()) s.table = fdec::gemm::read_table(f.table);  // a malformed file: exit 2, naming it
  char* end = nullptr;
  s.phi = std::strtof(f.phi.c_str(), &end);
  if (f.phi.empty() || *end || !std::isfinite(s.phi)) throw fa::UsageError("bad value '" + f.phi + "' for --phi");
  if (f.splits > fdec::kMaxSplits)
    throw fa::UsageError("--splits must be in 1 .. " + std::to_string(fdec::kMaxSplits) + " (0: the heuristic)");
  fdec::check_page_size(f.page_size);
  if (f.l2_policy == "evict-first") s.evict_first = 1;
  else if (f.l2_policy == "evict-normal") s.evict_first = 0;
  else if (f.l2_policy != "auto")
    throw fa::UsageError("bad value '" + f.l2_policy + "' for --l2-policy (auto, evict-first, evict-normal)");
  if (f.ragged && !f.kv_lens.empty()) throw fa::UsageError("--ragged draws the lengths; it cannot be combined with --kv-lens");
  fa::Problem& p = opts.problem;
  if (opts.in_dir.empty() && !opts.given.count("--kv-len")) {  // the Cli's default (kv-len = q-len) is not a cache
    const std::vector<int> lens = parse_int_list(f.kv_lens, "--kv-lens");
    p.kv_len = lens.empty() ? kDefaultContext : std::max(1, *std::max_element(lens.begin(), lens.end()));
  }
  if (opts.in_dir.empty()) p.validate();
  return s;
}

// The context length of every batch entry, once the shape is final.
std::vector<int> context_lengths(const fa::Problem& p, const Flags& f) {
  if (f.ragged) {  // uniform in 0 .. N, entry 0 keeps N so the longest case is always present
    fa::Rng rng(p.seed * 7 + 5);
    std::vector<int> lens(p.batch, p.kv_len);
    for (int b = 1; b < p.batch; ++b) lens[b] = int(rng.next() % uint64_t(p.kv_len + 1));
    return lens;
  }
  if (f.kv_lens.empty()) return std::vector<int>(p.batch, p.kv_len);
  const std::vector<int> lens = parse_int_list(f.kv_lens, "--kv-lens");
  if (int(lens.size()) != p.batch)
    throw fa::UsageError("--kv-lens has " + std::to_string(lens.size()) + " lengths for batch " + std::to_string(p.batch));
  for (int n : lens)
    if (n > p.kv_len)
      throw fa::UsageError("--kv-lens: length " + std::to_string(n) + " exceeds the cache capacity --kv-len " +
                           std::to_string(p.kv_len));
  return lens;
}

std::string join(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size() && i < 16; ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return v.size() > 16 ? s + ",..." : s;
}

// ---- inputs: 16-bit tensors on the device, and the rounded values the host checks with ----
struct Inputs {
  fa::DeviceBuffer<uint16_t> q;
  fdec::DeviceCache cache;
  std::vector<float> hq, hk, hv;  // whole host copies (rounded) with --in; empty for device-made inputs
  // The rounded value of element `index` of a tensor: from the host copy, or recomputed as the device made it.
  float value(fa::Dtype t, uint64_t seed, fdec::Tensor which, size_t index) const {
    const std::vector<float>& h = which == fdec::Tensor::q ? hq : which == fdec::Tensor::k ? hk : hv;
    return h.empty() ? fa::round_to(t, fdec::input_value(seed, which, index)) : h[index];
  }
};

// files: the tensors --in read (nullptr: make random inputs on the device).
void make_inputs(const fa::Problem& p, const Setup& s, fa::HostTensors* files, Inputs& in) {
  if (files) {  // rounded on load; a float16 .npy is fp16 already and stays as it is
    fa::HostTensors& h = *files;
    in.hq = std::move(h.q), in.hk = std::move(h.k), in.hv = std::move(h.v);  // rounded by main() on load
    in.q = fa::DeviceBuffer<uint16_t>(fdec::narrow(s.t, in.hq));
    in.cache.k = fa::DeviceBuffer<uint16_t>(fdec::narrow(s.t, in.hk));
    in.cache.v = fa::DeviceBuffer<uint16_t>(fdec::narrow(s.t, in.hv));
  } else {  // made on the device: a 128k-token cache is gigabytes
    in.q = fa::DeviceBuffer<uint16_t>(p.q_elems());
    in.cache.k = fa::DeviceBuffer<uint16_t>(p.kv_elems());
    in.cache.v = fa::DeviceBuffer<uint16_t>(p.kv_elems());
    fdec::fill_random(s.t, p.q_elems(), p.seed, fdec::Tensor::q, in.q.get());
    fdec::fill_random(s.t, p.kv_elems(), p.seed, fdec::Tensor::k, in.cache.k.get());
    fdec::fill_random(s.t, p.kv_elems(), p.seed, fdec::Tensor::v, in.cache.v.get());
  }
  in.cache.kv_lens = fa::DeviceBuffer<int>(s.lens);
}

// ---- check: the fp64 reference and the plain same-dtype attention on whole kv groups ----
struct Group {  // query heads hk*group .. of batch entry b, rows [group, q_len]
  int b, hk;
  std::vector<double> o, lse;
  std::vector<float> plain;
};

std::vector<Group> reference_groups(const fa::Problem& p, const Setup& s, const Inputs& in) {
  std::vector<std::pair<int, int>> which;
  double cost = 0;
  for (int b = 0; b < p.batch; ++b) cost += 2.0 * s.lens[b] * p.head_dim * p.q_len * p.heads;
  if (cost <= kCheckBudget) {
    for (int b = 0; b < p.batch; ++b)
      for (int hk = 0; hk < p.kv_heads; ++hk) which.push_back({b, hk});
  } else {
    which = {{0, 0}};
    if (p.batch * p.kv_heads > 1) which.push_back({p.batch - 1, p.kv_heads - 1});
  }
  const int g = p.group(), d = p.head_dim;
  std::vector<Group> groups;
  for (auto [b, hk] : which) {
    Group gr{b, hk, {}, {}, {}};
    const int n = s.lens[b];
    fa::Problem pg = p;  // the group as a problem of its own: batch 1, one kv head, kv_len n
    pg.batch = 1, pg.heads = g, pg.kv_heads = 1, pg.kv_len = std::max(n, 1);
    std::vector<float> q(pg.q_elems()), k(size_t(n) * d), v(size_t(n) * d);
    for (size_t e = 0; e < q.size(); ++e) q[e] = in.value(s.t, p.seed, fdec::Tensor::q, p.q_offset(b, hk * g) + e);
    for (size_t e = 0; e < k.size(); ++e) {
      k[e] = in.value(s.t, p.seed, fdec::Tensor::k, p.kv_offset(b, hk) + e);
      v[e] = in.value(s.t, p.seed, fdec::Tensor::v, p.kv_offset(b, hk) + e);
    }
    gr.plain.assign(pg.q_elems(), 0.f);
    if (n == 0) {  // no key at all: O = 0, LSE = -inf
      gr.o.assign(pg.q_elems(), 0.0), gr.lse.assign(pg.lse_elems(), -INFINITY);
    } else {
      fa::reference_forward(pg, q.data(), k.data(), v.data(), gr.o, gr.lse);
      for (int h = 0; h < g; ++h)
        fa::plain_lowp_forward_rows(s.t, pg, 0, h, 0, p.q_len, q.data(), k.data(), v.data(), gr.plain.data() + pg.q_offset(0, h));
    }
    groups.push_back(std::move(gr));
  }
  return groups;
}

struct Check {
  fa::ErrorReport o, lse;
  double bound = 0;
  bool ok() const { return o.ok() && lse.ok(); }
};

Check check(const fa::Problem& p, const Setup& s, const std::vector<Group>& groups, const std::vector<float>& o,
            const std::vector<float>& lse) {
  double plain_err = 0;
  for (const Group& gr : groups) plain_err = std::max(plain_err, fa::compare(gr.plain, gr.o, {1e30, 0}).max_abs);
  Check c;
  c.bound = fa::lowp_error_bound(s.t, plain_err);
  for (const Group& gr : groups) {
    const size_t q0 = p.q_offset(gr.b, gr.hk * p.group()), l0 = p.lse_offset(gr.b, gr.hk * p.group());
    c.o += fa::compare(o.data() + q0, gr.o.data(), gr.o.size(), {c.bound, 0});
    c.lse += fa::compare(lse.data() + l0, gr.lse.data(), gr.lse.size(), kTolLse);
  }
  return c;
}

void write_outputs(const std::string& dir, const fa::Problem& p, fa::Dtype t, const std::vector<uint16_t>& o,
                   const std::vector<float>& lse) {
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) throw std::runtime_error("cannot create folder " + dir);
  const std::vector<size_t> qs = {size_t(p.batch), size_t(p.heads), size_t(p.q_len), size_t(p.head_dim)};
  if (t == fa::Dtype::fp16) fa::npy_write(dir + "/o.npy", qs, reinterpret_cast<const fa::half_t*>(o.data()));
  else fa::npy_write(dir + "/o.npy", qs, fdec::widen(t, o).data());  // bf16 widened exactly to float32
  fa::npy_write(dir + "/lse.npy", {size_t(p.batch), size_t(p.heads), size_t(p.q_len)}, lse.data());
  std::printf("wrote:   %s/o.npy (%s), %s/lse.npy (float32)\n", dir.c_str(), t == fa::Dtype::fp16 ? "float16" : "float32",
              dir.c_str());
}

// ---- run: every kernel, checked, then timed ----
bool run(const fa::Options& opts, const fa::Problem& p, const Setup& s, const Flags& f, fa::HostTensors* files) {
  Inputs in;
  make_inputs(p, s, files, in);
  const int max_len = *std::max_element(s.lens.begin(), s.lens.end());
  if (std::any_of(s.kernels.begin(), s.kernels.end(), [](auto* k) { return k->launch.paged; }))
    in.cache.build_pages(p, s.lens, f.page_size, p.seed);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::printf("lengths: %s (capacity %d)\n", join(s.lens).c_str(), p.kv_len);
  const std::vector<Group> groups = reference_groups(p, s, in);
  // The K/V stream's L2 policy (README §4.6), the same for every kernel and for the read_kv ceiling.
  const bool auto_first = fdec::kv_evict_first_here(p, max_len);
  const bool evict_first = s.evict_first < 0 ? auto_first : s.evict_first == 1;
  std::printf("l2:      K and V streamed %s (%s%s of K/V per step, L2 %s; auto: evict-first up to %g x the L2)\n",
              evict_first ? "evict-first" : "evict-normal", s.evict_first < 0 ? "" : "--l2-policy; ",
              fa::human_bytes(fdec::kv_step_bytes(p, max_len)).c_str(),
              fa::human_bytes(double(fa::device_props().l2CacheSize)).c_str(), fdec::kEvictFirstL2s);
  // A policy forced by --l2-policy is named in the result rows' labels: "split_kv_mma@evict-normal".
  const std::string tag = s.evict_first < 0 ? "" : evict_first ? "@evict-first" : "@evict-normal";
  auto planned = [&](const fdec::Step& k, int splits) {
    fdec::Launch l = fdec::plan(k, p, s.t, max_len, splits);
    l.evict_first = evict_first;
    return l;
  };

  fa::DeviceBuffer<uint16_t> o(p.q_elems());
  fa::DeviceBuffer<float> lse(p.lse_elems()), ws;
  fa::DeviceBuffer<int> fallbacks(1);
  const int elem = 2;
  const double kv = fdec_model::kv_bytes(p, s.lens, elem);
  double flops = 0;  // 4 d per visible (query, key) pair
  for (int b = 0; b < p.batch; ++b) flops += fa::flops_forward(fdec::seen_by(p, s.lens[b])) / p.batch;
  std::vector<fa::ResultRow> rows;
  bool ok = true;

  // One kernel at one split count: poisoned outputs, checked, then timed.
  auto run_one = [&](const fdec::Step& k, const fdec::Launch& l, const std::string& label) {
    if (fdec::workspace_floats(p, l.splits) > ws.size()) ws = fa::DeviceBuffer<float>(fdec::workspace_floats(p, l.splits));
    const fdec::Cache cache = k.launch.paged ? in.cache.paged() : in.cache.contiguous();
    auto step = [&] { fdec::forward(k, p, s.t, in.q.get(), cache, o.get(), lse.get(), l, s.phi, ws.get(), fallbacks.get()); };
    o.poison(), lse.poison(), fallbacks.zero();
    if (ws.size()) ws.poison();
    step();
    CUDA_CHECK(cudaDeviceSynchronize());
    const std::vector<uint16_t> ob = o.download();
    const std::vector<float> lo = lse.download();
    const Check c = check(p, s, groups, fdec::widen(s.t, ob), lo);
    std::printf("check:   %-16s splits %3d: %s; %s (bound %.3g = 2 x plain %s + floor)\n", label.c_str(), l.splits,
                c.o.summary("O").c_str(), c.lse.summary("LSE").c_str(), c.bound, fa::dtype_name(s.t));
    const int fell_back = k.launch.unified ? fallbacks.download()[0] : 0;
    if (k.launch.unified)
      std::printf("         unified max (phi = %g): %d of %lld split blocks fell back to the running max\n", s.phi,
                  fell_back, l.blocks_unsplit * l.splits);
    ok = ok && c.ok();
    if (!opts.out_dir.empty()) write_outputs(opts.out_dir, p, s.t, ob, lo);
    if (opts.iters <= 0) return;
    // Not fa::time_kernel: FLOPs count the visible keys of each entry, and GB/s the K/V bytes alone.
    // A unified-max run whose blocks fell back (large logits, --scale 30) is named "unified_max@fallback": its row
    // keeps the default run's of the same shape (the results' key has no scale).
    fa::ResultRow r = fa::result_row("06", fell_back > 0 ? label + "@fallback" : label, "fwd", p);
    r.dtype = fa::dtype_name(s.t);
    r.model_hbm_bytes = k.launch.even ? fdec_model::model_hbm_bytes_even(p, s.lens, elem, l.splits)
                                      : fdec_model::model_hbm_bytes(p, s.lens, elem, k.launch.packed, l.splits,
                                                                    l.row_bucket);
    r.extra_bytes = double(fdec::workspace_floats(p, l.splits)) * 4, r.max_abs_err = c.o.max_abs;
    r.ms = fa::time_ms(step, opts.warmup, opts.iters);
    r.tflops = fa::tflops(flops, r.ms), r.gbps = fa::gbps(kv, r.ms);
    rows.push_back(r);
  };

  for (const fdec::Step* k : s.kernels) {
    fdec::Launch l;
    try {
      l = planned(*k, f.splits);
    } catch (const fa::NotOnThisGpu& e) {  // e.g. two K/V stages at d = 128 on a GPU with 99 KB per block
      std::printf("skipped: %s\n", e.what());
      continue;
    }
    if (k->launch.even)
      std::printf("plan:    %-16s %lld blocks unsplit (%d per SM fit, %d SMs) -> %d blocks%s, the chunks of all of them "
                  "dealt evenly\n", k->name, l.blocks_unsplit, l.blocks_per_sm, l.sms, l.splits,
                  f.splits ? " (--splits)" : " (one per SM)");
    else
      std::printf("plan:    %-16s %lld blocks unsplit (%d per SM fit, %d SMs) -> %d split(s) of %d keys%s\n", k->name,
                  l.blocks_unsplit, l.blocks_per_sm, l.sms, l.splits, fdec::split_len(max_len, l.splits),
                  f.splits ? " (--splits)" : k->launch.splits ? " (heuristic)" : "");
    run_one(*k, l, k->name + tag);
    if (f.sweep_splits && k->launch.splits)
      for (int sp = 1; sp <= l.max_splits; ++sp) {
        const fdec::Launch ls = planned(*k, sp);
        const bool chosen = sp == fdec::plan(*k, p, s.t, max_len, 0).splits;
        run_one(*k, ls, std::string(k->name) + "/s" + std::to_string(sp) + (chosen ? "*" : "") + tag);
      }
  }

  // The ceiling: the same K and V bytes, read and nothing else.
  if (opts.iters > 0) {
    fa::DeviceBuffer<unsigned> sink(1);
    const int sms = fa::device_props().multiProcessorCount;
    fa::ResultRow r = fa::result_row("06", "read_kv" + tag, "read", p);
    r.dtype = fa::dtype_name(s.t), r.model_hbm_bytes = kv;
    r.ms = fa::time_ms([&] { fdec::read_kv(p, in.cache.contiguous(), max_len, sms, evict_first, sink.get()); }, opts.warmup, opts.iters);
    r.gbps = fa::gbps(kv, r.ms);
    rows.push_back(r);
    fa::report_rows(opts, rows);
    std::printf("gbps = K and V bytes of the visible keys (%s) / time; the kernels also read Q and write O, LSE (and "
                "with splits > 1 write and re-read the workspace): model_hbm_bytes counts all of it\n",
                fa::human_bytes(kv).c_str());
  }
  return ok;
}

// --kernel auto: FlashDecoding++'s heuristic dataflow for this GPU and the block's packed rows (G x q_len): the
// CUDA-core kernel up to the table's threshold, the tensor-core kernel beyond (gemm/dataflow.hpp). Its rows are named
// "auto", next to the kernels it chooses among.
const fdec::Step& dataflow_choice(const fa::Problem& p, const Setup& s) {
  const int rows = fdec::rows_of(p, true).per_unit();
  const fdec::gemm::AttentionPath path = fdec::gemm::choose_attention(s.table, fa::device_name(), rows);
  const fdec::Step& chosen = fdec::kernel_named(fdec::gemm::attention_kernel(path, rows));
  static fdec::Step step;
  step = chosen;
  step.name = "auto";
  step.idea = "the heuristic dataflow's choice for this GPU and row count";
  std::printf("auto:    %d packed rows on %s -> %s (%s)\n", rows, fa::device_name().c_str(), chosen.name,
              s.table.rows.empty() ? "the built-in default" : "the --table file");
  return step;
}

// Device bytes: Q, O (16-bit), LSE, the 16-bit K and V cache (twice for the paged kernel's copy), the split
// workspace at the largest split (or split_kv_even block) count.
double device_bytes(const fa::Problem& p, const Setup& s) {
  const bool paged = std::any_of(s.kernels.begin(), s.kernels.end(), [](auto* k) { return k->launch.paged; });
  return 2.0 * 2 * p.q_elems() + 4.0 * p.lse_elems() + 2.0 * 2 * p.kv_elems() * (paged ? 2 : 1) +
         4.0 * double(fdec::workspace_floats(p, std::max(fdec::kMaxSplits, fdec::kMaxEvenBlocks)));
}

}  // namespace

int main(int argc, char** argv) try {
  // 1. Parse the command line (bad usage, an unknown --kernel or --dtype: exit 2).
  Flags f;
  fa::Options defaults;
  defaults.problem.batch = 1, defaults.problem.heads = 32, defaults.problem.q_len = 1, defaults.problem.head_dim = 128;
  fa::Cli cli("flash_decoding",
              "Chapter 06: decoding attention (q_len 1..8 against a K/V cache of capacity --kv-len, default 4096), "
              "fp16/bf16, every kernel checked against the fp64 reference and timed next to a read-only ceiling.",
              defaults);
  cli.add_option("--kernel", &f.kernel,
                 "kernels to run: " + fa::step_names(fdec::kernels()) + ", a comma-separated list, or all; auto: the "
                 "kernel the heuristic dataflow picks (--table)");
  cli.add_option("--table", &f.table,
                 "the heuristic dataflow's table for --kernel auto (gemm/dataflow.tsv; none: its built-in default)");
  cli.add_flag("--list-steps", &f.list_steps,
               "print the steps (the kernels in ladder order), one a line: name, dtypes, GPUs, idea (tab-separated), "
               "and exit");
  cli.add_option("--dtype", &f.dtype, "fp16 or bf16 (Q, K, V, O; LSE is fp32)");
  cli.add_option("--kv-lens", &f.kv_lens, "context length of each batch entry, e.g. 4096,17,0,1 (default: all --kv-len)");
  cli.add_flag("--ragged", &f.ragged, "draw each entry's context length uniformly from 0..kv-len (entry 0 keeps kv-len)");
  cli.add_option("--splits", &f.splits, "split count (0: the heuristic); for split_kv_even its block count (0: one per SM)",
                 0, true);
  cli.add_flag("--sweep-splits", &f.sweep_splits, "also run every split count 1..max (each checked; * marks the heuristic's)");
  cli.add_option("--phi", &f.phi, "the unified max phi of the unified_max kernel");
  cli.add_option("--page-size", &f.page_size, "keys per page of the paged kernel (16, 32, 64, 128, 256)", 1);
  cli.add_option("--l2-policy", &f.l2_policy,
                 "L2 policy of the K/V loads, every kernel and read_kv: auto (evict-first when a step reads at most a "
                 "few L2s of K and V), evict-first, evict-normal");
  cli.extend_help("--q-len", "this chapter: 1 .. 8 new tokens");
  cli.extend_help("--kv-len", "this chapter: the cache capacity, auto = 4096 rather than Nq");
  cli.extend_help("--head-dim", "this chapter: 64, 128");
  cli.set_help("--dropout", "dropout probability p: decoding has none, 0 only");
  fa::Options opts = cli.parse(argc, argv);
  if (opts.help) return cli.print_usage();
  if (f.list_steps) {  // before any GPU work: the scripts read the ladder from here
    fa::print_steps(fdec::kernels());
    return 0;
  }
  Setup s = parse_setup(opts, f);

  // 2. The problem (from the flags or the --in files), this chapter's limits, the context lengths, the inputs
  //    (bad input: exit 2). Without --in the inputs are made on the device: a 128k-token cache is gigabytes.
  const fa::Problem p = fa::input_problem(opts, false);
  fdec::check_supported(p);
  s.lens = context_lengths(p, f);
  fa::check_outputs_writable(opts);
  fa::HostTensors files;
  if (!opts.in_dir.empty()) {  // rounded to the dtype here: a value beyond its range is bad input, before the GPU
    files = fa::load_inputs(opts, p, false);
    fa::round_inputs(s.t, files);
  }
  std::printf("problem: %s dtype=%s\n", fa::describe(p).c_str(), fa::dtype_name(s.t));

  // 3. The GPU (none: exit 1), and room on it.
  fa::require_gpu();
  if (s.auto_kernel) s.kernels.push_back(&dataflow_choice(p, s));
  fa::require_device_memory(device_bytes(p, s), "query, cache, outputs and the split workspace");

  // 4-6. Run, check, time and print every kernel.
  return fa::verdict(run(opts, p, s, f, opts.in_dir.empty() ? nullptr : &files));
} catch (...) {
  return fa::exit_code_of_current_exception();
}
