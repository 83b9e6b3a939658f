// GPU tests: every chapter-06 kernel against the fp64 reference on the rounded inputs (O within 2 x the plain
// same-dtype attention's error + floor, LSE within the fp32 tolerance) and, at q_len 1, against chapter 04's
// fa2::forward (fp32, the same rounded inputs, one batch entry at a time for ragged lengths). Outputs and workspace
// are NaN-poisoned before every run. Shapes: ragged lengths with 0 and 1, GQA 32/8 and MQA 32/1, causal q_len 4,
// every split count 1..max, large logits that make the unified max fall back, page sizes 16..256, fp16 and bf16;
// the double-buffered and fused-merge kernels bit for bit against the single-buffered one; the tensor-core kernel
// against the fused one within the chapter's bound, for every row count it pads (1 to 16 rows, and 32, 64 as chunks);
// the evenly dealt kernel against the tensor-core one within the same bound, for block counts 1 to 256; the flat GEMM
// kernel against the tensor-core one within the same bound, rows 1 to 8 and 8-row chunks; every kernel bit for bit the
// same under both L2 policies of its K/V loads.
#include <doctest/doctest.h>

#include <cmath>

#include "cache_host.cuh"
#include "fa2.cuh"
#include "model.hpp"
#include "program.hpp"
#include "random.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int q_len, int N, int d, bool causal, float scale = 0.f) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = q_len, p.kv_len = N, p.head_dim = d, p.causal = causal;
  p.scale = scale, p.seed = 97 + N + 3 * H + d;
  return p;
}

struct Fixture {
  Dtype t;
  Problem p;
  std::vector<int> lens;
  std::vector<float> q, k, v;  // rounded
  std::vector<double> ro, rl;  // fp64 reference
  double bound = 0;            // 2 x plain + floor
  DeviceBuffer<uint16_t> dq;
  fdec::DeviceCache cache;

  Fixture(Dtype t_, const Problem& p_, std::vector<int> lens_, int page_size = 16) : t(t_), p(p_), lens(std::move(lens_)) {
    q = rounded(t, random_normal<float>(p.q_elems(), p.seed * 3 + 1));
    k = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 3 + 2));
    v = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 3 + 3));
    fdec_model::reference(p, lens, q, k, v, ro, rl);
    bound = lowp_error_bound(t, compare(fdec_model::plain(t, p, lens, q, k, v), ro, {1e30, 0}).max_abs);
    dq = DeviceBuffer<uint16_t>(fdec::narrow(t, q));
    cache.k = DeviceBuffer<uint16_t>(fdec::narrow(t, k));
    cache.v = DeviceBuffer<uint16_t>(fdec::narrow(t, v));
    cache.kv_lens = DeviceBuffer<int>(lens);
    cache.build_pages(p, lens, page_size, p.seed);
  }
  int max_len() const { return *std::max_element(lens.begin(), lens.end()); }

  struct Out {
    std::vector<float> o, lse;
    int fallbacks;
  };
  // One poisoned run of `kernel` with `splits` (0: the heuristic); evict_first: the K/V loads' L2 policy (-1: plan's).
  Out run(const fdec::Step& kernel, int splits, float phi = 0.f, int evict_first = -1) {
    fdec::Launch l = fdec::plan(kernel, p, t, max_len(), splits);
    if (evict_first >= 0) l.evict_first = evict_first == 1;
    DeviceBuffer<uint16_t> o(p.q_elems());
    DeviceBuffer<float> lse(p.lse_elems()), ws(fdec::workspace_floats(p, l.splits));
    DeviceBuffer<int> fb(1);
    o.poison(), lse.poison(), fb.zero();
    if (ws.size()) ws.poison();
    fdec::forward(kernel, p, t, dq.get(), kernel.launch.paged ? cache.paged() : cache.contiguous(), o.get(), lse.get(),
                  l, phi, ws.get(), fb.get());
    CUDA_CHECK(cudaDeviceSynchronize());
    return {fdec::widen(t, o.download()), lse.download(), fb.download()[0]};
  }
  void expect_right(const Out& r, const char* what) {
    const ErrorReport eo = compare(r.o, ro, {bound, 0}), el = compare(r.lse, rl, kTolFp32Forward);
    CHECK_MESSAGE(eo.ok(), eo.summary(std::string(what) + " O vs fp64"));
    CHECK_MESSAGE(el.ok(), el.summary(std::string(what) + " LSE vs fp64"));
  }
  // Chapter 04 (fp32 FlashAttention-2) on the same rounded inputs, one batch entry at a time.
  void expect_same_as_04(const Out& r, const char* what) {
    for (int b = 0; b < p.batch; ++b) {
      if (lens[b] == 0) continue;  // 04 needs kv_len >= 1; the reference check covers the empty entry
      const fdec_model::BatchView bv = fdec_model::batch_view(p, lens[b], q.data(), k.data(), v.data(), b);
      DeviceBuffer<float> q4(bv.q), k4(bv.k), v4(bv.v), o4(bv.p.q_elems()), l4(bv.p.lse_elems());
      o4.poison(), l4.poison();
      fa2::forward(bv.p, q4.get(), k4.get(), v4.get(), o4.get(), l4.get());
      CUDA_CHECK(cudaDeviceSynchronize());
      const ErrorReport eo = compare(r.o.data() + p.q_offset(b, 0), to_double(o4.download()).data(), bv.p.q_elems(), {bound, 0});
      const ErrorReport el = compare(r.lse.data() + p.lse_offset(b, 0), to_double(l4.download()).data(), bv.p.lse_elems(),
                                     kTolFp32Forward);
      CHECK_MESSAGE(eo.ok(), eo.summary(std::string(what) + " O vs 04 (batch entry " + std::to_string(b) + ")"));
      CHECK_MESSAGE(el.ok(), el.summary(std::string(what) + " LSE vs 04"));
    }
  }
};

void every_kernel(Dtype t, const Problem& p, const std::vector<int>& lens) {
  INFO(std::string(dtype_name(t)), " ", describe(p));
  Fixture f(t, p, lens);
  for (const fdec::Step& k : fdec::kernels()) {
    INFO("kernel ", std::string(k.name));
    const Fixture::Out r = f.run(k, 0);
    f.expect_right(r, k.name);
    if (p.q_len == 1) f.expect_same_as_04(r, k.name);
    if (k.launch.unified) CHECK(r.fallbacks == 0);  // ordinary logits, phi = 0
  }
}

// The tensor-core kernels' shapes: rows per block 1 (MHA), 4 (GQA 4), 8, 16 (MQA 16/1 and GQA 4 at q_len 4, causal),
// 32 (MQA 32/1: two row chunks), 64 (GQA 8 at q_len 8, causal: four row chunks); ragged lengths with 0, 1 and
// tails; large logits.
struct Shape {
  Problem p;
  std::vector<int> lens;
};
const std::vector<Shape>& tensor_core_shapes() {
  static const std::vector<Shape> shapes = {{make(4, 4, 4, 1, 1000, 64, false), {1000, 0, 1, 97}},
                                            {make(2, 32, 8, 1, 777, 128, false), {777, 200}},
                                            {make(2, 16, 2, 1, 300, 64, false), {31, 300}},
                                            {make(2, 16, 1, 1, 520, 128, false), {5, 520}},
                                            {make(2, 32, 1, 1, 400, 64, false), {400, 33}},
                                            {make(3, 8, 2, 4, 300, 128, true), {300, 3, 0}},
                                            {make(2, 8, 1, 8, 257, 64, true), {257, 8}},
                                            {make(2, 8, 2, 1, 600, 128, false, 30.f), {600, 45}}};
  return shapes;
}

}  // namespace

TEST_CASE("06 gpu: every kernel, ragged lengths with 0 and 1, MHA, q_len 1, vs fp64 and 04") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (int d : {64, 128}) every_kernel(t, make(4, 4, 4, 1, 1000, d, false), {1000, 0, 1, 97});
}

TEST_CASE("06 gpu: GQA 32/8 and MQA 32/1 at q_len 1, vs fp64 and 04") {
  every_kernel(Dtype::fp16, make(2, 32, 8, 1, 777, 128, false), {777, 64});
  every_kernel(Dtype::bf16, make(2, 32, 1, 1, 777, 64, false), {33, 777});
}

TEST_CASE("06 gpu: speculative q_len 4 with bottom-right causal, per entry's own length") {
  every_kernel(Dtype::fp16, make(3, 8, 2, 4, 300, 64, true), {300, 3, 0});
  every_kernel(Dtype::bf16, make(2, 32, 8, 4, 129, 128, true), {129, 4});
}

TEST_CASE("06 gpu: every split count 1..max gives the right answer") {
  for (Dtype t : {Dtype::fp16, Dtype::bf16}) {
    Fixture f(t, make(2, 8, 2, 1, 3000, 128, false), {3000, 17});
    for (const fdec::Step& k : fdec::kernels()) {
      if (!k.launch.splits) continue;
      for (int s = 1; s <= fdec_model::max_splits(f.max_len()); ++s) {
        INFO(std::string(dtype_name(t)), " kernel ", std::string(k.name), " splits ", s);
        f.expect_right(f.run(k, s), k.name);
      }
    }
  }
}

TEST_CASE("06 gpu: large logits and a far phi make the unified max fall back, and the answer stays right") {
  const fdec::Step& k = fdec::kernel_named("unified_max");
  Fixture big(Dtype::fp16, make(2, 8, 2, 1, 600, 64, false, 30.f), {600, 45});  // S in the hundreds: overflow
  const Fixture::Out r = big.run(k, 4, 0.f);
  CHECK(r.fallbacks > 0);
  big.expect_right(r, "unified_max, scale 30");
  Fixture far(Dtype::bf16, make(2, 8, 2, 1, 600, 128, false), {600, 45});  // phi 200 above every score: underflow
  const Fixture::Out r2 = far.run(k, 4, 200.f);
  CHECK(r2.fallbacks > 0);
  far.expect_right(r2, "unified_max, phi 200");
}

TEST_CASE("06 gpu: double buffering and the fused merge change no bit: split_kv_gqa = pipelined = fused") {
  // The same arithmetic in the same order; only when each chunk is copied (pipelined) and which launch merges
  // (fused: the last split block, through the same merge_row) differ. Ragged with an empty entry and
  // entries shorter than one chunk per warp, MHA (1 row), GQA (4 rows), MQA (16 rows), causal q_len 4, every
  // dtype and head_dim, splits 1 (O written directly), 3, 7 and the heuristic's.
  struct Shape {
    Problem p;
    std::vector<int> lens;
  };
  const std::vector<Shape> shapes = {{make(4, 4, 4, 1, 1000, 64, false), {1000, 0, 1, 97}},
                                     {make(2, 32, 8, 1, 777, 128, false), {777, 200}},
                                     {make(2, 16, 1, 1, 520, 128, false), {5, 520}},
                                     {make(3, 8, 2, 4, 300, 64, true), {300, 3, 0}}};
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (const Shape& sh : shapes) {
      Fixture f(t, sh.p, sh.lens);
      for (int s : {0, 1, 3, 7}) {
        INFO(std::string(dtype_name(t)), " ", describe(sh.p), " splits ", s);
        const Fixture::Out plain = f.run(fdec::kernel_named("split_kv_gqa"), s);
        for (const char* name : {"split_kv_pipelined", "split_kv_fused", "split_kv_fused"}) {  // fused twice: its
          INFO("kernel ", std::string(name));  // counters must be back at zero after a launch
          const Fixture::Out r = f.run(fdec::kernel_named(name), s);
          f.expect_right(r, name);
          CHECK(compare(r.o, to_double(plain.o), {0, 0}).ok());
          CHECK(compare(r.lse, to_double(plain.lse), {0, 0}).ok());
        }
      }
    }
}

TEST_CASE("06 gpu: the paged kernel equals the contiguous one for every page size") {
  for (int page : {16, 64, 256}) {
    INFO("page size ", page);
    Fixture f(Dtype::fp16, make(3, 8, 2, 2, 700, 64, true), {700, 1, 300}, page);
    const Fixture::Out paged = f.run(fdec::kernel_named("paged"), 3), flat = f.run(fdec::kernel_named("split_kv_gqa"), 3);
    f.expect_right(paged, "paged");
    CHECK(compare(paged.o, to_double(flat.o), {0, 0}).ok());  // same splits, same order: the same bits
  }
}

TEST_CASE("06 gpu: split_kv_mma = split_kv_fused within the bound, for every row count, causal q_len up to 8") {
  // The same copies, splits and fused merge; S and P V on tensor cores instead of fp32 FMAs, with P rounded to the
  // dtype for its mma (as the plain same-dtype attention rounds it) and the rows padded to a 16-row tile. So O may
  // differ from split_kv_fused's by what that rounding costs: held to the chapter's bound (2 x the plain attention's
  // error + one ulp at 1), which each of the two also meets against fp64. LSE is fp32 from fp32 scores in both, only
  // summed in another order: chapter 04's fp32 tolerance. Rows per block: 1 (MHA), 4 (GQA 4), 8, 16 (MQA 16/1 and
  // GQA 4 at q_len 4, causal), 32 (MQA 32/1: two row chunks), 64 (GQA 8 at q_len 8, causal: four row chunks); ragged
  // lengths with 0, 1 and tails; splits 1 (O written directly), 3, 7 and the heuristic's; large logits.
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (const Shape& sh : tensor_core_shapes()) {
      Fixture f(t, sh.p, sh.lens);
      for (int s : {0, 1, 3, 7}) {
        INFO(std::string(dtype_name(t)), " ", describe(sh.p), " splits ", s);
        const Fixture::Out fused = f.run(fdec::kernel_named("split_kv_fused"), s);
        for (int again = 0; again < 2; ++again) {  // twice: the merge counters must be back at zero
          const Fixture::Out r = f.run(fdec::kernel_named("split_kv_mma"), s);
          f.expect_right(r, "split_kv_mma");
          const ErrorReport eo = compare(r.o, to_double(fused.o), {f.bound, 0});
          const ErrorReport el = compare(r.lse, to_double(fused.lse), kTolFp32Forward);
          CHECK_MESSAGE(eo.ok(), eo.summary("split_kv_mma O vs split_kv_fused"));
          CHECK_MESSAGE(el.ok(), el.summary("split_kv_mma LSE vs split_kv_fused"));
        }
      }
    }
}

TEST_CASE("06 gpu: split_kv_even = split_kv_mma within the bound, for any block count, pieces crossing tiles") {
  // The same block body (attend_mma, lines 11-13) over other key ranges: a block's share may end one tile and start
  // the next, and a tile is merged from however many pieces it was cut into. So O may differ from split_kv_mma's by
  // the rounding of another split of the keys: the chapter's bound, as split_kv_mma against split_kv_fused. Block
  // counts 1 (one block walks everything; every tile written directly), 3 and 7 (pieces crossing tiles and entries),
  // the default (one per SM), 256 (more blocks than chunks for the short entries: the idle blocks exit); twice each,
  // as the merge counters must be back at zero.
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (const Shape& sh : tensor_core_shapes()) {
      Fixture f(t, sh.p, sh.lens);
      const Fixture::Out mma = f.run(fdec::kernel_named("split_kv_mma"), 0);
      for (int blocks : {0, 1, 3, 7, 256})
        for (int again = 0; again < 2; ++again) {
          INFO(std::string(dtype_name(t)), " ", describe(sh.p), " blocks ", blocks);
          const Fixture::Out r = f.run(fdec::kernel_named("split_kv_even"), blocks);
          f.expect_right(r, "split_kv_even");
          const ErrorReport eo = compare(r.o, to_double(mma.o), {f.bound, 0});
          const ErrorReport el = compare(r.lse, to_double(mma.lse), kTolFp32Forward);
          CHECK_MESSAGE(eo.ok(), eo.summary("split_kv_even O vs split_kv_mma"));
          CHECK_MESSAGE(el.ok(), el.summary("split_kv_even LSE vs split_kv_mma"));
        }
    }
}

TEST_CASE("06 gpu: flat_gemm = split_kv_mma within the bound, rows 1 to 8 in one block, more in 8-row chunks") {
  // The same copies, splits, stages and fused merge; the products transposed (S^T = K_j Q^T, O~^T += V_j^T P^T) with
  // the rows padded to 8 instead of 16, P rounded to the dtype as in split_kv_mma, the sums taken in another order.
  // So O may differ from split_kv_mma's by rounding: the chapter's bound; LSE by chapter 04's fp32 tolerance. Rows
  // per block 1 to 8 (MQA r/1 at q_len 1; GQA 2 at q_len 3, causal: 6 rows), then tensor_core_shapes(), whose 16,
  // 32 and 64 rows are 2, 4 and 8 chunks of 8; splits 1 (O written directly), 3 and the heuristic's; twice each, as
  // the merge counters must be back at zero.
  std::vector<Shape> shapes;
  for (int rows = 1; rows <= 8; ++rows)
    shapes.push_back({make(2, rows, 1, 1, 333, rows % 2 ? 64 : 128, false), {333, 40}});
  shapes.push_back({make(2, 4, 2, 3, 200, 64, true), {200, 2}});
  for (const Shape& sh : tensor_core_shapes()) shapes.push_back(sh);
  for (Dtype t : {Dtype::fp16, Dtype::bf16})
    for (const Shape& sh : shapes) {
      Fixture f(t, sh.p, sh.lens);
      for (int s : {0, 1, 3}) {
        INFO(std::string(dtype_name(t)), " ", describe(sh.p), " splits ", s);
        const Fixture::Out mma = f.run(fdec::kernel_named("split_kv_mma"), s);
        for (int again = 0; again < 2; ++again) {
          const Fixture::Out r = f.run(fdec::kernel_named("flat_gemm"), s);
          f.expect_right(r, "flat_gemm");
          const ErrorReport eo = compare(r.o, to_double(mma.o), {f.bound, 0});
          const ErrorReport el = compare(r.lse, to_double(mma.lse), kTolFp32Forward);
          CHECK_MESSAGE(eo.ok(), eo.summary("flat_gemm O vs split_kv_mma"));
          CHECK_MESSAGE(el.ok(), el.summary("flat_gemm LSE vs split_kv_mma"));
        }
      }
    }
}

TEST_CASE("06 gpu: the L2 policy of the K/V loads changes no bit of any kernel's output") {
  // evict-first or evict-normal decides which lines L2 gives up first (README §4.6), not what is loaded.
  Fixture f(Dtype::fp16, make(3, 32, 8, 1, 1500, 128, false), {1500, 1, 613});
  for (const fdec::Step& k : fdec::kernels()) {
    INFO("kernel ", std::string(k.name));
    const Fixture::Out first = f.run(k, 0, 0.f, 1), normal = f.run(k, 0, 0.f, 0);
    f.expect_right(first, k.name);
    CHECK(first.o == normal.o);
    CHECK(first.lse == normal.lse);
  }
}

TEST_CASE("06 gpu: every kernel on every device of the machine, one after the other in one process") {
  // The shared-memory opt-in and the fused merge's counters belong to a device: raised and allocated on device 0,
  // they must be raised and allocated again on device 1 (there, 48 KB would be the limit and device 0's counters
  // unreachable). With one GPU this is every_kernel again.
  int devices = 0;
  CUDA_CHECK(cudaGetDeviceCount(&devices));
  for (int dev = 0; dev < devices; ++dev) {
    INFO("device ", dev, " of ", devices);
    CUDA_CHECK(cudaSetDevice(dev));
    every_kernel(Dtype::fp16, make(2, 32, 8, 1, 700, 128, false), {700, 333});
  }
  CUDA_CHECK(cudaSetDevice(0));
}
