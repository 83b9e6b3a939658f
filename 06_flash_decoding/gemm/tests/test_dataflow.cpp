// dataflow.hpp on the CPU: the parser (the committed table, malformed tables refused with the file and line named),
// the lookup order (this GPU's exact shape, its * row, then "default", then the built-in guess) and the choices.
#include <doctest/doctest.h>

#include <string>

#include "dataflow.hpp"

using namespace fdec::gemm;

namespace {
const std::string kHead = "# a comment\n\ngpu\top\tn\tk\tcuda_core_max\tflat_max\n";
const std::string kGpu = "NVIDIA Test GPU";

Table table() {
  return parse_table(kHead + "default\tgemm\t*\t*\t2\t32\n" + kGpu + "\tgemm\t*\t*\t3\t48\n" + kGpu +
                         "\tgemm\t4096\t4096\t1\t16\n" + kGpu + "\tgemm\t11008\t*\t6\t6\n" + kGpu +
                         "\tattention\t*\t*\t8\t-\ndefault\tattention\t*\t*\t1\t-\n",
                     "t.tsv");
}
// The message of the UsageError that parsing `body` throws ("" if none).
std::string error_of(const std::string& body, const std::string& file = "bad.tsv") {
  try {
    parse_table(body, file);
  } catch (const fa::UsageError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("06 dataflow: the choice on a given table") {
  const Table t = table();
  // this GPU, the exact shape
  CHECK(choose_gemm(t, kGpu, 1, 4096, 4096) == Path::gemv);
  CHECK(choose_gemm(t, kGpu, 2, 4096, 4096) == Path::flat);
  CHECK(choose_gemm(t, kGpu, 16, 4096, 4096) == Path::flat);
  CHECK(choose_gemm(t, kGpu, 17, 4096, 4096) == Path::tile);
  // this GPU, n exact and k any; flat never wins there (flat_max = cuda_core_max)
  CHECK(choose_gemm(t, kGpu, 6, 11008, 4096) == Path::gemv);
  CHECK(choose_gemm(t, kGpu, 7, 11008, 4096) == Path::tile);
  // this GPU, another shape: its * row
  CHECK(choose_gemm(t, kGpu, 3, 12288, 4096) == Path::gemv);
  CHECK(choose_gemm(t, kGpu, 48, 12288, 4096) == Path::flat);
  CHECK(choose_gemm(t, kGpu, 49, 12288, 4096) == Path::tile);
  // another GPU: the default rows
  CHECK(choose_gemm(t, "Other", 2, 4096, 4096) == Path::gemv);
  CHECK(choose_gemm(t, "Other", 3, 4096, 4096) == Path::flat);
  CHECK(choose_gemm(t, "Other", 33, 4096, 4096) == Path::tile);
  CHECK(choose_attention(t, kGpu, 8) == AttentionPath::cuda_cores);
  CHECK(choose_attention(t, kGpu, 9) == AttentionPath::tensor_cores);
  CHECK(choose_attention(t, "Other", 2) == AttentionPath::tensor_cores);
  // no row at all: the built-in guess
  const Table empty = parse_table(kHead, "empty.tsv");
  CHECK(choose_gemm(empty, kGpu, kBuiltinCudaCoreMax, 64, 64) == Path::gemv);
  CHECK(choose_gemm(empty, kGpu, kBuiltinFlatMax, 64, 64) == Path::flat);
  CHECK(choose_gemm(empty, kGpu, kBuiltinFlatMax + 1, 64, 64) == Path::tile);
  CHECK(choose_attention(empty, kGpu, kBuiltinAttentionMax + 1) == AttentionPath::tensor_cores);
}

TEST_CASE("06 dataflow: format_rows writes what parse_table reads") {
  const Table t = table();
  const Table again = parse_table(format_rows(t.rows), "again.tsv");
  REQUIRE(again.rows.size() == t.rows.size());
  for (size_t i = 0; i < t.rows.size(); ++i) {
    CHECK(again.rows[i].gpu == t.rows[i].gpu);
    CHECK(again.rows[i].n == t.rows[i].n);
    CHECK(again.rows[i].k == t.rows[i].k);
    CHECK(again.rows[i].cuda_core_max == t.rows[i].cuda_core_max);
    CHECK(again.rows[i].flat_max == t.rows[i].flat_max);
  }
}

TEST_CASE("06 dataflow: the committed dataflow.tsv parses and has a default gemm and attention row") {
  const Table t = read_table(std::string(FDEC_GEMM_DIR) + "/dataflow.tsv");
  const Row* g = find_row(t, "no such gpu", Op::gemm, 4096, 4096);
  const Row* a = find_row(t, "no such gpu", Op::attention, kAny, kAny);
  REQUIRE(g);
  REQUIRE(a);
  CHECK(g->gpu == "default");
  CHECK(a->gpu == "default");
}

TEST_CASE("06 dataflow: malformed tables are refused, naming the file and the line") {
  const std::string row_ok = "default\tgemm\t*\t*\t2\t32\n";
  struct Bad {
    std::string body, says;
  };
  const Bad bad[] = {
      {"", "bad.tsv: no header"},
      {"# only a comment\n", "bad.tsv: no header"},
      {"gpu op n k cuda_core_max flat_max\n" + row_ok, "bad.tsv:1: the header"},  // spaces, not tabs
      {kHead + "default\tgemm\t*\t*\t2\n", "bad.tsv:4: 5 tab-separated fields"},
      {kHead + "default\tgemm\t*\t*\t2\t32\textra\n", "bad.tsv:4: 7 tab-separated fields"},
      {kHead + "default\tconv\t*\t*\t2\t32\n", "bad.tsv:4: op 'conv'"},
      {kHead + "default\tgemm\t0\t*\t2\t32\n", "bad.tsv:4: n '0'"},
      {kHead + "default\tgemm\t*\tabc\t2\t32\n", "bad.tsv:4: k 'abc'"},
      {kHead + "default\tgemm\t*\t*\t-1\t32\n", "bad.tsv:4: cuda_core_max '-1'"},
      {kHead + "default\tgemm\t*\t*\t2\t3x\n", "bad.tsv:4: flat_max '3x'"},
      {kHead + "default\tgemm\t*\t*\t8\t4\n", "bad.tsv:4: flat_max 4 is below"},
      {kHead + "default\tattention\t4096\t*\t2\t-\n", "bad.tsv:4: an attention row"},
      {kHead + "default\tattention\t*\t*\t2\t16\n", "bad.tsv:4: an attention row"},
      {kHead + "\tgemm\t*\t*\t2\t32\n", "bad.tsv:4: empty gpu"},
      {kHead + row_ok + row_ok, "bad.tsv:5: a second row"},
      {kHead + "default\tgemm\t*\t*\t99999999999\t99999999999\n", "bad.tsv:4: cuda_core_max"},
  };
  for (const Bad& b : bad) {
    INFO("table: ", b.body);
    const std::string e = error_of(b.body);
    CHECK(e.find(b.says) == 0);
  }
  CHECK(error_of(kHead + row_ok) == "");
  CHECK(error_of(kHead + "x\r\n", "crlf.tsv").find("crlf.tsv:4:") == 0);  // a CRLF file: the line still named
  CHECK_THROWS_AS(read_table("/nonexistent/dataflow.tsv"), fa::UsageError);
}

TEST_CASE("06 dataflow: the inflection points of a sweep") {
  // gemv fastest up to M = 2, flat up to 32, tile from 64
  const std::vector<SweepPoint> sweep = {{1, 1.0, 1.5, 4.0}, {2, 1.0, 1.2, 4.0},  {4, 1.3, 1.2, 4.0},
                                         {8, 2.0, 1.2, 4.0}, {32, 6.0, 1.9, 2.0}, {64, 9.0, 3.0, 2.5}};
  const Row r = inflection_row("G", 4096, 4096, sweep);
  CHECK(r.cuda_core_max == 2);
  CHECK(r.flat_max == 32);
  // gemv never fastest, tile from the start
  const Row r2 = inflection_row("G", 1, 1, {{1, 2.0, 1.0, 0.5}});
  CHECK(r2.cuda_core_max == 0);
  CHECK(r2.flat_max == 0);
}

TEST_CASE("06 dataflow: the attention kernel for a path and a row count, and the attention sweep's row") {
  CHECK(std::string(attention_kernel(AttentionPath::cuda_cores, 4)) == "split_kv_fused");
  CHECK(std::string(attention_kernel(AttentionPath::tensor_cores, 1)) == "flat_gemm");
  CHECK(std::string(attention_kernel(AttentionPath::tensor_cores, 8)) == "flat_gemm");
  CHECK(std::string(attention_kernel(AttentionPath::tensor_cores, 9)) == "split_kv_mma");
  // CUDA cores at least as fast up to 2 rows, then slower
  const Row r = attention_row("G", {{1, 1.0, 1.1}, {2, 1.0, 1.0}, {4, 1.2, 1.0}, {8, 1.0, 2.0}});
  CHECK(r.op == Op::attention);
  CHECK(r.cuda_core_max == 2);
  CHECK(attention_row("G", {{1, 2.0, 1.0}}).cuda_core_max == 0);
  // the row as the table writes and reads it
  const Table t = parse_table(format_rows({r}), "sweep.tsv");
  CHECK(choose_attention(t, "G", 2) == AttentionPath::cuda_cores);
  CHECK(choose_attention(t, "G", 3) == AttentionPath::tensor_cores);
}
