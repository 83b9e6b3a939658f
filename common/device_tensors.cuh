// Device copies of a problem's inputs and outputs, with NaN-poisoning of the outputs, so tests and
// programs do not repeat the same dozen allocations.
#pragma once
#include "device_buffer.cuh"
#include "inputs.hpp"

namespace fa {

struct DeviceTensors {
  DeviceBuffer<float> q, k, v, dout;  // inputs (dout only for a backward)
  DeviceBuffer<float> o, lse;         // forward outputs
  DeviceBuffer<float> dq, dk, dv;     // backward outputs (allocated when dout is given)

  DeviceTensors(const Problem& p, const HostTensors& in)
      : q(in.q), k(in.k), v(in.v), o(p.q_elems()), lse(p.lse_elems()) {
    if (!in.dout.empty()) {
      dout = DeviceBuffer<float>(in.dout);
      dq = DeviceBuffer<float>(p.q_elems());
      dk = DeviceBuffer<float>(p.kv_elems());
      dv = DeviceBuffer<float>(p.kv_elems());
    }
  }
  void poison_outputs() {
    o.poison();
    lse.poison();
    if (dq.size()) dq.poison(), dk.poison(), dv.poison();
  }
};

}  // namespace fa
