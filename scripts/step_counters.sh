#!/usr/bin/env bash
# Chapter 05's ladder under Nsight Compute: for every forward step (split_k, v1_mma .. v8_two_row_tiles, and
# v9_wgmma_tma, v10_pingpong on an sm_90 GPU) the counters that explain its gain, at d = 64 and d = 128.
#   scripts/step_counters.sh [BUILD_DIR] [OUT_CSV]   default: build, docs/results/<gpu>_steps.csv
#   scripts/step_counters.sh --backward [BUILD_DIR] [OUT_CSV]   every backward step (bwd_v1_mma ...), both dQ
#       modes: its K/V-block kernel, and the deterministic mode's dQ kernel; default docs/results/<gpu>_bwd_steps.csv
# Prints one markdown table per head dim for 05_warp_split_q/README.md (each step's counter: section 3; with
# --backward: BACKWARD.md section 5; docs/measuring.md, section 5); `python3 docs/step_counters.py table OUT_CSV`
# prints them again. Needs an NVIDIA GPU, Nsight Compute's ncu (on PATH, in the CUDA toolkit's bin, or
# NCU=/path/to/ncu) and python3; about 30 seconds on an H100 (the backward mode about 40).
# Exit 0 done, 1 no GPU, no ncu, a program failed or the launches did not match the steps, 2 bad usage.
set -uo pipefail
usage() { sed -n '2,11s/^# \{0,1\}//p' "$0"; }
BACKWARD=""
[ "${1:-}" = --backward ] && { BACKWARD=--backward; shift; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "step_counters.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
esac
[ $# -le 2 ] || { echo "step_counters.sh: at most two arguments (BUILD_DIR, OUT_CSV); see --help" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "step_counters.sh: no NVIDIA GPU found (nvidia-smi lists none): there are no counters to read here." >&2
  echo "docs/measuring.md (section 5) shows the method and the command; 05's README shows what is pending." >&2
  exit 1
fi
. scripts/find_ncu.sh
find_ncu step_counters.sh
command -v python3 >/dev/null || { echo "step_counters.sh: python3 is needed to read the counters" >&2; exit 1; }
PROG=$B/05_warp_split_q/warp_split_q
[ -x "$PROG" ] || { echo "step_counters.sh: $PROG not found: build first (README, Quick start)" >&2; exit 1; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${gpu:-unknown}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
OUT=${2:-docs/results/${slug}${BACKWARD:+_bwd}_steps.csv}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/step_counters.XXXXXX") || exit 1
PARSE="python3 docs/step_counters.py"

# The shapes of 05's ladder table (16k tokens, hidden 2048) at N = 4096: B = 4, and H = 32 (d = 64) or 16 (d = 128).
SHAPES=(
  "64|--batch 4 --heads 32 --q-len 4096 --head-dim 64"
  "128|--batch 4 --heads 16 --q-len 4096 --head-dim 128"
)
# The steps are the program's own list (its --help, --kernel line: v9 and v10 appear on an sm_90 GPU only; with
# --backward its --bwd-kernel line).
"$PROG" --help >"$WORK/help.txt" 2>&1 || { cat "$WORK/help.txt"; echo "!! $PROG --help failed"; exit 1; }
# shellcheck disable=SC2086  # BACKWARD is one option or none
STEPS=$($PARSE steps $BACKWARD "$WORK/help.txt") || { echo "== step_counters: files in $WORK"; exit 1; }
# One ncu pass list: the metrics of docs/step_counters.py, which also names the tables' columns.
# shellcheck disable=SC2086
METRICS=$($PARSE metrics $BACKWARD) || exit 1
# Values in base units where this ncu can say so (older ones scale: the units row says which).
units=""
"$NCU" --help >"$WORK/ncu_help.txt" 2>&1
grep -q -- "--print-units" "$WORK/ncu_help.txt" && units="--print-units base"
# ncu's own lines in a file of their own where it can: the program's check lines then reach its log whole.
ncu_log() { grep -q -- "--log-file" "$WORK/ncu_help.txt" && echo "--log-file $WORK/d$1.ncu.log"; }
echo "== step_counters: $gpu, $NCU"
echo "== steps: ${STEPS//,/ }"

# Which launch is which step: with --iters 0 the program runs each step exactly once (its check against the fp64
# reference; nothing is timed), in the order of --kernel all, so the kth launch of `kernel` is the kth step.
# Chapter 04's forward_kernel (the program's fp32 comparison, always run once) matches the name filter too and
# is left out by the parser, which also checks the launch count against the steps and the program's check lines.
RUN="--kernel all --iters 0 --no-previous --dtype fp16"
FILTER=regex:kernel
if [ -n "$BACKWARD" ]; then
  # --kernel none: no forward step is checked, but the program still runs chapter 04's forward_kernel once and the
  # last forward step's `kernel` once (it makes O and LSE). Then, per backward step and dQ mode, in --bwd-kernel's
  # order: rowsum_do_o_kernel (D), a memset of dQ (atomic mode), the step's kv_kernel, and in deterministic mode
  # backward/bwd_dq.cu's dq_kernel. The filter takes exactly kv_kernel and dq_kernel (not 04's backward_kv_kernel, which
  # does not run here anyway); the parser checks their order: kv, kv, dq per step.
  RUN="--kernel none --no-previous --backward --bwd-kernel all --iters 0 --dtype fp16"
  FILTER='regex:(^|[^a-z_])(kv|dq)_kernel([^a-z0-9_]|$)'
fi
rc=0
runs=()
for shape in "${SHAPES[@]}"; do
  d=${shape%%|*}
  cmd="$PROG $RUN ${shape#*|}"
  for attempt in 1 2 3; do
    echo
    echo "== d = $d: ncu on $cmd"
    : >"$WORK/d$d.ncu.log"
    # shellcheck disable=SC2086,SC2046  # cmd is a command line of words; ncu_log one option or none
    "$NCU" $(ncu_log "$d") --target-processes all --metrics "$METRICS" --kernel-name "$FILTER" \
      --export "$WORK/d$d" --force-overwrite $cmd >"$WORK/d$d.log" 2>&1
    status=$?
    # A metric this ncu or GPU does not know (names change between versions; the message may name the metric or
    # its base name, before the first dot): leave it out, say so, run again.
    dropped=$(tr ',' '\n' <<<"$METRICS" | while read -r m; do
      cat "$WORK/d$d.ncu.log" "$WORK/d$d.log" | grep -E "==(ERROR|WARNING)==" |
        grep -qE "(^|[^a-z0-9_])${m%%.*}([^a-z0-9_]|\$)" && echo "$m"; done)
    if [ -z "$dropped" ] || [ "$attempt" -eq 3 ]; then break; fi
    echo "== not known to this ncu, left out: $(paste -sd' ' <<<"$dropped")"
    METRICS=$(tr ',' '\n' <<<"$METRICS" | grep -vxF -f <(echo "$dropped") | paste -sd,)
  done
  if cat "$WORK/d$d.ncu.log" "$WORK/d$d.log" | grep -q ERR_NVGPUCTRPERM; then
    echo "!! ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run as root, or allow"
    echo "   non-admin profiling (NVIDIA's page on ERR_NVGPUCTRPERM says how)"
    rc=1
    break
  fi
  [ "$status" -eq 0 ] ||
    { tail -n 20 "$WORK/d$d.ncu.log" "$WORK/d$d.log"; echo "!! ncu run d = $d failed (logs: $WORK/d$d.*log)"; rc=1
      continue; }
  # shellcheck disable=SC2086  # units is one option or none
  "$NCU" --import "$WORK/d$d.ncu-rep" --csv --page raw $units >"$WORK/d$d.raw.csv" 2>"$WORK/d$d.import.log" ||
    { cat "$WORK/d$d.import.log"; echo "!! ncu --import d = $d failed"; rc=1; continue; }
  runs+=("$d=$WORK/d$d.raw.csv=$WORK/d$d.log")
done
[ "$rc" -eq 0 ] || { echo "== step_counters: a run failed (see '!!' above); $OUT not written; files in $WORK"; exit 1; }

echo
# shellcheck disable=SC2086
$PARSE collect $BACKWARD --gpu "$gpu" --out "$OUT" --steps "$STEPS" --metrics "$METRICS" "${runs[@]}" ||
  { echo "== step_counters: $OUT not written; files in $WORK"; exit 1; }
rm -rf "$WORK"
echo "== step_counters: done in $SECONDS s"
