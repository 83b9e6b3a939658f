"""Figure of the chapter 05 backward: the five GEMMs of one warp, where each operand comes from, and which
accumulators are reused as the next GEMM's operand (BACKWARD.md, section 3).

The operand situations are backward/bwd_frag.hpp's; tests/test_bwd_frag.cpp proves the ldmatrix address patterns.
Run:  python3 05_warp_split_q/figures/figures_bwd.py   (writes 05_warp_split_q/figures/bwd_gemms.png)
"""
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Patch  # noqa: E402

OUT = os.path.dirname(os.path.abspath(__file__))  # next to this script, in figures/

# Where an operand comes from (colour) -- the legend of the figure.
SOURCES = {
    "ldm": ("#9ecae1", "shared memory, ldmatrix (stored with k along the row)"),
    "trans": ("#fdae6b", "shared memory, ldmatrix .trans (stored with k as the row index)"),
    "regs": ("#a1d99b", "registers: an earlier GEMM's C fragments, packed to 16 bits"),
    "acc": ("#d9d9d9", "fp32 accumulator in registers"),
}

# (label, M x N x K, A, B, C); each operand: (source, text)
KV_KERNEL = [
    ("line 5", "S^T = K_j Q_i^T", "16 keys x Br, k = d",
     ("ldm", "K_j\n[key][d] = [m][k]"), ("ldm", "Q_i\n[query][d] = [n][k]"), ("acc", "S^T (fp32)")),
    ("line 5", "dP^T = V_j dO_i^T", "16 keys x Br, k = d",
     ("ldm", "V_j\n[key][d] = [m][k]"), ("ldm", "dO_i\n[query][d] = [n][k]"), ("acc", "dP^T (fp32)")),
    ("line 7", "dV_j += P^T dO_i", "16 keys x d, k = Br",
     ("regs", "P^T = exp(\u03c4 S^T - L)\n(step 1: via shared, ldmatrix)"), ("trans", "dO_i\n[query][d] = [k][n]"),
     ("acc", "dV_j (whole kernel)")),
    ("line 8", "dK_j += dS^T Q_i", "16 keys x d, k = Br",
     ("regs", "dS^T = P^T o (dP^T - D)\n(step 1: via shared, ldmatrix)"), ("trans", "Q_i\n[query][d] = [k][n]"),
     ("acc", "dK_j (whole kernel;\ntimes \u03c4 when written, line 10)")),
    ("line 9", "dQ_i += \u03c4 dS K_j", "16 queries x d/c (see below), k = Bc",
     ("trans", "dS: all warps' dS^T, shared\n[key][query] = [k][m]"), ("trans", "K_j\n[key][d] = [k][n]"),
     ("acc", "dQ_i: \u03c4 dS K_j added\nby fp32 atomicAdd")),
]
DQ_KERNEL = [
    ("line 14", "S = Q_i K_j^T", "16 queries x Bc, k = d",
     ("ldm", "Q_i\n[query][d] = [m][k]"), ("ldm", "K_j\n[key][d] = [n][k]"), ("acc", "S (fp32)")),
    ("line 14", "dP = dO_i V_j^T", "16 queries x Bc, k = d",
     ("ldm", "dO_i\n[query][d] = [m][k]"), ("ldm", "V_j\n[key][d] = [n][k]"), ("acc", "dP (fp32)")),
    ("line 16", "dQ_i += dS K_j", "16 queries x d, k = Bc",
     ("regs", "dS = P o (dP - D)"), ("trans", "K_j\n[key][d] = [k][n]"),
     ("acc", "dQ_i (whole kernel;\ntimes \u03c4 when written)")),
]

BOX_W, BOX_H = 2.45, 0.78
X_TEXT, X_C, X_A, X_B = 0.0, 3.0, 6.2, 9.3  # each row reads C = A x B, so a reused C sits next to the A below it


def box(ax, x, y, src, text):
    face = SOURCES[src][0]
    ax.add_patch(FancyBboxPatch((x, y - BOX_H / 2), BOX_W, BOX_H, boxstyle="round,pad=0.04", facecolor=face,
                                edgecolor="#555555", linewidth=0.8))
    ax.text(x + BOX_W / 2, y, text, ha="center", va="center", fontsize=7)


def reuse(ax, y_from, y_to, dx):
    """The C fragments of the GEMM in row y_from become the A fragments of the GEMM in row y_to."""
    x0, x1 = X_C + BOX_W + 0.05, X_A - 0.05
    ax.add_patch(FancyArrowPatch((x0, y_from - 0.1), (x0 + dx, y_from - 0.1), arrowstyle="-", color="#238b45",
                                 linewidth=1.3))
    ax.add_patch(FancyArrowPatch((x0 + dx, y_from - 0.1), (x0 + dx, y_to + 0.1), arrowstyle="-", color="#238b45",
                                 linewidth=1.3))
    ax.add_patch(FancyArrowPatch((x0 + dx, y_to + 0.1), (x1, y_to + 0.1), arrowstyle="-|>", mutation_scale=9,
                                 color="#238b45", linewidth=1.3))


def draw_rows(ax, rows, y0):
    ys = []
    for r, (line, gemm, shape, a, b, c) in enumerate(rows):
        y = y0 - r * 1.05
        ys.append(y)
        ax.text(X_TEXT, y + 0.12, f"{line}:  {gemm}", fontsize=8, fontweight="bold", va="center")
        ax.text(X_TEXT, y - 0.2, shape, fontsize=7, va="center", color="#444444")
        box(ax, X_C, y, *c)
        ax.text(X_C + BOX_W + 0.1, y + 0.22, "=" if c[1].startswith(("S", "dP")) else "+=", fontsize=8)
        box(ax, X_A, y, *a)
        ax.text(X_A + BOX_W + 0.3, y, "x", ha="center", va="center", fontsize=9)
        box(ax, X_B, y, *b)
    return ys


def main():
    fig, ax = plt.subplots(figsize=(11.5, 10.3))
    ax.set_xlim(-0.1, 11.9)
    ax.set_ylim(-5.1, 6.4)
    ax.axis("off")

    ax.text(0, 6.15, "K/V-block kernel (grid Tc x Hkv x B): warp w owns keys 16w..16w+15 of K_j, V_j, dK_j, dV_j",
            fontsize=9.5, fontweight="bold")
    ys = draw_rows(ax, KV_KERNEL, 5.45)
    # The register trick, twice: the C fragments of S^T and dP^T become the A fragments of dV and dK.
    reuse(ax, ys[0], ys[2], 0.5)
    reuse(ax, ys[1], ys[3], 0.25)

    ax.text(0, -0.2, "Deterministic dQ kernel (grid Tr x H x B): warp w owns query rows 16w..16w+15 of Q_i, dO_i, dQ_i",
            fontsize=9.5, fontweight="bold")
    ys2 = draw_rows(ax, DQ_KERNEL, -0.9)
    reuse(ax, ys2[1], ys2[2], 0.35)

    ax.text(0, -4.0, "\u03c4: the softmax scale (S = \u03c4 Q K^T, so dQ = \u03c4 dS K and dK = \u03c4 dS^T Q; "
            "BACKWARD.md, section 1).\n"
            "d/c: in the K/V-block kernel the Bc/16 warps share dQ_i (Br x d) as Br/16 row tiles x c column slices, "
            "c = Bc/Br\n(steps 1-5, Bc = 64: c = 1 at d = 64, c = 2 at d = 128 where Br = 32): each warp adds one "
            "16 x d/c slice.",
            fontsize=8, va="top", color="#333333")
    ax.legend(handles=[Patch(facecolor=f, edgecolor="#555555", label=t) for f, t in SOURCES.values()],
              loc="lower left", bbox_to_anchor=(0.0, -0.03), fontsize=7.5, ncol=2, frameon=False)
    fig.suptitle("The backward's GEMMs on mma.sync m16n8k16: A is m x k, B is k x n; "
                 "ldmatrix .trans exactly when the stored tile has k as its row index", fontsize=9.5)
    fig.savefig(os.path.join(OUT, "bwd_gemms.png"), dpi=150, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()
