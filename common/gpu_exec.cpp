// gpu_exec COMMAND [ARGS...]: runs COMMAND where a CUDA device exists, else exits 77 (ctest's skip
// code). The sanitizer tests run through it, so they report as skipped on machines without a GPU.
#include <unistd.h>

#include <cstdio>

#include "device.cuh"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: fa_gpu_exec COMMAND [ARGS...]\n");
    return 2;
  }
  if (!fa::has_cuda_device()) {
    std::printf("SKIPPED: no CUDA device\n");
    return 77;
  }
  execvp(argv[1], argv + 1);
  std::perror(argv[1]);
  return 1;
}
