#!/usr/bin/env python3
"""CPU test of scripts/torch_sdpa.py without PyTorch: --help, argument checking, and that check/bench
fail with a clear message (exit 1) where PyTorch or a GPU is missing."""
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa  # noqa: E402  (must import without torch)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_sdpa.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class TorchSdpaCli(unittest.TestCase):
    def test_help_without_torch(self):
        for args in (["--help"], ["-h"], ["bench", "--help"], ["check", "--help"]):
            r = run(*args)
            self.assertEqual(r.returncode, 0, args)
            self.assertIn("usage", r.stdout)

    def test_decode_arguments(self):
        a = torch_sdpa.parse_args(["bench", "--q-len", "1", "--sizes", "4096", "131072", "--batch", "8", "--heads",
                                   "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp16", "--backend",
                                   "cudnn"])
        self.assertEqual((a.q_len, a.sizes, a.kv_heads, a.dtype, a.backend), (1, [4096, 131072], 8, "fp16", "cudnn"))
        self.assertEqual(torch_sdpa.parse_args(["bench"]).kv_heads, 16)  # default: no GQA

    def test_bad_usage_exits_2(self):
        for args in (["bench", "--dtype", "fp8"], ["bench", "--backend", "xformers"], ["bench", "--heads", "6",
                     "--kv-heads", "4"], ["bench", "--q-len", "0"], ["bench", "--sizes", "-5"], ["nope"], []):
            self.assertEqual(run(*args).returncode, 2, args)

    def test_check_and_bench_fail_without_torch_or_gpu(self):
        try:
            import torch  # noqa: F401
            self.skipTest("PyTorch is installed here")
        except ImportError:
            pass
        for args in (["check", "/no/such/build"], ["bench"]):
            r = run(*args)
            self.assertEqual(r.returncode, 1, args)
            self.assertIn("PyTorch is not installed", r.stderr)


if __name__ == "__main__":
    unittest.main()
