// The chapter's kernels themselves, run on the CPU through tests/emu/emu.hpp (every GPU thread a cooperative context;
// shuffles, ldmatrix, mma.sync by the PTX ISA's rules; cp.async landing only at the wait_group that lets it): each
// step's own source, its host function included (the Args it builds, its grid, its merge), on host memory, against
// the fp64 reference with the GPU tests' rule (O within 2 x the plain same-dtype attention's error + floor, LSE within
// the fp32 tolerance). Outputs and workspace are NaN-poisoned before every run; shared memory is garbage at every
// block. Shapes: MHA and GQA with ragged lengths (0, 1, tails that are not a chunk multiple), causal q_len 3 packed
// with MQA, a negative scale, a sequence long enough that each warp walks several chunks (the double buffer turns
// over), large logits (the unified max falls back; flat_gemm's running max), fp16 and bf16, d = 64 and 128, one and
// several splits, paged with pages of 16 and 32 keys; flat_gemm with 8 rows (its tile full) and 12 (two row chunks).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cache_host.cuh"
#include "flash_decoding.cuh"
#include "model.hpp"
#include "model_testing.hpp"
#include "pages.hpp"
#include "steps/steps.hpp"

using namespace fa;

namespace {

struct StepFile {
  const char* file;  // steps/<file>.cu
  fdec::Kernel (*kernel)();
};
const std::vector<StepFile>& step_files() {
  static const std::vector<StepFile> list = {
      {"v01_fa2_grid", fdec::v01_fa2_grid::kernel},
      {"v02_split_kv", fdec::v02_split_kv::kernel},
      {"v03_split_kv_gqa", fdec::v03_split_kv_gqa::kernel},
      {"v04_split_kv_pipelined", fdec::v04_split_kv_pipelined::kernel},
      {"v05_split_kv_fused", fdec::v05_split_kv_fused::kernel},
      {"v06_split_kv_mma", fdec::v06_split_kv_mma::kernel},
      {"v07_split_kv_even", fdec::v07_split_kv_even::kernel},
      {"v08_unified_max", fdec::v08_unified_max::kernel},
      {"v09_paged", fdec::v09_paged::kernel},
      {"v10_flat_gemm", fdec::v10_flat_gemm::kernel},
  };
  return list;
}

// plan()'s launch without a device: the row bucket and chunks of the kernel, `splits` splits (the even kernel: blocks).
fdec::Launch launch_for(const fdec::Kernel& k, const Problem& p, int splits) {
  fdec::Launch l;
  const int rows = fdec::rows_of(p, k.packed).per_unit();
  l.row_bucket = fdec::row_bucket(rows, k.mma, k.flat), l.row_chunks = fdec::row_chunks(rows, l.row_bucket);
  l.blocks_unsplit = (long long)p.batch * fdec::units_of(p, k.packed) * l.row_chunks;
  l.splits = k.splits ? splits : 1;
  return l;
}

struct Fixture {
  Dtype t;
  fdec_test::Case c;  // the problem, its lengths and rounded inputs (model_testing.hpp)
  std::vector<uint16_t> q16, k16, v16, k_pages, v_pages;
  fdec::PageTable pages;

  Fixture(Dtype t_, const Problem& p, std::vector<int> lens, int page_size = 16)
      : t(t_), c(fdec_test::inputs(t_, p, std::move(lens))) {
    q16 = fdec::narrow(t, c.q), k16 = fdec::narrow(t, c.k), v16 = fdec::narrow(t, c.v);
    // the paged copy: pages.hpp's pool, filled on the host
    pages = fdec::page_table(p, c.lens, page_size, p.seed);
    const size_t page_elems = pages.page_elems(p);
    k_pages.assign(pages.num_pages * page_elems, 0), v_pages.assign(pages.num_pages * page_elems, 0);
    for (int b = 0; b < p.batch; ++b)
      for (int pg = 0; pg < pages.used[b]; ++pg) {
        const int id = pages.table[size_t(b) * pages.pages_per_seq + pg];
        for (int hk = 0; hk < p.kv_heads; ++hk)
          for (int r = 0; r < std::min(page_size, c.lens[b] - pg * page_size); ++r) {
            const size_t from = p.kv_offset(b, hk) + size_t(pg * page_size + r) * p.head_dim;
            const size_t to = id * page_elems + (size_t(hk) * page_size + r) * p.head_dim;
            std::copy_n(k16.begin() + from, p.head_dim, k_pages.begin() + to);
            std::copy_n(v16.begin() + from, p.head_dim, v_pages.begin() + to);
          }
      }
  }

  // One run of `kernel` with `splits` splits (the even kernel: blocks), outputs and workspace NaN-poisoned first.
  fdec_model::Result run(const fdec::Kernel& kernel, int splits, float phi = 0.f, bool evict_first = false) {
    const Problem& p = c.p;
    fdec::Launch l = launch_for(kernel, p, splits);
    l.evict_first = evict_first;
    std::vector<uint16_t> o(p.q_elems(), 0x7FFF);  // NaN in fp16 and in bf16
    std::vector<float> lse(p.lse_elems(), NAN), ws(std::max<size_t>(1, fdec::workspace_floats(p, l.splits)), NAN);
    int fallbacks = 0;
    fdec::Cache cache{k16.data(), v16.data(), c.lens.data(), nullptr, 0, 0};
    if (kernel.paged)
      cache = fdec::Cache{k_pages.data(), v_pages.data(), c.lens.data(), pages.table.data(), pages.pages_per_seq,
                          pages.page_size};
    kernel.forward(p, t, q16.data(), cache, o.data(), lse.data(), l, phi, l.splits > 1 ? ws.data() : nullptr,
                   &fallbacks);
    return {fdec::widen(t, o), lse, fallbacks, 0};
  }
  // O within 2 x the plain same-dtype attention's error + floor, LSE within the fp32 tolerance (model_testing.hpp).
  void expect_right(const fdec_model::Result& r) { fdec_test::expect_matches(t, c, r); }
};

struct Shape {
  Problem p;
  std::vector<int> lens;
  const char* what;
};
// d = 64 and 128 in turn, fp16 and bf16 in turn, so that every step meets each at least once per case list.
std::vector<Shape> shapes() {
  return {{fdec_test::make(2, 4, 2, 1, 97, 64, false), {97, 1}, "GQA 4/2, q_len 1, lengths 97 and 1"},
          {fdec_test::make(2, 2, 2, 1, 64, 128, false), {64, 0}, "MHA, lengths 64 and 0 (a row that sees no key)"},
          {fdec_test::make(1, 4, 1, 3, 203, 64, true), {203}, "MQA 4/1, causal q_len 3 (12 packed rows)"},
          {fdec_test::make(1, 2, 1, 1, 113, 128, false, -0.3f), {113}, "negative scale -0.3, length 113"},
          {fdec_test::make(1, 4, 2, 1, 777, 64, false), {777}, "GQA 4/2, length 777: a warp walks several chunks"}};
}

}  // namespace

TEST_CASE("06 emulated: every step's kernel, ragged, GQA/MQA, causal q_len 3, negative scale, vs fp64") {
  int n = 0;
  for (const Shape& c : shapes()) {
    const Dtype t = n++ % 2 ? Dtype::bf16 : Dtype::fp16;
    Fixture f(t, c.p, c.lens);
    for (const StepFile& s : step_files()) {
      const fdec::Kernel k = s.kernel();
      for (int splits : {1, 3}) {
        if (splits > 1 && !k.splits) continue;
        const std::string what = std::string(s.file) + ", " + dtype_name(t) + ", d " + std::to_string(c.p.head_dim) +
                                 ", " + c.what + ", splits " + std::to_string(splits);
        INFO(what);
        const fdec_model::Result r = f.run(k, splits);
        f.expect_right(r);
        if (k.unified) CHECK(r.fallbacks == 0);  // ordinary logits, phi = 0
      }
    }
  }
}

TEST_CASE("06 emulated: large logits make the unified max fall back, and the answer stays right") {
  // S in the hundreds: e^(S - phi) overflows
  Fixture big(Dtype::fp16, fdec_test::make(2, 8, 2, 1, 150, 64, false, 30.f), {150, 45});
  const fdec_model::Result r = big.run(fdec::v08_unified_max::kernel(), 3);
  CHECK(r.fallbacks > 0);
  big.expect_right(r);
  big.expect_right(big.run(fdec::v10_flat_gemm::kernel(), 3));  // the running max down the columns of S^T
  // phi 200 above every score: e^(S - phi) underflows
  Fixture far(Dtype::bf16, fdec_test::make(1, 4, 1, 1, 90, 128, false), {90});
  const fdec_model::Result r2 = far.run(fdec::v08_unified_max::kernel(), 2, 200.f);
  CHECK(r2.fallbacks > 0);
  far.expect_right(r2);
}

TEST_CASE("06 emulated: the paged kernel with pages of 16 and 32 keys equals the contiguous one") {
  for (int page : {16, 32}) {
    INFO("page size ", page);
    Fixture f(Dtype::fp16, fdec_test::make(3, 4, 2, 1, 100, 64, false), {100, 33, 0}, page);
    const fdec_model::Result paged = f.run(fdec::v09_paged::kernel(), 2);
    const fdec_model::Result contiguous = f.run(fdec::v03_split_kv_gqa::kernel(), 2);
    f.expect_right(paged);
    CHECK(compare(paged.o, to_double(contiguous.o), {0, 0}).ok());
    CHECK(compare(paged.lse, to_double(contiguous.lse), {0, 0}).ok());
  }
}

TEST_CASE("06 emulated: double buffering and the fused merge change no bit; the even kernel for 1 to 5 blocks") {
  Fixture f(Dtype::bf16, fdec_test::make(2, 8, 2, 2, 130, 64, true), {130, 70});
  for (int splits : {2, 4}) {
    INFO("splits ", splits);
    const fdec_model::Result gqa = f.run(fdec::v03_split_kv_gqa::kernel(), splits);
    for (auto kernel : {fdec::v04_split_kv_pipelined::kernel, fdec::v05_split_kv_fused::kernel}) {
      const fdec_model::Result r = f.run(kernel(), splits);
      CHECK(compare(r.o, to_double(gqa.o), {0, 0}).ok());
      CHECK(compare(r.lse, to_double(gqa.lse), {0, 0}).ok());
    }
  }
  for (int blocks = 1; blocks <= 5; ++blocks) {
    INFO("blocks ", blocks);
    f.expect_right(f.run(fdec::v07_split_kv_even::kernel(), blocks));
  }
  // 8 packed rows (GQA 4 at q_len 2, causal): flat_gemm's tile full, every column of S^T a row
  for (int splits : {1, 4}) f.expect_right(f.run(fdec::v10_flat_gemm::kernel(), splits));
  // the L2 policy is a hint: the evict-first copies give the same bits
  const fdec_model::Result normal = f.run(fdec::v06_split_kv_mma::kernel(), 3, 0.f, false);
  const fdec_model::Result first = f.run(fdec::v06_split_kv_mma::kernel(), 3, 0.f, true);
  CHECK(compare(first.o, to_double(normal.o), {0, 0}).ok());
}
