#!/usr/bin/env python3
"""Figures for chapter 02 (FlashAttention-1 forward), written to 02_fa1_forward/figures/.

    python3 02_fa1_forward/figures.py

  tiles_sram_hbm.png   where S lives: 00 writes the whole Nq x Nk matrix to HBM; 02 computes one
                       Br x Bc tile S_ij at a time in shared memory (SRAM) and never stores S.
  thread_grid.png      the 16 x 16 thread grid over one S_ij tile (Br = Bc = 64): the rows and the
                       strided columns thread (ty, tx) owns.
Pure matplotlib; the sizes drawn are the kernel's (fa1_forward.cu: kTx = kTy = 16, Bc = 64, Br = min(d, 64)).
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.patches as patches  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "figures")


def tiles_sram_hbm(path):
    fig, axes = plt.subplots(1, 2, figsize=(10, 4.6))
    nq, nk, br, bc = 8, 8, 2, 2  # an 8 x 8 grid of tiles
    ax = axes[0]
    ax.set_title("chapter 00: S and P in HBM\n(the whole $N_q \\times N_k$ matrix, written and read)")
    ax.add_patch(patches.Rectangle((0, 0), nk, nq, facecolor="#f4b183", edgecolor="black"))
    ax.text(nk / 2, nq / 2, "S, P\nin HBM\n$4 N_q N_k$ bytes each", ha="center", va="center", fontsize=11)
    ax = axes[1]
    ax.set_title("chapter 02: one tile $S_{ij}$ at a time in SRAM\n(Q block i = 2, K/V block j = 1 shown)")
    for i in range(nq // br):
        for j in range(nk // bc):
            ax.add_patch(patches.Rectangle((j * bc, i * br), bc, br, facecolor="white", edgecolor="#bbbbbb"))
    i, j = 2, 1
    ax.add_patch(patches.Rectangle((j * bc, i * br), bc, br, facecolor="#9dc3e6", edgecolor="black", lw=2))
    ax.text(j * bc + bc / 2, i * br + br / 2, "$S_{ij}$\nSRAM", ha="center", va="center", fontsize=10)
    ax.text(nk / 2, nq + 0.9, "the other tiles are never stored: each is computed, used, dropped",
            ha="center", fontsize=9)
    # Q_i to the left, K_j on top
    ax.add_patch(patches.Rectangle((-1.4, i * br), 1.0, br, facecolor="#c5e0b4", edgecolor="black"))
    ax.text(-0.9, i * br + br / 2, "$Q_i$", ha="center", va="center")
    ax.add_patch(patches.Rectangle((j * bc, -1.4), bc, 1.0, facecolor="#c5e0b4", edgecolor="black"))
    ax.text(j * bc + bc / 2, -0.9, "$K_j^T$", ha="center", va="center")
    for ax in axes:
        ax.set_xlim(-1.8, nk + 0.3)
        ax.set_ylim(nq + 1.4, -1.8)
        ax.set_aspect("equal")
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def thread_grid(path):
    br, bc, t = 64, 64, 16
    rows_per_thread = br // t
    fig, ax = plt.subplots(figsize=(6.4, 6.4))
    ax.set_title("one $S_{ij}$ tile ($B_r = B_c = 64$), 256 threads as 16 x 16:\n"
                 "thread (ty, tx) owns rows 4ty..4ty+3 and columns tx, tx+16, tx+32, tx+48")
    for ty in range(t):
        for tx in range(t):
            for c in range(bc // t):
                x = tx + t * c
                shade = "#deebf7" if (ty + tx) % 2 == 0 else "#f2f2f2"
                ax.add_patch(patches.Rectangle((x, ty * rows_per_thread), 1, rows_per_thread, facecolor=shade,
                                               edgecolor="none"))
    ty, tx = 5, 3  # one thread highlighted
    for c in range(bc // t):
        ax.add_patch(patches.Rectangle((tx + t * c, ty * rows_per_thread), 1, rows_per_thread,
                                       facecolor="#c00000", edgecolor="black"))
    ax.text(bc + 1, ty * rows_per_thread + 2, "thread (ty=5, tx=3):\n4 rows x 4 strided columns", va="center",
            fontsize=9)
    ax.text(bc / 2, br + 4, "a half-warp (16 lanes, same ty) holds whole rows: row max and sum by 4 shuffles",
            ha="center", fontsize=9)
    ax.set_xlim(0, bc + 22)
    ax.set_ylim(br + 6, -1)
    ax.set_aspect("equal")
    ax.set_xlabel("key column of $S_{ij}$")
    ax.set_ylabel("query row of $S_{ij}$")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    os.makedirs(OUT, exist_ok=True)
    tiles_sram_hbm(os.path.join(OUT, "tiles_sram_hbm.png"))
    thread_grid(os.path.join(OUT, "thread_grid.png"))


if __name__ == "__main__":
    main()
