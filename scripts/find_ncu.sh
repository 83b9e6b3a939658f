# Sourced by the scripts that read Nsight Compute counters (io_counters.sh, step_counters.sh): find_ncu NAME sets
# NCU to Nsight Compute's ncu - NCU=/path/to/ncu if given, else on PATH, next to nvcc, or in the usual install
# folders - or says how to get it (prefixed with NAME, the calling script) and exits 1.
find_ncu() {
  NCU=${NCU:-$(command -v ncu || true)}
  for guess in "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/nvcc)")/ncu" /usr/local/cuda/bin/ncu \
               /usr/local/cuda/nsight-compute*/ncu /opt/nvidia/nsight-compute/*/ncu; do
    [ -n "$NCU" ] || { [ -x "$guess" ] && NCU=$guess; }
  done
  if [ -z "$NCU" ] || [ ! -x "$NCU" ]; then
    echo "$1: Nsight Compute's ncu was not found (not on PATH, not in the CUDA toolkit's bin)." >&2
    echo "Install it with the CUDA toolkit (package nsight-compute) or point NCU=/path/to/ncu at it." >&2
    exit 1
  fi
}
