// main() of every GPU test binary: without a CUDA device it exits with 77, which ctest reports as
// "Not Run (Skipped)" (the test's SKIP_RETURN_CODE): never a silent pass, never a failure.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "device.cuh"

int main(int argc, char** argv) {
  if (!fa::has_cuda_device()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  std::printf("device: %s\n", fa::device_name().c_str());
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
