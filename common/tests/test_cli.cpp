#include <doctest/doctest.h>

#include <cmath>

#include "cli.hpp"

using namespace fa;

namespace {
Options parse(std::vector<const char*> args, bool* extra = nullptr) {
  Options d;
  d.problem.q_len = 128;
  Cli cli("prog", "test", d);
  bool dummy = false;
  cli.add_flag("--backward", extra ? extra : &dummy, "also run the backward pass");
  args.insert(args.begin(), "prog");
  return cli.parse(int(args.size()), args.data());
}
}  // namespace

TEST_CASE("cli: defaults follow the conventions") {
  Options o = parse({"--heads", "8", "--q-len", "300"});
  CHECK(o.problem.heads == 8);
  CHECK(o.problem.kv_heads == 8);  // kv-heads = heads
  CHECK(o.problem.kv_len == 300);  // kv-len = q-len
  CHECK(o.problem.softmax_scale() == doctest::Approx(1 / std::sqrt(64.0)));
  o = parse({"--kv-len=77", "--causal", "--scale", "0.5", "--dropout", "0.1", "--seed", "9"});
  CHECK(o.problem.kv_len == 77);
  CHECK(o.problem.causal);
  CHECK(o.problem.softmax_scale() == 0.5f);
  CHECK(o.problem.dropout_p == doctest::Approx(0.1));
  CHECK(o.problem.seed == 9);
  bool backward = false;
  parse({"--backward"}, &backward);
  CHECK(backward);
}

TEST_CASE("cli: bad usage is a UsageError that names the problem") {
  CHECK_THROWS_WITH_AS(parse({"--nope"}), "unknown option '--nope' (see --help)", UsageError);
  CHECK_THROWS_WITH_AS(parse({"--q-len", "abc"}), "bad value 'abc' for --q-len: expected an integer", UsageError);
  CHECK_THROWS_WITH_AS(parse({"--q-len"}), "--q-len needs a value (see --help)", UsageError);
  CHECK_THROWS_WITH_AS(parse({"--causal=1"}), "--causal takes no value", UsageError);
  CHECK_THROWS_AS(parse({"--q-len", "0"}), UsageError);
  CHECK_THROWS_AS(parse({"--dropout", "1"}), UsageError);
  CHECK_THROWS_AS(parse({"--heads", "6", "--kv-heads", "4"}), UsageError);
  CHECK_THROWS_AS(parse({"--scale", "0"}), UsageError);
  CHECK_THROWS_AS(parse({"--seed", "-1"}), UsageError);
  // The minimum a message names is the one that is accepted: every dimension of a shape is at least 1.
  for (const char* flag : {"--batch", "--heads", "--q-len", "--head-dim"}) {
    CHECK_THROWS_WITH_AS(parse({flag, "-1"}), (std::string("bad value '-1' for ") + flag + ": must be >= 1").c_str(),
                         UsageError);
    CHECK_THROWS_AS(parse({flag, "0"}), UsageError);
  }
}

TEST_CASE("cli: --help lists every shared flag") {
  Options d;
  Cli cli("prog", "test", d);
  const std::string u = cli.usage();
  for (const char* f : {"--batch", "--heads", "--kv-heads", "--q-len", "--kv-len", "--head-dim", "--causal", "--scale",
                        "--dropout", "--seed", "--iters", "--warmup", "--csv", "--in", "--out", "--help"})
    CHECK(u.find(f) != std::string::npos);
  const char* argv[] = {"prog", "--help"};
  CHECK(cli.parse(2, argv).help);
}

TEST_CASE("cli: -h, fp32 range of floats, minimums of int options, [auto] in the help") {
  const char* h[] = {"prog", "-h"};
  Options d;
  d.problem.q_len = 128;
  {
    Cli cli("prog", "test", d);
    CHECK(cli.parse(2, h).help);
  }
  CHECK_THROWS_WITH_AS(parse({"--scale", "1e-50"}),
                       "bad value '1e-50' for --scale: too small for fp32 (smallest normal 1.2e-38); it would round to 0",
                       UsageError);
  CHECK_THROWS_AS(parse({"--scale", "1e50"}), UsageError);
  CHECK_THROWS_AS(parse({"--scale", "nan"}), UsageError);
  CHECK(parse({"--scale", "1e-30"}).problem.scale == doctest::Approx(1e-30));
  CHECK_THROWS_AS(parse({"--in", ""}), UsageError);

  int sram = 0, rows = 0;
  Cli cli("prog", "test", d);
  cli.add_option("--sram-kb", &sram, "on-chip memory (auto = the device's)", 0, true);
  cli.add_option("--rows", &rows, "rows", 1);
  cli.extend_help("--head-dim", "this chapter: 16, 32");
  const std::string u = cli.usage();
  CHECK(u.find("--sram-kb N     on-chip memory (auto = the device's) [auto]") != std::string::npos);
  CHECK(u.find("--kv-heads N    key/value heads Hkv (divides H; auto = H) [auto]") != std::string::npos);
  CHECK(u.find("--scale X       softmax scale (auto = 1/sqrt(d)) [auto]") != std::string::npos);
  CHECK(u.find("head dimension d; this chapter: 16, 32 [64]") != std::string::npos);
  const char* neg[] = {"prog", "--sram-kb", "-3"};
  CHECK_THROWS_WITH_AS(cli.parse(3, neg), "bad value '-3' for --sram-kb: must be >= 0 (0 = auto)", UsageError);
  const char* zero[] = {"prog", "--rows", "0"};
  CHECK_THROWS_WITH_AS(cli.parse(3, zero), "bad value '0' for --rows: must be >= 1", UsageError);
}
