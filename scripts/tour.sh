#!/usr/bin/env bash
# The tour: every chapter program (scripts/chapters.tsv) on its defaults, then one summary table of all their rows.
#   scripts/tour.sh [BUILD_DIR]     default BUILD_DIR: build (configure and build first, see README.md)
# Without an NVIDIA GPU nothing can run: the tour says so and shows the rows a tour printed on a named GPU,
# committed as docs/results/<gpu>_tour.csv (a copy of BUILD/tour.csv), instead (exit 0). Exit 1 if a program
# fails, 2 on bad usage.
set -uo pipefail
usage() { sed -n '2,5s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "tour.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "tour.sh: one argument at most (the build folder)" >&2; exit 2; }
cd "$(dirname "$0")/.."
BUILD=${1:-build}

# One line per result row (the project's CSV format). A row without FLOPs (a copy, a softmax, a read ceiling) shows
# its GB/s alone; a row that was timed but not checked (a baseline) says so instead of its error.
summary() {
  awk -F, 'NR == 1 { next }
           { tflops = $15 > 0 ? sprintf("%8.2f TFLOP/s", $15) : sprintf("%16s", "")
             err = $19 < 0 ? "(timed, not checked)" : "err " $19
             printf "%-4s %-22s %-4s B=%-2s H=%-3s Nq=%-6s Nk=%-6s d=%-4s c=%s %10.4f ms %s %8.1f GB/s  %s\n",
                    $2, $3, $4, $6, $7, $9, $10, $11, $12, $14, tflops, $16, err }' "$@"
}

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  committed=$(ls docs/results/*_tour.csv 2>/dev/null | head -1)
  echo "No NVIDIA GPU found here: the chapter programs run their kernels on one, so the tour cannot run them."
  echo "What you can do without a GPU: build everything and run the CPU tests (README, Quick start), and read"
  echo "the chapters. What the tour printed on a GPU (its own rows, committed in ${committed:-docs/results/}):"
  if [ -n "$committed" ]; then
    gpu=$(awk -F, 'NR == 2 { gsub(/"/, "", $1); print $1 }' "$committed")
    echo
    echo "== committed results on an $gpu: every chapter program on its defaults ($committed)"
    summary "$committed"
  fi
  exit 0
fi

# Every chapter of scripts/chapters.tsv (folder and program: its 2nd and 3rd columns), in reading order.
mapfile -t CHAPTERS < <(awk -F'\t' '/^[0-9]/ { print $2 "/" $3 }' scripts/chapters.tsv)
found=0
for prog in "${CHAPTERS[@]}"; do
  [ -x "$BUILD/$prog" ] && found=$((found + 1))
done
[ "$found" -gt 0 ] || { echo "tour.sh: no chapter program in $BUILD: build first (README, Quick start)" >&2; exit 1; }

CSV="$BUILD/tour.csv"
rm -f "$CSV"
rc=0
k=0
for prog in "${CHAPTERS[@]}"; do
  [ -x "$BUILD/$prog" ] || continue
  k=$((k + 1))
  echo "== step $k/$found: ${prog%%/*} ($BUILD/$prog)"
  "$BUILD/$prog" --csv "$CSV" || { echo "!! ${prog##*/} exited $?"; rc=1; }
  echo
done
echo "== tour summary ($CSV)"
[ -f "$CSV" ] && summary "$CSV"
exit $rc
