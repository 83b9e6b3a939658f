#!/usr/bin/env python3
"""Figures for chapter 04 (FlashAttention-2), written to 04_fa2/figures/.

    python3 04_fa2/figures/figures.py

  loop_order.png     FA1 (chapter 02) vs FA2 (chapter 04): which loop is outer, what a thread block
                     owns, and what makes a round trip through HBM.
  causal_tiles.png   the (Q block, K/V block) tiles of a causal problem: skipped (above the diagonal,
                     never loaded), diagonal (crossing it: the mask is evaluated), interior (no mask).
                     Bottom-right aligned, drawn for Nq = 6 and Nk = 8 blocks of 64.
  micro_tile.png     forward step 4: a 4 x 4 micro-tile of S_ij per thread (rows 4ty.., columns tx + 16c)
                     and the float4 loads that feed it.
The causal classification is the kernels' (fa2_tiles.cuh: needs_mask, kv_end; Problem::visible).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))


def loop_order(path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8))
    tr, tc = 4, 4
    colors = ["#9dc3e6", "#c5e0b4", "#f4b183", "#ffe699"]
    for ax, fa2 in zip(axes, [False, True]):
        for i in range(tr):
            for j in range(tc):
                owner = i if fa2 else j  # FA2: block i owns row block i; FA1 (as in 02): one block walks column j
                ax.add_patch(patches.Rectangle((j, i), 1, 1, facecolor=colors[owner] if fa2 else "#eeeeee",
                                               edgecolor="black"))
        if fa2:
            ax.set_title("FA2 (chapter 04): outer loop over Q blocks = the grid\n"
                         "thread block i owns row block i; $O_i, \\ell_i, m_i$ stay on chip")
            for i in range(tr):
                ax.annotate("", xy=(tc - 0.15, i + 0.5), xytext=(0.15, i + 0.5),
                            arrowprops=dict(arrowstyle="->", lw=1.5))
                ax.text(tc + 0.1, i + 0.5, f"block {i}: streams $K_j, V_j$", va="center", fontsize=9)
        else:
            ax.set_title("FA1 (chapter 02): outer loop over K/V blocks\n"
                         "one thread block per (batch, head) walks every tile")
            order = 0
            for j in range(tc):
                for i in range(tr):
                    ax.text(j + 0.5, i + 0.5, str(order), ha="center", va="center", fontsize=9)
                    order += 1
            ax.text(tc + 0.1, 1.5, "$O_i, \\ell_i, m_i$ read and\nwritten in HBM at\nevery (i, j)", va="center",
                    fontsize=9)
        ax.set_xlim(-0.2, tc + 2.6)
        ax.set_ylim(tr + 0.4, -0.6)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.text(tc / 2, -0.35, "K/V block j", ha="center", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def causal_tiles(path):
    B = 64
    nq, nk = 6 * B, 8 * B
    shift = nk - nq  # bottom-right alignment: query i sees key j iff j <= i + shift

    def visible(i, j):
        return j < nk and j <= i + shift

    fig, ax = plt.subplots(figsize=(7.5, 5.2))
    kinds = {"skipped": "#ffffff", "diagonal": "#f4b183", "interior": "#9dc3e6"}
    for bi in range(nq // B):
        for bj in range(nk // B):
            i0, j0 = bi * B, bj * B
            last_row = i0 + B - 1
            if not visible(last_row, j0):
                kind = "skipped"  # the block's last row sees no key of the tile: the K/V loop has stopped
            elif not visible(i0, j0 + B - 1):
                kind = "diagonal"  # the first row misses the last key: the mask is evaluated
            else:
                kind = "interior"
            ax.add_patch(patches.Rectangle((bj, bi), 1, 1, facecolor=kinds[kind], edgecolor="black",
                                           hatch="//" if kind == "skipped" else None))
    ax.plot([shift / B, nk / B], [0, nq / B], color="#c00000", lw=2)
    handles = [patches.Patch(facecolor=c, edgecolor="black", hatch="//" if k == "skipped" else None, label=k)
               for k, c in kinds.items()]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(1.02, 0.0))
    ax.set_title("causal tiles, $N_q = 384$, $N_k = 512$, 64 x 64 tiles (bottom-right aligned:\n"
                 "query i sees key j iff $j \\leq i + N_k - N_q$; red: the diagonal)")
    ax.set_xlabel("K/V block j")
    ax.set_ylabel("Q block i")
    ax.set_xlim(0, nk / B)
    ax.set_ylim(nq / B, 0)
    ax.set_aspect("equal")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def micro_tile(path):
    br = bc = 64
    t, micro = 16, 4
    fig, ax = plt.subplots(figsize=(6.6, 6.4))
    ax.set_title("step 4: thread (ty, tx) owns a 4 x 4 micro-tile of $S_{ij}$\n"
                 "rows 4ty..4ty+3 (contiguous), columns tx, tx+16, tx+32, tx+48")
    for ty in range(t):
        for tx in range(t):
            shade = "#deebf7" if (ty + tx) % 2 == 0 else "#f2f2f2"
            for c in range(micro):
                ax.add_patch(patches.Rectangle((tx + t * c, ty * micro), 1, micro, facecolor=shade, edgecolor="none"))
    ty, tx = 5, 3
    for c in range(micro):
        ax.add_patch(patches.Rectangle((tx + t * c, ty * micro), 1, micro, facecolor="#c00000", edgecolor="black"))
    ax.text(bc + 1, ty * micro + 2, "per 4 values of d:\n4 float4 of $Q_i$ (its rows)\n"
            "4 float4 of $K_j$ (its columns)\n-> 64 FMAs", va="center", fontsize=9)
    ax.set_xlim(0, bc + 24)
    ax.set_ylim(br + 1, -1)
    ax.set_aspect("equal")
    ax.set_xlabel("key column of $S_{ij}$")
    ax.set_ylabel("query row of $S_{ij}$")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    os.makedirs(OUT, exist_ok=True)
    loop_order(os.path.join(OUT, "loop_order.png"))
    causal_tiles(os.path.join(OUT, "causal_tiles.png"))
    micro_tile(os.path.join(OUT, "micro_tile.png"))


if __name__ == "__main__":
    main()
