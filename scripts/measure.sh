#!/usr/bin/env bash
# The measurements behind every number in the READMEs: each chapter program at the sizes its README
# reports, then PyTorch SDPA (fp32) as the outside baseline, all appended to one CSV in the project's
# row format. Run it on a GPU machine after building (see README.md):
#   scripts/measure.sh [BUILD_DIR] [CSV]       default: build, docs/results/<gpu>.csv
# Each command is echoed before it runs, so a README can quote it. A failed check makes the exit code 1
# but the remaining measurements still run. Takes about 8 minutes on an H100.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${gpu:-unknown}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
CSV=${2:-docs/results/$slug.csv}
mkdir -p "$(dirname "$CSV")"
rm -f "$CSV"
rc=0
run() {
  echo
  echo "\$ $*"
  "$@" --csv "$CSV" || { echo "!! exit $?: $*"; rc=1; }
}
B=$BUILD
# 00: the O(N^2) wall at N = 1024 and 4096
run "$B/00_naive/naive" --backward
run "$B/00_naive/naive" --q-len 4096 --backward
# 01: the softmax sweep against the copy bandwidth, and the fused row kernels against 00
run "$B/01_online_softmax/online_softmax"
# 02: next to 00 at N = 1024 and 4096, and alone at N = 65536 where 00 cannot allocate S and P
run "$B/02_fa1_forward/fa1_forward"
run "$B/02_fa1_forward/fa1_forward" --q-len 4096
run "$B/02_fa1_forward/fa1_forward" --q-len 4096 --causal --dropout 0.1
run "$B/02_fa1_forward/fa1_forward" --batch 1 --heads 16 --q-len 65536 --warmup 1 --iters 3
# 03: next to 00's backward, and alone where 00's backward cannot allocate S, P and dP
run "$B/03_fa1_backward/fa1_backward"
run "$B/03_fa1_backward/fa1_backward" --q-len 4096 --batch 2
run "$B/03_fa1_backward/fa1_backward" --batch 2 --heads 16 --q-len 32768 --warmup 1 --iters 3
# 04: next to 02/03 at B=1 H=16 (where FA1 has 16 blocks) and B=4 H=32 (128 blocks: FA1's best case),
# the sweep N x d x causal, one long sequence with few heads, and GQA
run "$B/04_fa2/fa2" --backward
run "$B/04_fa2/fa2" --batch 4 --heads 32 --backward
run "$B/04_fa2/fa2" --sweep --backward --iters 5 --warmup 1
run "$B/04_fa2/fa2" --batch 1 --heads 2 --q-len 16384 --no-previous
run "$B/04_fa2/fa2" --heads 8 --kv-heads 2 --q-len 4096 --causal --backward --no-previous
# PyTorch SDPA, fp32, the backend it picks: the outside baseline at the sweep's sizes
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo
  echo "\$ python3 scripts/torch_sdpa.py check $B"
  python3 scripts/torch_sdpa.py check "$B" || rc=1
  for d in 64 128; do
    for c in "" --causal; do
      echo "\$ python3 scripts/torch_sdpa.py bench --sizes 1024 4096 16384 --head-dim $d $c --backward --csv $CSV"
      python3 scripts/torch_sdpa.py bench --sizes 1024 4096 16384 --head-dim $d $c --backward --csv "$CSV" || rc=1
    done
  done
  python3 scripts/torch_sdpa.py bench --sizes 4096 --batch 4 --heads 32 --backward --csv "$CSV" || rc=1
else
  echo "PyTorch with CUDA not found: no SDPA baseline rows"
fi
# 05: split-K and the tensor-core ladder on FlashAttention's benchmark shapes (16k tokens: batch = 16384 / N;
# hidden 2048: H = 32 at d = 64, H = 16 at d = 128), causal off and on, fp16; each run also times 04 (fp32).
# Then PyTorch's flash (FA2) and cuDNN backends on the same shapes, the baselines of 05's table.
for d in 64 128; do
  for n in 512 1024 2048 4096 8192 16384; do
    for c in "" --causal; do
      run "$B/05_warp_split_q/warp_split_q" --batch $((16384 / n)) --heads $((2048 / d)) --q-len "$n" --head-dim "$d" \
        --dtype fp16 $c --iters 10 --warmup 2
    done
  done
done
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for d in 64 128; do
    for n in 512 1024 2048 4096 8192 16384; do
      for c in "" --causal; do
        for backend in flash cudnn; do
          args=(bench --sizes "$n" --batch $((16384 / n)) --heads $((2048 / d)) --head-dim "$d" $c --dtype fp16 --backend "$backend")
          echo "\$ python3 scripts/torch_sdpa.py ${args[*]} --csv $CSV"
          python3 scripts/torch_sdpa.py "${args[@]}" --csv "$CSV" || rc=1
        done
      done
    done
  done
else
  echo "PyTorch with CUDA not found: no flash/cuDNN rows for 05"
fi
echo
echo "== measure: $(($(wc -l <"$CSV") - 1)) rows in $CSV, exit $rc"
exit $rc
