// Chapter 01 host API: softmax from 3 passes to 2 (online max/sum), the (m, l) merge, and one fused
// pass per attention row. All fp32; x and y are [rows, cols] row-major.
#pragma once
#include "problem.hpp"

namespace online_softmax {

void softmax_3pass(const float* x, float* y, int rows, int cols);        // kernel 1
void softmax_online_2pass(const float* x, float* y, int rows, int cols); // kernel 2
void softmax_online_merge(const float* x, float* y, int rows, int cols); // kernel 3: partial (m, l) merged

// Kernel 4: attention without materialising S. FA1 form: the output is renormalised at every step
// (o'_i); FA2 form: unnormalised accumulator, one division by l at the end. Both write O and LSE.
// Scale, causal mask (bottom-right), GQA; no dropout (a UsageError if p.dropout_p > 0). head_dim <= 256.
enum class Form { Fa1NormalisedEachStep, Fa2DeferredNormalisation };
// Throws fa::UsageError naming the supported values when attention_fused cannot run p.
void check_supported(const fa::Problem& p);
void attention_fused(const fa::Problem& p, Form form, const float* q, const float* k, const float* v, float* o,
                     float* lse);

}  // namespace online_softmax
