// hard_inputs KIND DIR B H HKV NQ NK D: writes q.npy, k.npy, v.npy and do.npy (float32, PyTorch's SDPA layout) of
// ill-conditioned inputs into DIR (an existing folder), for a chapter program's --in: KIND wide (q, k from N(0, 40^2): logits in the
// hundreds, not exact in fp32) or outliers (one element in 1000 of q, k, v a hundred times larger; inputs.hpp).
// The GPU tests run every chapter program on them: a correct kernel must pass the error rule there (testing.hpp).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "inputs.hpp"
#include "npy.hpp"

int main(int argc, char** argv) {
  if (argc != 9) {
    std::fprintf(stderr, "usage: fa_hard_inputs wide|outliers DIR B H HKV NQ NK D\n");
    return 2;
  }
  const std::string kind = argv[1], dir = argv[2];
  if (kind != "wide" && kind != "outliers") {
    std::fprintf(stderr, "fa_hard_inputs: KIND must be wide or outliers (got '%s')\n", kind.c_str());
    return 2;
  }
  fa::Problem p;
  p.batch = std::atoi(argv[3]), p.heads = std::atoi(argv[4]), p.kv_heads = std::atoi(argv[5]);
  p.q_len = std::atoi(argv[6]), p.kv_len = std::atoi(argv[7]), p.head_dim = std::atoi(argv[8]);
  try {
    p.validate();
    const fa::HostTensors t = kind == "wide" ? fa::wide_logit_inputs(p, true) : fa::outlier_inputs(p, true);
    const std::vector<size_t> qs = {size_t(p.batch), size_t(p.heads), size_t(p.q_len), size_t(p.head_dim)};
    const std::vector<size_t> ks = {size_t(p.batch), size_t(p.kv_heads), size_t(p.kv_len), size_t(p.head_dim)};
    fa::npy_write(dir + "/q.npy", qs, t.q.data());
    fa::npy_write(dir + "/k.npy", ks, t.k.data());
    fa::npy_write(dir + "/v.npy", ks, t.v.data());
    fa::npy_write(dir + "/do.npy", qs, t.dout.data());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fa_hard_inputs: %s\n", e.what());
    return 2;
  }
  return 0;
}
