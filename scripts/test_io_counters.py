#!/usr/bin/env python3
"""CPU test of scripts/io_counters.sh with stand-ins for the GPU: a fake nvidia-smi, a fake ncu that writes the
raw CSV page Nsight Compute would (demangled kernel names, a units row, scaled units, thousands separators,
kernels the script must leave out), and fake chapter programs that write result rows. It checks the additions,
the pairing with each pass's model row, and that every failure (no GPU, no ncu, a failed program, launches that
differ from the script's list) exits 1 and writes nothing. What ncu really counts is for the GPU (docs/io.md)."""
import csv
import json
import os
import shutil
import stat
import subprocess
import tempfile
import textwrap
import unittest

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "io_counters.sh")
GPU = "NVIDIA H100 80GB HBM3"

# What each program launches in its ncu run (--iters 0), in order, as ncu names them; fill_kernel is 06's input
# fill, which the script must not add. Every launch reads (k + 1) * 1.5 MB and writes (k + 1) * 1000 bytes.
LAUNCHES = {
    "naive": ["void naive::(anonymous namespace)::batched_gemm<false, true>(naive::(anonymous namespace)::GemmArgs)",
              "void naive::(anonymous namespace)::softmax_rows(fa::Problem, const float *, float *, float *, float *)",
              "batched_gemm", "batched_gemm", "batched_gemm", "softmax_backward_rows", "batched_gemm", "batched_gemm"],
    "fa1_backward": ["void fa1::(anonymous namespace)::fa1_forward_kernel<64>(fa::Problem, int, int)",
                     "fa1_backward_kernel"],
    "fa2": ["forward_kernel", "rowsum_do_o_kernel", "backward_kv_kernel", "rowsum_do_o_kernel", "backward_kv_kernel",
            "backward_dq_kernel"],
    "warp_split_q": ["forward_kernel",
                     "void wsq::(anonymous namespace)::kernel<__half, (int)64, (int)128, (int)64>(fa::Problem)"],
    "flash_decoding": ["fill_kernel"] * 3 + [
        "void fdec::(anonymous namespace)::split_kernel<__half, (int)128, (int)4, (bool)0, (bool)0>(Args<__half>)"] +
        ["split_kernel", "merge_kernel"] * 3 + ["split_kernel"] * 2 + ["even_kernel"] + ["split_kernel", "merge_kernel"] * 2
        + ["split_kernel"],
}
# The rows each program writes with --csv: (chapter, kernel, pass, dtype, B, H, Hkv, Nq, Nk, d, model bytes).
ROWS = {
    "naive": [("00", "naive", "fwd", "fp32", 1, 16, 16, 2048, 2048, 64, 1e9),
              ("00", "naive", "bwd", "fp32", 1, 16, 16, 2048, 2048, 64, 2e9)],
    "fa1_backward": [("02", "fa1_forward", "fwd", "fp32", 1, 16, 16, 2048, 2048, 64, 3e8),
                     ("03", "fa1_backward", "bwd", "fp32", 1, 16, 16, 2048, 2048, 64, 6e8),
                     ("00", "naive", "bwd", "fp32", 1, 16, 16, 2048, 2048, 64, 2e9)],
    "fa2": [("04", k, p, "fp32", 1, 16, 16, 2048, 2048, 64, 4e8)
            for k, p in (("v4_micro_tile", "fwd"), ("fa2_atomic_dq", "bwd"), ("fa2_determ_dq", "bwd"))],
    "warp_split_q": [("05", "v7_tiles", "fwd", "fp16", 1, 16, 16, 2048, 2048, 64, 1.7e7)],
    "flash_decoding": [("06", k, "fwd", "fp16", 1, 32, 8, 1, 32768, 128, 1.4e8)
                       for k in ("fa2_grid", "split_kv", "split_kv_gqa", "split_kv_pipelined", "split_kv_fused", "split_kv_mma",
                                 "split_kv_even", "unified_max", "paged", "flat_gemm")] +
                      [("06", "read_kv", "read", "fp16", 1, 32, 8, 1, 32768, 128, 1.3e8)],
}
PROGRAMS = {"naive": "00_naive", "fa1_backward": "03_fa1_backward", "fa2": "04_fa2",
            "warp_split_q": "05_warp_split_q", "flash_decoding": "06_flash_decoding"}

FAKE_NCU = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, subprocess, sys
    a = sys.argv[1:]
    if a == ["--help"]:
        print("  --print-units arg")
        sys.exit(0)
    if "--import" in a:
        print(open(a[a.index("--import") + 1]).read(), end="")
        sys.exit(0)
    app = a[a.index("--force-overwrite") + 1:]
    launches = json.loads(os.environ["FAKE_LAUNCHES"])[os.path.basename(app[0])]
    drop = os.environ.get("FAKE_DROP")
    with open(a[a.index("--export") + 1] + ".ncu-rep", "w") as f:
        f.write('"ID","Process ID","Kernel Name","dram__bytes_read.sum","dram__bytes_write.sum"\\n')
        f.write('"","","","Mbyte","byte"\\n')
        for k, name in enumerate(launches):
            if name != drop:
                f.write(f'"{k}","7","{name}","{1.5 * (k + 1)}","{1000 * (k + 1):,}"\\n')
    sys.exit(subprocess.run(app).returncode)
    """)
FAKE_PROGRAM = textwrap.dedent("""\
    #!/usr/bin/env python3
    import json, os, sys
    me = os.path.basename(sys.argv[0])
    if os.environ.get("FAKE_FAIL") == me:
        sys.exit(1)
    if "--csv" in sys.argv:
        with open(sys.argv[sys.argv.index("--csv") + 1], "w") as f:
            f.write("gpu,chapter,kernel,pass,dtype,B,H,Hkv,Nq,Nk,d,causal,dropout,ms,tflops,gbps,"
                    "model_hbm_bytes,extra_bytes,max_abs_err\\n")
            for r in json.loads(os.environ["FAKE_ROWS"])[me]:
                row = (os.environ["FAKE_GPU"],) + tuple(r)
                f.write('"%s",%s,%s,%s,%s,%d,%d,%d,%d,%d,%d,0,0,1,1,1,%.0f,0,0\\n' % row)
    """)


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class IoCounters(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_io_counters.")
        self.bin, self.build = os.path.join(self.dir, "bin"), os.path.join(self.dir, "build")
        os.makedirs(self.bin)
        executable(os.path.join(self.bin, "nvidia-smi"),
                   f'#!/bin/sh\n[ "$1" = -L ] && echo "GPU 0: {GPU} (UUID: GPU-0)" || echo "{GPU}"\n')
        executable(os.path.join(self.bin, "ncu"), FAKE_NCU)
        for prog, folder in PROGRAMS.items():
            os.makedirs(os.path.join(self.build, folder))
            executable(os.path.join(self.build, folder, prog), FAKE_PROGRAM)
        self.out = os.path.join(self.dir, "results", "gpu_io.csv")
        self.env = dict(os.environ, PATH=self.bin + os.pathsep + os.environ["PATH"], NCU=os.path.join(self.bin, "ncu"),
                        FAKE_LAUNCHES=json.dumps(LAUNCHES), FAKE_ROWS=json.dumps(ROWS), FAKE_GPU=GPU,
                        TMPDIR=self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_script(self, *args, **env):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=dict(self.env, **env))

    def test_bad_usage_exits_2(self):
        for args in (["--no-such-flag"], ["a", "b", "c"]):
            self.assertEqual(self.run_script(*args).returncode, 2, args)

    def test_sums_each_pass_and_pairs_it_with_its_model_row(self):
        r = self.run_script(self.build, self.out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(self.out, newline="") as f:
            rows = {(x["chapter"], x["kernel"], x["pass"]): x for x in csv.DictReader(f)}
        self.assertEqual(len(rows), 18)
        # 00 backward: launches 3..7 of the naive run (the forward's three come first).
        bwd = rows[("00", "naive", "bwd")]
        self.assertEqual(float(bwd["dram_read"]), 1.5e6 * sum(range(4, 9)))
        self.assertEqual(float(bwd["dram_write"]), 1000 * sum(range(4, 9)))
        self.assertEqual(float(bwd["model_hbm_bytes"]), 2e9)
        self.assertAlmostEqual(float(bwd["ratio"]), (1.5e6 + 1000) * sum(range(4, 9)) / 2e9, places=4)
        self.assertEqual(bwd["launches"], "batched_gemm+batched_gemm+softmax_backward_rows+batched_gemm+batched_gemm")
        self.assertEqual(bwd["shape"], "B=1 H=16 N=2048 d=64 fp32")
        self.assertEqual(bwd["gpu"], GPU)
        # 06 split_kv_gqa: the third split_kernel + merge_kernel pair after the three input fills (launches 6, 7).
        gqa = rows[("06", "split_kv_gqa", "fwd")]
        self.assertEqual(float(gqa["dram_read"]), 1.5e6 * (7 + 8))
        self.assertEqual(gqa["shape"], "B=1 H=32 Hkv=8 Nq=1 Nk=32768 d=128 fp16")
        self.assertEqual(rows[("05", "v7_tiles", "fwd")]["launches"], "kernel")
        self.assertEqual(float(rows[("02", "fa1_forward", "fwd")]["dram_read"]), 1.5e6)

    def test_launches_that_differ_from_the_list_are_an_error(self):
        r = self.run_script(self.build, self.out, FAKE_DROP="backward_dq_kernel")
        self.assertEqual(r.returncode, 1)
        self.assertIn("expected the launches", r.stdout + r.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_a_failed_program_writes_nothing(self):
        r = self.run_script(self.build, self.out, FAKE_FAIL="fa2")
        self.assertEqual(r.returncode, 1)
        self.assertIn("!!", r.stdout)
        self.assertFalse(os.path.exists(self.out))

    def test_no_ncu_and_no_gpu_exit_1_with_a_message(self):
        r = self.run_script(self.build, self.out, NCU=os.path.join(self.dir, "no-ncu"))
        self.assertEqual(r.returncode, 1)
        self.assertIn("ncu was not found", r.stderr)
        executable(os.path.join(self.bin, "nvidia-smi"), "#!/bin/sh\nexit 9\n")
        r = self.run_script(self.build, self.out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("no NVIDIA GPU found", r.stderr)

    def test_a_missing_program_says_build_first(self):
        os.remove(os.path.join(self.build, "04_fa2", "fa2"))
        r = self.run_script(self.build, self.out)
        self.assertEqual(r.returncode, 1)
        self.assertIn("build first", r.stderr)


if __name__ == "__main__":
    unittest.main()
