// What every chapter program does around its kernels: parse the one CLI, say what it will run,
// load or make the inputs, check a sample of the result against the fp64 reference, write .npy
// outputs, print and append result rows. Host code only; the device check lives in program.cuh.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "cli.hpp"
#include "metrics.hpp"
#include "problem.hpp"
#include "results.hpp"

namespace fa {

struct HostTensors {  // fp32 host copies in the layout of problem.hpp
  std::vector<float> q, k, v, dout;
};

// Deterministic random inputs for `p` (seeded by p.seed; dout only when backward).
HostTensors random_inputs(const Problem& p, bool backward);

// Random inputs, or the .npy files in opts.in_dir: then the shape comes from the files (and a
// shape flag that contradicts them is a UsageError) and opts.problem is updated.
HostTensors load_inputs(Options& opts, bool backward);

// o.npy [B, H, Nq, d] and lse.npy [B, H, Nq]; dq/dk/dv.npy in their tensors' shapes.
void write_forward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& o,
                           const std::vector<float>& lse);
void write_backward_outputs(const std::string& dir, const Problem& p, const std::vector<float>& dq,
                            const std::vector<float>& dk, const std::vector<float>& dv);

// Forward check against the fp64 reference: every row when the reference is cheap, otherwise
// sampled rows (first, middle, last) of the first and last head. o and lse are the whole outputs.
ErrorReport check_forward(const Problem& p, const HostTensors& in, const std::vector<float>& o,
                          const std::vector<float>& lse, Tolerance tol, std::string* what_checked);
// Backward check of dQ, dK, dV of the first and last kv group; where that would take the fp64
// reference too long, of dQ on the sampled rows of check_forward alone (what_checked says which).
ErrorReport check_backward(const Problem& p, const HostTensors& in, const std::vector<float>& dq,
                           const std::vector<float>& dk, const std::vector<float>& dv, Tolerance tol,
                           std::string* what_checked);

std::string describe(const Problem& p);  // "B=1 H=8 Hkv=8 Nq=1024 Nk=1024 d=64 causal=0 ..."

// Prints the rows as a table and appends them to opts.csv if given.
void report_rows(const Options& opts, const std::vector<ResultRow>& rows);

}  // namespace fa
