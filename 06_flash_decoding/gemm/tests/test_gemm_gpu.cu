// Every kernel of the registry (gemm.cuh) on the GPU against fp64 (check.hpp's rule), on ragged shapes (M = 1, 3, 8,
// 9, 17, 33, 65: the flat GEMM's 1 to 8 groups and 2 slabs; N, K not tile multiples) and on one 7B-class shape per
// kernel, the flat GEMM with the split-K that flat_splits picks for this GPU and with 3 splits forced; flat_cluster
// with 1 to 8 pieces, the same bits as flat (skipped, said so, on a GPU without thread block clusters); flat_wgmma
// on every padding of M (16 to 256 rows, and two slabs), tiles of 64, 128 and 192 outputs, with 1 to 4 pieces (sm_90
// only); read_w's checksum (every word of W read).
// Y and the workspace are NaN-poisoned first.
#include <doctest/doctest.h>

#include <cstring>
#include <utility>
#include <vector>

#include "check.hpp"
#include "device.cuh"
#include "device_buffer.cuh"
#include "gemm.cuh"

using namespace fdec::gemm;

namespace {

std::vector<fa::half_t> run_y(const HostGemm& h, void (*launch)(const Args&), int splits) {
  fa::DeviceBuffer<__half> x(h.x.size()), w(h.w.size()), y(size_t(h.m) * h.n);
  fa::DeviceBuffer<float> ws(std::max<size_t>(1, size_t(splits) * h.m * h.n));
  CUDA_CHECK(cudaMemcpy(x.get(), h.x.data(), h.x.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemcpy(w.get(), h.w.data(), h.w.size() * 2, cudaMemcpyHostToDevice));
  CUDA_CHECK(cudaMemset(y.get(), 0xFF, y.bytes()));  // NaN
  CUDA_CHECK(cudaMemset(ws.get(), 0xFF, ws.bytes()));
  Args a;
  a.m = h.m, a.n = h.n, a.k = h.k, a.x = x.get(), a.w = w.get(), a.y = y.get();
  a.splits = splits, a.workspace = splits > 1 ? ws.get() : nullptr;
  launch(a);
  CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<fa::half_t> out(size_t(h.m) * h.n);
  CUDA_CHECK(cudaMemcpy(out.data(), y.get(), y.bytes(), cudaMemcpyDeviceToHost));
  return out;
}
GemmError run(const HostGemm& h, void (*launch)(const Args&), int splits, bool sampled) {
  const std::vector<fa::half_t> out = run_y(h, launch, splits);
  return sampled ? check(h, out, sample(h.m, 8), sample(h.n, 64)) : check_all(h, out);
}
int sms() { return fa::device_props().multiProcessorCount; }
// The split-K `kernel` picks on this GPU (1 for the kernels without).
int splits_of(const Kernel& kernel, int m, int n, int k) { return kernel.splits ? kernel.splits(m, n, k, sms()) : 1; }
bool clusters() { return flat_cluster::slots(1, sms()) > 0; }  // this GPU launches thread block clusters

}  // namespace

TEST_CASE("06 gemm GPU: every kernel on ragged M, N, K vs fp64") {
  struct Shape {
    int n, k;
  };
  for (int m : {1, 3, 8, 9, 17, 33, 65})
    for (const Shape& s : std::vector<Shape>{{5, 8}, {77, 136}, {136, 392}, {1000, 1032}}) {
      const HostGemm h = make_inputs(m, s.n, s.k, 1000 + m);
      for (const Kernel& kernel : kernels()) {
        if (!runs_here(kernel)) continue;
        const int splits = splits_of(kernel, m, s.n, s.k);
        INFO(kernel.name, ": M ", m, ", N ", s.n, ", K ", s.k, ", splits ", splits);
        const GemmError e = run(h, kernel.launch, splits, false);
        INFO(e.summary());
        CHECK(e.ok());
      }
      if (s.k >= 3 * kFlatTileK) {
        const GemmError e = run(h, flat::launch, 3, false);
        INFO("flat, 3 splits: M ", m, ", N ", s.n, ", K ", s.k, ": ", e.summary());
        CHECK(e.ok());
      }
    }
}

TEST_CASE("06 gemm GPU: a 7B-class shape (N 4096, K 11008), sampled entries") {
  for (int m : {1, 8, 64, 200}) {
    const HostGemm h = make_inputs(m, 4096, 11008, 77 + m);
    for (const Kernel& kernel : kernels()) {
      if (!runs_here(kernel)) continue;
      const int splits = splits_of(kernel, m, h.n, h.k);
      INFO(kernel.name, ": M ", m, ", splits ", splits);
      const GemmError e = run(h, kernel.launch, splits, true);
      INFO(e.summary());
      CHECK(e.ok());
    }
  }
}

TEST_CASE("06 gemm GPU: the flat GEMM's split-K, launch after launch on the same arrival counts") {
  const HostGemm h = make_inputs(9, 4096, 4096, 5);
  for (int splits : {2, 3, 5, 16, 3}) {
    INFO("splits ", splits);
    const GemmError e = run(h, flat::launch, splits, true);
    INFO(e.summary());
    CHECK(e.ok());
  }
}

TEST_CASE("06 gemm GPU: flat_cluster's split-K summed in a cluster, 1 to 8 pieces, the same bits as flat") {
  if (!clusters()) {
    MESSAGE("skipped: flat_cluster needs thread block clusters (sm_90); this GPU has none");
    return;
  }
  const HostGemm long_k = make_inputs(1, 64, 2048, 1);  // 16 K tiles, but a cluster holds at most 8 blocks
  CHECK_THROWS_AS(run_y(long_k, flat_cluster::launch, 9), std::invalid_argument);
  for (int m : {1, 2, 5, 8, 9, 17, 33, 65})
    for (int splits : {1, 2, 3, 4, 8}) {
      const HostGemm h = make_inputs(m, 1000, 1032, 300 + m);  // ragged N; 9 K tiles, the last 8 wide
      INFO("M ", m, ", splits ", splits);
      const std::vector<fa::half_t> y = run_y(h, flat_cluster::launch, splits);
      const GemmError e = check_all(h, y);
      INFO(e.summary());
      CHECK(e.ok());
      const std::vector<fa::half_t> flat_y = run_y(h, flat::launch, splits);
      CHECK(std::memcmp(y.data(), flat_y.data(), y.size() * sizeof(fa::half_t)) == 0);  // split order, as flat
    }
  const HostGemm h = make_inputs(8, 4096, 11008, 7);  // the 7B shape, launch after launch
  for (int splits : {4, 2, 4}) CHECK(run(h, flat_cluster::launch, splits, true).ok());
}

#ifdef FDEC_GEMM_HOPPER
TEST_CASE("06 gemm GPU: flat_wgmma on every padding of M, tiles of 64, 128, 192, 1 to 4 pieces, launch after launch") {
  if (!flat_wgmma::supported()) {
    MESSAGE("skipped: flat_wgmma needs an sm_90 GPU (wgmma, TMA); this one is not");
    return;
  }
  for (int m : {1, 16, 17, 31, 64, 100, 128, 129, 255, 256, 257, 300})  // Mp 16 .. 256; M > 256: two slabs
    for (int splits : {1, 2, 3, 4}) {
      // Ragged N: tiles of 64 (the fourth 8 wide; slabs of 128 rows above 128); K: 5 to 9 K tiles, the last 8
      // wide (with 4 panels a stage, 3 of its panels wholly past K: TMA's zeros).
      const HostGemm h = make_inputs(m, 200, 1032, 500 + m);
      INFO("M ", m, ", splits ", splits);
      const GemmError e = run(h, flat_wgmma::launch, splits, false);
      INFO(e.summary());
      CHECK(e.ok());
    }
  // N of 67 tiles of 128: tiles of 128 at M <= 128 too; above, tiles of 192 (44 of them and one 72 wide) in 2 slabs
  for (int m : {16, 100, 129, 200, 256})
    for (int splits : {1, 2}) {
      const HostGemm h = make_inputs(m, 8520, 648, 600 + m);
      INFO("M ", m, ", splits ", splits);
      CHECK(run(h, flat_wgmma::launch, splits, false).ok());
    }
  // 7B shapes launch after launch: at M = 128, tiles of 64 (64 blocks; 128 with 2 pieces); at M = 256, of 192.
  const HostGemm h128 = make_inputs(128, 4096, 4096, 8);
  for (int splits : {2, 1, 2}) CHECK(run(h128, flat_wgmma::launch, splits, true).ok());
  const HostGemm h = make_inputs(256, 12288, 4096, 9);
  for (int splits : {1, 4, 2, 4}) CHECK(run(h, flat_wgmma::launch, splits, true).ok());
}
#endif

TEST_CASE("06 gemm GPU: read_w reads every 32-bit word of W once (its XOR)") {
  for (const std::pair<int, int>& nk : std::vector<std::pair<int, int>>{{5, 8}, {77, 136}, {4096, 4096}, {4096, 11008}}) {
    const int n = nk.first, k = nk.second;
    const HostGemm h = make_inputs(1, n, k, 5);
    unsigned want = 0;
    for (size_t i = 0; i < h.w.size(); i += 2) want ^= unsigned(h.w[i].bits) | unsigned(h.w[i + 1].bits) << 16;
    fa::DeviceBuffer<__half> w(h.w.size());
    fa::DeviceBuffer<unsigned> sum(1);
    CUDA_CHECK(cudaMemcpy(w.get(), h.w.data(), h.w.size() * 2, cudaMemcpyHostToDevice));
    sum.zero();
    read_w::launch(w.get(), n, k, sms(), sum.get());
    unsigned got = 0;
    CUDA_CHECK(cudaMemcpy(&got, sum.get(), 4, cudaMemcpyDeviceToHost));
    INFO("N ", n, ", K ", k);
    CHECK(got == want);
  }
}
