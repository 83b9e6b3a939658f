#!/usr/bin/env python3
"""Plot measured result rows (the project's CSV format) as TFLOP/s against sequence length.

    python3 docs/plot.py docs/results/nvidia_h100_80gb_hbm3.csv -o docs/h100_fwd.png

One line per (chapter, kernel); only rows of one shape family are drawn (B, H, Hkv, d, causal from
the flags, Nq = Nk), so every point on the plot is the same problem at another length.
Reads only the CSV columns every chapter program writes with --csv.
"""
import argparse
import csv
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("csv", nargs="+", help="result CSV file(s)")
    ap.add_argument("-o", "--output", default="results.png", help="output image (PNG)")
    ap.add_argument("--pass", dest="which", default="fwd", choices=["fwd", "bwd"], help="which pass to plot")
    ap.add_argument("--batch", default="1")
    ap.add_argument("--heads", default="16")
    ap.add_argument("--head-dim", default="64")
    ap.add_argument("--causal", action="store_true")
    args = ap.parse_args()

    lines, gpus = defaultdict(list), set()
    for path in args.csv:
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                shape = (r["B"], r["H"], r["Hkv"], r["d"], r["causal"], r["dropout"])
                want = (args.batch, args.heads, args.heads, args.head_dim, str(int(args.causal)), "0")
                if r["pass"] != args.which or r["Nq"] != r["Nk"] or shape != want:
                    continue
                gpus.add(r["gpu"])
                key = f'{r["chapter"]} {r["kernel"]}'
                lines[key].append((int(r["Nq"]), float(r["tflops"])))
    if not lines:
        raise SystemExit("no rows to plot")
    fig, ax = plt.subplots(figsize=(8, 5))
    for key in sorted(lines):
        pts = sorted(set(lines[key]))
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=key)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length N (Nq = Nk)")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f'{args.which}, B={args.batch} H={args.heads} d={args.head_dim}'
                 f'{" causal" if args.causal else ""}, fp32, on {", ".join(sorted(gpus))}')
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.output, dpi=120)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
