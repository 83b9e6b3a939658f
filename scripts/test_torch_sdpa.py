#!/usr/bin/env python3
"""CPU test of scripts/torch_sdpa.py without PyTorch: --help, argument checking, that check/bench fail with a
clear message (exit 1) where PyTorch or a GPU is missing, the list of checked cases (each within its chapter's
limits), the tolerances, and with NumPy the comparison of a program's .npy file with the reference. With
FA_BUILD set to a build folder, every case's program is also run on the case's input files with no GPU visible:
it must accept them (shape, dtype, flags) and stop only where it needs the GPU."""
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_sdpa  # noqa: E402  (must import without torch)

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_sdpa.py")


def run(*args):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


class TorchSdpaCli(unittest.TestCase):
    def test_help_without_torch(self):
        for args in (["--help"], ["-h"], ["bench", "--help"], ["check", "--help"], ["gemm", "--help"]):
            r = run(*args)
            self.assertEqual(r.returncode, 0, args)
            self.assertIn("usage", r.stdout)

    def test_decode_arguments(self):
        a = torch_sdpa.parse_args(["bench", "--q-len", "1", "--sizes", "4096", "131072", "--batch", "8", "--heads",
                                   "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp16", "--backend",
                                   "cudnn"])
        self.assertEqual((a.q_len, a.sizes, a.kv_heads, a.dtype, a.backend), (1, [4096, 131072], 8, "fp16", "cudnn"))
        self.assertEqual(torch_sdpa.parse_args(["bench"]).kv_heads, 16)  # default: no GQA
        g = torch_sdpa.parse_args(["gemm"])
        self.assertEqual((g.size, g.dtype), ([8192], "fp8"))
        self.assertEqual(torch_sdpa.parse_args(["gemm", "--size", "64", "128", "96", "--dtype", "fp16"]).size,
                         [64, 128, 96])

    def test_bad_usage_exits_2(self):
        for args in (["bench", "--dtype", "fp8"], ["bench", "--backend", "xformers"], ["bench", "--heads", "6",
                     "--kv-heads", "4"], ["bench", "--q-len", "0"], ["bench", "--sizes", "-5"], ["nope"], [],
                     ["gemm", "--size", "0"], ["gemm", "--size", "64", "64"], ["gemm", "--dtype", "fp32"],
                     ["gemm", "--size", "100"]):
            self.assertEqual(run(*args).returncode, 2, args)

    def test_check_and_bench_fail_without_torch_or_gpu(self):
        try:
            import torch  # noqa: F401
            self.skipTest("PyTorch is installed here")
        except ImportError:
            pass
        for args in (["check", "/no/such/build"], ["bench"], ["gemm"], ["gemm", "--dtype", "fp16", "--size", "64"]):
            r = run(*args)
            self.assertEqual(r.returncode, 1, args)
            self.assertIn("PyTorch is not installed", r.stderr)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TorchSdpaCases(unittest.TestCase):
    def test_every_chapter_program_is_a_target(self):
        for prog in {c.prog for c in torch_sdpa.CASES}:
            folder, name = prog.split("/")
            with open(os.path.join(REPO, folder, "CMakeLists.txt")) as f:
                self.assertIn(f"add_executable({name} ", f.read(), prog)
        self.assertEqual(sorted({c.prog.split("/")[0][:2] for c in torch_sdpa.CASES}),
                         ["00", "01", "02", "03", "04", "05", "06"])

    def test_cases_fit_their_chapter(self):
        for c in torch_sdpa.CASES:
            B, H, Hkv, Nq, Nk, d = c.shape
            self.assertEqual(H % Hkv, 0, c)
            self.assertGreater(H, Hkv, c)  # GQA everywhere
            if c.dtype == "fp32":
                self.assertNotIn("--dtype", c.flags, c)
            else:
                self.assertEqual(c.flags[c.flags.index("--dtype") + 1], c.dtype, c)
                self.assertIn(d, (64, 128), c)
            if c.prog.startswith("05_"):
                self.assertIn("--backward", c.flags)
                self.assertEqual(c.outputs, torch_sdpa.ALL)
            if c.prog.startswith("06_"):
                self.assertTrue(1 <= Nq <= 8, c)
                self.assertEqual(c.outputs, torch_sdpa.FORWARD)
                self.assertNotIn("--backward", c.flags)
            else:
                self.assertIsNone(c.lens, c)  # ragged contexts are chapter 06's alone
            if c.lens:
                self.assertEqual(len(c.lens), B, c)
                self.assertTrue(all(0 <= n <= Nk for n in c.lens), c)

    def test_low_precision_coverage(self):
        key = {(c.prog[:2], c.dtype, c.causal, c.shape[3], c.shape[5]) for c in torch_sdpa.CASES}
        for dtype in ("fp16", "bf16"):
            for causal in (False, True):
                self.assertIn(("05", dtype, causal, 97, 64), key)
            self.assertIn(True, [(k[0], k[1], k[2], k[3]) == ("06", dtype, False, 1) for k in key])
            self.assertIn(True, [(k[0], k[1], k[2], k[3]) == ("06", dtype, True, 4) for k in key])
        for chapter in ("05", "06"):
            self.assertEqual({k[4] for k in key if k[0] == chapter}, {64, 128})
        ragged = [c for c in torch_sdpa.CASES if c.lens]  # an empty entry, and one with rows that see no key
        self.assertTrue(any(0 in c.lens and any(0 < n < c.shape[3] for n in c.lens) and c.causal for c in ragged))

    def test_tolerances(self):
        tol = torch_sdpa.tolerance
        self.assertEqual(tol("fp32", "dq"), (1e-3, 0.0))
        self.assertEqual(tol("fp16", "o"), (4 * 2.0**-10, 0.0))
        self.assertEqual(tol("bf16", "o"), (4 * 2.0**-7, 0.0))
        self.assertEqual(tol("bf16", "lse"), (1e-4, 1e-5))
        for g in ("dq", "dk", "dv"):
            self.assertEqual(tol("fp16", g), (8 * 2.0**-10, 2 * 2.0**-10))
            self.assertEqual(tol("bf16", g), (8 * 2.0**-7, 2 * 2.0**-7))
        self.assertEqual([torch_sdpa.file_dtype(t, n) for t, n in (("fp16", "o"), ("fp16", "lse"), ("bf16", "o"),
                                                                    ("fp32", "o"), ("fp16", "dq"))],
                         ["float16", "float32", "float32", "float32", "float32"])

    def test_program_args(self):
        c = next(c for c in torch_sdpa.CASES if c.prog.startswith("06_") and c.causal)
        self.assertEqual(torch_sdpa.program_args("b", c, "i", "o"),
                         [os.path.join("b", c.prog), "--in", "i", "--out", "o", "--iters", "0", "--causal", "--dtype",
                          c.dtype])
        ragged = torch_sdpa.Case("p", ["--dtype", "bf16"], "bf16", (3, 8, 2, 4, 203, 64), False, (), (203, 3, 0))
        self.assertEqual(torch_sdpa.program_args("b", ragged, "i", "o"),
                         [os.path.join("b", "p"), "--in", "i", "--out", "o", "--iters", "0", "--kv-lens", "203,3,0",
                          "--dtype", "bf16"])
        self.assertEqual(torch_sdpa.input_shapes(ragged),
                         {"q": (3, 8, 4, 64), "k": (3, 2, 203, 64), "v": (3, 2, 203, 64), "do": (3, 8, 4, 64)})


def numpy_or_skip(test):
    try:
        import numpy
        return numpy
    except ImportError:
        test.skipTest("NumPy is not installed")


class CompareOutput(unittest.TestCase):
    """compare_output on files written as the programs write them (o.npy float16 for fp16, float32 for bf16)."""

    def setUp(self):
        self.np = numpy_or_skip(self)
        rng = self.np.random.default_rng(0)
        self.want = rng.standard_normal((2, 3, 5, 8)) * 0.3
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def compare(self, array, dtype, name, want=None):
        path = os.path.join(self.dir.name, name + ".npy")
        self.np.save(path, array)
        return torch_sdpa.compare_output(self.np, path, self.want if want is None else want, dtype, name)

    def test_fp16_o(self):
        np = self.np
        good, text = self.compare(self.want.astype(np.float16), "fp16", "o")
        self.assertTrue(good, text)
        self.assertFalse(self.compare(self.want.astype(np.float32), "fp16", "o")[0])  # wrong file dtype
        self.assertFalse(self.compare((self.want + 0.01).astype(np.float16), "fp16", "o")[0])
        self.assertFalse(self.compare(self.want.astype(np.float16)[:, :, :4], "fp16", "o")[0])  # wrong shape
        self.assertFalse(self.compare(np.swapaxes(self.want, 1, 2).reshape(self.want.shape).astype(np.float16),
                                      "fp16", "o")[0])  # heads and rows swapped

    def test_bf16_o(self):
        np = self.np
        bits = self.want.astype(np.float32).view(np.uint32)
        bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).view(np.float32)  # nearest even
        good, text = self.compare(bf16, "bf16", "o")
        self.assertTrue(good, text)
        good, text = self.compare(self.want.astype(np.float32), "bf16", "o")  # float32 values, not bf16
        self.assertFalse(good)
        self.assertIn("not bf16", text)
        self.assertFalse(self.compare(bf16.astype(np.float16), "bf16", "o")[0])

    def test_nan_and_empty_rows(self):
        np = self.np
        got = self.want.astype(np.float32)
        got[0, 0, 0, 0] = np.nan
        self.assertFalse(self.compare(got, "fp32", "dq")[0])
        lse = self.want[..., 0].copy()
        lse[1, 2, 3] = -np.inf  # a row that sees no key
        good, text = self.compare(lse.astype(np.float32), "fp16", "lse", want=lse)
        self.assertTrue(good, text)
        finite = lse.astype(np.float32)
        finite[1, 2, 3] = 0
        self.assertFalse(self.compare(finite, "fp16", "lse", want=lse)[0])
        self.assertFalse(self.compare((lse + 3e-4).astype(np.float32), "fp16", "lse", want=lse)[0])


class ProgramsAcceptTheCases(unittest.TestCase):
    """FA_BUILD=build: each case's program reads the case's files and stops only for want of a GPU (exit 1)."""

    def test_inputs_accepted(self):
        build = os.environ.get("FA_BUILD")
        if not build:
            self.skipTest("FA_BUILD (a build folder) is not set")
        np = numpy_or_skip(self)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
        ran = 0
        for c in torch_sdpa.CASES:
            if not os.path.exists(os.path.join(build, c.prog)):
                continue
            with tempfile.TemporaryDirectory() as tmp:
                inp = os.path.join(tmp, "in")
                os.makedirs(inp)
                rng = np.random.default_rng(0)
                for name, shape in torch_sdpa.input_shapes(c).items():
                    np.save(os.path.join(inp, name + ".npy"), rng.standard_normal(shape).astype(np.float32))
                r = subprocess.run(torch_sdpa.program_args(build, c, inp, os.path.join(tmp, "out")),
                                   capture_output=True, text=True, env=env)
                self.assertEqual(r.returncode, 1, f"{c}: {r.stderr}")
                self.assertIn("no CUDA device", r.stderr, c)
                ran += 1
        if ran == 0:
            self.skipTest(f"no chapter program in {build}")


if __name__ == "__main__":
    unittest.main()
