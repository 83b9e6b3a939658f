// Steps 9 and 10 themselves, run on the CPU through tests/emu/emu_sm90.hpp (every GPU thread a cooperative context; the
// producer and the consumers meet at emulated mbarriers; TMA and wgmma computed from the PTX ISA's rules): both
// dtypes, head_dim 64 and 128, ragged lengths (q_len != kv_len, tails of tiles), causal with rows that see no key,
// GQA, large logits, outputs NaN-poisoned, judged by the rule of the GPU tests (check.hpp). No H100 needed; it says
// nothing about speed or about what the real asynchronous hardware could reorder (the GPU tests and the sanitizer
// runs do).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "random.hpp"

#include "tests/emu/emu_schedule.hpp"

#include "forward/check.hpp"
#include "forward/steps.hpp"

using namespace fa;

namespace {

Problem make(int B, int H, int Hkv, int nq, int nk, int d, bool causal) {
  Problem p;
  p.batch = B, p.heads = H, p.kv_heads = Hkv, p.q_len = nq, p.kv_len = nk, p.head_dim = d, p.causal = causal;
  p.seed = 9 + nq + 5 * nk + d;
  return p;
}

template <class T>
using Fn = void (*)(const Problem&, const T*, const T*, const T*, T*, float*);

template <class T>
void check_hopper_steps(Dtype t, const Problem& p, double qk_stddev) {
  const std::vector<float> qf = rounded(t, random_normal<float>(p.q_elems(), p.seed * 4 + 1, 0.0, qk_stddev)),
                           kf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 2, 0.0, qk_stddev)),
                           vf = rounded(t, random_normal<float>(p.kv_elems(), p.seed * 4 + 3));
  const std::vector<T> q = to_dtype<T>(qf), k = to_dtype<T>(kf), v = to_dtype<T>(vf);
  const wsq::LowpReference ref = wsq::lowp_reference(t, p, qf, kf, vf, 1e30);
  const std::pair<const char*, Fn<T>> steps[] = {{"v9_wgmma_tma", wsq::forward_v9_wgmma_tma<T>},
                                                 {"v10_pingpong", wsq::forward_v10_pingpong<T>}};
  for (const emu9::Schedule schedule : {emu9::Schedule::round_robin, emu9::Schedule::lowest_first})
  for (const auto& [name, fn] : steps) {
    emu9::schedule = schedule;  // emu_schedule.hpp: a missing wait shows in one order of the threads or the other
    INFO("step ", std::string(name), ", ", std::string(emu9::schedule_name(schedule)), " schedule, ", std::string(dtype_name(t)), ", ", p.batch, "x", p.heads, "/", p.kv_heads, " ", p.q_len, "x",
         p.kv_len, " d=", p.head_dim, " causal=", p.causal, " Q/K stddev ", qk_stddev);
    std::vector<T> o(p.q_elems());
    std::vector<float> lse(p.lse_elems());
    std::memset(o.data(), 0xFF, o.size() * sizeof(T));  // NaN poison, as on the GPU
    std::memset(lse.data(), 0xFF, lse.size() * sizeof(float));
    fn(p, q.data(), k.data(), v.data(), o.data(), lse.data());
    std::vector<float> o_f(o.size());
    for (size_t x = 0; x < o.size(); ++x) o_f[x] = to_float(o[x]);
    const wsq::LowpCheck c = wsq::check_lowp_forward(p, ref, o_f, lse);
    CHECK_MESSAGE(c.ok(), c.summary());
  }
}

void check_both(const Problem& p, double qk_stddev = 1.0) {
  check_hopper_steps<half_t>(Dtype::fp16, p, qk_stddev);
  check_hopper_steps<bfloat16_t>(Dtype::bf16, p, qk_stddev);
}

}  // namespace

TEST_CASE("emulated Hopper steps: ragged lengths, several K/V tiles (buffer reuse), causal on/off, d = 64 and 128") {
  for (bool causal : {false, true}) {
    check_both(make(1, 1, 1, 1, 1, 64, causal));
    check_both(make(1, 2, 1, 97, 300, 64, causal));    // 3 K/V tiles: both buffers, one reused
    check_both(make(1, 1, 1, 300, 203, 128, causal));  // 3 Q blocks; causal: rows that see no key
  }
}

TEST_CASE("emulated Hopper steps: GQA, large logits, a long row of tiles (5 phases of each barrier)") {
  check_both(make(1, 4, 2, 65, 129, 64, true));
  check_both(make(1, 1, 1, 130, 257, 128, false), 8.0);
  check_both(make(1, 1, 1, 20, 600, 64, false));  // 5 K/V tiles: the producer waits on "empty" phases 0, 1
}

TEST_CASE("emulated Hopper steps: a negative and a tiny scale, with masked keys (causal, ragged tails), batch > 1") {
  // Masked scores are -inf; a scale applied after the mask would make them +inf with a negative scale (every row
  // that crosses the mask NaN). A tiny scale makes every row's softmax nearly uniform.
  for (float scale : {-0.125f, -1.0f, 1e-6f}) {
    INFO("scale ", scale);
    for (bool causal : {false, true}) {
      Problem p = make(2, 2, 1, 97, 203, 64, causal);  // 203 keys: a tail tile of 75
      p.scale = scale;
      check_both(p);
    }
    Problem p = make(1, 1, 1, 130, 100, 128, true);  // causal with q_len > kv_len: rows that see no key
    p.scale = scale;
    check_both(p);
  }
}

TEST_CASE("emulated Hopper steps: causal edges of the tiles (kv_len - q_len = Bc - 2), a whole Q block with no key") {
  // Bc = 128: kv_len - q_len = 126 puts the diagonal two keys before the end of every K/V tile; q_len - kv_len = 200
  // leaves the first Q block of 128 rows without a key (its consumers must still write O = 0, LSE = -inf).
  check_both(make(2, 2, 1, 100, 226, 64, true));
  check_both(make(1, 1, 1, 300, 100, 128, true));
}
