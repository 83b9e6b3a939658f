#!/usr/bin/env python3
"""The docs/ scripts' command lines on bad input (a CPU test): --help writes nothing, a missing results folder is
a usage error that creates no output folder, a binary file given as a table is refused in one line, and without
matplotlib each plotting script says so in one line instead of a traceback."""
import os
import subprocess
import sys
import tempfile
import unittest

DOCS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(args, cwd, hide_matplotlib=False):
    if hide_matplotlib:  # the script as run by a Python without matplotlib
        code = ("import sys, runpy; sys.modules['matplotlib'] = None; sys.argv = sys.argv[1:]; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        args = ["-c", code] + args
    return subprocess.run([sys.executable] + args, cwd=cwd, capture_output=True, text=True, timeout=120)


class ScriptsCli(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_figures_help_writes_nothing(self):
        r = run([os.path.join(DOCS, "figures.py"), "--help"], self.dir)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("usage", r.stdout)
        self.assertEqual(os.listdir(self.dir), [])
        r = run([os.path.join(DOCS, "figures.py"), "--bogus"], self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertEqual(os.listdir(self.dir), [])

    def test_plot_missing_results_folder(self):
        out = os.path.join(self.dir, "out")
        r = run([os.path.join(DOCS, "plot.py"), "--results", os.path.join(self.dir, "nonexistent"), "--out", out],
                self.dir)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no such folder", r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        self.assertFalse(os.path.exists(out))

    def test_step_counters_table_of_a_binary_file(self):
        path = os.path.join(self.dir, "some.npy")
        with open(path, "wb") as f:
            f.write(b"\x93NUMPY\x01\x00\xff\xfe\x00")
        r = run([os.path.join(DOCS, "step_counters.py"), "table", path], self.dir)
        self.assertEqual(r.returncode, 1)
        self.assertIn("not text", r.stderr)
        self.assertNotIn("Traceback", r.stderr)

    def test_without_matplotlib_one_line(self):
        for script in ("plot.py", "figures.py", "io_counters.py"):
            r = run([os.path.join(DOCS, script)], self.dir, hide_matplotlib=True)
            self.assertEqual(r.returncode, 1, script)
            self.assertNotIn("Traceback", r.stderr, script)
            self.assertIn("needs matplotlib", r.stderr, script)
            self.assertEqual(len(r.stderr.strip().splitlines()), 1, r.stderr)


if __name__ == "__main__":
    unittest.main()
