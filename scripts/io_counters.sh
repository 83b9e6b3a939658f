#!/usr/bin/env bash
# IO verified: the HBM bytes each chapter's traffic model predicts (the model_hbm_bytes of its result row) next
# to the DRAM bytes Nsight Compute counts for the same pass (dram__bytes_read.sum + dram__bytes_write.sum,
# summed over the pass's kernel launches), one moderate shape per chapter. docs/io.md explains the method.
#   scripts/io_counters.sh [BUILD_DIR] [OUT_CSV]   default: build, docs/results/<gpu>_io.csv
# Then `python3 docs/plot.py` draws docs/figures/<g>_io.png from it. Needs an NVIDIA GPU, Nsight Compute's ncu
# (on PATH, in the CUDA toolkit's bin, or NCU=/path/to/ncu) and python3; about 2 minutes on an H100.
# Exit 0 done, 1 no GPU, no ncu, a program failed or a count did not match its launches, 2 bad usage.
set -uo pipefail
usage() { sed -n '2,8s/^# \{0,1\}//p' "$0"; }
case "${1:-}" in
  -h | --help) usage; exit 0 ;;
  -*) echo "io_counters.sh: unknown option '$1'; see --help" >&2; exit 2 ;;
esac
[ $# -le 2 ] || { echo "io_counters.sh: at most two arguments (BUILD_DIR, OUT_CSV); see --help" >&2; exit 2; }
cd "$(dirname "$0")/.." || exit 1
B=${1:-build}

if ! nvidia-smi -L 2>/dev/null | grep -q "^GPU"; then
  echo "io_counters.sh: no NVIDIA GPU found (nvidia-smi lists none): there are no DRAM counters to read here." >&2
  echo "docs/io.md shows the method and the commands; the traffic models themselves are CPU-tested." >&2
  exit 1
fi
. scripts/find_ncu.sh
find_ncu io_counters.sh
command -v python3 >/dev/null || { echo "io_counters.sh: python3 is needed to add up the counters" >&2; exit 1; }
for prog in 00_naive/naive 03_fa1_backward/fa1_backward 04_fa2/fa2 05_warp_split_q/warp_split_q \
            06_flash_decoding/flash_decoding; do
  [ -x "$B/$prog" ] || { echo "io_counters.sh: $B/$prog not found: build first (README, Quick start)" >&2; exit 1; }
done
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
slug=$(echo "${gpu:-unknown}" | tr '[:upper:]' '[:lower:]' | tr -cs 'a-z0-9' '_' | sed 's/_$//')
OUT=${2:-docs/results/${slug}_io.csv}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/io_counters.XXXXXX") || exit 1

# One moderate shape for chapters 00-05 (S and P of 00 are 256 MiB each: far larger than the 50 MB L2), and
# one decode step for 06 (K and V: 128 MiB in fp16).
SHAPE="--batch 1 --heads 16 --q-len 2048 --head-dim 64"
DECODE="--batch 1 --heads 32 --kv-heads 8 --q-len 1 --kv-len 32768 --head-dim 128 --dtype fp16"
# The program runs: id|program and its flags. Each runs twice: under ncu with --iters 0 (each pass runs once,
# for its check: nothing is timed), and alone with --iters 1 --warmup 0 --csv for the rows' model_hbm_bytes.
# Chapter 03's program runs 02's forward before its backward, so it gives 02's row too.
RUNS=(
  "00|00_naive/naive $SHAPE --backward"
  "03|03_fa1_backward/fa1_backward $SHAPE"
  "04|04_fa2/fa2 $SHAPE --backward --no-previous"
  "05|05_warp_split_q/warp_split_q $SHAPE --dtype fp16 --kernel v7_tiles --no-previous"
  "06|06_flash_decoding/flash_decoding $DECODE --kernel all"
)
# The measurements: run id|chapter|kernel|pass (the result row's)|the launches of the run whose kernel is one of
# the names listed, in launch order, with the measured pass's launches in [brackets]. Launches of other kernels
# (06's input fill, chapter 00's inside run 03) are left out; a run whose launches of the listed kernels differ
# from the list is reported as an error, not guessed at.
MEASURE=(
  "00|00|naive|fwd|[batched_gemm softmax_rows batched_gemm] batched_gemm batched_gemm softmax_backward_rows batched_gemm batched_gemm"
  "00|00|naive|bwd|batched_gemm softmax_rows batched_gemm [batched_gemm batched_gemm softmax_backward_rows batched_gemm batched_gemm]"
  "03|02|fa1_forward|fwd|[fa1_forward_kernel] fa1_backward_kernel"
  "03|03|fa1_backward|bwd|fa1_forward_kernel [fa1_backward_kernel]"
  "04|04|v4_micro_tile|fwd|[forward_kernel] rowsum_do_o_kernel backward_kv_kernel rowsum_do_o_kernel backward_kv_kernel backward_dq_kernel"
  "04|04|fa2_atomic_dq|bwd|forward_kernel [rowsum_do_o_kernel backward_kv_kernel] rowsum_do_o_kernel backward_kv_kernel backward_dq_kernel"
  "04|04|fa2_determ_dq|bwd|forward_kernel rowsum_do_o_kernel backward_kv_kernel [rowsum_do_o_kernel backward_kv_kernel backward_dq_kernel]"
  "05|05|v7_tiles|fwd|forward_kernel [kernel]"
  "06|06|fa2_grid|fwd|[split_kernel] split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv|fwd|split_kernel [split_kernel merge_kernel] split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv_gqa|fwd|split_kernel split_kernel merge_kernel [split_kernel merge_kernel] split_kernel merge_kernel split_kernel split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv_pipelined|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel [split_kernel merge_kernel] split_kernel split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv_fused|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel [split_kernel] split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv_mma|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel [split_kernel] even_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|split_kv_even|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel [even_kernel] split_kernel merge_kernel split_kernel merge_kernel split_kernel"
  "06|06|unified_max|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel even_kernel [split_kernel merge_kernel] split_kernel merge_kernel split_kernel"
  "06|06|paged|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel even_kernel split_kernel merge_kernel [split_kernel merge_kernel] split_kernel"
  "06|06|flat_gemm|fwd|split_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel merge_kernel split_kernel split_kernel even_kernel split_kernel merge_kernel split_kernel merge_kernel [split_kernel]"
)

# Values in bytes where this ncu can say so (older ones scale to Kbyte, Mbyte, ...: the units row says which).
units=""
"$NCU" --help 2>/dev/null | grep -q -- "--print-units" && units="--print-units base"
echo "== io_counters: $gpu, $NCU"
rc=0
n=${#RUNS[@]}
for k in "${!RUNS[@]}"; do
  id=${RUNS[$k]%%|*}
  cmd="$B/${RUNS[$k]#*|}"
  # ncu profiles only the kernels this run's measurements name (a regex of those names; the sum checks them).
  names=$(printf '%s\n' "${MEASURE[@]}" | awk -F'|' -v id="$id" '$1 == id { print $5 }' | tr -d '[]' | tr ' ' '\n' |
          sort -u | paste -sd'|')
  echo
  echo "== run $((k + 1))/$n ($id): ncu on $cmd --iters 0"
  # shellcheck disable=SC2086  # cmd is a command line of words
  "$NCU" --target-processes all --metrics dram__bytes_read.sum,dram__bytes_write.sum --kernel-name "regex:$names" \
    --export "$WORK/$id" --force-overwrite $cmd --iters 0 >"$WORK/$id.ncu.log" 2>&1 ||
    { tail -20 "$WORK/$id.ncu.log"; echo "!! ncu run $id failed (log: $WORK/$id.ncu.log)"; rc=1; continue; }
  if grep -q ERR_NVGPUCTRPERM "$WORK/$id.ncu.log"; then
    echo "!! ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run as root, or allow"
    echo "   non-admin profiling (NVIDIA's page on ERR_NVGPUCTRPERM says how)"
    rc=1
    break
  fi
  # shellcheck disable=SC2086  # units is one option or none
  "$NCU" --import "$WORK/$id.ncu-rep" --csv --page raw $units >"$WORK/$id.raw.csv" 2>"$WORK/$id.import.log" ||
    { cat "$WORK/$id.import.log"; echo "!! ncu --import $id failed"; rc=1; continue; }
  echo "== run $((k + 1))/$n ($id): $cmd --iters 1 --warmup 0 (the rows' model_hbm_bytes)"
  # shellcheck disable=SC2086
  $cmd --iters 1 --warmup 0 --csv "$WORK/$id.rows.csv" >"$WORK/$id.log" 2>&1 ||
    { tail -20 "$WORK/$id.log"; echo "!! $cmd failed (log: $WORK/$id.log)"; rc=1; }
done
[ "$rc" -eq 0 ] || { echo "== io_counters: a run failed (see '!!' above); $OUT not written; files in $WORK"; exit 1; }

# Add up the counters of each measured pass and pair them with the pass's model row.
python3 - "$WORK" "$OUT" "${MEASURE[@]}" <<'EOF' || { echo "== io_counters: $OUT not written; files in $WORK"; exit 1; }
import csv, os, re, sys

work, out, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
UNIT = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9}
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def function_name(name):
    """'void ns::(anonymous namespace)::kernel<64, true>(fa::Problem, ...)' -> 'kernel' (what the lists name)."""
    name = name.replace("(anonymous namespace)", "")
    while re.search(r"<[^<>]*>", name):  # template arguments, innermost first (they may hold parentheses)
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split("(")[0].split("::")[-1].split()[-1]


def launches(path):
    """The profiled launches in launch order: (name, DRAM bytes read, DRAM bytes written)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    head = next(i for i, r in enumerate(rows) if "ID" in r and METRICS[0] in r)
    cols = rows[head]
    units, data = {}, rows[head + 1:]
    if data and data[0][cols.index("ID")] == "":  # the units row
        units = dict(zip(cols, data[0]))
        data = data[1:]
    name_col = next(c for c in ("Kernel Name", "Function Name", "Demangled Name") if c in cols)
    got = []
    for r in sorted(data, key=lambda r: int(r[cols.index("ID")])):
        v = [float(r[cols.index(m)].replace(",", "")) * UNIT[units.get(m) or "byte"] for m in METRICS]
        got.append((function_name(r[cols.index(name_col)]), v[0], v[1]))
    return got


def shape(r):
    s = f'B={r["B"]} H={r["H"]}' + (f' Hkv={r["Hkv"]}' if r["Hkv"] != r["H"] else "")
    s += f' N={r["Nq"]}' if r["Nq"] == r["Nk"] else f' Nq={r["Nq"]} Nk={r["Nk"]}'
    return s + f' d={r["d"]} {r["dtype"]}' + (" causal" if r["causal"] != "0" else "")


cache, lines, bad = {}, [], []
for spec in specs:
    run, chapter, kernel, pas, expect = spec.split("|")
    if run not in cache:
        with open(os.path.join(work, run + ".rows.csv"), newline="") as f:
            cache[run] = (launches(os.path.join(work, run + ".raw.csv")), list(csv.DictReader(f)))
    profiled, rows = cache[run]
    tokens = expect.split()
    names = [t.strip("[]") for t in tokens]
    measured, inside = [], False
    for t in tokens:
        inside = inside or t.startswith("[")
        measured.append(inside)
        inside = inside and not t.endswith("]")
    seen = [x for x in profiled if x[0] in set(names)]
    if [x[0] for x in seen] != names:
        bad.append(f"{chapter} {kernel} {pas}: expected the launches\n    {' '.join(names)}\n"
                   f"  ncu profiled\n    {' '.join(x[0] for x in seen) or '(none)'}")
        continue
    row = [r for r in rows if (r["chapter"], r["kernel"], r["pass"]) == (chapter, kernel, pas)]
    if len(row) != 1:
        bad.append(f"{chapter} {kernel} {pas}: {len(row)} rows of that name in the run's CSV")
        continue
    row = row[0]
    read = sum(x[1] for x, m in zip(seen, measured) if m)
    write = sum(x[2] for x, m in zip(seen, measured) if m)
    model = float(row["model_hbm_bytes"])
    used = "+".join(n for n, m in zip(names, measured) if m)
    lines.append([row["gpu"], chapter, kernel, pas, shape(row), f"{model:.0f}", f"{read:.0f}", f"{write:.0f}",
                  f"{(read + write) / model:.4f}", used])
if bad:
    sys.exit("io_counters: " + "\n".join(bad))
os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
with open(out + ".tmp", "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["gpu", "chapter", "kernel", "pass", "shape", "model_hbm_bytes", "dram_read", "dram_write", "ratio",
                "launches"])
    w.writerows(lines)
os.replace(out + ".tmp", out)
print(f"\n{'chapter':8} {'kernel':16} {'pass':4} {'shape':42} {'model MB':>10} {'read MB':>10} {'write MB':>10} "
      f"{'ratio':>7}")
for l in lines:
    print(f"{l[1]:8} {l[2]:16} {l[3]:4} {l[4]:42} {float(l[5]) / 1e6:10.1f} {float(l[6]) / 1e6:10.1f} "
          f"{float(l[7]) / 1e6:10.1f} {float(l[8]):7.3f}")
print(f"\n== io_counters: {len(lines)} rows in {out} (ratio = (read + write) / model; docs/io.md says how to read it)")
EOF
rm -rf "$WORK"
echo "== io_counters: done in $SECONDS s"
