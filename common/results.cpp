#include "results.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

#include "replace_file.hpp"

namespace fa {
namespace {

std::string num(double x, const char* fmt = "%.6g") {
  char b[64];
  std::snprintf(b, sizeof b, fmt, x);
  return b;
}

// JSON has no nan or inf: a failed check's NaN error becomes null.
std::string json_num(double x, const char* fmt = "%.6g") { return std::isfinite(x) ? num(x, fmt) : "null"; }

}  // namespace

std::string csv_header() {
  return "gpu,chapter,kernel,pass,dtype,B,H,Hkv,Nq,Nk,d,causal,dropout,ms,tflops,gbps,"
         "model_hbm_bytes,extra_bytes,max_abs_err";
}

std::string csv_line(const ResultRow& r) {
  const Problem& p = r.problem;
  std::ostringstream s;
  s << '"' << r.gpu << "\"," << r.chapter << ',' << r.kernel << ',' << r.pass << ',' << r.dtype << ','
    << p.batch << ',' << p.heads << ',' << p.kv_heads << ',' << p.q_len << ',' << p.kv_len << ','
    << p.head_dim << ',' << int(p.causal) << ',' << p.dropout_p << ',' << num(r.ms) << ','
    << num(r.tflops) << ',' << num(r.gbps) << ',' << num(r.model_hbm_bytes, "%.0f") << ','
    << num(r.extra_bytes, "%.0f") << ',' << num(r.max_abs_err, "%.3g");
  return s.str();
}

std::string json_line(const ResultRow& r) {
  const Problem& p = r.problem;
  std::ostringstream s;
  s << "{\"gpu\": \"" << r.gpu << "\", \"chapter\": \"" << r.chapter << "\", \"kernel\": \"" << r.kernel
    << "\", \"pass\": \"" << r.pass << "\", \"dtype\": \"" << r.dtype << "\", \"B\": " << p.batch
    << ", \"H\": " << p.heads << ", \"Hkv\": " << p.kv_heads << ", \"Nq\": " << p.q_len
    << ", \"Nk\": " << p.kv_len << ", \"d\": " << p.head_dim << ", \"causal\": " << int(p.causal)
    << ", \"dropout\": " << p.dropout_p << ", \"ms\": " << json_num(r.ms)
    << ", \"tflops\": " << json_num(r.tflops) << ", \"gbps\": " << json_num(r.gbps)
    << ", \"model_hbm_bytes\": " << json_num(r.model_hbm_bytes, "%.0f")
    << ", \"extra_bytes\": " << json_num(r.extra_bytes, "%.0f")
    << ", \"max_abs_err\": " << json_num(r.max_abs_err, "%.3g") << "}";
  return s.str();
}

void append_rows(const std::string& path, const std::vector<ResultRow>& rows) {
  const bool jsonl = path.size() >= 6 && path.compare(path.size() - 6, 6, ".jsonl") == 0;
  std::string old;
  {
    std::ifstream in(path, std::ios::binary);
    if (in) old.assign(std::istreambuf_iterator<char>(in), {});
  }
  // The old rows and the new ones replace the file whole: a failed write leaves the old file as it was.
  replace_file(path, [&](std::ofstream& f) {
    f << old;
    if (!old.empty() && old.back() != '\n') f << "\n";
    if (old.empty() && !jsonl) f << csv_header() << "\n";
    for (const auto& r : rows) f << (jsonl ? json_line(r) : csv_line(r)) << "\n";
  });
}

std::string format_table(const std::vector<ResultRow>& rows) {
  std::ostringstream s;
  char line[320];
  std::snprintf(line, sizeof line, "%-8s %-22s %-4s %-5s %-22s %10s %9s %9s %11s %11s %10s\n", "chapter",
                "kernel", "pass", "dtype", "B,H,Hkv,Nq,Nk,d,c,p", "ms", "TFLOP/s", "GB/s", "model HBM",
                "extra mem", "max err");
  s << line;
  for (const auto& r : rows) {
    const Problem& p = r.problem;
    const std::string shape = std::to_string(p.batch) + "," + std::to_string(p.heads) + "," +
                              std::to_string(p.kv_heads) + "," + std::to_string(p.q_len) + "," +
                              std::to_string(p.kv_len) + "," + std::to_string(p.head_dim) + "," +
                              (p.causal ? "c" : "-") + "," + num(p.dropout_p, "%g");
    std::snprintf(line, sizeof line, "%-8s %-22s %-4s %-5s %-22s %10.4f %9.2f %9.1f %11s %11s %10s\n",
                  r.chapter.c_str(), r.kernel.c_str(), r.pass.c_str(), r.dtype.c_str(), shape.c_str(), r.ms,
                  r.tflops, r.gbps, human_bytes(r.model_hbm_bytes).c_str(), human_bytes(r.extra_bytes).c_str(),
                  r.max_abs_err < 0 ? "-" : num(r.max_abs_err, "%.2e").c_str());
    s << line;
  }
  return s.str();
}

}  // namespace fa
