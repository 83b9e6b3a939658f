// CPU tests (CI): the forward ladder's registry, and the checks every step makes before any GPU work.
#include <doctest/doctest.h>

#include <set>
#include <string>

#include "fa2.cuh"

TEST_CASE("04 ladder: four steps in order, unique names, each naming its idea") {
  const auto& steps = fa2::forward_steps();
  REQUIRE(steps.size() == 4);
  const char* names[] = {"v1_loop_swap", "v2_deferred_norm", "v3_q_grid", "v4_micro_tile"};
  std::set<std::string> seen;
  for (size_t s = 0; s < steps.size(); ++s) {
    CHECK(std::string(steps[s].name) == names[s]);  // the order is the lesson: each adds one idea
    CHECK(std::string(steps[s].idea).size() > 10);
    CHECK(bool(steps[s].launch));
    CHECK(std::string(steps[s].dtypes) == "fp32");  // CUDA cores, fp32: every GPU runs every step
    CHECK(steps[s].arch == fa::Arch::any);
    seen.insert(steps[s].name);
  }
  CHECK(seen.size() == steps.size());
}

TEST_CASE("04 ladder: every step refuses what the chapter does not support, before touching the GPU") {
  fa::Problem p;
  p.q_len = p.kv_len = 8;
  for (const auto& step : fa2::forward_steps()) {
    INFO(std::string(step.name));
    p.head_dim = 48;
    CHECK_THROWS_WITH_AS(step.launch(p, nullptr, nullptr, nullptr, nullptr, nullptr),
                         doctest::Contains("16, 32, 64 or 128"), fa::UsageError);
    p.head_dim = 64;
    p.dropout_p = 1.5f;
    CHECK_THROWS_AS(step.launch(p, nullptr, nullptr, nullptr, nullptr, nullptr), fa::UsageError);
    p.dropout_p = 0.f;
    p.batch = 70000;  // grid dimension z
    CHECK_THROWS_AS(step.launch(p, nullptr, nullptr, nullptr, nullptr, nullptr), fa::UsageError);
    p.batch = 1;
  }
}
