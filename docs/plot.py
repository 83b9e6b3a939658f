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
    <g>_05_fwd_<dtype>.png     chapter 05's steps and PyTorch's backends, TFLOP/s against N. fp8 (both
                               figures): from <gpu>_fp8.csv (what `scripts/measure.sh --chapters 05fp8` writes,
                               one run) where it exists, with that run's step 10 and PyTorch's backends in fp16
                               on the same shapes as the yardsticks
    <g>_05_bwd_<dtype>.png     chapter 05's last backward step (both dQ modes) and PyTorch's backends' backward,
                               TFLOP/s against N
    <g>_06_bandwidth.png       chapter 06, GB/s of K and V read against the cache length, the read-only ceiling
    <g>_06_splits.png          chapter 06, GB/s against the number of KV splits; split_kv_even, whose sweep is
                               over its number of blocks, in a panel of its own
    <g>_04_block_sparse.png    chapter 04's block-sparse kernels, time against block density, next to the dense
                               kernels on the same shape (04_fa2/README.md, section 6)
    <g>_journey.png            every step in reading order at one shape (B = 4, H = 16, N = 4096, d = 128, no
                               mask, forward): 00, 01's fused row, 02, 04's v1-v4 (fp32), 05's steps (fp16), then
                               PyTorch's flash and cuDNN backends, TFLOP/s on a log scale: drawn only where chapter
                               00 has a row at that shape: from <gpu>_journey.csv (what `scripts/measure.sh
                               --chapters journey` writes, one run; used for this figure only) where it exists,
                               else from <gpu>.csv
    <g>_io.png                 predicted against measured HBM bytes (io_counters.py), from <gpu>_io.csv, which
                               scripts/io_counters.sh writes: drawn only where that file exists
    <g>_train_gpt.png          a small GPT trained with each attention backend (PyTorch's flash and cuDNN, ours):
                               loss against step and its difference from flash's, from <gpu>_train.csv, which
                               scripts/train_gpt.py writes: drawn only where that file exists
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
from matplotlib.colors import to_rgb  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import figures  # noqa: E402  (the diagrams)
import io_counters  # noqa: E402  (the Nsight Compute counts against the traffic models)
import step_counters  # noqa: E402  (05's per-step counters: tables, no figure)

GiB = 1024.0 ** 3
TOUR_SUFFIX = "_tour.csv"  # scripts/tour.sh's rows (every program on its defaults): shown by the tour, not plotted
TRAIN_SUFFIX = "_train.csv"  # scripts/train_gpt.py: loss curves, not result rows (<gpu>_train_*.csv: tables only)
# Side tables quoted by a page, not drawn: the training curves and lab 10's sweep (_train*), chapter 06's
# --kernel auto against the fixed kernels (_06_auto), the decode GEMMs of 06/gemm (_gemm*, decode_gemm's own CSV
# format), chapter 05's FP8 accuracy lab (_fp8_lab: fp8_lab's own format, on the CPU model or, with --gpu, the
# kernels too).
SIDE_TABLES = ("_train", "_06_auto", "_gemm", "_fp8_lab")
JOURNEY_SUFFIX = "_journey.csv"  # scripts/measure.sh --chapters journey: rows for the journey figure only
FP8_SUFFIX = "_fp8.csv"  # scripts/measure.sh --chapters 05fp8: rows for chapter 05's fp8 figures only

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
    ("04", "v1_loop_swap"): "04 v1 loops swapped",
    ("04", "v2_deferred_norm"): "04 v2 + deferred normalisation",
    ("04", "v3_q_grid"): "04 v3 + grid over Q blocks",
    ("04", "v4_micro_tile"): "04 FA2",
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
             "memory_bytes": 80e9, "sms": 132},
}

# Chapter 06: the read-only bandwidth kernel (the ceiling) and rows of a split-count sweep, by kernel name.
CEILING_KERNEL = re.compile(r"(read|bandwidth|copy)", re.I)
SPLIT_KERNEL = re.compile(r"(?:splits?|_s|/s)[=_-]?(\d+)(\*?)$", re.I)  # "*": the heuristic's count


BWD_STEP = re.compile(r"^bwd_v(\d+)_(.+)_(atomic|determ)_dq$")  # chapter 05's backward ladder


def label(r):
    m = BWD_STEP.match(r["kernel"]) if r["chapter"] == "05" else None
    if m and (r["chapter"], r["kernel"]) not in LABELS:
        mode = "atomic dQ" if m.group(3) == "atomic" else "deterministic dQ"
        return f'05 backward step {m.group(1)} (bwd_v{m.group(1)}_{m.group(2)}), {mode}'
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


# Within one figure every kernel gets its own colour and its own marker (figure_styles). Colours follow the
# chapter: a chapter with one kernel in the figure has its colour from scripts/chapters.tsv, one with up to
# SHADES_MAX kernels has shades of it (light to dark, in LABELS order), one with more has colours of PALETTE.
MARKERS = ("o", "s", "D", "^", "v", "P", "*", "p", "h", "d", "<", ">", "8", "H", "X")
SHADES_MAX = 4
PALETTE = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
           "tab:cyan", "navy", "goldenrod", "darkmagenta", "lime", "tab:gray")
TORCH_COLORS = {"sdpa": "black", "sdpa_flash": "black", "sdpa_cudnn": "tab:pink", "sdpa_efficient": "tab:gray",
                "sdpa_math": "tab:green"}
# Chapter 04's block-sparse rows, where a figure of dense kernels shows them: one entry of their own.
BSPARSE_STYLE = dict(color="tab:green", marker="X", markersize=8, linestyle="none")
LABEL_ORDER = {name: k for k, name in enumerate(OrderedDict.fromkeys(LABELS.values()))}


def shades(color, n):
    """n colours of the hue of `color`, from light (half white) to dark (a quarter black), the colour itself among
    them; the colour itself when n is 1."""
    if n == 1:
        return [color]
    rgb = to_rgb(color)
    out = []
    for k in range(n):
        t = 0.5 - 0.75 * k / (n - 1)  # > 0: mixed with white, < 0: with black
        out.append(tuple(c + (1 - c) * t if t > 0 else c * (1 + t) for c in rgb))
    return out


def figure_styles(rows, fixed=None, avoid=()):
    """{label: style} for the kernels of one figure: no two kernels share a colour or a marker. `fixed` maps labels
    to styles decided by the caller (block-sparse); their markers are not given to any other kernel. `avoid`: colours
    the figure uses for other lines, left out of PALETTE."""
    fixed = dict(fixed or {})
    first = OrderedDict()
    for r in rows:
        first.setdefault(r["label"], r)
    labels = sorted((n for n in first if n not in fixed),
                    key=lambda n: (first[n]["chapter"] == "torch", first[n]["chapter"], LABEL_ORDER.get(n, 10 ** 6), n))
    by_chapter = OrderedDict()
    for n in labels:
        by_chapter.setdefault(first[n]["chapter"], []).append(n)
    colors = {}
    taken = {CHAPTER_COLORS.get(c) for c, names in by_chapter.items() if len(names) <= SHADES_MAX}
    taken |= {TORCH_COLORS.get(first[n]["kernel"], "black") for n in by_chapter.get("torch", [])}
    taken |= {st.get("color") for st in fixed.values()}
    spare = [c for c in PALETTE if c not in taken and c not in avoid]
    for chapter, names in by_chapter.items():
        if chapter == "torch":
            for n in names:
                colors[n] = TORCH_COLORS.get(first[n]["kernel"], "black")
        elif len(names) <= SHADES_MAX:
            colors.update(zip(names, shades(CHAPTER_COLORS.get(chapter, "gray"), len(names))))
        else:
            colors.update((n, spare[k % len(spare)]) for k, n in enumerate(names))
    used = {st.get("marker") for st in fixed.values()}
    markers = [m for m in MARKERS if m not in used]
    styles = dict(fixed)
    for k, n in enumerate(labels):
        styles[n] = dict(color=colors[n], marker=markers[k % len(markers)],
                         linestyle="--" if first[n]["chapter"] == "torch" else "-")
    return styles


def style_of(r, styles=None):
    """The style of row r's kernel: from the figure's styles where given, else its chapter's colour."""
    if styles and r["label"] in styles:
        return dict(styles[r["label"]])
    return dict(color=CHAPTER_COLORS.get(r["chapter"], "gray"), marker="o",
                linestyle="--" if r["chapter"] == "torch" else "-")


def log_y(ax, ticks=(0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)):
    ax.set_yscale("log")
    lo, hi = ax.get_ylim()
    ax.set_yticks([t for t in ticks if lo <= t <= hi])
    ax.set_yticklabels([f"{t:g}" for t in ticks if lo <= t <= hi])
    ax.minorticks_off()


def figure_legend(fig, axes, ncol=4, title=None):
    """One legend for all panels, below them (the figure is saved with bbox_inches="tight", which makes room for
    it): kernels in the order of figure_styles (chapter, then LABELS order), other lines after them."""
    handles = OrderedDict()
    for ax in axes:
        for h, name in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(name, h)
    first = list(handles)
    names = sorted(handles, key=lambda n: (2 if not n[:2].isdigit() and not n.startswith("PyTorch") else
                                           n.startswith("PyTorch"), LABEL_ORDER.get(n, 10 ** 6), first.index(n)))
    fig.legend([handles[n] for n in names], names, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=ncol,
               fontsize=8, frameon=False, title=title, title_fontsize=8)


def save(fig, path, dpi=110):
    fig.savefig(path, dpi=dpi, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def bsparse_rows(sel, which):
    """Chapter 04's block-sparse rows of `sel` relabelled as one kernel (their own legend entry and style), and the
    other rows; the label says which densities were run."""
    sparse, dense = [], []
    for r in sel:
        m = BSPARSE_KERNEL.match(r["kernel"]) if r["chapter"] == "04" else None
        (sparse if m else dense).append((r, m))
    if not sparse:
        return [r for r, _ in dense], {}
    ss = sorted({float(m.group(2)) for _, m in sparse})
    what = "forward" if which == "fwd" else "backward, both dQ modes"
    name = (f"04 block-sparse {what}, block density s = {ss[0]:g}" + (f"-{ss[-1]:g}" if len(ss) > 1 else "") +
            " (TFLOP/s of the tiles computed)")
    return [r for r, _ in dense] + [dict(r, label=name) for r, _ in sparse], {name: dict(BSPARSE_STYLE)}


def tflops_vs_n(rows, gpu, which, path):
    """fp32 chapters 00-04 and PyTorch: B=1, H=16, no dropout, one panel per (d, causal) that has rows. Chapter
    04's block-sparse rows (same shape, a fraction of the tiles) are points of their own style."""
    sel = [r for r in rows if r["pass"] == which and r["dtype"] == "fp32" and r["B"] == 1 and r["H"] == 16
           and r["Hkv"] == 16 and r["Nq"] == r["Nk"] and r["dropout"] == 0 and r["tflops"] > 0]
    panels = sorted({(r["d"], r["causal"]) for r in sel})
    if not panels:
        return None
    sel, fixed = bsparse_rows(sel, which)
    styles = figure_styles(sel, fixed)
    ncol = min(2, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(5.6 * ncol, 3.7 * nrow), sharey=True, squeeze=False)
    axes = axes.ravel()
    ymin = min(r["tflops"] for r in sel) / 1.5
    ymax = max(r["tflops"] for r in sel) * 1.5
    for ax, (d, causal) in zip(axes, panels):
        lines = defaultdict(list)
        for r in sel:
            if (r["d"], r["causal"]) == (d, causal):
                lines[r["label"]].append(r)
        for name in lines:
            pts = sorted(lines[name], key=lambda r: r["Nq"])
            ax.plot([r["Nq"] for r in pts], [r["tflops"] for r in pts], label=name, **style_of(pts[0], styles),
                    zorder=3 if len({r["Nq"] for r in pts}) == 1 else 2)  # lone points over the lines
            if pts[0]["chapter"] == "00":
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
    name = "forward" if which == "fwd" else "backward"
    fig.suptitle(f"Attention {name}, fp32, B = 1, H = 16: TFLOP/s against N, on {gpu}", fontsize=11)
    fig.tight_layout()
    figure_legend(fig, axes[:len(panels)], ncol=2)
    return save(fig, path)


def memory_vs_n(rows, gpu, spec, path):
    """Extra memory against N at B=1, H=16, d=64, fp32, forward and backward panels; chapter 00's line stops where
    it was last measured and goes on dotted as its N^2 formula. Kernels with no extra memory are named in a note.
    Chapter 04's block-sparse rows are left out (the dense kernel's memory: 04_fa2/README.md, section 6)."""
    sel = [r for r in rows if r["B"] == 1 and r["H"] == 16 and r["Hkv"] == 16 and r["d"] == 64
           and r["Nq"] == r["Nk"] and r["causal"] == 0 and r["dropout"] == 0 and r["dtype"] == "fp32"
           and r["chapter"] in ("00", "02", "03", "04") and not BSPARSE_KERNEL.match(r["kernel"])]
    if not sel:
        return None
    cap = spec.get("memory_bytes") if spec else None
    # 4 KiB .. 16 TiB: room above the device memory for the note on 00, and below the lines for the note on the
    # kernels with no extra memory.
    y_lo, y_hi = 2.0 ** 12, 2.0 ** 44
    panels = OrderedDict()
    for which in ("fwd", "bwd"):
        lines, zero = OrderedDict(), []
        for r in sorted(sel, key=lambda r: LABEL_ORDER.get(r["label"], 10 ** 6)):
            if r["pass"] != which:
                continue
            if r["extra_bytes"] > 0:
                lines.setdefault(r["label"], []).append(r)
            elif r["label"] not in zero:
                zero.append(r["label"])
        # Kernels with the very same points (04's two dQ modes: D only) share one line and one legend entry.
        merged = OrderedDict()
        for name, pts in lines.items():
            pts = sorted(pts, key=lambda r: r["Nq"])
            key = tuple((r["Nq"], r["extra_bytes"]) for r in pts)
            merged.setdefault(key, ([], pts))[0].append(name)
        named = [(names[0] if len(names) == 1 else " and ".join(names) + " (the same bytes)", pts)
                 for names, pts in merged.values()]
        panels[which] = ([(name, [dict(r, label=name) for r in pts]) for name, pts in named], zero)
    styles = figure_styles([r for lines, _ in panels.values() for _, pts in lines for r in pts])
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.2), sharey=True)
    for ax, (which, (lines, zero)) in zip(axes, panels.items()):
        ns = sorted({r["Nq"] for r in sel if r["pass"] == which})
        xs_all = set(ns)
        for name, pts in lines:
            st = style_of(pts[0], styles)
            ax.plot([r["Nq"] for r in pts], [r["extra_bytes"] for r in pts], label=name, **st)
            if pts[0]["chapter"] == "00":
                # The N^2 formula beyond the last measured point: bytes per N^2 from the last row.
                last = pts[-1]
                per_nn = last["extra_bytes"] / (last["Nq"] * last["Nk"])
                n_hi = max(max(ns), 65536)
                xs = [last["Nq"] * 2 ** k for k in range(0, int(math.log2(n_hi / last["Nq"])) + 1)]
                xs_all.update(xs)
                ax.plot(xs, [per_nn * x * x for x in xs], color=st["color"], linestyle=":", linewidth=1.4)
                mats = ["S", "P", "dP"] if which == "bwd" else ["S", "P"]
                ax.annotate(f"00 measured up to N = {last['Nq']}; dotted: its formula, {per_nn:.0f} B x N\u00b2\n"
                            f"({last['H']} heads x {len(mats)} matrices ({', '.join(mats)}) x 4 bytes).\n"
                            "Past the device memory the program refuses to run.",
                            xy=(xs[-1], per_nn * xs[-1] ** 2), xytext=(0.03, 0.97), textcoords="axes fraction",
                            fontsize=8, va="top", color=st["color"],
                            bbox=dict(boxstyle="round,pad=0.3", facecolor="white", edgecolor="none", alpha=0.9),
                            arrowprops=dict(arrowstyle="->", color=st["color"], lw=0.8))
        if cap:
            ax.axhline(cap, color="gray", linewidth=1.2)
            ax.text(min(xs_all), cap * 1.35, f"device memory, {cap / 1e9:.0f} GB", fontsize=8, color="gray")
        if zero:
            ax.text(0.97, 0.03, "no extra memory (L is an output):\n" + wrap_names(zero, 44),
                    transform=ax.transAxes, ha="right", va="bottom", fontsize=8)
        pow2_ticks(ax, xs_all)
        ax.set_yscale("log")
        ax.set_ylim(y_lo, y_hi)
        ticks = [2.0 ** e for e in range(12, 44, 4)]  # 4 KiB, 64 KiB, 1 MiB, ... 4 TiB
        ax.set_yticks(ticks)
        ax.set_yticklabels([bytes_text(t) for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("sequence length N (Nq = Nk, log scale)")
        ax.set_title("forward" if which == "fwd" else "backward", fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
    axes[0].set_ylabel("extra memory: bytes beyond Q, K, V, O, L (log scale)")
    fig.suptitle(f"Memory beyond inputs and outputs against N, fp32, B = 1, H = 16, d = 64, on {gpu}", fontsize=11)
    fig.tight_layout()
    figure_legend(fig, axes, ncol=3)
    return save(fig, path)


def wrap_names(names, width):
    """Names joined by commas into lines of about `width` characters, never breaking a name."""
    lines = [""]
    for k, n in enumerate(names):
        piece = n + ("," if k < len(names) - 1 else "")
        if lines[-1] and len(lines[-1]) + 1 + len(piece) > width:
            lines.append("")
        lines[-1] = f"{lines[-1]} {piece}".strip()
    return "\n".join(lines)


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
    fig, ax = plt.subplots(figsize=(9, 6.6))
    x_hi = max(1e3, 10 ** math.ceil(math.log10(1.2 * max(p["ai"] for p in pts))))  # PyTorch's minimum-traffic rows
    xs = [10 ** (k / 20) for k in range(0, int(20 * math.log10(x_hi)) + 1)]  # 1 .. x_hi FLOP/byte
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
    done = set()
    styles = figure_styles(pts, avoid=[c for _, _, c in roofs])
    for p in sorted(pts, key=lambda p: (LABEL_ORDER.get(p["label"], 10 ** 6), p["pass"] == "bwd")):
        key = (p["label"], p["pass"])
        st = style_of(p, styles)
        filled = p["pass"] == "fwd"
        ax.scatter(p["ai"], p["tflops"], marker=st["marker"], s=30, alpha=0.85, linewidths=1.0,
                   facecolors=st["color"] if filled else "none", edgecolors=st["color"],
                   label=f'{p["label"]} ({"forward" if filled else "backward"})' if key not in done else None)
        done.add(key)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(1, x_hi)
    ax.set_ylim(0.5, 2e3)
    ax.set_xlabel("arithmetic intensity, FLOPs per byte of modelled HBM traffic (log scale)")
    ax.set_ylabel("achieved TFLOP/s (log scale)")
    ax.set_title(f"Roofline: every measured row with a FLOP count and a traffic model, on {gpu}", fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    fig.tight_layout()
    (x0, y0), (x1, y1) = ax.transData.transform([(1, bw / 1e3), (10, 10 * bw / 1e3)])  # the slope as drawn
    ax.text(1.2, 1.2 * bw / 1e3 * 1.35, note, rotation=math.degrees(math.atan2(y1 - y0, x1 - x0)), fontsize=7,
            color="gray", rotation_mode="anchor")
    fig.legend(*ax.get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=2, fontsize=8,
               frameon=False, title="filled: forward, hollow: backward", title_fontsize=8)
    save(fig, path)
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


FP16_REFERENCE_STEP = "v10_pingpong"  # what the fp8 steps are measured against: the last fp16 step (05 FP8.md §17)


def attention_shape(r):
    """A forward row's shape: (B, H, Hkv, Nq, Nk, d, causal)."""
    return (r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["causal"])


def fp16_references(rows, shapes):
    """The fp8 figures' yardsticks: the fp16 forward rows of step 10 and of PyTorch's backends at `shapes` (B, H, Hkv,
    Nq, Nk, d, causal), as copies labelled "... (fp16)": fp8 has no PyTorch baseline of its own."""
    refs = []
    for r in rows:
        if (r["dtype"] == "fp16" and r["pass"] == "fwd" and r["tflops"] > 0
                and (r["chapter"] == "torch" or (r["chapter"] == "05" and r["kernel"] == FP16_REFERENCE_STEP))
                and attention_shape(r) in shapes):
            refs.append(dict(r, label=f'{r["label"]} (fp16)'))
    return refs


def ladder_05(rows, gpu, dtype, path):
    """Chapter 05's steps as bars at its largest measured shape, PyTorch flash / cuDNN as horizontal lines (for
    fp8: the fp16 rows of PyTorch and of step 10)."""
    mine = [r for r in rows if r["chapter"] == "05" and r["dtype"] == dtype and r["pass"] == "fwd" and r["tflops"] > 0]
    if not mine:
        return None
    shape_of = attention_shape
    counts = defaultdict(int)
    for r in mine:
        counts[shape_of(r)] += 1
    shape = max(counts, key=lambda s: (counts[s], -s[6], s[3], s[5]))  # most steps; no mask; longest N
    steps = [r for r in mine if shape_of(r) == shape]  # in file order: the ladder's order
    base = [r for r in rows if r["chapter"] == "torch" and r["dtype"] == dtype and r["pass"] == "fwd"
            and shape_of(r) == shape and r["tflops"] > 0]
    if dtype == "fp8":
        base = fp16_references(rows, {shape})
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(steps) + 3), 4.8))
    ax.bar(range(len(steps)), [r["tflops"] for r in steps], color=CHAPTER_COLORS["05"], width=0.7)
    for i, r in enumerate(steps):  # inside the bar's top: above it the PyTorch lines may run
        ax.text(i, r["tflops"] / 1.06, f'{r["tflops"]:.0f}', ha="center", va="top", fontsize=8, color="white",
                weight="bold")
    styles = figure_styles(base)
    for r, ls in zip(base, ("--", "-.", ":", (0, (3, 1, 1, 1)))):
        ax.axhline(r["tflops"], color=style_of(r, styles)["color"], linestyle=ls, linewidth=1.3,
                   label=f'{r["label"]}: {r["tflops"]:.0f} TFLOP/s')
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([r["kernel"] for r in steps], rotation=30, ha="right", fontsize=8)
    ax.set_yscale("log")
    lo = min(r["tflops"] for r in steps + base)
    hi = max(r["tflops"] for r in steps + base)
    ax.set_ylim(10 ** math.floor(math.log10(lo / 1.5)), hi * 1.6)
    log_y(ax, ticks=(0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
    ax.set_ylabel("TFLOP/s (log scale)")
    B, H, Hkv, Nq, Nk, d, causal = shape
    ax.set_title(f"05's ladder: forward TFLOP/s of each step, {dtype}, B={B} H={H} N={Nq} d={d}"
                 f"{' causal' if causal else ', no mask'}, on {gpu}", fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    if base:
        fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(base), fontsize=8, frameon=False)
    return save(fig, path)


def panels_vs_n(sel, panels, restyle, ylabel, title, path, log=False):
    """TFLOP/s against N, one panel per (d, causal) of `panels` (two columns), a line per label, each kernel with its
    own colour and marker (figure_styles); restyle(first row, style) may change a line's style. Shared by chapter
    05's forward and backward figures."""
    styles = figure_styles(sel)
    ncol = min(2, len(panels))
    nrow = (len(panels) + ncol - 1) // ncol
    fig, axes = plt.subplots(nrow, ncol, figsize=(6.2 * ncol, 4.0 * nrow), sharey=True, squeeze=False)
    axes = axes.ravel()
    for ax, (d, causal) in zip(axes, panels):
        lines = OrderedDict()
        for r in sel:
            if (r["d"], r["causal"]) == (d, causal):
                lines.setdefault(r["label"], []).append(r)
        for name, pts in lines.items():
            pts = sorted(pts, key=lambda r: r["Nq"])
            st = style_of(pts[0], styles)
            restyle(pts[0], st)
            ax.plot([r["Nq"] for r in pts], [r["tflops"] for r in pts], label=name, markersize=5, **st)
        pow2_ticks(ax, {r["Nq"] for v in lines.values() for r in v})
        if log:
            ax.set_yscale("log")
        ax.set_title(f"d = {d}, {'causal' if causal else 'no mask'}", fontsize=10)
        ax.set_xlabel("sequence length N (Nq = Nk; batch = tokens / N)")
        ax.grid(True, alpha=0.3)
    if log:
        for ax in axes[:len(panels)]:
            log_y(ax, ticks=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
    for ax in axes[len(panels):]:
        ax.axis("off")
    for k in range(0, len(axes), ncol):
        axes[k].set_ylabel(ylabel)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout()
    figure_legend(fig, axes[:len(panels)], ncol=3)
    return save(fig, path)


def fwd_05(rows, gpu, dtype, path):
    """05 and PyTorch TFLOP/s against N, one panel per (d, causal); B may change with N (fixed token count). The
    steps are coloured in ladder order (viridis, dark to light), each with its own marker."""
    sel = [r for r in rows if r["chapter"] in ("05", "torch") and r["dtype"] == dtype and r["pass"] == "fwd"
           and r["Nq"] == r["Nk"] and r["tflops"] > 0]
    panels = sorted({(r["d"], r["causal"]) for r in sel if r["chapter"] == "05"})
    if not panels:
        return None
    steps = sorted(OrderedDict.fromkeys(r["label"] for r in sel if r["chapter"] == "05"),
                   key=lambda n: LABEL_ORDER.get(n, 10 ** 6))
    shade = {name: plt.cm.viridis(0.9 * k / max(1, len(steps) - 1)) for k, name in enumerate(steps)}
    if dtype == "fp8":  # the yardsticks, at the fp8 rows' shapes: step 10 black, PyTorch's backends dashed
        sel += fp16_references(rows, {attention_shape(r) for r in sel if r["chapter"] == "05"})

    def restyle(r, st):
        if r["label"] in shade:
            st.update(color=shade[r["label"]])
        elif r["chapter"] == "05":  # step 10 in fp16
            st.update(color="black", linestyle=":")
    return panels_vs_n(sel, panels, restyle, "TFLOP/s (log scale)",
                       f"05 forward: TFLOP/s of each step against N, {dtype}, on {gpu}", path, log=True)


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
            st.update(linestyle="-" if r["kernel"].endswith("_atomic_dq") else ":")
    return panels_vs_n(sel, panels, restyle, "TFLOP/s (backward = 2.5x forward FLOPs)",
                       f"05 backward, last step (bwd_v{last}): TFLOP/s against N, {dtype}, on {gpu}", path)


def decode_06(rows, gpu, spec, path_n, path_splits):
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
    if plain:
        out.append(decode_bandwidth(rows, plain, ceiling, gpu, path_n))
    if split:
        out.append(decode_splits(split, ceiling, gpu, spec, path_splits))
    return out


CEILING_STYLE = dict(color="silver", linewidth=4, alpha=0.9, solid_capstyle="round")


def decode_bandwidth(rows, plain, ceiling, gpu, path):
    """One panel per (B, H, Hkv, q_len, d, dtype), each kernel its own colour and marker, PyTorch's backends on the
    same shapes dashed, the read-only kernel of the same shapes as a thick grey line (the ceiling)."""
    fam = lambda r: (r["B"], r["H"], r["Hkv"], r["Nq"], r["d"], r["dtype"])  # noqa: E731
    fams = list(OrderedDict.fromkeys(fam(r) for r in plain))[:4]
    torch_rows = [r for r in rows if r["chapter"] == "torch" and fam(r) in fams and r["gbps"] > 0]
    styles = figure_styles([r for r in plain if fam(r) in fams] + torch_rows)
    cols = min(2, len(fams))
    rows_n = (len(fams) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.4 * cols, 4.3 * rows_n), squeeze=False, sharey=True)
    ymax = max(r["gbps"] for r in plain + torch_rows + ceiling if fam(r) in fams)
    for ax, f in zip(axes.flat, fams):
        top = sorted((r for r in ceiling if fam(r) == f), key=lambda r: r["Nk"])
        if top:
            ax.plot([r["Nk"] for r in top], [r["gbps"] for r in top], label="read-only bandwidth kernel (the ceiling)",
                    zorder=1, **CEILING_STYLE)
        lines = OrderedDict()
        for r in plain + torch_rows:
            if fam(r) == f:
                lines.setdefault(r["label"], []).append(r)
        for name, pts in lines.items():
            pts = sorted(pts, key=lambda r: r["Nk"])
            ax.plot([r["Nk"] for r in pts], [r["gbps"] for r in pts], label=name, markersize=6, zorder=2,
                    **style_of(pts[0], styles))
        pow2_ticks(ax, {r["Nk"] for v in lines.values() for r in v})
        ax.set_ylim(0, ymax * 1.06)
        ax.set_xlabel("KV cache length Nk (log scale)")
        B, H, Hkv, Nq, d, dtype = f
        ax.set_title(f"{dtype}, B = {B}, H = {H}, Hkv = {Hkv}, q_len = {Nq}, d = {d}", fontsize=10)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(fams):]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("GB/s (K and V bytes read / time)")
    fig.suptitle(f"06 decoding: GB/s of K and V read against the cache length, on {gpu}", fontsize=11)
    fig.tight_layout()
    figure_legend(fig, list(axes.flat)[:len(fams)], ncol=3)
    return save(fig, path)


def decode_splits(split, ceiling, gpu, spec, path):
    """GB/s against the split count, one line per swept kernel and shape, the heuristic's choice starred; a kernel
    whose sweep is over its number of blocks (split_kv_even: each block an equal share of every group's keys) gets
    a panel of its own, so the two counts never share an axis."""
    shape_of = lambda r: (r["B"], r["H"], r["Hkv"], r["Nq"], r["Nk"], r["d"], r["dtype"])  # noqa: E731
    groups = OrderedDict()
    for r in split:  # one line per swept kernel and shape ("split_kv_gqa/s16*": kernel split_kv_gqa, 16 splits)
        m = SPLIT_KERNEL.search(r["kernel"])
        key = (r["kernel"][:m.start()].rstrip("/_-"), shape_of(r))
        groups.setdefault(key, []).append((int(m.group(1)), r["gbps"], m.group(2) == "*"))
    by_blocks = lambda kernel: "even" in kernel  # noqa: E731
    panels = [p for p in (False, True) if any(by_blocks(k) == p for k, _ in groups)]
    shapes = list(OrderedDict.fromkeys(sh for _, sh in groups))

    def shape_text(sh):
        B, H, Hkv, Nq, Nk, d, dtype = sh
        return f"B = {B}, H = {H}, Hkv = {Hkv}, q_len = {Nq}, Nk = {Nk}, d = {d}, {dtype}"
    kernels = list(OrderedDict.fromkeys(k for k, _ in groups))
    colors = dict(zip(kernels, [c for c in PALETTE if c != "tab:gray"]))
    markers = dict(zip(kernels, MARKERS))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.6 * len(panels), 4.8), squeeze=False, sharey=True)
    ymax = max(g for pts in groups.values() for _, g, _ in pts)
    ymax = max([ymax] + [r["gbps"] for r in ceiling if shape_of(r) in shapes])
    for ax, blocks in zip(axes[0], panels):
        drawn, counts, stars = set(), set(), defaultdict(list)
        for (kernel, sh), pts in groups.items():
            if by_blocks(kernel) != blocks:
                continue
            pts.sort()
            counts.update(p[0] for p in pts)
            name = kernel if len(shapes) == 1 else f"{kernel}: {shape_text(sh)}"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colors[kernel], marker=markers[kernel],
                    markersize=3.5, linewidth=1.2, label=name)
            for c, g, _ in [p for p in pts if p[2]]:
                ax.plot([c], [g], marker="*", markersize=16, color=colors[kernel], markeredgecolor="black",
                        linestyle="none", zorder=4)
                stars[c].append(g)
            top = [r for r in ceiling if shape_of(r) == sh]
            if top and sh not in drawn:  # one ceiling line per shape, however many kernels were swept
                drawn.add(sh)
                ax.axhline(top[0]["gbps"], color="gray", linewidth=1.2, linestyle="--",
                           label=f"read-only bandwidth kernel: {top[0]['gbps']:.0f} GB/s"
                           + ("" if len(shapes) == 1 else f" ({shape_text(sh)})"))
        for c, gs in stars.items():  # one number per starred count, above its highest star
            ax.annotate(f"{c}", (c, max(gs)), xytext=(0, 10), textcoords="offset points", ha="center", fontsize=9,
                        weight="bold")
        sms = spec.get("sms") if spec else None
        if blocks and sms and min(counts) <= sms <= max(counts):
            ax.axvline(sms, color="black", linestyle=":", linewidth=1, label=f"{sms} blocks = one per SM")
        ticks = [c for c in sorted(counts) if c & (c - 1) == 0]
        pow2_ticks(ax, ticks)
        ax.set_xlim(min(counts) / 1.3, max(counts) * 1.3)
        ax.set_ylim(0, ymax * 1.15)
        ax.plot([], [], marker="*", markersize=12, color="white", markeredgecolor="black", linestyle="none",
                label="the heuristic's choice (its count written above)")
        if blocks:
            ax.set_xlabel("number of blocks in the grid (log scale)")
            ax.set_title("split_kv_even: keys dealt evenly over N blocks", fontsize=10)
        else:
            ax.set_xlabel("number of KV splits per (batch, kv head) (log scale)")
            ax.set_title("split-KV kernels: keys cut into N splits", fontsize=10)
        ax.grid(True, alpha=0.3)
        h, n = ax.get_legend_handles_labels()
        order = sorted(range(len(n)), key=lambda k: (n[k].split(":")[0] not in kernels, k))  # kernels first
        ax.legend([h[k] for k in order], [n[k] for k in order], fontsize=8, loc="upper center",
                  bbox_to_anchor=(0.5, -0.16), ncol=1, frameon=False)
    axes[0][0].set_ylabel("GB/s (K and V bytes read / time)")
    title = "06 decoding: GB/s against the split count"
    if len(shapes) == 1:
        title += f", {shape_text(shapes[0])}"
    fig.suptitle(f"{title}, on {gpu}", fontsize=11)
    fig.tight_layout()
    return save(fig, path)


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
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    for ax, (which, title) in zip(axes, (("fwd", "forward"), ("bwd", "backward"))):
        modes = [k for k in sorted(pts) if (k[0] == "fwd") == (which == "fwd")]
        if not modes:
            ax.axis("off")
            continue
        for k, ((mode, shape), color) in enumerate(zip(modes, ("tab:blue", "tab:green", "tab:orange"))):
            xy = sorted(pts[(mode, shape)])
            ax.plot([x for x, _ in xy], [y for _, y in xy], marker="oD^"[k], color=color,
                    label=f"block-sparse, {names[mode]}")
            dense = [r for r in rows if r["chapter"] == "04" and r["kernel"] == BSPARSE_DENSE[mode]
                     and shape_of(r) == shape]
            if not dense:
                continue
            t = dense[0]["ms"]
            ax.plot([1.0], [t], marker="s", color=color, linestyle="none", label=f"dense, {names[mode]}")
            lo = min(x for x, _ in xy)
            ax.plot([lo, 1], [t * lo, t], color=color, linestyle=":", linewidth=1, label=f"dense × s, {names[mode]}")
            for x, y in xy:  # the speed-up over dense: below right of the first kernel's points, above left of the
                # second's (the lines rise to the right, so those corners are clear of them)
                ax.annotate(f"{t / y:.1f}×", xy=(x, y), xytext=(-6, 6) if k else (6, -12), textcoords="offset points",
                            ha="right" if k else "left", fontsize=8, color=color)
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
    fig.suptitle(f"04 block-sparse against dense: time against block density (× = dense time / block-sparse time), "
                 f"on {gpu}", fontsize=11)
    fig.tight_layout()
    return save(fig, path)


# The journey (<g>_journey.png): one forward shape, every step of the tutorial in reading order, then PyTorch's
# flash and cuDNN backends. (chapter, kernel, dtype); chapter 05's steps follow from LABELS (split_k, v1 .. v10).
JOURNEY_SHAPE = dict(B=4, H=16, Hkv=16, Nq=4096, Nk=4096, d=128, causal=0)
JOURNEY = ([("00", "naive", "fp32"), ("01", "fused_fa2_form", "fp32"), ("02", "fa1_forward", "fp32"),
            ("04", "v1_loop_swap", "fp32"), ("04", "v2_deferred_norm", "fp32"), ("04", "v3_q_grid", "fp32"),
            ("04", "v4_micro_tile", "fp32")]
           + [("05", k, "fp16") for c, k in LABELS if c == "05"]
           + [("torch", "sdpa_flash", "fp16"), ("torch", "sdpa_cudnn", "fp16")])
JOURNEY_TICKS = {("00", "naive"): "00 naive (S, P in HBM)", ("01", "fused_fa2_form"): "01 fused row (FA2 form)",
                 ("02", "fa1_forward"): "02 FA1 forward", ("04", "v4_micro_tile"): "04 v4_micro_tile (FA2)",
                 ("torch", "sdpa_flash"): "PyTorch SDPA flash (FA2)", ("torch", "sdpa_cudnn"): "PyTorch SDPA cuDNN"}


def journey(rows, gpu, spec, path):
    """Forward TFLOP/s of every step at one shape (JOURNEY_SHAPE), in reading order, coloured by chapter, on a log
    scale. Drawn only when chapter 00 was measured at that shape (the run that measures the journey runs every step
    there); a step without a row at that shape keeps its place, marked "not measured"."""
    at = {}  # the first row of each step (a kernel timed again next to a later chapter's keeps its first time)
    for r in rows:
        if (r["pass"] == "fwd" and r["dropout"] == 0 and r["tflops"] > 0
                and all(r[k] == v for k, v in JOURNEY_SHAPE.items())):
            at.setdefault((r["chapter"], r["kernel"], r["dtype"]), r)
    if not any(c == "00" for c, _, _ in at):
        return None
    steps = list(JOURNEY)
    extra = [k for k in at if k[0] == "05" and k[2] == "fp16" and k not in steps]  # a 05 step LABELS lacks
    steps[-2:-2] = extra
    fig, ax = plt.subplots(figsize=(max(9, 0.62 * len(steps) + 2), 5.6))
    vals = [at[k]["tflops"] if k in at else None for k in steps]
    measured = [v for v in vals if v]
    lo = 10 ** math.floor(math.log10(min(measured) / 1.5))
    hi = max(measured + [spec["fp16_tc_tflops"] if spec else 0]) * 2
    color_of = lambda k: TORCH_COLORS.get(k[1], "black") if k[0] == "torch" else CHAPTER_COLORS.get(k[0], "gray")  # noqa: E731
    for i, (k, v) in enumerate(zip(steps, vals)):
        if v is None:
            ax.text(i, lo * 1.15, "not measured", ha="center", va="bottom", fontsize=7, color="gray", rotation=90)
            continue
        ax.bar(i, v, color=color_of(k), width=0.72, edgecolor="black", linewidth=0.5)
        ax.text(i, v * 1.06, f"{v:.3g}" if v < 100 else f"{v:.0f}", ha="center", va="bottom", fontsize=8)
    for i in range(1, len(steps)):  # a thin line where the chapter changes
        if steps[i][0] != steps[i - 1][0]:
            ax.axvline(i - 0.5, color="gray", linewidth=0.6, alpha=0.6)
    if spec:
        for peak, text in ((spec["fp32_tflops"], "fp32 FFMA peak"), (spec["fp16_tc_tflops"], "fp16 tensor-core peak")):
            ax.axhline(peak, color="gray", linestyle=":", linewidth=1)
            ax.text(-0.45, peak * 1.08, f"{text}, {peak:.0f} TFLOP/s (spec)", ha="left", fontsize=7.5,
                    color="dimgray")  # left: above the fp32 chapters' bars, which stay under the fp32 peak
    ax.set_xticks(range(len(steps)))
    ax.set_xticklabels([JOURNEY_TICKS.get(k[:2], f"{k[0]} {k[1]}") for k in steps], rotation=40, ha="right",
                       fontsize=8, rotation_mode="anchor")
    ax.set_xlim(-0.6, len(steps) - 0.4)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    log_y(ax, ticks=(0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000))
    ax.set_ylabel("forward TFLOP/s (log scale)")
    ax.grid(True, axis="y", alpha=0.3)
    sh = JOURNEY_SHAPE
    ax.set_title(f"The journey: forward TFLOP/s of every step, B = {sh['B']}, H = {sh['H']}, N = {sh['Nq']}, "
                 f"d = {sh['d']}, {'causal' if sh['causal'] else 'no mask'}, on {gpu}\n"
                 "chapters 00-04 in fp32 (CUDA cores), 05 and PyTorch in fp16 (tensor cores)", fontsize=10)
    groups = list(OrderedDict.fromkeys(k[:2] if k[0] == "torch" else k[0] for k in steps))
    names = {"00": "00 naive", "01": "01 online softmax", "02": "02 FA1 forward", "04": "04 FA2 (steps v1-v4)",
             "05": "05 warp split-Q (steps split_k, v1-v10)", ("torch", "sdpa_flash"): "PyTorch SDPA, flash backend",
             ("torch", "sdpa_cudnn"): "PyTorch SDPA, cuDNN backend"}
    fig.tight_layout()
    fig.legend(handles=[Patch(facecolor=color_of(g if isinstance(g, tuple) else (g, "")), edgecolor="black",
                              linewidth=0.5, label=names.get(g, str(g))) for g in groups],
               loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(7, len(groups)), fontsize=8, frameon=False)
    return save(fig, path)


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


def plot_csv(path, out_dir, table=False, readme=False, journey_rows=(), fp8_rows=()):
    """Every figure of one GPU's CSV; journey_rows: that GPU's rows of a <gpu>_journey.csv, which the journey
    figure takes before the CSV's own rows at its shape; fp8_rows: those of a <gpu>_fp8.csv, which the fp8
    figures take instead of the CSV's own."""
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
    for dtype in sorted({r["dtype"] for r in rows if r["chapter"] == "05"} | ({"fp8"} if fp8_rows else set())):
        src = list(fp8_rows) if dtype == "fp8" and fp8_rows else rows  # fp8: one run, its fp16 yardsticks included
        written += [ladder_05(src, gpu, dtype, p(f"05_ladder_{dtype}")), fwd_05(src, gpu, dtype, p(f"05_fwd_{dtype}")),
                    bwd_05(src, gpu, dtype, p(f"05_bwd_{dtype}"))]
    written += decode_06(rows, gpu, spec, p("06_bandwidth"), p("06_splits"))
    written.append(block_sparse_04(rows, gpu, p("04_block_sparse")))
    # one run: the journey file's rows alone where there is one (its shape also has rows of other runs in the main CSV)
    written.append(journey(list(journey_rows) or rows, gpu, spec, p("journey")))
    return [w for w in written if w]


# The training run (<g>_train_gpt.png): scripts/train_gpt.py's loss curves of one model trained with each attention
# backend from the same seed, and each curve's difference from flash's.
TRAIN_STYLE = {"flash": ("black", "-", "PyTorch SDPA flash (FA2)"), "flash_rerun": ("gray", ":", "flash again (the noise)"),
               "cudnn": ("tab:pink", "--", "PyTorch SDPA cuDNN"), "ours": ("tab:purple", "-", "ours (05's last steps)")}


def training(path, out_dir):
    """Loss against step for each backend (left) and its difference from flash's (right), tokens/s in the legend."""
    curves = OrderedDict()
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            c = curves.setdefault(r["backend"], {"gpu": r["gpu"], "step": [], "loss": [], "ms": [], "tokens": 0})
            c["step"].append(int(r["step"]))
            c["loss"].append(float(r["loss"]))
            c["ms"].append(float(r["ms_per_step"]))
            c["tokens"] = int(r["tokens_per_step"])
    if not curves:
        return None
    gpu = next(iter(curves.values()))["gpu"]
    fig, (ax, dx) = plt.subplots(1, 2, figsize=(12, 4.6))
    fig.subplots_adjust(wspace=0.32)
    ref = curves.get("flash")
    for name, c in curves.items():
        color, ls, label = TRAIN_STYLE.get(name, ("tab:blue", "-", name))
        ms = sorted(c["ms"][2:] or c["ms"])[len(c["ms"][2:] or c["ms"]) // 2]
        label = f"{label}: {c['tokens'] / ms:.0f}k tokens/s"  # tokens per ms = thousands per second
        ax.plot(c["step"], c["loss"], color=color, linestyle=ls, linewidth=1.4, label=label)
        if ref and name != "flash":
            dx.plot(c["step"], [x - y for x, y in zip(c["loss"], ref["loss"])], color=color, linestyle=ls,
                    linewidth=1.2, label=label.split(":")[0])
    ax.set_yscale("log")
    log_y(ax, ticks=(0.5, 0.7, 1, 1.5, 2, 3, 4, 5, 7, 10))
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (log scale)")
    ax.set_title("loss of each backend, same seed and data")
    ax.grid(True, alpha=0.3, which="both")
    dx.axhline(0, color="black", linewidth=0.8)
    dx.set_xlabel("step")
    dx.set_ylabel("loss minus flash's loss")
    dx.set_title("difference from the flash run")
    dx.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), bbox_to_anchor=(0.5, -0.06), frameon=False)
    fig.suptitle(f"A small GPT trained with each attention backend on {gpu} (scripts/train_gpt.py)")
    out = os.path.join(out_dir, f"{short_name(gpu)}_train_gpt.png")
    save(fig, out)
    plt.close(fig)
    return out


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
                  and not any(part in f for part in SIDE_TABLES) and os.path.join(args.results, f) not in io_files)
    journey_files = [c for c in csvs if c.endswith(JOURNEY_SUFFIX)]
    fp8_files = [c for c in csvs if c.endswith(FP8_SUFFIX)]
    csvs = [c for c in csvs if c not in journey_files and c not in fp8_files]
    if not csvs and not journey_files:
        raise SystemExit(f"no .csv files in {args.results}")

    def side_rows(files, what):  # GPU -> rows of its side files
        by_gpu = OrderedDict()
        for c in files:
            rows, _ = read_rows(c)
            print(f"{c}: {len(rows)} rows for {what}")
            for r in rows:
                by_gpu.setdefault(r["gpu"], []).append(r)
        return by_gpu
    journey_rows = side_rows(journey_files, "the journey figure")
    fp8_rows = side_rows(fp8_files, "the fp8 figures")
    os.makedirs(args.out, exist_ok=True)
    written = []
    for c in csvs:
        with open(c, newline="") as f:
            gpus = {r["gpu"] for r in csv.DictReader(f)}
        written += plot_csv(c, args.out, args.roofline_table, args.readme_table,
                            [r for g in gpus for r in journey_rows.pop(g, [])],
                            [r for g in gpus for r in fp8_rows.pop(g, [])])
    for gpu, rows in journey_rows.items():  # a journey file of a GPU with no other CSV: its figure alone
        written.append(journey(rows, gpu, SPEC.get(short_name(gpu)), os.path.join(args.out,
                                                                                  f"{short_name(gpu)}_journey.png")))
    for gpu, rows in fp8_rows.items():  # the same for an fp8 file
        out = lambda name: os.path.join(args.out, f"{short_name(gpu)}_{name}.png")  # noqa: E731
        written += [ladder_05(rows, gpu, "fp8", out("05_ladder_fp8")), fwd_05(rows, gpu, "fp8", out("05_fwd_fp8"))]
    written = [w for w in written if w]
    for c in io_files:
        rows = io_counters.read_rows(c)
        if args.io_table:
            print(f"\n{c}\n\n{io_counters.table(rows)}\n")
        written.append(io_counters.draw(rows, os.path.join(args.out, f"{short_name(rows[0]['gpu'])}_io.png"),
                                        CHAPTER_COLORS))
    for f in sorted(os.listdir(args.results)):
        if f.endswith(TRAIN_SUFFIX):
            written.append(training(os.path.join(args.results, f), args.out))
    written += figures.draw_all(args.out)
    for w in written:
        print(f"wrote {w}")


if __name__ == "__main__":
    main()
