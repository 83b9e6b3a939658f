#!/usr/bin/env python3
"""Figures of chapter 06 (drawn from the chapter's formulas, no GPU needed):
  figures/split_merge.png  one query row against a long K/V cache: the keys cut into splits, one block each,
                           partials (O_s, LSE_s) in a workspace, the merge weighting them by exp(LSE_s - M)
  figures/grid_fill.png    blocks in the grid vs the SMs of an H100 (the heuristic's slots) for FA2's grid and
                           the split grid, at the chapter's measured shapes
Run: python3 06_flash_decoding/figures/figures.py
"""
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, Rectangle  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))  # this script sits next to its figures

# The heuristic of model.hpp (choose_splits), repeated here for the figure.
MIN_SPLIT_KEYS, MAX_SPLITS, SLACK = 256, 128, 1.05


def max_splits(n):
    return min(max(math.ceil(n / MIN_SPLIT_KEYS), 1), MAX_SPLITS)


def choose_splits(blocks, n, slots):
    if blocks >= slots or n <= 0:
        return 1
    cost = lambda s: math.ceil(blocks * s / slots) / s  # noqa: E731
    best = min(cost(s) for s in range(1, max_splits(n) + 1))
    return next(s for s in range(1, max_splits(n) + 1) if cost(s) <= SLACK * best)


def split_merge():
    fig, ax = plt.subplots(figsize=(10, 4.6))
    ax.set_xlim(0, 10)
    ax.set_ylim(0, 5.2)
    ax.axis("off")
    S = 4
    colors = ["#4C72B0", "#55A868", "#C44E52", "#8172B2"]
    ax.add_patch(Rectangle((0.3, 4.4), 0.5, 0.5, color="#DD8452"))
    ax.text(0.55, 4.65, "q", ha="center", va="center", color="white", fontsize=12)
    ax.text(1.0, 4.65, "one query row (q_len 1), read by every split", va="center", fontsize=9)
    width = 9.0 / S
    for s in range(S):
        x = 0.5 + s * width
        ax.add_patch(Rectangle((x, 3.4), width - 0.1, 0.6, color=colors[s], alpha=0.85))
        ax.text(x + (width - 0.1) / 2, 3.7, f"K, V keys of split {s}", ha="center", va="center", color="white", fontsize=9)
        ax.add_patch(Rectangle((x + 0.25, 2.2), width - 0.6, 0.7, fill=False, ec=colors[s], lw=2))
        ax.text(x + (width - 0.1) / 2, 2.55, f"block {s}: online softmax\n(m_s, l_s, O~_s)", ha="center", va="center",
                fontsize=8)
        ax.add_patch(FancyArrowPatch((x + (width - 0.1) / 2, 3.4), (x + (width - 0.1) / 2, 2.9), arrowstyle="->",
                                     mutation_scale=12))
        ax.text(x + (width - 0.1) / 2, 1.65, "O_s = O~_s / l_s\nLSE_s = m_s + log l_s", ha="center", va="center",
                fontsize=8, family="monospace")
        ax.add_patch(FancyArrowPatch((x + (width - 0.1) / 2, 1.35), (5.0, 0.85), arrowstyle="->", mutation_scale=12,
                                     color="gray"))
    ax.text(0.5, 4.12, "split-KV: S blocks per (batch, kv group); each writes a partial to the workspace", fontsize=9)
    ax.add_patch(Rectangle((2.2, 0.1), 5.6, 0.7, fill=False, ec="black", lw=2))
    ax.text(5.0, 0.45, "merge:  M = max_s LSE_s,  w_s = exp(LSE_s - M)  (0 for an empty split)\n"
            "O = sum w_s O_s / sum w_s,   LSE = M + log sum w_s", ha="center", va="center", fontsize=9)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "split_merge.png"), dpi=130)
    plt.close(fig)


def grid_fill():
    sms = 132  # H100 SXM; the heuristic's slots are the SMs (README §4)
    shapes = [(1, 32), (1, 8), (8, 32), (8, 8)]  # (B, Hkv) with H = 32, q_len 1, N = 32k
    labels, fa2, split = [], [], []
    for B, hkv in shapes:
        labels.append(f"B={B}\nHkv={hkv}")
        fa2.append(B * 32)  # FA2's grid: one block per (query head, batch) at q_len 1
        s = choose_splits(B * hkv, 32768, sms)
        split.append(B * hkv * s)
    fig, ax = plt.subplots(figsize=(7, 4))
    xs = range(len(shapes))
    bars = [ax.bar([x - 0.2 for x in xs], fa2, width=0.4, label="FA2 grid: B x H blocks"),
            ax.bar([x + 0.2 for x in xs], split, width=0.4, label="split_kv_gqa: B x Hkv x S blocks (heuristic S)")]
    bottom = 20  # the axis starts here (log scale); each count is written half-way up its bar, in log terms
    for bar in bars:  # the block count in each bar: 128 and 132 are too close to read off the axis
        for rect in bar:
            h = rect.get_height()
            ax.text(rect.get_x() + rect.get_width() / 2, math.sqrt(bottom * h), f"{h:.0f}", ha="center",
                    va="center", fontsize=9, color="white", weight="bold")
    ax.axhline(sms, color="black", ls="--", lw=1)
    ax.text(-0.45, sms * 1.08, f"{sms} SMs: the heuristic's slots, one block each", ha="left", fontsize=8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels)
    ax.set_yscale("log")
    ax.set_ylim(bottom, 1500)  # room above the bars for the legend
    ax.set_ylabel("blocks in the grid (log scale)")
    ax.set_title("Blocks in the grid: decoding, H = 32, q_len 1, N = 32k, d = 128\n"
                 "(the split heuristic's model of an H100, 132 SMs)", fontsize=11)
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "grid_fill.png"), dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    split_merge()
    grid_fill()
    print("wrote", os.path.join(OUT, "split_merge.png"), "and grid_fill.png")
