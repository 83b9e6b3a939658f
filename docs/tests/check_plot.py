#!/usr/bin/env python3
"""CPU test of docs/plot.py: run it on a folder of result CSVs and check that it writes every PNG expected.

    check_plot.py RESULTS_DIR OUT_DIR NAME [NAME ...]
    check_plot.py RESULTS_DIR OUT_DIR FIGURES_DIR

Each NAME is a PNG file name that must be written into OUT_DIR (a fresh, empty folder each run) and must be
a PNG; with a FIGURES_DIR, the names are those of the PNGs in it, so the script must regenerate exactly the
committed figures. The test runs it twice (docs/CMakeLists.txt): on docs/tests/ (synthetic_results.csv,
synthetic_results_journey.csv, synthetic_results_fp8.csv and synthetic_results_io.csv), invented rows that exercise
every code path (chapters 05 and 06, 05's fp8 figures, the journey figure and the Nsight Compute figure included), and on the committed measurements in
docs/results/ against the committed docs/figures/.
plot.py runs with --io-table, so the table of docs/io.md is printed (and tested) wherever a *_io.csv exists.
"""
import os
import shutil
import subprocess
import sys

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    results, out, names = sys.argv[1], sys.argv[2], sys.argv[3:]
    if len(names) == 1 and os.path.isdir(names[0]):
        names = sorted(f for f in os.listdir(names[0]) if f.endswith(".png"))
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    plot = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "plot.py")
    r = subprocess.run([sys.executable, plot, "--results", results, "--out", out, "--io-table"], capture_output=True, text=True)
    print(r.stdout, r.stderr)
    if r.returncode != 0:
        sys.exit(f"plot.py exited with {r.returncode}")
    bad = []
    for name in names:
        path = os.path.join(out, name)
        if not os.path.isfile(path):
            bad.append(f"{name}: not written")
            continue
        with open(path, "rb") as f:
            if f.read(8) != PNG_MAGIC:
                bad.append(f"{name}: not a PNG")
    extra = sorted(set(os.listdir(out)) - set(names))
    if extra:
        bad.append("written but not expected (add them to the test): " + ", ".join(extra))
    if bad:
        sys.exit("\n".join(bad))
    print(f"all {len(names)} PNGs written")


if __name__ == "__main__":
    main()
