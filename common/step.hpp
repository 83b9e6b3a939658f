// The one shape of a ladder step, shared by every chapter that builds its kernel up in steps (04, 05, 06).
// A step is a complete kernel in a file of its own; the chapter lists its steps once, in ladder order, as a
// std::vector<fa::Step<...>>, and everything else loops over that list: the program's --kernel and --list-steps,
// the GPU tests, the sanitizer runs, and the scripts (measure.sh, plot.py, the tour), which read --list-steps.
#pragma once
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.hpp"

namespace fa {

// The GPUs a step runs on. any: every CUDA GPU the chapter builds for; sm80: compute capability 8.0 and newer
// (mma.sync with bf16, cp.async); sm90a: Hopper alone (wgmma, TMA: sm_90a code has no fallback for other GPUs).
enum class Arch { any, sm80, sm90a };
inline const char* arch_name(Arch a) { return a == Arch::any ? "any" : a == Arch::sm80 ? "sm_80+" : "sm_90a"; }
// Whether a GPU of compute capability major.minor runs a step of arch a.
inline bool arch_runs(Arch a, int major, int minor) {
  return a == Arch::any || (a == Arch::sm80 && major >= 8) || (a == Arch::sm90a && major == 9 && minor == 0);
}

// One host function per 16-bit dtype, for the chapters whose kernels are templates over the dtype (05, 06):
// Fn<half_t> and Fn<bfloat16_t> are the two instantiations' function pointer types.
template <template <class> class Fn>
struct PerDtype {
  Fn<half_t> fp16;
  Fn<bfloat16_t> bf16;
  template <class T>
  Fn<T> of() const {
    if constexpr (std::is_same_v<T, half_t>) return fp16;
    else return bf16;
  }
};

template <class Launch>
struct Step {
  const char* name;    // what --kernel selects, and the `kernel` column of the result rows
  const char* idea;    // the one idea this step adds to the step before it, in a line
  Launch launch;       // what runs it: the step's host function (fp32), or a PerDtype of them
  const char* dtypes;  // the dtypes it takes, as --dtype names them: "fp32" or "fp16,bf16"
  Arch arch;           // the GPUs it runs on
};

// --list-steps: one line per step, tab-separated: name, dtypes, arch, idea. The scripts read this; a person
// reads the same list in the program's help.
template <class S>
void print_steps(const std::vector<S>& steps) {
  for (const S& s : steps) std::printf("%s\t%s\t%s\t%s\n", s.name, s.dtypes, arch_name(s.arch), s.idea);
}

}  // namespace fa
