// Deterministic random inputs. The generator is our own (splitmix64 + Box-Muller), so a seed gives
// the same tensors on every platform and compiler. Inputs are offset from zero mean on purpose:
// zero-mean data hides some indexing bugs (a wrong row often has the same statistics).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "dtype.hpp"

namespace fa {

class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() {  // splitmix64
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {
    const double u1 = 1.0 - uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

 private:
  uint64_t s_;
};

// x = mean + stddev * N(0, 1), rounded to T. Large-magnitude logits: use a large stddev (e.g. 30)
// so that q.k reaches |x| ~ 1e4 and the softmax's max subtraction is exercised.
template <class T>
std::vector<T> random_normal(size_t n, uint64_t seed, double mean = 0.5, double stddev = 1.0) {
  Rng rng(seed);
  std::vector<T> x(n);
  for (auto& e : x) e = from_float<T>(float(mean + stddev * rng.normal()));
  return x;
}

}  // namespace fa
