#!/usr/bin/env python3
"""Chapter 05's steps under Nsight Compute: the counters that explain each step's gain, one row per step.

    python3 docs/step_counters.py table docs/results/<gpu>_steps.csv      # the tables of 05's README, section 4
    python3 docs/step_counters.py table docs/results/<gpu>_bwd_steps.csv  # the backward's (BACKWARD.md, section 5)

scripts/step_counters.sh runs chapter 05's program under ncu (every forward step, one launch each; with --backward
every backward step in both dQ modes) and uses the other subcommands:
    metrics [--backward]             the metrics profiled (one ncu pass list), comma-separated
    steps [--backward] HELP_FILE     the steps the program's --help lists for --kernel (--bwd-kernel), in ladder order
    collect [--backward] --gpu G --out CSV --steps a,b,... D=RAW_CSV=LOG ...
                                     pairs the Nth launch of chapter 05's `kernel` in each ncu report (its raw page,
                                     RAW_CSV) with the Nth step, checks that LOG (the program's output) checked those
                                     steps in that order, writes CSV and prints the tables: one counter per step
                                     (EXPLAINS), then every counter, one table per head dim. With --backward: per
                                     step, the K/V-block kernel `kv_kernel` of the atomic dQ mode, the same kernel of
                                     the deterministic mode and the deterministic mode's `dq_kernel`, in that order
                                     (BWD_EXPLAINS, BWD_COLUMNS)

The CSV (docs/results/<gpu>_steps.csv) has one row per step, head dim and metric: gpu, step, d, metric, value, unit.
Values are in the unit named (time in ns, bytes in byte; ncu's own unit otherwise, never scaled). The backward's
(<gpu>_bwd_steps.csv) has the same columns; its step is the step and dQ mode of the K/V-block kernel
(bwd_v5_vec_atomic/atomic_dq, bwd_v5_vec_atomic/determ_dq) or the deterministic mode's dQ kernel
(bwd_v5_vec_atomic/determ_dq/dq_kernel).
"""
import argparse
import csv
import math
import os
import re
import sys

SUFFIX = "_steps.csv"  # how scripts/step_counters.sh names its files, and how docs/plot.py leaves them out

# The metrics (one ncu pass list), in the CSV's order.
NAMES = [
    "gpu__time_duration.sum",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",  # every tensor instruction: mma.sync, wgmma
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active",
    "sm__warps_active.avg.pct_of_peak_sustained_active",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",  # LSU only: wgmma's and TMA's shared-memory traffic is not in it
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
    "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio",
    "smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio",
    "dram__bytes_read.sum",
    "dram__bytes_write.sum",
    "sm__inst_executed.sum",  # warp instructions
]
# The tables' columns: (header, the metrics added up, scale from the CSV's unit, digits). Stall columns are warps
# stalled for that reason per issued instruction (ncu's "per issue active" ratios).
COLUMNS = [
    ("time (us)", NAMES[0:1], 1e-3, 0),
    ("tensor pipe %", NAMES[1:2], 1, 1),
    ("HMMA pipe %", NAMES[2:3], 1, 1),
    ("issue slots %", NAMES[3:4], 1, 1),
    ("instructions (M)", NAMES[14:15], 1e-6, 1),
    ("occupancy %", NAMES[4:5], 1, 1),
    ("smem wavefronts (M)", NAMES[5:6], 1e-6, 1),
    ("bank conflicts (M)", NAMES[6:7], 1e-6, 1),
    ("barrier", NAMES[7:8], 1, 2),
    ("long sb", NAMES[8:9], 1, 2),
    ("short sb", NAMES[9:10], 1, 2),
    ("mio throttle", NAMES[10:11], 1, 2),
    ("math throttle", NAMES[11:12], 1, 2),
    ("DRAM MB (read + write)", NAMES[12:14], 1e-6, 1),
]
KERNEL = "kernel"  # every step's kernel is wsq::(anonymous namespace)::kernel<...>; chapter 04's is forward_kernel
# Units ncu may print when it scales (older versions, or without --print-units base), to the CSV's unit.
TIME = {"nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}
BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "Tbyte": 1e12, "KB": 1e3, "MB": 1e6, "GB": 1e9}
PREFIX = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}

# The one counter that should explain each step's gain over the step before it, as 05's README (section 4) words it:
# step -> (column of COLUMNS, the counter, what it should show).
EXPLAINS = {
    "split_k": ("smem wavefronts (M)", "shared-memory wavefronts (millions)",
                "the warps' partial $\\tilde O$, $m$, $\\ell$ added up through shared memory"),
    "v1_mma": ("smem wavefronts (M)", "the same", "split-Q: each warp owns its rows, no reduction through shared memory"),
    "v2_ldmatrix": ("bank conflicts (M)", "shared-memory bank conflicts (millions)",
                    "fewer load instructions, the same 8-way conflicts"),
    "v3_swizzle": ("bank conflicts (M)", "the same", "none left"),
    "v4_cp_async": ("long sb", "warps waiting on a global load (long scoreboard), per issued instruction",
                    "fewer waits on global loads"),
    "v5_regs_p": ("smem wavefronts (M)", "shared-memory wavefronts (millions)", "$P$'s stores and reloads gone"),
    "v6_exp2": ("instructions (M)", "warp instructions executed (millions)",
                "one `ex2` and a subtract per element instead of `expf`'s multiply"),
    "v7_tiles": ("occupancy %", "achieved occupancy (%)",
                 "at d = 64 one block of 8 warps per SM, where step 6 ran 12 warps (a loss)"),
    "v8_two_row_tiles": ("smem wavefronts (M)", "shared-memory wavefronts (millions)", "half the shared reads per mma"),
    "v9_wgmma_tma": ("tensor pipe %", "tensor pipe busy, `mma.sync` and `wgmma` (%)",
                     "`wgmma` reads shared memory itself"),
    "v10_pingpong": ("tensor pipe %", "the same", "one warpgroup's products overlap the other's softmax"),
}


# The backward (BACKWARD.md, section 5): the forward's metrics, and the global atomics that add dQ up in atomic
# mode. An atomicAdd whose result is unused may run as a reduction (RED) or an atomic (ATOM) instruction, whichever
# the compiler emits: the tables add the two up, the CSV keeps them apart.
ATOMICS = [
    "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",  # warp-level requests of global reductions
    "l1tex__t_requests_pipe_lsu_mem_global_op_atom.sum",
    "lts__t_sectors_srcunit_tex_op_red.sum",  # the 32-byte L2 sectors they touch
    "lts__t_sectors_srcunit_tex_op_atom.sum",
    "lts__t_sectors_op_red.sum",  # every L2 reduction, whoever sends it: also the Hopper steps' bulk reduce-adds (TMA)
]
BWD_NAMES = NAMES + ATOMICS
BWD_COLUMNS = COLUMNS + [
    ("atomic requests (M)", [ATOMICS[0], ATOMICS[1]], 1e-6, 2),
    ("L2 atomic sectors (M)", [ATOMICS[2], ATOMICS[3]], 1e-6, 1),
    ("L2 reduction sectors, all units (M)", [ATOMICS[4]], 1e-6, 1),
]
MODES = ["atomic_dq", "determ_dq"]  # the program's order; its check lines name <step>_<mode>
KV_KERNEL, DQ_KERNEL = "kv_kernel", "dq_kernel"  # every step's K/V-block kernel; backward/bwd_dq.cu's, shared by every step
DQ_ROW = "/dq_kernel"  # the deterministic mode's dQ kernel: <step>/determ_dq/dq_kernel
# (step, d) whose deterministic mode adds dQ in its K/V kernel, in a fixed order, and so launches no dq_kernel
# (BACKWARD.md section 11.7).
DQ_IN_KV = {("bwd_v14_dq_ordered", 64), ("bwd_v14_dq_ordered", 128)}
# Per backward step, the counters that should explain its gain over the step before it, as BACKWARD.md (sections 3
# and 5) words it: step -> [(column of BWD_COLUMNS, the counter, what it should show), ...]. A step not here (a newer
# one) gets a row of "—".
BWD_EXPLAINS = {
    "bwd_v1_mma": [("instructions (M)", "warp instructions executed (millions)",
                    "the five products on tensor cores; no step before it: the count the later steps cut"),
                   ("tensor pipe %", "tensor pipe busy (%)",
                    "how much of the tensor cores the tensor-core backward keeps busy before any tuning")],
    "bwd_v2_regs": [("smem wavefronts (M)", "shared-memory wavefronts (millions)",
                     "$P^\\top$, $dS^\\top$ not stored and reloaded for lines 7-8 "
                     "(atomic mode still stores $dS^\\top$ for $dQ$)")],
    "bwd_v3_cp_async": [("long sb", "warps waiting on a global load (long scoreboard), per issued instruction",
                         "$Q_i$, $dO_i$ arrive while the previous tile computes (the wait may move to the barrier)")],
    "bwd_v4_exp2": [("instructions (M)", "warp instructions executed (millions)",
                     "one FFMA and one `ex2` per element instead of `expf`, the mask tested once per tile")],
    "bwd_v5_vec_atomic": [("atomic requests (M)", "global atomic requests (millions)",
                           "one `float2` atomic for two columns: half the requests (atomic mode, sm_90)"),
                          ("L2 atomic sectors (M)", "L2 sectors the atomics touch (millions)",
                           "8 full sectors per request instead of 8 half-used ones: half the sectors")],
    "bwd_v6_bc128": [("atomic requests (M)", "global atomic requests (millions)",
                      "one pass of $B_r \\times d$ atomics per tile now serves 128 keys: half the requests"),
                     ("instructions (M)", "warp instructions executed (millions)",
                      "half the atomic instructions and half the $Q_i$, $dO_i$ copies per FLOP")],
    "bwd_v7_br64": [("barrier", "warps waiting at a barrier, per issued instruction",
                     "half the tiles at d = 128: half the barriers per FLOP (d = 64: step 6 itself)"),
                    ("smem wavefronts (M)", "shared-memory wavefronts (millions)",
                     "each $K_j$, $V_j$ fragment load of line 5 feeds twice the mma")],
    "bwd_v8_kv_frags": [("smem wavefronts (M)", "shared-memory wavefronts (millions)",
                         "d = 64: line 5's $K_j$, $V_j$ fragments loaded once per block, not per tile "
                         "(d = 128: step 7 itself)"),
                        ("instructions (M)", "warp instructions executed (millions)",
                         "8 fewer `ldmatrix.x4` per warp and tile at d = 64")],
    # The Hopper steps (BACKWARD.md section 11.4), on an sm_90 GPU.
    "bwd_v9_wgmma_tma": [("tensor pipe %", "tensor pipe busy, `mma.sync` and `wgmma` (%)",
                          "the five products on `wgmma`, operands read from shared memory by the tensor cores"),
                         ("instructions (M)", "warp instructions executed (millions)",
                          "one `wgmma` for many `mma.sync` and their `ldmatrix`")],
    "bwd_v10_dq_bulk_reduce": [("atomic requests (M)", "global atomic requests (millions)",
                                "dQ added by bulk reduce-adds from shared memory: no per-element atomics"),
                               ("L2 reduction sectors, all units (M)",
                                "L2 sectors reduced, whoever sends them (millions)",
                                "the same dQ bytes, now sent by the copy engine")],
    "bwd_v11_dq_double_buffer": [("barrier", "warps waiting at a barrier, per issued instruction",
                                  "the MMA warpgroups wait less for the writer to free a dQ tile")],
    "bwd_v12_dq_tile_reduce": [("instructions (M)", "warp instructions executed (millions)",
                                "two 16 KiB bulk copies per tile instead of 128 of 256 bytes"),
                               ("barrier", "warps waiting at a barrier, per issued instruction",
                                "the writer no longer holds the MMA warpgroups back")],
    "bwd_v13_br128": [("barrier", "warps waiting at a barrier, per issued instruction",
                       "d = 64: half the tiles per K/V block, half the per-tile waits per FLOP (d = 128: step 12)"),
                      ("L2 reduction sectors, all units (M)", "L2 sectors reduced, whoever sends them (millions)",
                       "d = 64: dQ split by rows, half the bytes reduced")],
    "bwd_v14_dq_ordered": [("time (us)", "kernel time (us)",
                            "deterministic: no second dQ kernel (no `dq_kernel` row), at d = 64 and 128")],
}


class Error(Exception):
    """A report or a log that does not match what was run: the script says so and writes nothing."""


def function_name(name):
    """'void wsq::(anonymous namespace)::kernel<__half, (int)64>(fa::Problem)' -> 'kernel'."""
    name = name.replace("(anonymous namespace)", "")
    while re.search(r"<[^<>]*>", name):  # template arguments, innermost first (they may hold parentheses)
        name = re.sub(r"<[^<>]*>", "", name)
    return name.split("(")[0].split("::")[-1].split()[-1]


def steps_from_help(text, flag="--kernel"):
    """The forward steps (flag --bwd-kernel: the backward's), in ladder order, from that line of the --help."""
    for line in text.splitlines():
        m = re.match(r"\s*" + re.escape(flag) + r"\b.*?steps separated by commas:\s*([^(\[]+)", line)
        if m:
            steps = [s.strip() for s in m.group(1).split(",") if s.strip()]
            if steps:
                return steps
    raise Error(f"the program's --help has no '{flag} ... steps separated by commas: a, b, ...' line")


def checked_steps(log):
    """The steps the program checked, in order: its 'check:   <step> ...' lines (ncu's own lines start '==')."""
    return [m.group(1) for m in re.finditer(r"^check:\s+(\S+)", log, re.M)]


def checked_backward(log):
    """The backward runs the program checked, in order: its 'check:   backward <step>_<mode>, ...' lines."""
    return [m.group(1) for m in re.finditer(r"^check:\s+backward\s+([^\s,]+)", log, re.M)]


def normalise(value, unit):
    """(value, unit) as ncu printed them -> (value, unit) in the CSV's unit: ns, byte, or ncu's unscaled unit."""
    if unit in TIME:
        return value * TIME[unit], "ns"
    if unit in BYTES:
        return value * BYTES[unit], "byte"
    m = re.fullmatch(r"([KMGT])([a-z_]{2,})", unit or "")
    if m:  # a scaled count (Kwavefront ...); lower-case prefixes (msecond) are handled above
        return value * PREFIX[m.group(1)], m.group(2)
    return value, unit or ""


def number(text):
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return math.nan  # "n/a": a metric this GPU has no value for


def launches(path, metrics):
    """The profiled launches of KERNEL in launch order: a list of {metric: (value, unit)}; other kernels left out."""
    return [values for name, values in named_launches(path, metrics) if name == KERNEL]


def named_launches(path, metrics):
    """Every profiled launch in launch order: a list of (function name, {metric: (value, unit)})."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    try:
        head = next(i for i, r in enumerate(rows) if "ID" in r)
    except StopIteration:
        raise Error(f"{path}: no header row (with 'ID') in ncu's raw page") from None
    cols = rows[head]
    missing = [m for m in metrics if m not in cols]
    if missing:
        raise Error(f"{path}: ncu reported no column for {', '.join(missing)}")
    units, data = {}, rows[head + 1:]
    if data and data[0][cols.index("ID")] == "":  # the units row
        units = dict(zip(cols, data[0]))
        data = data[1:]
    name_col = next((c for c in ("Kernel Name", "Function Name", "Demangled Name") if c in cols), None)
    if name_col is None:
        raise Error(f"{path}: no kernel name column")
    got = []
    for r in sorted(data, key=lambda r: int(r[cols.index("ID")])):
        got.append((function_name(r[cols.index(name_col)]),
                    {m: normalise(number(r[cols.index(m)]), units.get(m, "")) for m in metrics}))
    return got


def assign(steps, profiled, checked, d):
    """Step k <- the kth launch (the program runs each step once with --iters 0, in the order --help lists)."""
    if checked != steps:
        raise Error(f"d = {d}: the program checked the steps\n    {' '.join(checked) or '(none)'}\n"
                    f"  its --help lists\n    {' '.join(steps)}")
    if len(profiled) != len(steps):
        raise Error(f"d = {d}: ncu profiled {len(profiled)} launches of '{KERNEL}' for {len(steps)} steps "
                    f"({' '.join(steps)}): one launch per step was expected")
    return list(zip(steps, profiled))


def assign_backward(steps, profiled, checked, d):
    """Per step, in --bwd-kernel's order (the program runs each once per dQ mode with --iters 0): the atomic mode's
    kv_kernel, the deterministic mode's kv_kernel, then its dq_kernel (none for the steps of DQ_IN_KV). Other kernels
    (the forward that makes O, the rowsum D, chapter 04's) are left out; any other count or order of these two is an
    error."""
    runs = [f"{s}_{m}" for s in steps for m in MODES]
    if checked != runs:
        raise Error(f"d = {d}: the program checked the backward runs\n    {' '.join(checked) or '(none)'}\n"
                    f"  its --help's steps in both dQ modes are\n    {' '.join(runs)}")
    ours = [(name, v) for name, v in profiled if name in (KV_KERNEL, DQ_KERNEL)]
    has_dq = [(s, int(d)) not in DQ_IN_KV for s in steps]
    want = [k for dq in has_dq for k in [KV_KERNEL, KV_KERNEL] + [DQ_KERNEL] * dq]
    got = [name for name, _ in ours]
    if got != want:
        raise Error(f"d = {d}: ncu profiled {got.count(KV_KERNEL)} launches of '{KV_KERNEL}' and "
                    f"{got.count(DQ_KERNEL)} of '{DQ_KERNEL}' for {len(steps)} steps x {len(MODES)} dQ modes "
                    f"({' '.join(steps)}): per step '{KV_KERNEL}' (atomic dQ), '{KV_KERNEL}' then '{DQ_KERNEL}' "
                    f"(deterministic) was expected; in launch order ncu saw\n    {' '.join(got) or '(none)'}")
    keys = [k for s, dq in zip(steps, has_dq)
            for k in [f"{s}/{MODES[0]}", f"{s}/{MODES[1]}"] + [f"{s}/{MODES[1]}{DQ_ROW}"] * dq]
    return [(key, v) for key, (_, v) in zip(keys, ours)]


def rows_of(gpu, d, pairs, metrics):
    return [[gpu, step, d, m, f"{v[m][0]:.10g}" if not math.isnan(v[m][0]) else "", v[m][1]]
            for step, v in pairs for m in metrics]


def write_csv(path, rows):
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path + ".tmp", "w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["gpu", "step", "d", "metric", "value", "unit"])
        w.writerows(rows)
    os.replace(path + ".tmp", path)


def _by_d(rows):
    """{d: {step: {metric: value}}} and {d: [steps in the CSV's order]}."""
    by_d, order = {}, {}
    for gpu, step, d, metric, value, unit in rows:
        by_d.setdefault(int(d), {}).setdefault(step, {})[metric] = value
        order.setdefault(int(d), [])
        if step not in order[int(d)]:
            order[int(d)].append(step)
    return by_d, order


def _cell(values, metrics, scale, digits):
    v = [values.get(m, "") for m in metrics]
    return "n/a" if "" in v else f"{sum(map(float, v)) * scale:,.{digits}f}"


def tables(rows, columns=COLUMNS):
    """One markdown table per head dim: rows = steps (in the CSV's order), the columns whose metrics are present."""
    by_d, order = _by_d(rows)
    present = {r[3] for r in rows}
    cols = [c for c in columns if all(m in present for m in c[1])]
    out = []
    for d in sorted(by_d):
        out.append(f"d = {d}:\n")
        out.append("| step | " + " | ".join(c[0] for c in cols) + " |")
        out.append("|---|" + "---|" * len(cols))
        for step in order[d]:
            out.append(f"| {step} | " + " | ".join(_cell(by_d[d][step], *c[1:]) for c in cols) + " |")
        out.append("")
    return "\n".join(out)


def explain_table(rows):
    """Per step, the counter of EXPLAINS: the previous step's value -> this step's, at each head dim."""
    by_d, order = _by_d(rows)
    ds = sorted(by_d)
    column = {c[0]: c for c in COLUMNS}
    out = ["| step | counter | what it should show (§3) | " + " | ".join(f"d = {d}" for d in ds) + " |",
           "|---|---|---|" + "---|" * len(ds)]
    for k, step in enumerate(order[ds[0]]):
        if step not in EXPLAINS:
            continue
        header, counter, why = EXPLAINS[step]
        _, metrics, scale, digits = column[header]
        cells = []
        for d in ds:
            steps = order[d]
            now = _cell(by_d[d].get(step, {}), metrics, scale, digits)
            i = steps.index(step) if step in steps else 0
            cells.append(now if i == 0 else f"{_cell(by_d[d][steps[i - 1]], metrics, scale, digits)} → {now}")
        out.append(f"| {step} | {counter} | {why} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def explain_backward(rows):
    """Per backward step, the counters of BWD_EXPLAINS in each dQ mode's K/V-block kernel: the previous step's value ->
    this step's (the first step: its value), at each head dim. A step BWD_EXPLAINS does not know gets a row of —."""
    by_d, order = _by_d(rows)
    ds = sorted(by_d)
    column = {c[0]: c for c in BWD_COLUMNS}
    heads = [f"d = {d}, {mode.replace('_dq', '')}" for d in ds for mode in MODES]
    out = ["| step | counter | what it should show | " + " | ".join(heads) + " |",
           "|---|---|---|" + "---|" * len(heads)]
    steps = []
    for key in order[ds[0]]:
        if key.split("/")[0] not in steps:
            steps.append(key.split("/")[0])
    for k, step in enumerate(steps):
        if step not in BWD_EXPLAINS:
            out.append(f"| {step} | — | — | " + " | ".join("—" for _ in heads) + " |")
            continue
        for n, (header, counter, why) in enumerate(BWD_EXPLAINS[step]):
            _, metrics, scale, digits = column[header]
            cells = []
            for d in ds:
                for mode in MODES:
                    now = _cell(by_d[d].get(f"{step}/{mode}", {}), metrics, scale, digits)
                    before = f"{steps[k - 1]}/{mode}"
                    cells.append(now if k == 0 or before not in by_d[d] else
                                 f"{_cell(by_d[d][before], metrics, scale, digits)} → {now}")
            out.append(f"| {step if n == 0 else ''} | {counter} | {why} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def is_backward(rows):
    return any("/" in r[1] for r in rows)


def report(rows):
    if not rows:
        raise Error("no rows")
    if is_backward(rows):
        return ("One counter per backward step, in the K/V-block kernel of each dQ mode (the previous step's value → "
                "this step's):\n\n" + explain_backward(rows) + "\nEvery counter (<step>/<dQ mode>: its K/V-block "
                "kernel; .../dq_kernel: the deterministic mode's dQ kernel):\n\n" + tables(rows, BWD_COLUMNS))
    return ("One counter per step (the previous step's value → this step's):\n\n" + explain_table(rows) +
            "\nEvery counter:\n\n" + tables(rows))


def read_csv(path):
    try:
        with open(path, newline="", encoding="utf-8") as f:
            r = csv.reader(f)
            head = next(r, None)
            if head != ["gpu", "step", "d", "metric", "value", "unit"]:
                raise Error(f"{path}: not a {SUFFIX} file (header {head})")
            return [row for row in r if row]
    except UnicodeDecodeError:
        raise Error(f"{path}: not a {SUFFIX} file (not text)") from None


def collect(args):
    steps = [s for s in args.steps.split(",") if s]
    metrics = [m for m in args.metrics.split(",") if m] if args.metrics else (BWD_NAMES if args.backward else NAMES)
    rows = []
    for run in args.runs:
        d, raw, log = run.split("=", 2)
        with open(log, errors="replace") as f:
            text = f.read()
        if args.backward:
            pairs = assign_backward(steps, named_launches(raw, metrics), checked_backward(text), d)
        else:
            pairs = assign(steps, launches(raw, metrics), checked_steps(text), d)
        rows += rows_of(args.gpu, d, pairs, metrics)
    write_csv(args.out, rows)
    print(report(rows))
    print(f"== step_counters: {len(rows)} rows in {args.out}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    backward = {"action": "store_true", "help": "the backward steps (both dQ modes) instead of the forward's"}
    sub.add_parser("metrics", help="the metrics, comma-separated").add_argument("--backward", **backward)
    st = sub.add_parser("steps", help="the steps of the program's --help (a file)")
    st.add_argument("--backward", **backward)
    st.add_argument("help_file")
    c = sub.add_parser("collect", help="ncu reports -> CSV and tables")
    c.add_argument("--backward", **backward)
    c.add_argument("--gpu", required=True)
    c.add_argument("--out", required=True)
    c.add_argument("--steps", required=True, help="the steps, comma-separated, in launch order")
    c.add_argument("--metrics", default="",
                   help="the metrics profiled, comma-separated (default: all of NAMES, BWD_NAMES with --backward)")
    c.add_argument("runs", nargs="+", help="D=RAW_CSV=LOG for each head dim")
    sub.add_parser("table", help="the markdown tables of a _steps.csv").add_argument("csv")
    args = ap.parse_args()
    try:
        if args.command == "metrics":
            print(",".join(BWD_NAMES if args.backward else NAMES))
        elif args.command == "steps":
            with open(args.help_file, errors="replace") as f:
                print(",".join(steps_from_help(f.read(), "--bwd-kernel" if args.backward else "--kernel")))
        elif args.command == "collect":
            collect(args)
        else:
            print(report(read_csv(args.csv)))
    except (Error, OSError) as e:
        sys.exit(f"step_counters: {e}")


if __name__ == "__main__":
    main()
