#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "formulas.hpp"
#include "results.hpp"

using namespace fa;

TEST_CASE("formulas: FLOPs and minimal bytes") {
  Problem p;
  p.batch = 2, p.heads = 4, p.kv_heads = 2, p.q_len = 100, p.kv_len = 300, p.head_dim = 64;
  CHECK(flops_forward(p) == 4.0 * 2 * 4 * 100 * 300 * 64);
  CHECK(flops_backward(p) == 2.5 * flops_forward(p));
  p.causal = true;  // bottom-right: row i sees i + 201 keys
  CHECK(visible_pairs(p) == 100 * 201 + 100 * 99 / 2);
  p.q_len = p.kv_len = 1000;
  CHECK(visible_pairs(p) == 1000.0 * 1001 / 2);  // about half of N^2
  CHECK(hbm_bytes_min_forward(p) == 4.0 * (2 * p.q_elems() + 2 * p.kv_elems()) + 4.0 * p.lse_elems());
  // Standard attention, B H = 8, Nq = Nk = 1000, d = 64, H = 2 Hkv: S, P written and read (4 N^2 per head,
  // 5 with P~); backward 7 N^2 per head plus dO twice, Q, dQ and K, V, dK, dV once.
  const double nn = 8.0 * 1000 * 1000, qd = 8.0 * 1000 * 64, kvd = 4.0 * 1000 * 64, rows = 8.0 * 1000;
  CHECK(hbm_bytes_naive_forward(p) == 4 * (4 * nn + 2 * qd + 2 * kvd + rows));
  p.dropout_p = 0.1f;
  CHECK(hbm_bytes_naive_forward(p) == 4 * (5 * nn + 2 * qd + 2 * kvd + rows));
  CHECK(hbm_bytes_naive_backward(p) == 4 * (7 * nn + 4 * qd + 4 * kvd));
  CHECK(tflops(2e12, 1000.0) == doctest::Approx(2.0));
  CHECK(gbps(3e9, 1.0) == doctest::Approx(3000.0));
}

TEST_CASE("result rows: one header, one line per row") {
  ResultRow r;
  r.gpu = "NVIDIA H100 80GB HBM3", r.chapter = "00", r.kernel = "naive";
  r.problem.q_len = r.problem.kv_len = 1024;
  r.ms = 1.5;
  const std::string h = csv_header(), l = csv_line(r);
  CHECK(std::count(h.begin(), h.end(), ',') == std::count(l.begin(), l.end(), ','));
  CHECK(l.rfind("\"NVIDIA H100 80GB HBM3\",00,naive,fwd,fp32,1,1,1,1024,1024,64,0,0,1.5,", 0) == 0);
  CHECK(json_line(r).find("\"Nq\": 1024") != std::string::npos);
  CHECK(json_line(r).find("\"max_abs_err\": -1}") != std::string::npos);
  r.max_abs_err = std::nan("");  // a failed check: JSON has no NaN
  CHECK(json_line(r).find("\"max_abs_err\": null}") != std::string::npos);
  CHECK(human_bytes(1536) == "1.5 KiB");
}

TEST_CASE("result rows: --csv appends CSV with one header, or JSON Lines for .jsonl") {
  ResultRow r;
  r.chapter = "00", r.kernel = "naive";
  auto read_lines = [](const std::string& path) {
    std::ifstream f(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(f, l);) lines.push_back(l);
    return lines;
  };
  const std::string dir = std::filesystem::temp_directory_path().string();
  const std::string csv = dir + "/fa_rows_test.csv", jsonl = dir + "/fa_rows_test.jsonl";
  std::remove(csv.c_str()), std::remove(jsonl.c_str());
  append_rows(csv, {r});
  append_rows(csv, {r, r});  // the header is written once
  const auto c = read_lines(csv);
  REQUIRE(c.size() == 4);
  CHECK(c[0] == csv_header());
  CHECK(c[3] == csv_line(r));
  CHECK(!std::filesystem::exists(csv + ".tmp"));  // written through a temporary file, renamed at the end
  append_rows(jsonl, {r, r});
  const auto j = read_lines(jsonl);
  REQUIRE(j.size() == 2);
  CHECK(j[0] == json_line(r));
  std::remove(csv.c_str()), std::remove(jsonl.c_str());
}
