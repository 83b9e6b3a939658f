"""Figures of chapter 05: the fragment maps of mma.sync m16n8k16 and ldmatrix, and the shared-memory swizzle.

The maps are those of common/frag.hpp (PTX ISA 9.7.14.5.8 and 9.7.14.5.15), restated here in Python for drawing;
common/tests/test_frag.cpp is what proves them.
Run:  python3 05_warp_split_q/figures/figures.py   (writes 05_warp_split_q/figures/*.png)
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))  # next to this script, in figures/


def a_elem(lane, e):
    g, t = lane >> 2, lane & 3
    return g + 8 * ((e >> 1) & 1), 2 * t + (e & 1) + 8 * (e >> 2)


def b_elem(lane, e):
    g, t = lane >> 2, lane & 3
    return 2 * t + (e & 1) + 8 * (e >> 1), g


def c_elem(lane, e):
    g, t = lane >> 2, lane & 3
    return g + 8 * (e >> 1), 2 * t + (e & 1)


def colour(lane):
    return plt.get_cmap("Set3")((lane >> 2) % 12)


def draw_grid(ax, rows, cols, cells, title, xlabel, ylabel, small=False):
    """cells: {(r, c): (text, lane)}"""
    for (r, c), (text, lane) in cells.items():
        ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=colour(lane), edgecolor="white", linewidth=0.8))
        ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=5.2 if small else 6.5)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.set_xticks([x + 0.5 for x in range(cols)])
    ax.set_xticklabels(range(cols), fontsize=6)
    ax.set_yticks([y + 0.5 for y in range(rows)])
    ax.set_yticklabels(range(rows), fontsize=6)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.set_aspect("equal")
    ax.tick_params(length=0)


def mma_figure():
    fig, axes = plt.subplots(1, 3, figsize=(15, 5.6), gridspec_kw={"width_ratios": [16, 8, 8]})
    a = {a_elem(l, e): (f"T{l}\na{e}", l) for l in range(32) for e in range(8)}
    b = {b_elem(l, e): (f"T{l}\nb{e}", l) for l in range(32) for e in range(4)}
    c = {c_elem(l, e): (f"T{l}\nc{e}", l) for l in range(32) for e in range(4)}
    draw_grid(axes[0], 16, 16, a, "A (16x16, row): lane T, element a0..a7\n(register = e / 2)", "k", "m")
    draw_grid(axes[1], 16, 8, b, "B (16x8, col): b0..b3", "n", "k")
    draw_grid(axes[2], 16, 8, c, "C/D (16x8, fp32): c0..c3", "n", "m")
    fig.suptitle("mma.sync.aligned.m16n8k16: which lane holds which element (colour = group g = lane / 4)", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "mma_m16n8k16_fragments.png"), dpi=130)
    plt.close(fig)


def ldmatrix_figure():
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.8), gridspec_kw={"width_ratios": [16, 16, 8, 8]})
    # Row addresses of a 16x16 tile: lane L supplies the row that starts at (row, col); shown in the 8 cells.
    def addr_cells(row_of, col_of):
        cells = {}
        for lane in range(32):
            r, c0 = row_of(lane), col_of(lane)
            for c in range(c0, c0 + 8):
                cells[(r, c)] = (f"T{lane}" if c == c0 else "", lane)
        return cells
    draw_grid(axes[0], 16, 16, addr_cells(lambda l: (l & 7) + 8 * ((l >> 3) & 1), lambda l: 8 * (l >> 4)),
              "ldmatrix.x4 addresses for an A tile\n(Q, P; and V with .trans)", "column", "row")
    draw_grid(axes[1], 16, 16, addr_cells(lambda l: (l & 7) + 8 * (l >> 4), lambda l: 8 * ((l >> 3) & 1)),
              "addresses for K stored [key][dim]\n(B of two n-tiles, no .trans)", "dim", "key")
    plain = {(l >> 2, 2 * (l & 3) + e): (f"T{l}\n.{e}", l) for l in range(32) for e in range(2)}
    trans = {(2 * (l & 3) + e, l >> 2): (f"T{l}\n.{e}", l) for l in range(32) for e in range(2)}
    draw_grid(axes[2], 8, 8, plain, "one 8x8 matrix: what each lane\nreceives (register m, half .e)", "col", "row")
    draw_grid(axes[3], 8, 8, trans, "the same with .trans", "col", "row")
    fig.suptitle("ldmatrix.sync.aligned.m8n8.x4: lane 8m + r gives the address of row r of matrix m", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "ldmatrix_x4.png"), dpi=130)
    plt.close(fig)


def swizzle_figure():
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, swz in zip(axes, (False, True)):
        cells = {}
        for r in range(8):
            for c in range(8):
                phys = c ^ (r & 7) if swz else c
                cells[(r, phys)] = (f"c{c}", 4 * c)  # colour = logical chunk (colour() groups lanes by 4)
        draw_grid(ax, 8, 8, cells,
                  ("XOR swizzle: chunk c of row r at c ^ (r mod 8)" if swz else "plain: chunk c of row r at c") +
                  "\nan ldmatrix phase reads logical chunk c0 of rows 0-7", "physical 16-byte chunk (banks 4c .. 4c+3)", "row")
        for r in range(8):
            phys = (0 ^ r) if swz else 0
            ax.add_patch(plt.Rectangle((phys, r), 1, 1, fill=False, edgecolor="red", linewidth=2))
    axes[0].text(4, 8.9, "8 rows in banks 0-3: 8-way conflict", ha="center", fontsize=8, color="red")
    axes[1].text(4, 8.9, "8 rows in 8 different bank quads: conflict-free", ha="center", fontsize=8, color="red")
    fig.suptitle("A shared tile row of 64 fp16 values = 128 bytes = 8 chunks = all 32 banks once", fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "swizzle.png"), dpi=130)
    plt.close(fig)


def register_trick_figure():
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.4), gridspec_kw={"width_ratios": [16, 16]})
    s = {}
    for l in range(32):
        for n in range(2):
            for e in range(4):
                r, c = c_elem(l, e)
                s[(r, 8 * n + c)] = (f"T{l}\nS{n}.c{e}", l)
    p = {a_elem(l, e): (f"T{l}\na{e}", l) for l in range(32) for e in range(8)}
    draw_grid(axes[0], 16, 16, s, "C fragments of S, n-tiles 2k and 2k+1 (keys 16k..16k+15)", "key", "row")
    draw_grid(axes[1], 16, 16, p, "A fragment of P for k-step k: the same lane everywhere", "key", "row")
    fig.suptitle("Step 5: P never leaves the registers; a_{2r}, a_{2r+1} = the pair (c0, c1) or (c2, c3) of one n-tile",
                 fontsize=11)
    fig.tight_layout()
    fig.savefig(os.path.join(OUT, "register_trick.png"), dpi=130)
    plt.close(fig)


if __name__ == "__main__":
    mma_figure()
    ldmatrix_figure()
    swizzle_figure()
    register_trick_figure()
    print("wrote", ", ".join(sorted(f for f in os.listdir(OUT) if f.endswith(".png"))), "to", OUT)
