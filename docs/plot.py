#!/usr/bin/env python3
"""Regenerate every PNG in docs/figures/ from the measured rows in docs/results/*.csv.

    python3 docs/plot.py                                   # all figures, from docs/results/ into docs/figures/
    python3 docs/plot.py --results DIR --out DIR           # other folders (the CPU test uses this)
    python3 docs/plot.py --roofline-table                  # also print the roofline table of docs/roofline.md
    python3 docs/plot.py --readme-table                    # also print the results table of the top README
    python3 docs/plot.py --io-table                        # also print the table of docs/io.md

One CSV per GPU (scripts/measure.sh writes docs/results/<gpu>.csv). For each, with <g> the GPU's short name
(h100 for "NVIDIA H100 80GB HBM3"):
    <g>_fwd.png, <g>_bwd.png   TFLOP/s against N (Nq = Nk) for the fp32 chapters 00-04 and PyTorch SDPA,
                               B = 1, H = 16, one panel per (head_dim, causal)
    <g>_memory.png             extra memory (bytes beyond inputs and outputs) against N, forward and backward
    <g>_roofline.png           every row with a FLOP count and a traffic model, on the GPU's roofline
    <g>_05_ladder_<dtype>.png  chapter 05's steps as bars, PyTorch's flash and cuDNN backends as lines
    <g>_05_fwd_<dtype>.png     chapter 05's steps and PyTorch's backends, TFLOP/s against N
    <g>_05_bwd_<dtype>.png     chapter 05's last backward step (both dQ modes) and PyTorch's backends' backward,
                               TFLOP/s against N
    <g>_06_bandwidth.png       chapter 06, GB/s of K and V read against the cache length, the read-only ceiling
    <g>_06_splits.png          chapter 06, GB/s against the number of KV splits
    <g>_04_block_sparse.png    chapter 04's block-sparse kernels, time against block density, next to the dense
                               kernels on the same shape (04_fa2/README.md, section 6)
    <g>_io.png                 predicted against measured HBM bytes (io_counters.py), from <gpu>_io.csv, which
                               scripts/io_counters.sh writes: drawn only where that file exists
<gpu>_steps.csv (scripts/step_counters.sh: chapter 05's counters per step) is a table, not a figure: this script
leaves it out, and `python3 docs/step_counters.py table FILE` prints it.
The 05, 06 and block-sparse figures are drawn only when the CSV has rows of them. The diagrams that come from no
CSV (the map of the chapters, the FlashAttention-3 schedules) are drawn by docs/figures.py, which this script
runs too, so one command regenerates every committed PNG.

Duplicated rows: two programs of one run may measure the same kernel on the same shape (chapter 02's program
and chapter 04's both time 02's kernel; 04's block-sparse runs each time the dense kernels again). Rows are keyed by GPU, the kernel's human
name (the LABELS table below, which maps both names to one), pass, dtype and shape; the first row of a key
in file order is the canonical one and the later ones are dropped (the script says how many).
"""
import argparse
import csv
import math
import os
import re
import sys
from collections import OrderedDict, defaultdict

try:
    import matplotlib
except ImportError:
    sys.exit("docs/plot.py needs matplotlib: apt-get install python3-matplotlib (Debian/Ubuntu) or pip install matplotlib")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import figures  # noqa: E402  (the diagrams)
import io_counters  # noqa: E402  (the Nsight Compute counts against the traffic models)
import step_counters  # noqa: E402  (05's per-step counters: tables, no figure)

GiB = 1024.0 ** 3
TOUR_SUFFIX = "_tour.csv"  # scripts/tour.sh's rows (every program on its defaults): shown by the tour, not plotted

# Human names for (chapter, kernel). Two kernel names that are the same kernel map to the same label.
LABELS = {
    ("00", "naive"): "00 standard attention (S, P in HBM)",
    ("00", "naive_softmax"): "00 softmax_rows (3 passes)",
    ("01", "copy_d2d"): "device-to-device copy",
    ("01", "softmax_3pass"): "01 safe softmax, 3 passes",
    ("01", "softmax_online_2pass"): "01 online softmax, 2 passes",
    ("01", "softmax_online_merge"): "01 online softmax + merge",
    ("01", "fused_fa1_form"): "01 fused row, FA1 form",
    ("01", "fused_fa2_form"): "01 fused row, FA2 form",
    ("02", "fa1_forward"): "02 FA1 forward",
    ("03", "fa1_backward"): "03 FA1 backward",
    ("04", "v4_micro_tile"): "04 FA2",
    ("04", "v1_loop_swap"): "04 v1 loops swapped",
    ("04", "v2_deferred_norm"): "04 v2 + deferred normalisation",
    ("04", "v3_q_grid"): "04 v3 + grid over Q blocks",
    ("04", "fa2_atomic_dq"): "04 FA2, atomic dQ",
    ("04", "fa2_determ_dq"): "04 FA2, deterministic dQ",
    ("05", "split_k"): "05 split-K (warps split K_j, V_j)",
    ("05", "v1_mma"): "05 v1 split-Q, mma.sync",
    ("05", "v2_ldmatrix"): "05 v2 + ldmatrix",
    ("05", "v3_swizzle"): "05 v3 + swizzled shared memory",
    ("05", "v4_cp_async"): "05 v4 + cp.async pipeline",
    ("05", "v5_regs_p"): "05 v5 + P kept in registers",
    ("05", "v6_exp2"): "05 v6 + exp2, scale folded",
    ("05", "v7_tiles"): "05 v7 + tiles per head_dim",
    ("05", "v8_two_row_tiles"): "05 v8 + two row tiles per warp",
    ("05", "v9_wgmma_tma"): "05 v9 Hopper: wgmma + TMA + producer warpgroup",
    ("05", "v10_pingpong"): "05 v10 + ping-pong and softmax/GEMM overlap",
    ("06", "fa2_grid"): "06 FA2's grid (no split)",
    ("06", "split_kv"): "06 split-KV",
    ("06", "split_kv_gqa"): "06 split-KV, GQA heads packed",
    ("06", "split_kv_pipelined"): "06 split-KV, GQA packed, double-buffered K/V",
    ("06", "split_kv_fused"): "06 split-KV, double-buffered, merge in the split kernel",
    ("06", "split_kv_mma"): "06 split-KV, fused merge, S and PV on tensor cores",
    ("06", "split_kv_even"): "06 split_kv_mma, keys dealt evenly to one block per SM",
    ("06", "unified_max"): "06 unified max (FlashDecoding++)",
    ("06", "paged"): "06 paged KV cache",
    ("torch", "sdpa"): "PyTorch SDPA (backend it picks)",
    ("torch", "sdpa_flash"): "PyTorch SDPA, flash backend (FA2)",
    ("torch", "sdpa_cudnn"): "PyTorch SDPA, cuDNN backend",
    ("torch", "sdpa_efficient"): "PyTorch SDPA, memory-efficient backend",
    ("torch", "sdpa_math"): "PyTorch SDPA, math backend",
}


def chapter_colors(path=os.path.join(HERE, "..", "scripts", "chapters.tsv")):
    """Each chapter's colour, from the project's one list of chapters (its id and colour columns)."""
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line[:1].isdigit()]
    return {r[0]: r[6] for r in rows}


CHAPTER_COLORS = {**chapter_colors(), "torch": "black"}

# Ceilings from the GPU's spec sheet, keyed by the short name. Measured ceilings come from the CSV itself
# (the copy row of chapter 01, the read-only row of chapter 06); see docs/roofline.md for the sources.
SPEC = {
    "h100": {"name": "H100 SXM5 datasheet", "fp32_tflops": 66.9, "fp16_tc_tflops": 989.4, "hbm_gbps": 3350.0,
             "memory_bytes": 80e9},
}

# Chapter 06: the read-only bandwidth kernel (the ceiling) and rows of a split-count sweep, by kernel name.
CEILING_KERNEL = re.compile(r"(read|bandwidth|copy)", re.I)
SPLIT_KERNEL = re.compile(r"(?:splits?|_s|/s)[=_-]?(\d+)(\*?)$", re.I)  # "*": the heuristic's count


def label(r):
    return LABELS.get((r["chapter"], r["kernel"]), f'{r["chapter"]} {r["kernel"]}')


def short_name(gpu):
    m = re.search(r"\b([ABHL]\d{2,3}|RTX\s?\d{4})\b", gpu, re.I)
    return m.group(1).replace(" ", "").lower() if m else re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")


def read_rows(path):
    """Typed rows of one CSV; duplicates resolved to the first row of each key (see the module comment)."""
    ints = ("B", "H", "Hkv", "Nq", "Nk", "d", "causal")
    floats = ("dropout", "ms", "tflops", "gbps", "model_hbm_bytes", "extra_bytes", "max_abs_err")
    rows, seen, dropped = [], set(), 0
    with open(path, newline="") as f:
        for raw in csv.DictReader(f):
            r = dict(raw)
            for k in ints:
                r[k] = int(r[k])
            for k in floats:
                r[k] = float(r[k])
            r["label"] = label(r)
            key = (r["gpu"], r["label"], r["pass"], r["dtype"]) + tuple(r[k] for k in ints) + (r["dropout"],)
            if key in seen:
                dropped += 1
                continue
            seen.add(key)
            rows.append(r)
    return rows, dropped


def flops(r):
    return r["tflops"] * 1e12 * r["ms"] * 1e-3


def pow2_ticks(ax, xs):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(xs))
    ax.set_xticklabels([f"{x // 1024}k" if x >= 1024 and x % 1024 == 0 else str(x) for x in sorted(xs)])
    ax.minorticks_off()


MARKERS = "osD^vP*X"


def style_of(r):
    """Colour by chapter; kernels of one chapter differ by marker (in LABELS order)."""
    same = list(OrderedDict.fromkeys(v for (c, _), v in LABELS.items() if c == r["chapter"]))
    m = MARKERS[same.index(r["label"]) % len(MARKERS)] if r["label"] in same else "o"
    return dict(color=CHAPTER_COLORS.get(r["chapter"], "gray"),
                linestyle="--" if r["chapter"] == "torch" else "-", marker=m)


def log_y(ax, ticks=(0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)):
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ax.set_yticks([t for t in ticks if lo <= t <= hi])
    ax.set_yticklabels([f"{t:g}" for t in ticks if lo <= t <= hi])
    ax.minorticks_off()


def figure_legend(fig, axes, ncol=4):
    handles = OrderedDict()
    for ax in axes:
        for h, name in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(name, h)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=ncol, fontsize=8, frameon=False)


def tflops_vs_n(rows, gpu, which, path):
    """fp32 chapters 00-04 and PyTorch: B=1, H=16, no dropout, one panel per (d, causal) that has rows."""
    sel = [r for r in rows if r["pass"] == which and r["dtype"] == "fp32" and r["B"] == 1 and r["H"] == 16
           and r["Hkv"] == 16 and r["Nq"] == r["Nk"] and r["dropout"] == 0 and r["tflops"] > 0]
    panels = sorted({(r["d"], r["causal"]) for r in sel})
    if not panels:
        return None
    ncol = min(2, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.2 * ncol, 3.6 * nrow + 1.0), sharey=True, squeeze=False)
    axes = axes.ravel()
    ymin = min(r["tflops"] for r in sel) / 1.5
    ymax = max(r["tflops"] for r in sel) * 1.5
    for ax, (d, causal) in zip(axes, panels):
        lines = defaultdict(list)
        for r in sel:
            if (r["d"], r["causal"]) == (d, causal):
                lines[r["label"]].append(r)
        for name in sorted(lines, key=lambda n: (n.startswith("PyTorch"), n)):
            pts = sorted(lines[name], key=lambda r: r["Nq"])
            ax.plot([r["Nq"] for r in pts], [r["tflops"] for r in pts], label=name, **style_of(pts[0]))
            if pts[0]["chapter"] == "00" and len(pts) > 0:
                ax.annotate(f"00 not run past N = {pts[-1]['Nq']}\n(S and P grow as N\u00b2: see the memory plot)",
                            xy=(pts[-1]["Nq"], pts[-1]["tflops"]), xytext=(8, -4), textcoords="offset points",
                            fontsize=7, color=CHAPTER_COLORS["00"], va="top")
        pow2_ticks(ax, {r["Nq"] for r in sel})
        ax.set_ylim(ymin, ymax)
        log_y(ax)
        ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}", fontsize=10)
        ax.set_xlabel("sequence length N (Nq = Nk)")
        ax.grid(True, which="major", alpha=0.3)
    for ax in axes[len(panels):]:
        ax.axis("off")
    for k in range(0, len(axes), ncol):
        axes[k].set_ylabel("TFLOP/s (log scale)")
    figure_legend(fig, axes[:len(panels)], ncol=3)
    name = "forward" if which == "fwd" else "backward"
    fig.suptitle(f"Attention {name}, fp32, B = 1, H = 16, on {gpu}", fontsize=11)
    fig.tight_layout(rect=(0, 0.1 if nrow > 1 else 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def memory_vs_n(rows, gpu, spec, path):
    """Extra memory against N at B=1, H=16, d=64; chapter 00's line stops where it was last measured."""
    sel = [r for r in rows if r["B"] == 1 and r["H"] == 16 and r["Hkv"] == 16 and r["d"] == 64
           and r["Nq"] == r["Nk"] and r["causal"] == 0 and r["dropout"] == 0 and r["dtype"] == "fp32"
           and r["chapter"] in ("00", "02", "03", "04")]
    if not sel:
        return None
    cap = spec.get("memory_bytes") if spec else None
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.4), sharey=True)
    for ax, which in zip(axes, ("fwd", "bwd")):
        lines, zero = defaultdict(list), set()
        for r in sel:
            if r["pass"] != which:
                continue
            if r["extra_bytes"] > 0:
                lines[r["label"]].append(r)
            else:
                zero.add(r["label"])
        ns = sorted({r["Nq"] for v in lines.values() for r in v})
        xs_all = set(ns)
        for name in sorted(lines):
            pts = sorted(lines[name], key=lambda r: r["Nq"])
            ax.plot([r["Nq"] for r in pts], [r["extra_bytes"] for r in pts], label=name, **style_of(pts[0]))
            if pts[0]["chapter"] == "00":
                # The N^2 formula beyond the last measured point: bytes per N^2 from the last row.
                last = pts[-1]
                per_nn = last["extra_bytes"] / (last["Nq"] * last["Nk"])
                n_hi = max(max(ns), 65536)
                xs = [last["Nq"] * 2 ** k for k in range(0, int(math.log2(n_hi / last["Nq"])) + 1)]
                xs_all.update(xs)
                ax.plot(xs, [per_nn * x * x for x in xs], color="tab:red", linestyle=":", linewidth=1.2)
                ax.annotate(f"00 measured up to N = {last['Nq']}; dotted: the formula\n"
                            f"{per_nn:.0f} B x N\u00b2 (S, P{', dP' if which == 'bwd' else ''}), past the device "
                            "memory\nthe program refuses to run",
                            xy=(last["Nq"], last["extra_bytes"]), xytext=(0.02, 0.78), textcoords="axes fraction",
                            fontsize=7, va="top", color="tab:red",
                            arrowprops=dict(arrowstyle="->", color="tab:red", lw=0.8))
        if cap:
            ax.axhline(cap, color="gray", linewidth=1)
            ax.text(min(xs_all), cap * 1.3, f"device memory, {cap / 1e9:.0f} GB", fontsize=7, color="gray")
        if zero:
            ax.text(0.97, 0.03, "no extra memory: " + ", ".join(sorted(zero)) + "\n(LSE is an output)",
                    transform=ax.transAxes, ha="right", fontsize=7)
        pow2_ticks(ax, xs_all)
        ax.set_yscale("log")
        ticks = [2.0 ** e for e in range(16, 44, 4)]  # 64 KiB, 1 MiB, 16 MiB, ... 4 TiB
        ax.set_yticks(ticks)
        ax.set_yticklabels([bytes_text(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("sequence length N (Nq = Nk)")
        ax.set_title("forward" if which == "fwd" else "backward", fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="center right")
    axes[0].set_ylabel("extra memory (log scale)")
    fig.suptitle(f"Memory beyond inputs and outputs, fp32, B = 1, H = 16, d = 64, on {gpu}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def bytes_text(b):
    for unit, size in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if b >= size:
            return f"{b / size:g} {unit}"
    return f"{b:g} B"


def measured_copy_gbps(rows):
    c = [r["gbps"] for r in rows if r["chapter"] == "01" and r["kernel"] == "copy_d2d"]
    return max(c) if c else None


def measured_read_gbps(rows):
    c = [r["gbps"] for r in rows if r["chapter"] == "06" and CEILING_KERNEL.search(r["kernel"])]
    return max(c) if c else None


def roofline_points(rows):
    """fp32 rows that have both a FLOP count and a traffic model; intensity = FLOPs / model HBM bytes. The roof
    drawn is the fp32 FMA rate: the fp16/bf16 rows of chapters 05 and 06 run on tensor cores or are reads of a
    cache, and their pages show them against their own baselines. Chapter 04's block-sparse rows are the dense
    kernel skipping tiles: their own figure (block_sparse_04) shows them against it."""
    pts = []
    for r in rows:
        if BSPARSE_KERNEL.match(r["kernel"]):
            continue
        if r["dtype"] == "fp32" and r["tflops"] > 0 and r["model_hbm_bytes"] > 0:
            pts.append(dict(r, ai=flops(r) / r["model_hbm_bytes"]))
    return pts


def classify(p, bw_gbps, compute_tflops):
    """memory bound: >= 70% of the bandwidth roof at its intensity; compute bound: >= 70% of the compute roof."""
    mem_roof = p["ai"] * bw_gbps / 1e3
    if p["tflops"] >= 0.7 * compute_tflops:
        return "compute bound"
    if p["tflops"] >= 0.7 * mem_roof and mem_roof < compute_tflops:
        return "memory bound"
    return "neither"


def roofline(rows, gpu, spec, path, table=False):
    pts = roofline_points(rows)
    bw = measured_copy_gbps(rows) or measured_read_gbps(rows)
    if not pts or not bw:
        return None
    fig, ax = plt.subplots(figsize=(8.5, 6.6))
    xs = [10 ** (k / 20) for k in range(0, 61)]  # 1 .. 1000 FLOP/byte
    roofs = []
    if spec:
        roofs.append((spec["fp32_tflops"], f"fp32 FFMA, {spec['fp32_tflops']:.0f} TFLOP/s (spec)", "tab:green"))
        roofs.append((spec["fp16_tc_tflops"], f"fp16 tensor cores, {spec['fp16_tc_tflops']:.0f} TFLOP/s (spec, dense)",
                      "tab:purple"))
    for peak, text, color in roofs:
        ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], color=color, linewidth=1.5)
        ax.text(xs[-1], peak * 1.08, text, ha="right", fontsize=8, color=color)
        ridge = peak * 1e3 / bw
        ax.axvline(ridge, color=color, linestyle=":", linewidth=0.8)
        ax.text(ridge * 1.05, 0.6, f"ridge {ridge:.0f} FLOP/B", rotation=90, fontsize=7, color=color)
    ax.plot(xs, [x * bw / 1e3 for x in xs], color="gray", linewidth=0.8, linestyle="--")
    note = f"HBM: {bw:.0f} GB/s, measured copy"
    if spec:
        ax.plot(xs, [x * spec["hbm_gbps"] / 1e3 for x in xs], color="gray", linewidth=0.6, linestyle=":")
        note += f" (dotted: {spec['hbm_gbps']:.0f} GB/s, spec)"
    ax.text(1.2, 1.2 * bw / 1e3 * 1.35, note, rotation=33, fontsize=7, color="gray", rotation_mode="anchor")
    done = set()
    for p in sorted(pts, key=lambda p: p["label"]):
        key = (p["label"], p["pass"])
        st = style_of(p)
        filled = p["pass"] == "fwd"
        ax.scatter(p["ai"], p["tflops"], marker=st["marker"], s=30, alpha=0.85, linewidths=1.0,
                   facecolors=st["color"] if filled else "none", edgecolors=st["color"],
                   label=f'{p["label"]} ({"forward" if filled else "backward"})' if key not in done else None)
        done.add(key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1, 1e3)
    ax.set_ylim(0.5, 2e3)
    ax.set_xlabel("arithmetic intensity, FLOPs per byte of modelled HBM traffic (log scale)")
    ax.set_ylabel("achieved TFLOP/s (log scale)")
    ax.set_title(f"Roofline: every measured row with a FLOP count and a traffic model, on {gpu}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.legend(*ax.get_legend_handles_labels(), loc="lower center", ncol=3, fontsize=7, frameon=False,
               title="filled: forward, hollow: backward", title_fontsize=7)
    fig.tight_layout(rect=(0, 0.16, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    if table and spec:
        # One line per kernel and pass: the row at B=1 H=16 N=4096 d=64 (no mask) where there is one, else the
        # largest problem; the range of TFLOP/s over all of the kernel's rows.
        print(f"\n| kernel | pass | shown row | FLOP/byte | TFLOP/s (all rows) | of the {spec['fp32_tflops']:.0f} TFLOP/s "
              f"roof | GB/s (model) | of the {bw:.0f} GB/s copy | regime |")
        print("|---|---|---|---|---|---|---|---|---|")
        groups = OrderedDict()
        for p in sorted(pts, key=lambda p: (p["label"], p["pass"] == "bwd")):
            groups.setdefault((p["label"], p["pass"]), []).append(p)
        for (name, which), ps in groups.items():
            pick = [p for p in ps if (p["B"], p["H"], p["Nq"], p["d"], p["causal"], p["dropout"]) == (1, 16, 4096, 64, 0, 0)]
            p = pick[0] if pick else max(ps, key=flops)
            shape = f'B={p["B"]} H={p["H"]} N={p["Nq"]} d={p["d"]}'
            gbps = p["model_hbm_bytes"] / (p["ms"] * 1e6)
            lo, hi = min(q["tflops"] for q in ps), max(q["tflops"] for q in ps)
            print(f'| {name} | {which} | {shape} | {p["ai"]:.1f} | {p["tflops"]:.1f} ({lo:.1f}-{hi:.1f}) | '
                  f'{100 * p["tflops"] / spec["fp32_tflops"]:.0f}% | {gbps:.0f} | {100 * gbps / bw:.0f}% | '
                  f'{classify(p, bw, spec["fp32_tflops"])} |')
    return path


def ladder_05(rows, gpu, dtype, path):
    """Chapter 05's steps as bars at its largest measured shape, PyTorch flash / cuDNN as horizontal lines."""
    mine = [r for r in rows if r["chapter"] == "05" and r["dtype"] == dtype and r["pass"] == "fwd" and r["tflops"] > 0]
    if not mine:
        return None
    shape_of = lambda r: (r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["causal"])  # noqa: E731
    counts = defaultdict(int)
    for r in mine:
        counts[shape_of(r)] += 1
    shape = max(counts, key=lambda s: (counts[s], -s[6], s[3], s[5]))  # most steps; no mask; longest N
    steps = [r for r in mine if shape_of(r) == shape]  # in file order: the ladder's order
    base = [r for r in rows if r["chapter"] == "torch" and r["dtype"] == dtype and r["pass"] == "fwd"
            and shape_of(r) == shape and r["tflops"] > 0]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(steps) + 3), 4.6))
    ax.bar(range(len(steps)), [r["tflops"] for r in steps], color="tab:purple")
    for i, r in enumerate(steps):
        ax.text(i, r["tflops"], f'{r["tflops"]:.0f}', ha="center", va="bottom", fontsize=8)
    for r, ls in zip(base, ("--", "-.", ":", (0, (3, 1, 1, 1)))):
        ax.axhline(r["tflops"], color="black", linestyle=ls, linewidth=1.2, label=f'{r["label"]}: {r["tflops"]:.0f}')
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([r["kernel"] for r in steps], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("TFLOP/s")
    B, H, Hkv, Nq, Nk, d, causal = shape
    ax.set_title(f"05 ladder, forward, {dtype}, B={B} H={H} N={Nq} d={d}{' causal' if causal else ''}, on {gpu}",
                 fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if base:
        ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def panels_vs_n(sel, panels, restyle, ylabel, title, path, height=5.2, legend_room=0.2):
    """TFLOP/s against N, one panel per (d, causal) of `panels`, a line per label; restyle(first row, style) may
    change a line's style. Shared by chapter 05's forward and backward figures."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.8 * len(panels), height), sharey=True, squeeze=False)
    for ax, (d, causal) in zip(axes[0], panels):
        lines = OrderedDict()
        for r in sel:
            if (r["d"], r["causal"]) == (d, causal):
                lines.setdefault(r["label"], []).append(r)
        for name, pts in lines.items():
            pts = sorted(pts, key=lambda r: r["Nq"])
            st = style_of(pts[0])
            restyle(pts[0], st)
            ax.plot([r["Nq"] for r in pts], [r["tflops"] for r in pts], label=name, **st)
        pow2_ticks(ax, {r["Nq"] for v in lines.values() for r in v})
        ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}", fontsize=10)
        ax.set_xlabel("sequence length N (Nq = Nk; batch = tokens / N)")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel(ylabel)
    figure_legend(fig, axes[0], ncol=4)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, legend_room, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def fwd_05(rows, gpu, dtype, path):
    """05 and PyTorch TFLOP/s against N, one panel per (d, causal); B may change with N (fixed token count)."""
    sel = [r for r in rows if r["chapter"] in ("05", "torch") and r["dtype"] == dtype and r["pass"] == "fwd"
           and r["Nq"] == r["Nk"] and r["tflops"] > 0]
    panels = sorted({(r["d"], r["causal"]) for r in sel if r["chapter"] == "05"})
    if not panels:
        return None
    steps = list(OrderedDict.fromkeys(r["label"] for r in sel if r["chapter"] == "05"))
    shade = {name: plt.cm.viridis(0.85 * k / max(1, len(steps) - 1)) for k, name in enumerate(steps)}

    def restyle(r, st):
        if r["label"] in shade:
            st.update(color=shade[r["label"]], marker="o")
    return panels_vs_n(sel, panels, restyle, "TFLOP/s", f"05 forward, {dtype}, on {gpu}", path)


def bwd_05(rows, gpu, dtype, path):
    """05's last backward step (the highest bwd_vN, atomic and deterministic dQ) and PyTorch's backward against N,
    one panel per (d, causal). Only the last step: earlier steps were measured at every N in older runs, with an
    older dQ kernel, and a curve of mixed runs would mislead."""
    step_no = lambda r: int(re.match(r"bwd_v(\d+)_", r["kernel"]).group(1))  # noqa: E731
    mine = [r for r in rows if r["chapter"] == "05" and r["dtype"] == dtype and r["pass"] == "bwd" and r["tflops"] > 0
            and re.match(r"bwd_v\d+_", r["kernel"]) and r["Nq"] == r["Nk"]]
    if not mine:
        return None
    last = max(step_no(r) for r in mine)
    sel = [r for r in mine if step_no(r) == last] + [
        r for r in rows if r["chapter"] == "torch" and r["dtype"] == dtype and r["pass"] == "bwd" and r["tflops"] > 0
        and r["Nq"] == r["Nk"]]
    panels = sorted({(r["d"], r["causal"]) for r in sel if r["chapter"] == "05"})

    def restyle(r, st):
        if r["chapter"] == "05":
            st.update(marker="o", linestyle="-" if r["kernel"].endswith("_atomic_dq") else ":")
    return panels_vs_n(sel, panels, restyle, "TFLOP/s (backward = 2.5x forward FLOPs)",
                       f"05 backward, last step (bwd_v{last}), {dtype}, on {gpu}", path, height=4.8, legend_room=0.12)


def decode_06(rows, gpu, path_n, path_splits):
    """06: GB/s (K and V bytes read / time) against the cache length, and against the split count."""
    # Rows run with a forced L2 policy ("split_kv_mma@evict-first", "read_kv@evict-normal"; README §4.6) are a
    # comparison of their own, not the chapter's kernels at their plan.
    mine = [r for r in rows if r["chapter"] == "06" and r["gbps"] > 0 and "@" not in r["kernel"]]
    if not mine:
        return []
    ceiling = [r for r in mine if CEILING_KERNEL.search(r["kernel"])]
    split = [r for r in mine if not CEILING_KERNEL.search(r["kernel"]) and SPLIT_KERNEL.search(r["kernel"])]
    plain = [r for r in mine if r not in ceiling and r not in split]
    out = []
    if plain:  # one panel per (B, H, Hkv, q_len, d, dtype), the read-only kernel of the same shapes as a line
        fam = lambda r: (r["B"], r["H"], r["Hkv"], r["Nq"], r["d"], r["dtype"])  # noqa: E731
        fams = list(OrderedDict.fromkeys(fam(r) for r in plain))[:4]
        cols = min(2, len(fams))
        rows_n = (len(fams) + cols - 1) // cols
        fig, axes = plt.subplots(rows_n, cols, figsize=(6.2 * cols, 4.2 * rows_n), squeeze=False)
        for ax, f in zip(axes.flat, fams):
            lines = OrderedDict()
            for r in plain:
                if fam(r) == f:
                    lines.setdefault(r["label"], []).append(r)
            for r in [r for r in rows if r["chapter"] == "torch" and fam(r) == f and r["gbps"] > 0]:
                lines.setdefault(r["label"], []).append(r)
            for name, pts in lines.items():
                pts = sorted(pts, key=lambda r: r["Nk"])
                ax.plot([r["Nk"] for r in pts], [r["gbps"] for r in pts], label=name, **style_of(pts[0]))
            top = sorted((r for r in ceiling if fam(r) == f), key=lambda r: r["Nk"])
            if top:
                ax.plot([r["Nk"] for r in top], [r["gbps"] for r in top], color="gray", linewidth=2.5, alpha=0.6,
                        label="read-only bandwidth kernel (the ceiling)")
            pow2_ticks(ax, {r["Nk"] for v in lines.values() for r in v})
            ax.set_ylim(bottom=0)
            ax.set_xlabel("KV cache length Nk (log scale)")
            ax.set_ylabel("GB/s (K and V bytes read / time)")
            B, H, Hkv, Nq, d, dtype = f
            ax.set_title(f"{dtype}, B={B} H={H} Hkv={Hkv} q_len={Nq} d={d}", fontsize=9)
            ax.grid(True, alpha=0.3)
        for ax in list(axes.flat)[len(fams):]:
            ax.axis("off")
        axes.flat[0].legend(fontsize=6)
        fig.suptitle(f"06 decoding on {gpu}", fontsize=10)
        fig.tight_layout()
        fig.savefig(path_n, dpi=110)
        plt.close(fig)
        out.append(path_n)
    if split:
        fig, ax = plt.subplots(figsize=(7.5, 4.6))
        groups = OrderedDict()
        for r in split:  # one line per swept kernel and shape ("split_kv_gqa/s16*": kernel split_kv_gqa, 16 splits)
            m = SPLIT_KERNEL.search(r["kernel"])
            key = (r["kernel"][:m.start()].rstrip("/_-"), r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["dtype"])
            groups.setdefault(key, []).append((int(m.group(1)), r["gbps"], m.group(2) == "*"))
        drawn_ceilings = set()
        for (kernel, B, H, Hkv, Nq, Nk, d, dtype), pts in groups.items():
            pts.sort()
            line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3,
                           label=f"{kernel}: B={B} H={H}/{Hkv} q_len={Nq} Nk={Nk} d={d} {dtype}")[0]
            for p in [p for p in pts if p[2]]:
                ax.plot([p[0]], [p[1]], marker="*", markersize=14, color=line.get_color(), linestyle="none",
                        label=f"the heuristic's choice: {p[0]} splits")
            shape = (B, H, Hkv, Nq, Nk, d, dtype)
            top = [r for r in ceiling if (r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["dtype"]) == shape]
            if top and shape not in drawn_ceilings:  # one ceiling line per shape, however many kernels were swept
                drawn_ceilings.add(shape)
                ax.axhline(top[0]["gbps"], color="gray", linewidth=1.2,
                           label=f"read-only bandwidth kernel, same shape: {top[0]['gbps']:.0f} GB/s")
        counts = {p[0] for pts in groups.values() for p in pts}  # label powers of 2 and the heuristic's choices
        pow2_ticks(ax, {c for c in counts if c & (c - 1) == 0} | {p[0] for pts in groups.values() for p in pts if p[2]})
        ax.set_ylim(bottom=0)
        ax.set_xlabel("number of KV splits; split_kv_even: number of blocks (log scale)")
        ax.set_ylabel("GB/s (K and V bytes read / time)")
        ax.set_title(f"06 decoding against the split count, on {gpu}", fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(path_splits, dpi=110)
        plt.close(fig)
        out.append(path_splits)
    return out


# Chapter 04's block-sparse rows: "bsparse_<mode>_s<density>" (04_fa2/main.cu), mode fwd, atomic_dq or determ_dq.
BSPARSE_KERNEL = re.compile(r"^bsparse_(fwd|atomic_dq|determ_dq)_s([0-9.]+)$")
BSPARSE_DENSE = {"fwd": "v4_micro_tile", "atomic_dq": "fa2_atomic_dq", "determ_dq": "fa2_determ_dq"}


def block_sparse_04(rows, gpu, path):
    """Time against block density s for each block-sparse kernel, its dense kernel at s = 1 (same shape), and
    the dense time scaled by s (what skipping tiles would give if nothing else cost time). Log-log axes: the
    scaled line is a diagonal, and the low densities do not crowd together."""
    shape_of = lambda r: (r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["causal"], r["dtype"])  # noqa: E731
    pts = defaultdict(list)
    for r in rows:
        m = BSPARSE_KERNEL.match(r["kernel"]) if r["chapter"] == "04" else None
        if m:
            pts[(m.group(1), shape_of(r))].append((float(m.group(2)), r["ms"]))
    if not pts:
        return None
    names = {"fwd": "forward", "atomic_dq": "atomic dQ", "determ_dq": "deterministic dQ"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    for ax, (which, title) in zip(axes, (("fwd", "forward"), ("bwd", "backward"))):
        modes = [k for k in sorted(pts) if (k[0] == "fwd") == (which == "fwd")]
        if not modes:
            ax.axis("off")
            continue
        for k, ((mode, shape), color) in enumerate(zip(modes, ("tab:blue", "tab:green", "tab:orange"))):
            xy = sorted(pts[(mode, shape)])
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="o", color=color, label=f"block-sparse, {names[mode]}")
            dense = [r for r in rows if r["chapter"] == "04" and r["kernel"] == BSPARSE_DENSE[mode]
                     and shape_of(r) == shape]
            if not dense:
                continue
            t = dense[0]["ms"]
            ax.plot([1.0], [t], marker="s", color=color, linestyle="none", label=f"dense, {names[mode]}")
            lo = min(x for x, _ in xy)
            ax.plot([lo, 1], [t * lo, t], color=color, linestyle=":", linewidth=1, label=f"dense × s, {names[mode]}")
            for x, y in xy:  # the speed-up over dense; the second kernel's labels go above its points
                ax.annotate(f"{t / y:.1f}×", xy=(x, y), xytext=(5, 6 if k else -11), textcoords="offset points",
                            fontsize=7, color=color)
        B, H, Hkv, Nq, Nk, d, causal, dtype = modes[0][1]
        ax.set_title(f"{title}, B={B} H={H} N={Nq} d={d}{' causal' if causal else ''} {dtype}", fontsize=10)
        ax.set_xscale("log")
        log_y(ax, ticks=(1, 2, 3, 5, 10, 20, 30, 50, 100, 200, 300, 500))
        ticks = [0.05, 0.1, 0.2, 0.5, 1.0]
        ax.set_xticks(ticks)
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.set_xlabel("block density s (fraction of tiles computed, log scale)")
        ax.set_ylabel("time (ms, log scale)")
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=7, loc="upper left")
    fig.suptitle(f"04 block-sparse against dense (× = dense time / block-sparse time), on {gpu}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


HEADLINE = {  # pass -> [(label, column name)]
    "fwd": [("00 standard attention (S, P in HBM)", "00 naive"), ("01 fused row, FA2 form", "01 fused row (FA2 form)"),
            ("02 FA1 forward", "02 FA1"), ("04 FA2", "04 FA2"), ("PyTorch SDPA (backend it picks)", "PyTorch SDPA")],
    "bwd": [("00 standard attention (S, P in HBM)", "00 naive"), ("03 FA1 backward", "03 FA1"),
            ("04 FA2, atomic dQ", "04 FA2 (atomic dQ)"), ("04 FA2, deterministic dQ", "04 FA2 (deterministic dQ)"),
            ("PyTorch SDPA (backend it picks)", "PyTorch SDPA")],
}


def headline_table(rows):
    """The top README's tables: TFLOP/s at B=1 H=16 d=64, fp32, no mask, by N (canonical rows)."""
    sel = {(r["pass"], r["label"], r["Nq"]): r["tflops"] for r in rows
           if (r["B"], r["H"], r["Hkv"], r["d"], r["causal"], r["dropout"], r["dtype"]) == (1, 16, 16, 64, 0, 0, "fp32")
           and r["Nq"] == r["Nk"] and r["tflops"] > 0}
    for which, cols in HEADLINE.items():
        ns = sorted({k[2] for k in sel if k[0] == which})
        print(f"\n{'forward' if which == 'fwd' else 'backward'}, TFLOP/s\n")
        print("| N | " + " | ".join(c for _, c in cols) + " |")
        print("|---" * (len(cols) + 1) + "|")
        for n in ns:
            v = [sel.get((which, name, n)) for name, _ in cols]
            print(f"| {n} | " + " | ".join("—" if x is None else f"{x:.1f}" if x >= 10 else f"{x:.2f}" for x in v) + " |")


def plot_csv(path, out_dir, table=False, readme=False):
    rows, dropped = read_rows(path)
    if not rows:
        raise SystemExit(f"{path}: no rows")
    gpus = sorted({r["gpu"] for r in rows})
    if len(gpus) != 1:
        raise SystemExit(f"{path}: rows of {len(gpus)} GPUs ({', '.join(gpus)}); keep one CSV per GPU")
    gpu = gpus[0]
    g = short_name(gpu)
    spec = SPEC.get(g)
    print(f"{path}: {len(rows)} rows on {gpu}" + (f", {dropped} duplicated rows dropped" if dropped else ""))
    if readme:
        headline_table(rows)
    p = lambda name: os.path.join(out_dir, f"{g}_{name}.png")  # noqa: E731
    written = [tflops_vs_n(rows, gpu, "fwd", p("fwd")), tflops_vs_n(rows, gpu, "bwd", p("bwd")),
               memory_vs_n(rows, gpu, spec, p("memory")), roofline(rows, gpu, spec, p("roofline"), table)]
    for dtype in sorted({r["dtype"] for r in rows if r["chapter"] == "05"}):
        written += [ladder_05(rows, gpu, dtype, p(f"05_ladder_{dtype}")), fwd_05(rows, gpu, dtype, p(f"05_fwd_{dtype}")),
                    bwd_05(rows, gpu, dtype, p(f"05_bwd_{dtype}"))]
    written += decode_06(rows, gpu, p("06_bandwidth"), p("06_splits"))
    written.append(block_sparse_04(rows, gpu, p("04_block_sparse")))
    return [w for w in written if w]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(HERE, "results"), help="folder of result CSVs")
    ap.add_argument("--out", default=os.path.join(HERE, "figures"), help="folder the PNGs are written to")
    ap.add_argument("--roofline-table", action="store_true", help="print the roofline table (markdown)")
    ap.add_argument("--readme-table", action="store_true", help="print the top README's results table (markdown)")
    ap.add_argument("--io-table", action="store_true", help="print docs/io.md's table of model and DRAM bytes")
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        ap.error(f"--results {args.results}: no such folder")
    io_files = io_counters.io_csvs(args.results)
    csvs = sorted(os.path.join(args.results, f) for f in os.listdir(args.results)
                  if f.endswith(".csv") and not f.endswith(step_counters.SUFFIX) and not f.endswith(TOUR_SUFFIX)
                  and os.path.join(args.results, f) not in io_files)
    if not csvs:
        raise SystemExit(f"no .csv files in {args.results}")
    os.makedirs(args.out, exist_ok=True)
    written = []
    for c in csvs:
        written += plot_csv(c, args.out, args.roofline_table, args.readme_table)
    for c in io_files:
        rows = io_counters.read_rows(c)
        if args.io_table:
            print(f"\n{c}\n\n{io_counters.table(rows)}\n")
        written.append(io_counters.draw(rows, os.path.join(args.out, f"{short_name(rows[0]['gpu'])}_io.png"),
                                        CHAPTER_COLORS))
    written += figures.draw_all(args.out)
    for w in written:
        print(f"wrote {w}")


if __name__ == "__main__":
    main()
