#!/usr/bin/env bash
# The measurements behind every number in the READMEs: each chapter program at the sizes its README
# reports, with PyTorch SDPA as the outside baseline, all in one CSV in the project's row format.
# Run it on a GPU machine after building (see README.md):
#   scripts/measure.sh [--chapters LIST] [BUILD_DIR] [CSV]   default: all, build, docs/results/<gpu>.csv
#   LIST: chapters to measure, e.g. 05,06: the ids of scripts/chapters.tsv, and 05bwd, 05fwd, 05fp8, journey (04 includes the fp32
#         PyTorch rows; 05: every forward step next to PyTorch's flash and cuDNN; 05bwd: 05's backward steps on the same shapes next to
#         PyTorch's backward; 05fwd: 05's last steps, forward only, next to PyTorch's flash and cuDNN; 05fp8: the FP8
#         steps next to step 10 in fp16 and PyTorch's flash and cuDNN (05's FP8.md, section 17; alone, its default
#         CSV is docs/results/<gpu>_fp8.csv); journey: every forward step of 00-05 and PyTorch's flash and cuDNN at
#         one shape, B 4 H 16 N 4096 d 128: docs/journey.md (alone, its default CSV is docs/results/<gpu>_journey.csv).
#         The two files of their own keep the chapters' own rows those of the chapters' runs.
# Each command is echoed before it runs, so a README can quote it, with a progress line (step k/N).
# The new rows replace the rows of CSV with the same kernel and shape; all other rows are kept. CSV is
# replaced only if every step passed; otherwise it is left as it was and the new rows are kept next to it
# (CSV.partial). A failed check makes the exit code 1 but the remaining measurements still run.
# All chapters take about 35 minutes on an H100 (measured: 00-04 about 10, 05 5.4, journey under 2, 06 about 3 with the
# decode GEMMs, 05bwd 8.8 with steps 8, 13 and 14 at every N, 05fwd about 9: 47 of its 56 steps took 7.3; 05fp8 7.7 on an H200, steps 11-19).
set -uo pipefail
usage() { sed -n '2,19s/^# \{0,1\}//p' "$0"; }
CHAPTERS=""  # default: every chapter of scripts/chapters.tsv, and 05bwd
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  --chapters)
    [ $# -ge 2 ] || { echo "measure.sh: --chapters needs a list, e.g. --chapters 05,06" >&2; exit 2; }
    CHAPTERS=$2
    shift 2 ;;
  -*) echo "measure.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
# The chapters (scripts/chapters.tsv): id -> "folder/program"
declare -A PROGRAM
while IFS=$'\t' read -r id folder program _; do
  [[ $id =~ ^[0-9] ]] && PROGRAM[$id]=$folder/$program
done < scripts/chapters.tsv
[ -n "$CHAPTERS" ] || CHAPTERS=$(printf '%s\n' "${!PROGRAM[@]}" 05bwd | sort | paste -sd,)
for c in ${CHAPTERS//,/ }; do
  [[ -n ${PROGRAM[$c]:-} || $c =~ ^(05fwd|05fp8|05bwd|journey)$ ]] ||
    { echo "measure.sh: --chapters: '$c' is not a chapter of scripts/chapters.tsv ($(printf '%s\n' "${!PROGRAM[@]}" | sort | tr '\n' ' ')) nor 05bwd, 05fwd, 05fp8, journey" >&2; exit 2; }
done
[ $# -le 2 ] || { echo "measure.sh: at most two arguments (BUILD_DIR, CSV); see --help" >&2; exit 2; }
B=${1:-build}
if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "measure.sh: no NVIDIA GPU found (nvidia-smi lists none): there is nothing to measure here." >&2
  echo "The numbers measured on a named GPU are in docs/results/ (scripts/tour.sh shows them)." >&2
  exit 1
fi
chosen=${CHAPTERS//05fwd/05}
chosen=${chosen//05fp8/05}
chosen=${chosen//05bwd/05}
chosen=${chosen//journey/00,01,02,04,05}
for id in "${!PROGRAM[@]}"; do
  [[ ",$chosen," == *",$id,"* ]] || continue
  [ -x "$B/${PROGRAM[$id]}" ] || { echo "measure.sh: $B/${PROGRAM[$id]} not found: build first (README, Quick start)" >&2; exit 1; }
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${gpu:-unknown}" | tr 'A-Z' 'a-z' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
CSV=${2:-docs/results/$slug.csv}
[ "$CHAPTERS" = journey ] && CSV=${2:-docs/results/${slug}_journey.csv}
[ "$CHAPTERS" = 05fp8 ] && CSV=${2:-docs/results/${slug}_fp8.csv}
mkdir -p "$(dirname "$CSV")"
TMP=$(mktemp "$CSV.XXXXXX") || exit 1
trap 'rm -f "$TMP"' EXIT
# Interrupted (Ctrl-C, a time limit): the rows measured so far are kept next to CSV, which is left as it was.
trap 'mv "$TMP" "$CSV.partial"; echo "== measure: interrupted; the rows so far are in $CSV.partial"; trap - EXIT; exit 130' INT TERM

have_torch=0
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null && have_torch=1
# The Hopper steps exist on an sm_90 GPU of a build with them (05_warp_split_q/README.md, section 3).
# The registry's sm_90a steps, as the program lists them (--list-steps: name, dtypes, arch, idea).
HOPPER_STEPS=""
if [[ ",$CHAPTERS," == *",05fwd,"* ]]; then
  for s in $("$B/05_warp_split_q/warp_split_q" --list-steps 2>/dev/null | awk -F'\t' '$3 == "sm_90a" && $2 != "fp8" { print $1 }'); do
    HOPPER_STEPS+=",$s"
  done
fi
# The backward's last two sm_90a steps, measured at every N next to step 8 (05bwd below; every step runs at N = 4096).
HOPPER_BWD_STEPS=""
if [[ ",$CHAPTERS," == *",05bwd,"* ]]; then
  for s in $("$B/05_warp_split_q/warp_split_q" --list-steps --backward 2>/dev/null | awk -F'\t' '$3 == "sm_90a" { print $1 }' | tail -2); do
    HOPPER_BWD_STEPS+=",$s"
  done
fi
FP8_STEPS=""
if [[ ",$CHAPTERS," == *",05fwd,"* || ",$CHAPTERS," == *",05fp8,"* ]]; then
  FP8_STEPS=$("$B/05_warp_split_q/warp_split_q" --list-steps 2>/dev/null | awk -F'\t' '$2 == "fp8" { print $1 }')
fi
steps=()
# add CHAPTER COMMAND: queue COMMAND if CHAPTER was chosen (--chapters); "torch" steps need PyTorch with CUDA
add() {
  [[ ",$CHAPTERS," == *",$1,"* ]] || return 0
  [[ $2 == python3* && $have_torch -eq 0 ]] && return 0
  steps+=("$2")
}
# 00: the O(N^2) wall at N = 1024 and 4096
add 00 "$B/00_naive/naive --backward"
add 00 "$B/00_naive/naive --q-len 4096 --backward"
# 01: the softmax sweep against the copy bandwidth, and the fused row kernels against 00
add 01 "$B/01_online_softmax/online_softmax"
# 02: next to 00 at N = 1024 and 4096, and alone at N = 65536 where 00 cannot allocate S and P
add 02 "$B/02_fa1_forward/fa1_forward"
add 02 "$B/02_fa1_forward/fa1_forward --q-len 4096"
add 02 "$B/02_fa1_forward/fa1_forward --q-len 4096 --causal --dropout 0.1"
add 02 "$B/02_fa1_forward/fa1_forward --batch 1 --heads 16 --q-len 65536 --warmup 1 --iters 3"
# 03: next to 00's backward, and alone where 00's backward cannot allocate S, P and dP
add 03 "$B/03_fa1_backward/fa1_backward"
add 03 "$B/03_fa1_backward/fa1_backward --q-len 4096 --batch 2"
add 03 "$B/03_fa1_backward/fa1_backward --batch 2 --heads 16 --q-len 32768 --warmup 1 --iters 3"
# 04: every forward step next to 02/03 at B=1 H=16 (where FA1 has 16 blocks) and B=4 H=32 (128
# blocks: FA1's best case), the sweep N x d x causal, one long sequence with few heads, and GQA
add 04 "$B/04_fa2/fa2 --kernel all --backward"
add 04 "$B/04_fa2/fa2 --kernel all --batch 4 --heads 32 --backward"
add 04 "$B/04_fa2/fa2 --kernel all --head-dim 128 --iters 10 --warmup 2"
add 04 "$B/04_fa2/fa2 --kernel all --batch 4 --heads 32 --head-dim 128 --iters 10 --warmup 2"
add 04 "$B/04_fa2/fa2 --sweep --backward --iters 5 --warmup 1"
add 04 "$B/04_fa2/fa2 --batch 1 --heads 2 --q-len 16384 --no-previous"
add 04 "$B/04_fa2/fa2 --heads 8 --kv-heads 2 --q-len 4096 --causal --backward --no-previous"
# 04 block-sparse: a density sweep at N = 16384 (random masks and a sliding window), forward + backward, each
# timed next to the dense kernels on the same inputs (04_fa2/README.md section 6)
for spec in random:0.1 random:0.25 random:0.5 local:512; do
  add 04 "$B/04_fa2/fa2 --batch 1 --heads 16 --q-len 16384 --head-dim 64 --block-mask $spec --backward --no-previous --iters 5 --warmup 1"
done
# PyTorch SDPA, fp32, the backend it picks: the outside baseline of 00-04 at the sweep's sizes
add 04 "python3 scripts/torch_sdpa.py check $B"
for d in 64 128; do
  for c in "" " --causal"; do
    add 04 "python3 scripts/torch_sdpa.py bench --sizes 1024 4096 16384 --head-dim $d$c --backward"
  done
done
add 04 "python3 scripts/torch_sdpa.py bench --sizes 4096 --batch 4 --heads 32 --backward"
# 05: split-K and the tensor-core ladder on FlashAttention's benchmark shapes (16k tokens: batch = 16384 / N;
# hidden 2048: H = 32 at d = 64, H = 16 at d = 128), causal off and on, fp16, forward; each run also times 04
# (fp32). Then PyTorch's flash (FA2) and cuDNN backends' forward on the same shapes: 05's baselines.
# 05bwd: the backward steps (both dQ modes, next to 04's backward) on the same shapes, and PyTorch's backward;
# `--kernel none` and `--backward-only` time no forward, so 05's forward rows stay those of a 05 run. Every step at
# N = 4096 (the ladder's table); at every N step 8 (the last of sm_80) and, on an sm_90 GPU, the last two Hopper steps
# (each step's check against fp64 is what takes the time).
BWD_LAST=bwd_v8_kv_frags$HOPPER_BWD_STEPS
for d in 64 128; do
  for c in "" " --causal"; do
    for n in 512 1024 2048 4096 8192 16384; do
      add 05 "$B/05_warp_split_q/warp_split_q --kernel all --batch $((16384 / n)) --heads $((2048 / d)) --head-dim $d --q-len $n --dtype fp16$c --iters 10 --warmup 2"
    done
    for backend in flash cudnn; do
      add 05 "python3 scripts/torch_sdpa.py bench --tokens 16384 --heads $((2048 / d)) --head-dim $d --sizes 512 1024 2048 4096 8192 16384$c --dtype fp16 --backend $backend --iters 10 --warmup 2"
    done
  done
done
for d in 64 128; do
  for c in "" " --causal"; do
    for n in 512 1024 2048 4096 8192 16384; do
      which=$BWD_LAST; [ "$n" = 4096 ] && which=all
      add 05bwd "$B/05_warp_split_q/warp_split_q --kernel none --no-previous --backward --bwd-kernel $which --batch $((16384 / n)) --heads $((2048 / d)) --head-dim $d --q-len $n --dtype fp16$c --iters 10 --warmup 2"
    done
    for backend in flash cudnn; do
      add 05bwd "python3 scripts/torch_sdpa.py bench --tokens 16384 --heads $((2048 / d)) --head-dim $d --sizes 512 1024 2048 4096 8192 16384$c --dtype fp16 --backend $backend --backward-only --iters 10 --warmup 2"
    done
  done
done
# 05fwd: the forward alone, the ladder's last steps (v8; v9, v10 on an sm_90 GPU) next to FA2 and cuDNN on the same
# shapes: the Hopper steps' table in a few minutes (05 above runs every step).
for d in 64 128; do
  for c in "" " --causal"; do
    for n in 512 1024 2048 4096 8192 16384; do
      shape="--batch $((16384 / n)) --heads $((2048 / d)) --head-dim $d --q-len $n"
      add 05fwd "$B/05_warp_split_q/warp_split_q --kernel v8_two_row_tiles$HOPPER_STEPS $shape --dtype fp16$c --no-previous --iters 10 --warmup 2"
      # the FP8 steps, on a GPU that lists them: the same shapes in e4m3, block scales (05's FP8.md);
      # 05fp8 runs them alone, next to step 10 in fp16 (05fwd has step 10 in the line above)
      if [ -n "$FP8_STEPS" ]; then
        fp8="$B/05_warp_split_q/warp_split_q --dtype fp8 $shape$c --no-previous --iters 10 --warmup 2"
        add 05fwd "$fp8"
        if [[ ",$CHAPTERS," != *",05fwd,"* ]]; then
          add 05fp8 "$B/05_warp_split_q/warp_split_q --kernel v10_pingpong $shape --dtype fp16$c --no-previous --iters 10 --warmup 2"
          add 05fp8 "$fp8"
        fi
      fi
    done
    for backend in flash cudnn; do
      torch="python3 scripts/torch_sdpa.py bench --tokens 16384 --heads $((2048 / d)) --head-dim $d --sizes 512 1024 2048 4096 8192 16384$c --dtype fp16 --backend $backend --iters 10 --warmup 2"
      add 05fwd "$torch"
      [[ ",$CHAPTERS," == *",05fwd,"* ]] || add 05fp8 "$torch"
    done
  done
done
# journey: one shape, FlashAttention's benchmark shape at d = 128 (16k tokens: B 4 x N 4096; hidden 2048: H 16),
# forward, every step from 00 to 05's last, then PyTorch's flash (FA2) and cuDNN backends (docs/journey.md).
# 01 also times 00 and 04 times 02 next to it: those rows are of this run too.
J="--batch 4 --heads 16 --q-len 4096 --head-dim 128"
add journey "$B/00_naive/naive $J --iters 5 --warmup 1"
add journey "$B/01_online_softmax/online_softmax $J --cols 4096 --iters 5 --warmup 1"
add journey "$B/02_fa1_forward/fa1_forward $J --iters 5 --warmup 1"
add journey "$B/04_fa2/fa2 --kernel all $J --iters 5 --warmup 1"
add journey "$B/05_warp_split_q/warp_split_q --kernel all $J --dtype fp16 --no-previous --iters 10 --warmup 2"
for backend in flash cudnn; do
  add journey "python3 scripts/torch_sdpa.py bench --tokens 16384 --heads 16 --head-dim 128 --sizes 4096 --dtype fp16 --backend $backend --iters 10 --warmup 2"
done
# 06: decoding, fp16, d = 128, H = 32: every kernel and the read_kv ceiling at B in {1, 8}, Hkv in {32, 8},
# N in {4k, 32k, 128k}; the split-count sweeps of split_kv_gqa, split_kv_fused and split_kv_mma and the block-count
# sweep of split_kv_even (every count checked, the heuristic's marked *); the unified max with large logits (every split falls back: the cost of the
# fallback); PyTorch SDPA flash and cuDNN at q_len 1; split_kv_mma and read_kv at N = 32k with the L2 policy
# forced to evict-first and to evict-normal
for b in 1 8; do
  for hkv in 32 8; do
    for n in 4096 32768 131072; do
      add 06 "$B/06_flash_decoding/flash_decoding --batch $b --heads 32 --kv-heads $hkv --kv-len $n --head-dim 128 --dtype fp16 --iters 10 --warmup 2"
    done
    for backend in flash cudnn; do
      add 06 "python3 scripts/torch_sdpa.py bench --sizes 4096 32768 131072 --q-len 1 --batch $b --heads 32 --kv-heads $hkv --head-dim 128 --dtype fp16 --backend $backend --iters 10 --warmup 2"
    done
  done
done
for kernel in split_kv_gqa split_kv_fused split_kv_mma split_kv_even; do  # the ladder's last steps against the step
  # they start from; split_kv_even's sweep is over its block count (README §4.5)
  add 06 "$B/06_flash_decoding/flash_decoding --batch 1 --heads 32 --kv-heads 8 --kv-len 32768 --head-dim 128 --kernel $kernel --sweep-splits --iters 10 --warmup 1"
done
add 06 "$B/06_flash_decoding/flash_decoding --batch 1 --heads 32 --kv-heads 8 --kv-len 32768 --head-dim 128 --kernel unified_max --scale 30 --iters 10 --warmup 1"
for shape in "1 8" "1 32" "8 8" "8 32"; do  # the K/V stream's L2 policy forced both ways (README §4.6), split_kv_mma
  read -r b hkv <<< "$shape"
  for policy in evict-first evict-normal; do
    add 06 "$B/06_flash_decoding/flash_decoding --batch $b --heads 32 --kv-heads $hkv --kv-len 32768 --head-dim 128 --kernel split_kv_mma --l2-policy $policy --iters 10 --warmup 2"
  done
done
# 06's decode GEMMs (06_flash_decoding/gemm/README.md section 8): every kernel, cuBLAS and the read_w ceiling on the four
# 7B shapes x 9 values of M; then the dispatcher with the tuned table against each fixed choice. decode_gemm writes
# its own row format (a GEMM has no attention shape), so these rows go to CSV's neighbours <csv>_gemm.csv and
# <csv>_gemm_auto.csv, each replaced whole by a run that passes (GEMM_CSV_OF below).
add 06 "$B/06_flash_decoding/gemm/decode_gemm"
add 06 "$B/06_flash_decoding/gemm/decode_gemm --table 06_flash_decoding/gemm/dataflow.tsv --kernel auto,gemv,flat,flat_cluster,tile,flat_wgmma,cublas"
# A chapter of scripts/chapters.tsv with no measurements of its own above: its program on its defaults.
for id in $(printf '%s\n' "${!PROGRAM[@]}" | sort); do
  if [[ ",$CHAPTERS," == *",$id,"* ]] && ! printf '%s\n' "${steps[@]}" | grep -qE "/${PROGRAM[$id]}( |\$)"; then
    add "$id" "$B/${PROGRAM[$id]}"
  fi
done

# The decode GEMMs' CSVs: the final file of each kind of decode_gemm step, and a temporary file until the run passes.
gemm_csv_of() { [[ $1 == *"--table"* ]] && echo "${CSV%.csv}_gemm_auto.csv" || echo "${CSV%.csv}_gemm.csv"; }
declare -A GEMM_TMP
rc=0
n=${#steps[@]}
for k in "${!steps[@]}"; do
  cmd=${steps[$k]}
  csv_arg="--csv $TMP" shown=$CSV
  [[ $cmd == *"torch_sdpa.py check"* ]] && csv_arg="" shown=""
  if [[ $cmd == *decode_gemm* ]]; then
    shown=$(gemm_csv_of "$cmd")
    [ -n "${GEMM_TMP[$shown]:-}" ] || GEMM_TMP[$shown]=$(mktemp "$shown.XXXXXX")
    csv_arg="--csv ${GEMM_TMP[$shown]}"
  fi
  echo
  echo "== step $((k + 1))/$n"
  echo "\$ $cmd${shown:+ --csv $shown}"
  # shellcheck disable=SC2086  # each step is a command line of words
  $cmd $csv_arg || { echo "!! exit $?: $cmd"; rc=1; }
done
[ "$have_torch" -eq 1 ] || echo "PyTorch with CUDA not found: no SDPA baseline rows"

rows=$(($(wc -l <"$TMP") - 1))
[ "$rows" -ge 0 ] || rows=0
# The new rows replace the rows of CSV with the same key (GPU, chapter, kernel, pass, dtype, shape, causal,
# dropout: the first 13 columns); every other row of CSV is kept, so measuring some chapters updates only them.
if [ "$rc" -eq 0 ] && [ -s "$CSV" ] && [ "$rows" -gt 0 ]; then
  MERGED=$(mktemp "$CSV.XXXXXX") || exit 1
  awk -F, 'FNR == 1 { if (NR == 1) print; next }
           { key = ""; for (i = 1; i <= 13; i++) key = key FS $i }
           NR == FNR { fresh[key] = 1; rows[++n] = $0; next }
           !(key in fresh) { print }
           END { for (i = 1; i <= n; i++) print rows[i] }' "$TMP" "$CSV" >"$MERGED" && mv "$MERGED" "$TMP"
fi
echo
trap - INT TERM
for f in "${!GEMM_TMP[@]}"; do  # the decode GEMMs' rows: each file replaced whole, or kept next to it
  if [ "$rc" -eq 0 ]; then mv "${GEMM_TMP[$f]}" "$f" && echo "== measure: decode GEMM rows in $f"
  else mv "${GEMM_TMP[$f]}" "$f.partial"; fi
done
if [ "$rc" -eq 0 ]; then
  mv "$TMP" "$CSV" && trap - EXIT
  echo "== measure: $rows new rows in $CSV"
else
  mv "$TMP" "$CSV.partial" && trap - EXIT
  echo "== measure: a step failed (see '!!' above): $CSV left as it was; the $rows new rows are in $CSV.partial"
fi
exit $rc
