// GPU tests of step 8 block-sparse (wsq::forward_block_sparse, 04's README section 6) x fp16/bf16 x head_dim 64/128
// against the fp64 reference and the plain same-dtype attention with the same block mask (check.hpp's rule) and
// against chapter 04's block-sparse forward (fp32, same rounded inputs), outputs NaN-poisoned. Shapes: the edge
// lengths, causal on/off, GQA, a fully masked row block, an empty mask, the dense and causal-equivalent masks.
#include <doctest/doctest.h>

#include <algorithm>

#include "block_mask.hpp"
#include "device_buffer.cuh"
#include "fa2.cuh"
#include "random.hpp"
#include "testing.hpp"

#include "forward/check.hpp"
#include "forward/warp_split_q.cuh"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.seed = 91 + nq + 5 * nk + d;
  return p;
}

template <class T>
void check(Dtype t, const Problem& p, const BlockMask& mask) {
  INFO(std::string(dtype_name(t)), ", ", describe(p), ", mask density ", mask.density());
  const std::vector<float> qf = rounded(t, random_normal<float>(p.q_elems(), p.seed * 4 + 1, 0.0, 1.0)),
                           kf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 2, 0.0, 1.0)),
                           vf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 3));
  DeviceBuffer<T> q(to_dtype<T>(qf)), k(to_dtype<T>(kf)), v(to_dtype<T>(vf)), o(p.q_elems());
  DeviceBuffer<float> lse(p.lse_elems()), q32(qf), k32(kf), v32(vf), o32(p.q_elems()), lse32(p.lse_elems());
  const DeviceBuffer<uint8_t> bits(mask.bits);
  o32.poison(), lse32.poison(), o.poison(), lse.poison();
  fa2::forward(p, q32.get(), k32.get(), v32.get(), o32.get(), lse32.get(), bits.get());
  wsq::forward_block_sparse<T>(p, q.get(), k.get(), v.get(), o.get(), lse.get(), bits.get());
  CUDA_CHECK(cudaDeviceSynchronize());
  const wsq::LowpReference ref = wsq::lowp_reference(t, p, qf, kf, vf, 1e30, &mask);  // every row
  const std::vector<T> o_t = o.download();
  std::vector<float> o_f(o_t.size());
  for (size_t x = 0; x < o_t.size(); ++x) o_f[x] = to_float(o_t[x]);
  const std::vector<float> lse_f = lse.download();
  const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse_f);
  CHECK_MESSAGE(c.ok(), c.summary());
  const ErrorReport e04 = compare(o_f, to_double(o32.download()), {c.bound + kTolFp32Forward.atol, 0});
  CHECK_MESSAGE(e04.ok(), e04.summary("O vs 04 block-sparse"));
  const ErrorReport l04 = compare(lse_f, to_double(lse32.download()), wsq::kTolLse);
  CHECK_MESSAGE(l04.ok(), l04.summary("LSE vs 04 block-sparse"));
}

void check_both(const Problem& p, const BlockMask& mask) {
  check<half_t>(Dtype::fp16, p, mask);
  check<bfloat16_t>(Dtype::bf16, p, mask);
}

}  // namespace

TEST_CASE("05 block-sparse vs fp64 and 04: edge lengths, causal on/off, d = 64 and 128, three generators") {
  for (int d : {64, 128})
    for (auto [nq, nk] : edge_lengths())
      for (bool causal : {false, true}) {
        const Problem p = make(1, 2, 1, nq, nk, d, causal);
        check_both(p, local_block_mask(p, 100));
        check_both(p, strided_block_mask(p, 3));
        check_both(p, random_block_mask(p, 0.3, 21));
      }
}

TEST_CASE("05 block-sparse: GQA 8/2, tile multiples, the dense and causal-equivalent masks") {
  const Problem g = make(2, 8, 2, 203, 331, 64, true);
  check_both(g, random_block_mask(g, 0.5, 8));
  const Problem t = make(1, 4, 4, 1024, 1024, 128, false);
  check_both(t, local_block_mask(t, 256));
  for (bool causal : {false, true}) {
    const Problem p = make(1, 2, 2, 203, 113, 64, causal);
    check_both(p, dense_block_mask(p));
    if (causal) check_both(p, causal_block_mask(p));
  }
}

TEST_CASE("05 block-sparse: a fully masked row block (O = 0, LSE = -inf) and an empty mask") {
  const Problem p = make(1, 2, 1, 400, 300, 64, false);
  BlockMask m = dense_block_mask(p);
  for (int c = 0; c < m.Tc; ++c) m.bits[size_t(1) * m.Tc + c] = 0;
  for (int r = 0; r < m.Tr; ++r) m.bits[size_t(r) * m.Tc + 2] = 0;
  check_both(p, m);
  std::fill(m.bits.begin(), m.bits.end(), 0);
  check_both(p, m);
}
