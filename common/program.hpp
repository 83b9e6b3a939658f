// The host side of every chapter program, one job per function, in the order main() calls them:
//   parse (cli.hpp) -> inputs (inputs.hpp) -> outputs writable? -> [GPU: program.cuh] -> check
//   against fp64 -> write .npy -> report rows -> verdict; and, in main's catch, the exit code.
#pragma once
#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "block_mask.hpp"
#include "cli.hpp"
#include "inputs.hpp"
#include "metrics.hpp"
#include "problem.hpp"
#include "results.hpp"

namespace fa {

// --out and --csv can be written (an existing folder we may write to, or one whose parent we may):
// checked before any work, so a long run never ends in "cannot write". UsageError otherwise.
void check_outputs_writable(const Options& opts);

// o.npy [B, H, Nq, d] and lse.npy [B, H, Nq]; dq/dk/dv.npy in their tensors' shapes. Each file is
// written under a temporary name and renamed, so a failed write leaves no truncated file.
void write_forward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& o,
                           const std::vector<float>& lse);
void write_backward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& dq,
                            const std::vector<float>& dk, const std::vector<float>& dv);

// Forward check against the fp64 reference: every row when the reference is cheap, otherwise
// sampled rows (first, middle, last) of the first and last head. o and lse are the whole outputs.
// The error rule of testing.hpp: an element passes when its error is at most twice the largest error of the plain
// fp32 attention on the same rows, plus a floor: `tol` for O, kTolLse for LSE. `mask`: a block-sparse run's mask
// (the reference applies it too).
ErrorReport check_forward(const Problem& p, const HostTensors& in, const std::vector<float>& o,
                          const std::vector<float>& lse, Tolerance tol, std::string* what_checked,
                          const BlockMask* mask = nullptr);
// The plain backward the rule measures a backward against, in the kernels' own dtype: dQ, dK, dV of kv group
// (b, hk) ([group, q_len, d] and [kv_len, d] each), and dQ of rows [i0, i1) of head (b, h) alone. Unset: the plain
// fp32 backward of reference.hpp (chapters 00-04); chapter 05 passes its plain fp16/bf16 one.
struct PlainBackward {
  std::function<void(int b, int hk, float* dq, float* dk, float* dv)> group;
  std::function<void(int b, int h, int i0, int i1, float* dq)> dq_rows;
};
// Backward check of dQ, dK, dV of the first and last kv group; where that would take the fp64
// reference too long, of dQ on the sampled rows of check_forward alone (what_checked says which). The same rule,
// against the plain backward of each gradient, with `tol` the floor.
ErrorReport check_backward(const Problem& p, const HostTensors& in, const std::vector<float>& dq,
                           const std::vector<float>& dk, const std::vector<float>& dv, Tolerance tol,
                           std::string* what_checked, const BlockMask* mask = nullptr,
                           const PlainBackward* plain = nullptr);

// Prints the rows as a table and appends them to opts.csv if given.
void report_rows(const Options& opts, const std::vector<ResultRow>& rows);
// "speedup: 02 fa1_forward is 3.10x 00 naive" (baseline time / this time), if both were timed.
void print_speedup(const ResultRow& row, const ResultRow& baseline);

// A ladder of kernels (a vector of steps, each with a `name`), for --kernel: "a, b, c" in ladder order, and
// the steps a --kernel value selects: "all" gives every step, a name that step, anything else a UsageError
// that lists the names.
template <class Step>
std::string step_names(const std::vector<Step>& steps) {
  std::string names;
  for (const Step& s : steps) names += std::string(names.empty() ? "" : ", ") + s.name;
  return names;
}
template <class Step>
std::vector<Step> select_steps(const std::vector<Step>& steps, const std::string& kernel,
                               const std::string& flag = "--kernel") {
  if (kernel == "all") return steps;
  std::vector<Step> chosen;  // "a,b": several steps, in the order given
  for (size_t start = 0; start <= kernel.size();) {
    const size_t end = std::min(kernel.find(',', start), kernel.size());
    const std::string name = kernel.substr(start, end - start);
    bool found = false;
    for (const Step& s : steps)
      if (s.name == name) chosen.push_back(s), found = true;
    if (!found)
      throw UsageError(flag + " " + name + ": no such step (one of " + step_names(steps) + ", a comma-separated list, or all)");
    start = end + 1;
  }
  return chosen;
}

// Prints PASSED or FAILED and returns main's exit code (0 or 1).
int verdict(bool ok);
// For main's catch (...): prints "error: ..." after flushing stdout (so a log reads in order) and
// returns 2 for a UsageError (bad usage, bad input) or 1 for anything else.
int exit_code_of_current_exception();

}  // namespace fa
