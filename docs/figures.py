#!/usr/bin/env python3
"""The diagrams of docs/ that come from no measurement: the map of the chapters and the FlashAttention-3
schedules. docs/plot.py calls draw_all(), so `python3 docs/plot.py` regenerates these with the data plots;
`python3 docs/figures.py [OUT_DIR]` draws only these.
"""
import argparse
import os
import sys

try:
    import matplotlib
except ImportError:
    sys.exit("docs/figures.py needs matplotlib: apt-get install python3-matplotlib (Debian/Ubuntu) or pip install matplotlib")

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch  # noqa: E402

# One box per chapter: name, what lives in HBM besides Q, K, V, O, extra memory, how the GPU is filled.
CHAPTERS = [
    ("00 naive", "S, P written to HBM\nand read back", "extra O(B H N\u00b2)", "3 kernels,\nlarge GEMMs"),
    ("01 online softmax", "(m, l) merged on the fly;\none row, one warp", "extra 0", "one warp per\nquery row"),
    ("02 FA1 forward", "K_j, V_j tiles in SRAM;\nO, l, m round-trip HBM", "extra O(B H N)", "one block per\n(batch, head)"),
    ("03 FA1 backward", "P recomputed from\n(m, l); D = rowsum(dO\u2218O)", "extra O(B H N)", "one block per\n(batch, kv head)"),
    ("04 FA2", "Q_i outer loop, O~ in\nregisters, only L stored", "extra 0 (fwd)", "one block per\n(Q block, head)"),
    ("05 warp split-Q", "same algorithm on\ntensor cores, fp16/bf16", "extra 0 (fwd)", "warps own rows\nof Q_i"),
    ("06 flash decoding", "Nq = 1..8: split the KV\nsequence, merge by LSE", "extra O(splits)", "blocks over\n(KV split, kv head)"),
]
CHANGES = ["online\nsoftmax", "tiling", "recompute", "swap loops,\ndefer /l", "mma.sync,\nsplit-Q", "split KV"]
COLORS = ["#f4cccc", "#fce5cd", "#fff2cc", "#fff2cc", "#d9ead3", "#d9d2e9", "#d0e0e3"]


def draw_map(path):
    fig, ax = plt.subplots(figsize=(16, 4.2))
    ax.set_xlim(0, 7 * 2.3)
    ax.set_ylim(0, 4.2)
    ax.axis("off")
    w, h, gap = 1.9, 3.2, 0.4
    for k, (name, idea, mem, grid) in enumerate(CHAPTERS):
        x = k * (w + gap) + 0.1
        ax.add_patch(FancyBboxPatch((x, 0.4), w, h, boxstyle="round,pad=0.04", fc=COLORS[k], ec="black", lw=1))
        ax.text(x + w / 2, 3.35, name, ha="center", va="center", fontsize=10, weight="bold")
        ax.text(x + w / 2, 2.55, idea, ha="center", va="center", fontsize=8)
        ax.text(x + w / 2, 1.65, mem, ha="center", va="center", fontsize=8, style="italic")
        ax.text(x + w / 2, 0.95, grid, ha="center", va="center", fontsize=8, color="#333333")
        if k < len(CHANGES):
            ax.add_patch(FancyArrowPatch((x + w + 0.03, 2.0), (x + w + gap - 0.03, 2.0), arrowstyle="-|>",
                                         mutation_scale=12, lw=1))
            ax.text(x + w + gap / 2, 3.95, CHANGES[k], ha="center", va="center", fontsize=7, color="#444444")
    ax.text(0.1, 0.12, "rows of each box: the idea | extra memory beyond Q, K, V, O and L | how the work fills "
            "the GPU.  Above the arrows: the one change from one chapter to the next.", fontsize=8)
    ax.set_title("From standard attention to FlashAttention-2 on tensor cores and Flash-Decoding: one idea per "
                 "chapter", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def timeline(ax, rows, title, xlabel=True):
    """rows: [(label, [(start, length, text, color), ...])] drawn as horizontal bars, top to bottom. A bar of one
    unit holds about 8 characters a line: longer texts are given two lines ("\n")."""
    for y, (name, bars) in enumerate(reversed(rows)):
        for start, length, text, color in bars:
            ax.barh(y, length, left=start, height=0.66, color=color, edgecolor="black", linewidth=0.6)
            ax.text(start + length / 2, y, text, ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([r[0] for r in reversed(rows)], fontsize=8)
    if xlabel:
        ax.set_xlabel("time (schematic: one GEMM = 2 units, one softmax = 1 unit)")
    ax.set_title(title, fontsize=10)
    ax.set_xlim(0, 14.5)
    ax.grid(True, axis="x", alpha=0.3)


GEMM, SOFT, LOAD = "#9fc5e8", "#f9cb9c", "#b6d7a8"


def key(fig, load=False):
    """What the colours mean, below the panels (the figure is saved with bbox_inches="tight")."""
    items = [(GEMM, "GEMM on the tensor cores (wgmma)"), (SOFT, "softmax on the CUDA cores")]
    if load:
        items.append((LOAD, "TMA copy of K_j, V_j into shared-memory stage s"))
    fig.legend(handles=[Patch(facecolor=c, edgecolor="black", linewidth=0.6, label=t) for c, t in items],
               loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=len(items), fontsize=8, frameon=False)


def save(fig, path):
    fig.savefig(path, dpi=110, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def draw_fa3_pingpong(path):
    """Two consumer warpgroups, each: GEMM0 (S = Q K^T), softmax, GEMM1 (O += P V); their softmax in the
    other's GEMM."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    serial = [("warpgroup 1", [(0, 2, "QK\u1d40 j", GEMM), (2, 1, "softmax\nj", SOFT), (3, 2, "PV j", GEMM),
                               (5, 2, "QK\u1d40 j+1", GEMM), (7, 1, "softmax\nj+1", SOFT), (8, 2, "PV j+1", GEMM)]),
              ("tensor cores busy", [(0, 2, "", GEMM), (3, 2, "", GEMM), (5, 2, "", GEMM), (8, 2, "", GEMM)])]
    timeline(axes[0], serial, "one warpgroup alone: the tensor cores idle during every softmax", xlabel=False)
    pp = [("warpgroup 1", [(0, 2, "QK\u1d40 j", GEMM), (2, 1, "softmax\nj", SOFT), (4, 2, "PV j", GEMM),
                           (6, 2, "QK\u1d40 j+1", GEMM), (8, 1, "softmax\nj+1", SOFT), (12, 2, "PV j+1", GEMM)]),
          ("warpgroup 2", [(2, 2, "QK\u1d40 j", GEMM), (4, 1, "softmax\nj", SOFT), (8, 2, "PV j", GEMM),
                           (10, 2, "QK\u1d40 j+1", GEMM), (12, 1, "softmax\nj+1", SOFT)]),
          ("tensor cores busy", [(0, 2, "wg 1", GEMM), (2, 2, "wg 2", GEMM), (4, 4, "wg 1", GEMM),
                                 (8, 4, "wg 2", GEMM), (12, 2, "wg 1", GEMM)])]
    timeline(axes[1], pp, "ping-pong: barriers order the GEMMs so one group's softmax hides under the other's GEMM")
    fig.tight_layout()
    key(fig)
    return save(fig, path)


def draw_fa3_pipeline(path):
    """Producer/consumer with a ring of shared-memory stages, and the intra-warpgroup overlap."""
    fig, axes = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True)
    prod = [("producer warp (TMA)", [(0, 1, "K,V 0\n\u2192 s0", LOAD), (1, 1, "K,V 1\n\u2192 s1", LOAD),
                                     (6, 1, "K,V 2\n\u2192 s0", LOAD), (11, 1, "K,V 3\n\u2192 s1", LOAD)]),
            ("consumer warpgroup", [(1, 2, "QK\u1d40 0", GEMM), (3, 1, "sm 0", SOFT), (4, 2, "PV 0", GEMM),
                                    (6, 2, "QK\u1d40 1", GEMM), (8, 1, "sm 1", SOFT), (9, 2, "PV 1", GEMM)])]
    timeline(axes[0], prod, "warp specialisation, 2 stages s0, s1: the producer refills a stage as soon as "
             "the consumers release it", xlabel=False)
    intra = [("consumer warpgroup", [(0, 2, "QK\u1d40 j+1", GEMM), (2, 2, "PV j", GEMM), (4, 2, "QK\u1d40 j+2", GEMM),
                                     (6, 2, "PV j+1", GEMM), (8, 2, "QK\u1d40 j+3", GEMM)]),
             ("same warpgroup, CUDA cores", [(2, 1, "softmax\nj+1", SOFT), (6, 1, "softmax\nj+2", SOFT)])]
    timeline(axes[1], intra, "intra-warpgroup overlap: softmax of block j+1 runs while the async wgmma of P\u2c7c V\u2c7c does")
    fig.tight_layout()
    key(fig, load=True)
    return save(fig, path)


def draw_all(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    return [draw_map(os.path.join(out_dir, "map.png")),
            draw_fa3_pingpong(os.path.join(out_dir, "fa3_pingpong.png")),
            draw_fa3_pipeline(os.path.join(out_dir, "fa3_pipeline.png"))]


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out_dir", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures"),
                    help="folder the PNGs are written to (default: docs/figures)")
    for p in draw_all(ap.parse_args().out_dir):
        print(f"wrote {p}")
