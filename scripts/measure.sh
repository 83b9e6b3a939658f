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
# 06: decoding, fp16, d = 128, H = 32: every kernel and the read_kv ceiling at B in {1, 8}, Hkv in {32, 8},
# N in {4k, 32k, 128k}; the split-count sweep (every count checked, the heuristic's marked *); the unified max
# with large logits (every split falls back: the cost of the fallback); PyTorch SDPA flash and cuDNN at q_len 1
for b in 1 8; do
  for hkv in 32 8; do
    for n in 4096 32768 131072; do
      run "$B/06_flash_decoding/flash_decoding" --batch $b --heads 32 --kv-heads $hkv --kv-len $n --head-dim 128 \
        --dtype fp16 --iters 10 --warmup 2
    done
  done
done
run "$B/06_flash_decoding/flash_decoding" --batch 1 --heads 32 --kv-heads 8 --kv-len 32768 --head-dim 128 \
  --kernel split_kv_gqa --sweep-splits --iters 10 --warmup 1
run "$B/06_flash_decoding/flash_decoding" --batch 1 --heads 32 --kv-heads 8 --kv-len 32768 --head-dim 128 \
  --kernel unified_max --scale 30 --iters 10 --warmup 1
if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  for b in 1 8; do
    for hkv in 32 8; do
      for backend in flash cudnn; do
        cmd=(python3 scripts/torch_sdpa.py bench --sizes 4096 32768 131072 --q-len 1 --batch $b --heads 32
             --kv-heads $hkv --head-dim 128 --dtype fp16 --backend $backend --iters 10 --warmup 2 --csv "$CSV")
        echo "\$ ${cmd[*]}"
        "${cmd[@]}" || rc=1
      done
    done
  done
else
  echo "PyTorch with CUDA not found: no SDPA decoding rows"
fi
echo
echo "== measure: $(($(wc -l <"$CSV") - 1)) rows in $CSV, exit $rc"
exit $rc
