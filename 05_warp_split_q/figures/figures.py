"""Figures of chapter 05: the fragment maps of mma.sync m16n8k16 and ldmatrix, and the shared-memory swizzle.

The maps are those of common/frag.hpp (PTX ISA 9.7.14.5.8 and 9.7.14.5.15), restated here in Python for drawing;
common/tests/test_frag.cpp is what proves them.
Run:  python3 05_warp_split_q/figures/figures.py   (writes 05_warp_split_q/figures/*.png)
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402

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


# Four well-separated light colours, for the four 8x8 matrices of ldmatrix.x4 and the four registers of an A fragment.
FOUR = ("#8dd3c7", "#ffed6f", "#bebada", "#fb8072")


def draw_grid(ax, rows, cols, cells, title, xlabel, ylabel, small=False, fill=colour, fontsize=None):
    """cells: {(r, c): (text, key)}; fill(key) is the cell's colour (default: the lane group of lane = key)."""
    for (r, c), (text, key) in cells.items():
        ax.add_patch(plt.Rectangle((c, r), 1, 1, facecolor=fill(key), edgecolor="white", linewidth=0.8))
        ax.text(c + 0.5, r + 0.5, text, ha="center", va="center", fontsize=fontsize or (5.2 if small else 6.5))
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


def outline(ax, cells, color="black", lw=2.2):
    for r, c in cells:
        ax.add_patch(plt.Rectangle((c, r), 1, 1, fill=False, edgecolor=color, linewidth=lw, zorder=3))


def ldmatrix_figure():
    """ldmatrix.x4 moves four 8x8 matrices of 16-bit values: lanes 8m..8m+7 give the row addresses of matrix m, and
    every lane receives one 32-bit register from each matrix (register m: two neighbours of matrix m). Colour =
    matrix in every panel; lane 0's share is outlined to show that one lane's four registers come from all four."""
    fill = lambda m: FOUR[m]  # noqa: E731
    fig, axes = plt.subplots(2, 2, figsize=(14, 13))

    def addr_cells(row_of, col_of):
        """16x16 tile; lane L = 8m + r supplies the row that starts at (row_of(L), col_of(L)): 8 cells of matrix m."""
        cells, corner = {}, {}
        for lane in range(32):
            m, r, c0 = lane >> 3, row_of(lane), col_of(lane)
            for c in range(c0, c0 + 8):
                cells[(r, c)] = (f"T{lane}" if c == c0 else "", m)
            corner.setdefault(m, (r, c0))
        return cells, corner

    def matrix_names(ax, cells):
        for m in range(4):
            rs = [r for (r, c), (_, k) in cells.items() if k == m]
            cs = [c for (r, c), (_, k) in cells.items() if k == m]
            ax.text((min(cs) + max(cs) + 1) / 2 + 0.5, (min(rs) + max(rs) + 1) / 2, f"matrix {m}\nlanes {8 * m}-{8 * m + 7}",
                    ha="center", va="center", fontsize=10, weight="bold", color="#333333")

    a_rows = lambda l: (l & 7) + 8 * ((l >> 3) & 1)  # noqa: E731,E741  (matrices 0, 1 down the left half)
    a_cols = lambda l: 8 * (l >> 4)  # noqa: E731,E741
    cells, _ = addr_cells(a_rows, a_cols)
    draw_grid(axes[0][0], 16, 16, cells, "1. addresses for an A tile (Q, P; and V with .trans):\n"
              "lane 8m + r points at row r of matrix m", "column (16-bit elements)", "row", fill=fill, fontsize=7)
    matrix_names(axes[0][0], cells)
    cells, _ = addr_cells(lambda l: (l & 7) + 8 * (l >> 4), lambda l: 8 * ((l >> 3) & 1))
    draw_grid(axes[0][1], 16, 16, cells, "2. addresses for K stored [key][dim]\n(B operand of two n-tiles, no .trans)",
              "dim", "key", fill=fill, fontsize=7)
    matrix_names(axes[0][1], cells)
    # What lanes receive, for the A tile of panel 1: element (row, col) goes to lane 4 (row mod 8) + (col mod 8) / 2,
    # register m (its matrix), half col mod 2.
    recv = {}
    for r in range(16):
        for c in range(16):
            m = (r >> 3) + 2 * (c >> 3)
            lane = 4 * (r & 7) + ((c & 7) >> 1)
            recv[(r, c)] = (f"T{lane}\nr{m}.{c & 1}", m)
    draw_grid(axes[1][0], 16, 16, recv, "3. what each lane receives, A tile of panel 1: lane T, register r (= matrix),\n"
              "half .0/.1; lane T0 outlined: its four registers come from all four matrices", "column", "row",
              fill=fill, fontsize=6)
    outline(axes[1][0], [rc for rc, (t, _) in recv.items() if t.startswith("T0\n")])
    trans = {(2 * (l & 3) + e, l >> 2): (f"T{l}\n.{e}", 0) for l in range(32) for e in range(2)}
    draw_grid(axes[1][1], 8, 8, trans, "4. with .trans: matrix 0 of panel 1 (the same in each matrix);\n"
              "lane T gets a column pair instead of a row pair (T0 outlined)", "column", "row", fill=fill, fontsize=8)
    outline(axes[1][1], [rc for rc, (t, _) in trans.items() if t.startswith("T0\n")])
    fig.suptitle("ldmatrix.sync.aligned.m8n8.x4: four 8x8 matrices of 16-bit values, colour = matrix m.\n"
                 "Lanes 8m .. 8m+7 give the row addresses of matrix m (panels 1, 2); every lane then receives one 32-bit "
                 "register\nfrom each matrix: register m holds two neighbouring values of matrix m (panels 3, 4)",
                 fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.95), h_pad=2.5)
    fig.savefig(os.path.join(OUT, "ldmatrix_x4.png"), dpi=110)
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
    """The C fragments of S for n-tiles 2k, 2k+1 and the A fragment of P for k-step k: same lane, same positions.
    Colour = the A register (a0,a1 / a2,a3 / a4,a5 / a6,a7) each value lands in, on both sides."""
    fig, axes = plt.subplots(1, 2, figsize=(17, 10.4))
    s = {}
    for l in range(32):
        for n in range(2):
            for e in range(4):
                r, c = c_elem(l, e)
                s[(r, 8 * n + c)] = (f"T{l}\nc{e}", 2 * n + (e >> 1))  # register of P it becomes
    p = {a_elem(l, e): (f"T{l}\na{e}", e >> 1) for l in range(32) for e in range(8)}
    fill = lambda reg: FOUR[reg]  # noqa: E731
    draw_grid(axes[0], 16, 16, s, "S: C fragments of n-tiles 2k (keys 0-7 of the pair) and 2k+1 (keys 8-15)\n"
              "cell: lane T, element c0..c3 of that n-tile's fragment", "key (16k + column)", "query row", fill=fill,
              fontsize=7)
    draw_grid(axes[1], 16, 16, p, "P: A fragment for k-step k (the same 16 keys)\ncell: lane T, element a0..a7",
              "key (16k + column)", "query row", fill=fill, fontsize=7)
    for ax, names in ((axes[0], ("n-tile 2k", "n-tile 2k+1")), (axes[1], ("k = 0..7", "k = 8..15"))):
        ax.axvline(8, color="black", linewidth=2.5)
        for x, text in zip((4, 12), names):
            ax.text(x, -0.25, text, ha="center", va="bottom", fontsize=9, weight="bold")
        ax.set_title(ax.get_title(), fontsize=10, pad=22)
    handles = [Patch(facecolor=FOUR[0], label="c0, c1 of n-tile 2k  ->  a0, a1 (register 0)"),
               Patch(facecolor=FOUR[1], label="c2, c3 of n-tile 2k  ->  a2, a3 (register 1)"),
               Patch(facecolor=FOUR[2], label="c0, c1 of n-tile 2k+1  ->  a4, a5 (register 2)"),
               Patch(facecolor=FOUR[3], label="c2, c3 of n-tile 2k+1  ->  a6, a7 (register 3)")]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=10, frameon=False)
    fig.suptitle("Step 5: P never leaves the registers. Every lane already holds, as C fragments of S, exactly the "
                 "values\nit needs as the A fragment of P: each pair (c0, c1) or (c2, c3), rounded to 16 bits and packed, "
                 "is one A register", fontsize=12)
    fig.tight_layout(rect=(0, 0.07, 1, 0.9), w_pad=3)
    fig.savefig(os.path.join(OUT, "register_trick.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    mma_figure()
    ldmatrix_figure()
    swizzle_figure()
    register_trick_figure()
    print("wrote", ", ".join(sorted(f for f in os.listdir(OUT) if f.endswith(".png"))), "to", OUT)
