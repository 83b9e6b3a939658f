// Result rows: one CSV header for the whole project, so the tour, the plots and docs/ read the
// rows of every chapter the same way.
#pragma once
#include <string>
#include <vector>

#include "bytes.hpp"
#include "problem.hpp"

namespace fa {

// Built by name, field by field (program.cuh's result_row fills the first ones, time_kernel the
// timing ones): a row says which kernel ran on which problem, how fast, and how far from fp64.
struct ResultRow {
  std::string gpu, chapter, kernel, pass = "fwd", dtype = "fp32";
  Problem problem;
  double ms = 0, tflops = 0, gbps = 0;
  double model_hbm_bytes = 0;  // what the chapter's IO formula predicts
  double extra_bytes = 0;      // device memory beyond inputs and outputs (S and P for 00)
  double max_abs_err = -1;     // vs the fp64 reference; -1 = not checked
};

std::string csv_header();
std::string csv_line(const ResultRow& r);
// One JSON object per row, the CSV's fields under the same names; a non-finite number is null.
std::string json_line(const ResultRow& r);
// Appends rows to `path`: JSON Lines (one json_line each) if it ends in ".jsonl", else CSV, writing the
// header first if the file is new or empty. The file is replaced whole (temporary file + rename).
void append_rows(const std::string& path, const std::vector<ResultRow>& rows);
// A fixed-width table for the terminal.
std::string format_table(const std::vector<ResultRow>& rows);

}  // namespace fa
