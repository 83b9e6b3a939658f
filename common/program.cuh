// run_program: the frame of every chapter's main(). It parses the command line (exit 2 on bad
// usage), prints the plan, exits 1 with "no CUDA device" where there is none, then runs `body`
// and turns its verdict or any exception into the exit code (0 ok, 1 failed check or error).
#pragma once
#include <cstdio>
#include <functional>

#include "device.cuh"
#include "program.hpp"

namespace fa {

inline int run_program(Cli& cli, int argc, const char* const* argv,
                       const std::function<bool(Options&)>& body) {
  Options opts;
  try {
    opts = cli.parse(argc, argv);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  if (opts.help) {
    std::printf("%s", cli.usage().c_str());
    return 0;
  }
  std::printf("problem: %s\n", opts.in_dir.empty() ? describe(opts.problem).c_str()
                                                   : ("inputs from " + opts.in_dir).c_str());
  if (!has_cuda_device()) {
    std::fprintf(stderr, "error: no CUDA device (this program runs its kernels on an NVIDIA GPU)\n");
    return 1;
  }
  try {
    std::printf("device:  %s\n", device_name().c_str());
    const bool ok = body(opts);
    std::printf("%s\n", ok ? "PASSED" : "FAILED");
    return ok ? 0 : 1;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}

}  // namespace fa
