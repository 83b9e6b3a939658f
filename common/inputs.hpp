// A program's inputs: the problem's shape (from the flags or from the .npy headers of --in), then
// the tensors themselves (seeded random, or the files). Everything here runs before a GPU is looked
// for, so every input problem is a UsageError (exit 2) on any machine, with or without a GPU.
#pragma once
#include <string>
#include <vector>

#include "cli.hpp"
#include "problem.hpp"

namespace fa {

struct HostTensors {  // fp32 host copies in the layout of problem.hpp
  std::vector<float> q, k, v, dout;
};

// Deterministic random inputs for `p` (seeded by p.seed; dout only when backward): q, k, v from
// N(0.5, 1), dout from N(0, 1).
HostTensors random_inputs(const Problem& p, bool backward);
// The same with large logits: q and k are whole numbers drawn uniformly from [-32, 32], so
// scale * q.k reaches the hundreds (about 340 one standard deviation at d = 64), far past exp()'s
// fp32 limit of ~88: a softmax that forgets the running maximum gives inf/NaN. The products and
// their sums are exact in fp32 (|sum| < 2^24) and 1/sqrt(d) is a power of two for d = 16, 64, 256,
// so S itself carries no rounding and the stated fp32 tolerances still apply.
HostTensors large_logit_inputs(const Problem& p, bool backward);
// Ill-conditioned inputs as real activations can be: q and k from N(0, 40^2), so the logits reach the hundreds
// and, unlike large_logit_inputs, S is not exact in fp32: even a plain fp32 attention is off by ~3e-4 (the
// error rule of testing.hpp is what lets a correct kernel pass here).
HostTensors wide_logit_inputs(const Problem& p, bool backward);
// N(0.5, 1) inputs with a few huge entries: one element in 1000 of q, k and v (at least one each) is 100 times
// larger, as the outlier features of a trained model are.
HostTensors outlier_inputs(const Problem& p, bool backward);

// The problem to run: opts.problem (checked by Cli::parse), or with --in the shape of q.npy, k.npy,
// v.npy (and do.npy): headers, dtype, rank and shapes checked against each other, and a shape flag
// that contradicts them is an error.
Problem input_problem(const Options& opts, bool backward);

// Bytes of the host copies a program holds: inputs, its outputs, and one more copy of the outputs
// (a comparison run), all fp32.
double host_bytes_needed(const Problem& p, bool backward);

// The tensors of `p`: random, or read from --in. Refuses up front a problem larger than the host
// memory available, and inputs with a NaN or an Inf (the message names the first one's index).
HostTensors load_inputs(const Options& opts, const Problem& p, bool backward);

}  // namespace fa
