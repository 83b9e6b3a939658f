#!/usr/bin/env bash
# The tour: every finished chapter's program on its defaults, then one summary table of all rows.
#   scripts/tour.sh [BUILD_DIR]     (default: build; configure and build first, see README.md)
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
CSV="$BUILD/tour.csv"
rm -f "$CSV"
rc=0
# chapter folder : program
for entry in 00_naive:naive 01_online_softmax:online_softmax 02_fa1_forward:fa1_forward \
             03_fa1_backward:fa1_backward 04_fa2:fa2; do
  dir=${entry%%:*} prog=${entry##*:}
  [ -x "$BUILD/$dir/$prog" ] || continue
  echo "== $dir: $prog"
  "$BUILD/$dir/$prog" --csv "$CSV" || { echo "!! $prog exited $?"; rc=1; }
  echo
done
[ -f "$CSV" ] || { echo "no chapter program found in $BUILD (build first)"; exit 1; }
echo "== tour summary ($CSV)"
awk -F, 'NR == 1 { next }
         { printf "%-4s %-24s %-4s %-5s Nq=%-6s Nk=%-6s d=%-4s c=%s %10.4f ms %8.2f TFLOP/s %8.1f GB/s  err %s\n",
                  $2, $3, $4, $5, $9, $10, $11, $12, $14, $15, $16, $19 }' "$CSV"
exit $rc
