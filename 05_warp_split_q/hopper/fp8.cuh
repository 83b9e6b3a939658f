// Host side of step 11 (FP8): the quantised tensors on the GPU and the quantisation pass that fills them
// (forward/fp8_quant.cu: any GPU of the chapter), which step 11's kernel (forward/v11_fp8.cu: sm_90a) reads.
#pragma once
#include <cstdint>

#include "device_buffer.cuh"
#include "dtype.hpp"
#include "hopper/fp8.hpp"
#include "problem.hpp"

namespace wsq::fp8 {

// The quantised tensors of a problem, allocated once (the pass writes every byte, pads included).
struct Tensors {
  fa::DeviceBuffer<uint8_t> q, k, vt;
  fa::DeviceBuffer<float> sq, sk, sv, amax;  // amax: the pass's per-block maxima (scratch)
  explicit Tensors(const fa::Problem& p);
  View view() const { return {q.get(), k.get(), vt.get(), sq.get(), sk.get(), sv.get()}; }
};

// The quantisation pass: Q, K, V (bf16, [B,H,Nq,d] and [B,Hkv,Nk,d]) -> e4m3 with one scale per 128-row block
// or per tensor; Q and K rotated first with --hadamard; V transposed with its keys permuted (fp8.hpp: key_at).
void quantise(const fa::Problem& p, const Options& o, const fa::bfloat16_t* q, const fa::bfloat16_t* k,
              const fa::bfloat16_t* v, Tensors& out);

}  // namespace wsq::fp8
