#!/usr/bin/env python3
"""Predicted against measured HBM traffic: each chapter's model_hbm_bytes next to Nsight Compute's DRAM bytes.

    python3 docs/io_counters.py                      # every docs/results/*_io.csv: a figure each, and the table
    python3 docs/io_counters.py --results DIR --out DIR

scripts/io_counters.sh writes docs/results/<gpu>_io.csv, one row per measured pass: gpu, chapter, kernel, pass,
shape, model_hbm_bytes (the chapter's traffic model), dram_read and dram_write (dram__bytes_read.sum and
dram__bytes_write.sum over the pass's kernel launches), ratio ((read + write) / model) and launches (the kernels
added up). For each file this draws <g>_io.png (<g>: the GPU's short name, h100): measured against predicted
bytes on log-log axes with the line y = x, one labelled point per pass; and prints the markdown table of
docs/io.md. docs/plot.py calls draw() too, so `python3 docs/plot.py` redraws this figure with all the others.
"""
import argparse
import csv
import math
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("docs/io_counters.py needs matplotlib: apt-get install python3-matplotlib (Debian/Ubuntu) or pip install matplotlib")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

SUFFIX = "_io.csv"  # how scripts/io_counters.sh names its files, and how docs/plot.py tells them apart


def read_rows(path):
    """Typed rows of one _io.csv, all of one GPU (the figure and the table are per GPU)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    for r in rows:
        for k in ("model_hbm_bytes", "dram_read", "dram_write"):
            r[k] = float(r[k])
        r["measured"] = r["dram_read"] + r["dram_write"]
        if r["model_hbm_bytes"] <= 0:
            raise SystemExit(f'{path}: {r["chapter"]} {r["kernel"]} {r["pass"]}: model_hbm_bytes must be > 0')
    gpus = sorted({r["gpu"] for r in rows})
    if len(gpus) != 1:
        raise SystemExit(f"{path}: rows of {len(gpus)} GPUs ({', '.join(gpus)}); keep one file per GPU")
    return rows


def name(r):
    return f'{r["chapter"]} {r["kernel"]} {r["pass"]}'


def mb(x):
    return f"{x / 1e6:,.1f}"


def table(rows):
    """The markdown table of docs/io.md, in file order (the chapters' order)."""
    lines = ["| chapter | kernel | pass | shape | model (MB) | DRAM read (MB) | DRAM write (MB) | measured / model |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f'| {r["chapter"]} | {r["kernel"]} | {r["pass"]} | {r["shape"]} | {mb(r["model_hbm_bytes"])} | '
                     f'{mb(r["dram_read"])} | {mb(r["dram_write"])} | {r["measured"] / r["model_hbm_bytes"]:.2f} |')
    return "\n".join(lines)


def draw(rows, path, colors=None):
    """Measured (read + write) against predicted bytes, log-log, with y = x and a factor-2 band. Points carry a
    number; the key beside the axes names each (labels next to the points overlap where passes are close)."""
    colors = colors or {}
    xs = [r["model_hbm_bytes"] for r in rows]
    ys = [r["measured"] for r in rows]
    lo = min(xs + [y for y in ys if y > 0]) / 2
    hi = max(xs + ys) * 2
    fig, (ax, key) = plt.subplots(1, 2, figsize=(11.5, 7), gridspec_kw=dict(width_ratios=(2.2, 1)))
    ax.plot([lo, hi], [lo, hi], color="black", linewidth=1, label="measured = model")
    ax.plot([lo, hi], [2 * lo, 2 * hi], color="gray", linewidth=0.8, linestyle=":", label="2x and 1/2x the model")
    ax.plot([lo, hi], [lo / 2, hi / 2], color="gray", linewidth=0.8, linestyle=":")
    key.axis("off")
    key.text(0, 1, "#  pass  (measured / model)", fontsize=8, weight="bold", va="top", transform=key.transAxes)
    step = min(0.06, 0.95 / max(1, len(rows)))  # the key's line spacing: two text lines per pass
    spots = []  # [(x, y, [numbers], colour)]: points within 4% of each other in both axes share one label
    for k, r in enumerate(rows, start=1):
        y = max(r["measured"], lo)  # a pass that read nothing from DRAM still gets a point, on the bottom edge
        filled = r["pass"] == "fwd"
        c = colors.get(r["chapter"], "tab:gray")
        ax.scatter(r["model_hbm_bytes"], y, s=36, facecolors=c if filled else "none", edgecolors=c, linewidths=1.2,
                   zorder=3)
        x = r["model_hbm_bytes"]
        near = [sp for sp in spots if abs(math.log(sp[0] / x)) < 0.04 and abs(math.log(sp[1] / y)) < 0.04]
        if near:
            near[0][2].append(k)
        else:
            spots.append((x, y, [k], c))
        key.text(0, 1 - step * k, f'{k:>2}  {name(r)}  ({r["measured"] / r["model_hbm_bytes"]:.2f}x)\n'
                 f'     {r["shape"]}', fontsize=7, color=c, va="top", transform=key.transAxes, family="monospace")
    for n, (x, y, ks, c) in enumerate(spots):
        ax.annotate(", ".join(map(str, ks)), (x, y), xytext=(6, 3 if n % 2 else -10), textcoords="offset points",
                    fontsize=8, color=c)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("predicted: the chapter's model_hbm_bytes (log scale)")
    ax.set_ylabel("measured: dram__bytes_read.sum + dram__bytes_write.sum (log scale)")
    ax.set_title("filled: forward, hollow: backward; below the line: fewer bytes than the model (L2 hits),\n"
                 "above: more (partial sectors, write-allocate, traffic the model leaves out)", fontsize=8)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f'HBM traffic of each pass: the traffic model against Nsight Compute, on {rows[0]["gpu"]}',
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def io_csvs(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(SUFFIX))


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=os.path.join(here, "results"), help="folder of *_io.csv files")
    ap.add_argument("--out", default=os.path.join(here, "figures"), help="folder the PNGs are written to")
    args = ap.parse_args()
    if not os.path.isdir(args.results):
        ap.error(f"--results {args.results}: no such folder")
    import plot  # the GPU's short name and the chapters' colours, as in every other figure

    paths = io_csvs(args.results)
    if not paths:
        raise SystemExit(f"no *{SUFFIX} files in {args.results}: run scripts/io_counters.sh on a GPU first")
    os.makedirs(args.out, exist_ok=True)
    for p in paths:
        rows = read_rows(p)
        print(f"\n{p}: {len(rows)} passes on {rows[0]['gpu']}\n\n{table(rows)}\n")
        g = plot.short_name(rows[0]["gpu"])
        print("wrote " + draw(rows, os.path.join(args.out, f"{g}_io.png"), plot.CHAPTER_COLORS))


if __name__ == "__main__":
    main()
