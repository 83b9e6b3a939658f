#!/usr/bin/env bash
# The measurements behind every number in the READMEs: each chapter program at the sizes its README
# reports, then PyTorch SDPA (fp32) as the outside baseline, all in one CSV in the project's row format.
# Run it on a GPU machine after building (see README.md):
#   scripts/measure.sh [BUILD_DIR] [CSV]       default: build, docs/results/<gpu>.csv
# Each command is echoed before it runs, so a README can quote it, with a progress line (step k/N).
# The rows go to a temporary file that replaces CSV at the end, only if every step passed; otherwise
# CSV is left as it was and the new rows are kept next to it (CSV.partial). A failed check makes the
# exit code 1 but the remaining measurements still run. Takes about 8 minutes on an H100.
set -uo pipefail
usage() { sed -n '2,9s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "measure.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
esac
[ $# -le 2 ] || { echo "measure.sh: at most two arguments (BUILD_DIR, CSV); see --help" >&2; exit 2; }
cd "$(dirname "$0")/.."
B=${1:-build}
if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "measure.sh: no NVIDIA GPU found (nvidia-smi lists none): there is nothing to measure here." >&2
  echo "The numbers measured on a named GPU are in docs/results/ (scripts/tour.sh shows them)." >&2
  exit 1
fi
for prog in 00_naive/naive 01_online_softmax/online_softmax 02_fa1_forward/fa1_forward 03_fa1_backward/fa1_backward 04_fa2/fa2; do
  [ -x "$B/$prog" ] || { echo "measure.sh: $B/$prog not found: build first (README, Quick start)" >&2; exit 1; }
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${gpu:-unknown}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
CSV=${2:-docs/results/$slug.csv}
mkdir -p "$(dirname "$CSV")"
TMP=$(mktemp "$CSV.XXXXXX") || exit 1
trap 'rm -f "$TMP"' EXIT

have_torch=0
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && have_torch=1
steps=(
  # 00: the O(N^2) wall at N = 1024 and 4096
  "$B/00_naive/naive --backward"
  "$B/00_naive/naive --q-len 4096 --backward"
  # 01: the softmax sweep against the copy bandwidth, and the fused row kernels against 00
  "$B/01_online_softmax/online_softmax"
  # 02: next to 00 at N = 1024 and 4096, and alone at N = 65536 where 00 cannot allocate S and P
  "$B/02_fa1_forward/fa1_forward"
  "$B/02_fa1_forward/fa1_forward --q-len 4096"
  "$B/02_fa1_forward/fa1_forward --q-len 4096 --causal --dropout 0.1"
  "$B/02_fa1_forward/fa1_forward --batch 1 --heads 16 --q-len 65536 --warmup 1 --iters 3"
  # 03: next to 00's backward, and alone where 00's backward cannot allocate S, P and dP
  "$B/03_fa1_backward/fa1_backward"
  "$B/03_fa1_backward/fa1_backward --q-len 4096 --batch 2"
  "$B/03_fa1_backward/fa1_backward --batch 2 --heads 16 --q-len 32768 --warmup 1 --iters 3"
  # 04: every forward step next to 02/03 at B=1 H=16 (where FA1 has 16 blocks) and B=4 H=32 (128
  # blocks: FA1's best case), the sweep N x d x causal, one long sequence with few heads, and GQA
  "$B/04_fa2/fa2 --kernel all --backward"
  "$B/04_fa2/fa2 --kernel all --batch 4 --heads 32 --backward"
  "$B/04_fa2/fa2 --sweep --backward --iters 5 --warmup 1"
  "$B/04_fa2/fa2 --batch 1 --heads 2 --q-len 16384 --no-previous"
  "$B/04_fa2/fa2 --heads 8 --kv-heads 2 --q-len 4096 --causal --backward --no-previous"
)
if [ "$have_torch" -eq 1 ]; then
  # PyTorch SDPA, fp32, the backend it picks: the outside baseline at the sweep's sizes
  steps+=("python3 scripts/torch_sdpa.py check $B")
  for d in 64 128; do
    for c in "" " --causal"; do
      steps+=("python3 scripts/torch_sdpa.py bench --sizes 1024 4096 16384 --head-dim $d$c --backward")
    done
  done
  steps+=("python3 scripts/torch_sdpa.py bench --sizes 4096 --batch 4 --heads 32 --backward")
fi
rc=0
n=${#steps[@]}
for k in "${!steps[@]}"; do
  cmd=${steps[$k]}
  csv_arg="--csv $TMP"
  [[ $cmd == *"torch_sdpa.py check"* ]] && csv_arg=""
  echo
  echo "== step $((k + 1))/$n"
  echo "\$ $cmd${csv_arg:+ --csv $CSV}"
  # shellcheck disable=SC2086  # each step is a command line of words
  $cmd $csv_arg || { echo "!! exit $?: $cmd"; rc=1; }
done
[ "$have_torch" -eq 1 ] || echo "PyTorch with CUDA not found: no SDPA baseline rows"

rows=$(($(wc -l <"$TMP") - 1))
[ "$rows" -ge 0 ] || rows=0
echo
if [ "$rc" -eq 0 ]; then
  mv "$TMP" "$CSV" && trap - EXIT
  echo "== measure: $rows rows in $CSV"
else
  mv "$TMP" "$CSV.partial" && trap - EXIT
  echo "== measure: a step failed (see '!!' above): $CSV left as it was; the $rows new rows are in $CSV.partial"
fi
exit $rc
