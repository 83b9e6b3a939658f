#!/usr/bin/env bash
# The tour: every chapter program (scripts/chapters.tsv) on its defaults, then one summary table of all their rows.
#   scripts/tour.sh [BUILD_DIR]     default BUILD_DIR: build (configure and build first, see README.md)
# Without an NVIDIA GPU nothing can run: the tour says so and shows the results committed in
# docs/results/ for a named GPU instead (exit 0). Exit 1 if a program fails, 2 on bad usage.
set -uo pipefail
usage() { sed -n '2,5s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "tour.sh: unknown option '$1'" >&2; usage >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "tour.sh: one argument at most (the build folder)" >&2; exit 2; }
cd "$(dirname "$0")/.."
BUILD=${1:-build}

# One line per result row (the project's CSV format).
summary() {
  awk -F, 'NR == 1 { next }
           { printf "%-4s %-22s %-4s B=%-2s H=%-3s Nq=%-6s Nk=%-6s d=%-4s c=%s %10.4f ms %8.2f TFLOP/s %8.1f GB/s  err %s\n",
                    $2, $3, $4, $6, $7, $9, $10, $11, $12, $14, $15, $16, $19 }' "$@"
}

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  committed=$(ls docs/results/*.csv 2>/dev/null | grep -Ev "_(io|steps)\.csv$" | head -1)
  echo "No NVIDIA GPU found here: the chapter programs run their kernels on one, so the tour cannot run them."
  echo "What you can do without a GPU: build everything and run the CPU tests (README, Quick start), and read"
  echo "the chapters. What the tour shows on a GPU, as measured by scripts/measure.sh and committed in ${committed:-docs/results/}:"
  if [ -n "$committed" ]; then
    gpu=$(awk -F, 'NR == 2 { gsub(/"/, "", $1); print $1 }' "$committed")
    echo
    echo "== committed results on an $gpu at the programs' default sizes (the full set: $committed)"
    # The rows each program prints on its defaults (00: B=1 H=16 N=1024; 01: its softmax sweep and
    # B=1 H=16 N=1024; 02: B=4 H=32 N=1024; 03: B=4 H=16 N=1024; 04: B=1 H=16 N=4096), d = 64, no mask.
    awk -F, 'NR == 1 { print; next }
             $11 == 0 || ($11 == 64 && $12 == 0 && $13 == 0 && $9 == $10 && $7 == $8 &&
                          index(" 1,16,1024 4,32,1024 4,16,1024 1,16,4096 ", " " $6 "," $7 "," $9 " ")) {
               key = $2 FS $3 FS $4 FS $6 FS $7 FS $9 FS $10
               if (!seen[key]++) print
             }' "$committed" | summary
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
