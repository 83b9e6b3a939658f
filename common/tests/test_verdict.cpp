// The error rule behind every program's verdict (testing.hpp, program.hpp's check_forward and check_backward),
// on the CPU: a correct fp32 attention passes on ill-conditioned inputs (wide logits, outliers) where a fixed
// tolerance calls it broken, and broken ones (no running max, a wrong element, a lost key) fail there too.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "inputs.hpp"
#include "program.hpp"
#include "reference.hpp"
#include "testing.hpp"

using namespace fa;

namespace {

Problem problem(int d, bool causal) {
  Problem p;
  p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 97, p.kv_len = 113, p.head_dim = d, p.causal = causal;
  p.validate();
  return p;
}

// One fp32 attention "kernel": the online softmax in fp32 (chapter 01's recurrence, keys in order), the kind of
// summation order a tiled kernel uses, different from the plain attention's. skip_max: exp(S) without the running
// max (the bug the rule must catch); lose_key: key 0 left out of every row.
void online_fp32(const Problem& p, const HostTensors& in, std::vector<float>& o, std::vector<float>& lse,
                 bool skip_max = false, bool lose_key = false) {
  const int d = p.head_dim;
  o.assign(p.q_elems(), 0.f), lse.assign(p.lse_elems(), 0.f);
  const float scale = p.softmax_scale(), inf = std::numeric_limits<float>::infinity();
  for (int b = 0; b < p.batch; ++b)
    for (int h = 0; h < p.heads; ++h) {
      const float* Q = in.q.data() + p.q_offset(b, h);
      const float* K = in.k.data() + p.kv_offset(b, p.kv_head_of(h));
      const float* V = in.v.data() + p.kv_offset(b, p.kv_head_of(h));
      for (int i = 0; i < p.q_len; ++i) {
        float m = -inf, l = 0.f;
        std::vector<float> acc(d, 0.f);
        for (int j = lose_key ? 1 : 0; j < p.visible_keys(i); ++j) {
          float s = 0.f;
          for (int c = 0; c < d; ++c) s += Q[size_t(i) * d + c] * K[size_t(j) * d + c];
          s *= scale;
          const float m_new = skip_max ? 0.f : std::max(m, s);
          const float alpha = std::exp(m - m_new), e = std::exp(s - m_new);
          l = l * (skip_max ? 1.f : alpha) + e;
          for (int c = 0; c < d; ++c) acc[c] = acc[c] * (skip_max ? 1.f : alpha) + e * V[size_t(j) * d + c];
          m = m_new;
        }
        float* out = o.data() + p.q_offset(b, h) + size_t(i) * d;
        for (int c = 0; c < d; ++c) out[c] = l > 0.f ? acc[c] / l : 0.f;
        lse[p.lse_offset(b, h) + i] = l > 0.f ? m + std::log(l) : -inf;
      }
    }
}

ErrorReport check(const Problem& p, const HostTensors& in, const std::vector<float>& o, const std::vector<float>& lse) {
  std::string what;
  return check_forward(p, in, o, lse, kTolFp32Forward, &what);
}

}  // namespace

TEST_CASE("verdict: a correct fp32 attention passes on ill-conditioned inputs, where a fixed tolerance fails it") {
  for (bool causal : {false, true}) {
    INFO("causal = " << causal);
    const Problem p = problem(128, causal);
    const HostTensors in = wide_logit_inputs(p, false);
    std::vector<float> o, lse;
    online_fp32(p, in, o, lse);
    const ErrorReport e = check(p, in, o, lse);
    CHECK(e.ok());
    CHECK(e.plain_max_abs > 1e-5);  // the problem is ill-conditioned: a plain fp32 attention is off too
    // A fixed tolerance (the rule's floor alone) calls the same correct output broken.
    std::vector<double> ro, rl;
    reference_forward(p, in.q.data(), in.k.data(), in.v.data(), ro, rl);
    CHECK_FALSE(compare(o, ro, kTolFp32Forward).ok());
  }
}

TEST_CASE("verdict: outliers in q, k and v pass when right") {
  const Problem p = problem(64, true);
  const HostTensors in = outlier_inputs(p, false);
  std::vector<float> o, lse;
  online_fp32(p, in, o, lse);
  CHECK(check(p, in, o, lse).ok());
}

TEST_CASE("verdict: broken attentions fail on the same inputs") {
  for (int kind = 0; kind < 3; ++kind) {
    for (bool wide : {false, true}) {
      INFO("kind " << kind << std::string(wide ? ", wide logits" : ", large (exact) logits"));
      const Problem p = problem(64, false);
      const HostTensors in = wide ? wide_logit_inputs(p, false) : large_logit_inputs(p, false);
      std::vector<float> o, lse;
      online_fp32(p, in, o, lse, /*skip_max=*/kind == 0, /*lose_key=*/kind == 1);
      if (kind == 2) o[p.q_offset(1, 3) + 5 * size_t(p.head_dim) + 7] += 0.01f;  // one wrong element
      CHECK_FALSE(check(p, in, o, lse).ok());
    }
  }
}

TEST_CASE("verdict: the backward rule passes the plain fp32 backward itself and fails a perturbed gradient") {
  Problem p = problem(64, true);
  const HostTensors in = wide_logit_inputs(p, true);
  std::vector<float> dq(p.q_elems()), dk(p.kv_elems()), dv(p.kv_elems());
  for (int b = 0; b < p.batch; ++b)
    for (int hk = 0; hk < p.kv_heads; ++hk)
      plain_fp32_backward_group(p, b, hk, in.q.data(), in.k.data(), in.v.data(), in.dout.data(),
                                dq.data() + p.q_offset(b, hk * p.group()), dk.data() + p.kv_offset(b, hk),
                                dv.data() + p.kv_offset(b, hk));
  std::string what;
  const ErrorReport e = check_backward(p, in, dq, dk, dv, kTolFp32Backward, &what);
  CHECK(e.ok());
  CHECK(e.plain_max_abs >= 0);
  dk[p.kv_offset(1, 1) + 3] += 0.05f;
  CHECK_FALSE(check_backward(p, in, dq, dk, dv, kTolFp32Backward, &what).ok());
}
