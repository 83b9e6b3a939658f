#!/usr/bin/env python3
"""CPU test of scripts/step_counters.sh and docs/step_counters.py with stand-ins for the GPU: a fake nvidia-smi, a
fake ncu that runs the program and writes the raw CSV page Nsight Compute would (demangled names, a units row,
scaled units, thousands separators, chapter 04's forward_kernel that must be left out), and a fake chapter 05
program with a --help and check lines. It checks the step list, the step-to-launch assignment, the CSV, the
tables, a metric ncu does not know (left out, run again), and that every failure (no GPU, no ncu, a failed
program, launches or check lines that differ from the steps) exits 1 and writes nothing. The backward mode
(--backward) the same way: the fake program runs, per backward step of its --bwd-kernel line and dQ mode, the
kernels the real one launches (the forward that makes O, the rowsum D, kv_kernel, dq_kernel), and the fake ncu
profiles those the script's --kernel-name filter matches. What the counters say is for the GPU (docs/measuring.md,
section 5)."""
import csv
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "step_counters.sh")
sys.path.insert(0, os.path.join(HERE, "..", "docs"))
import step_counters  # noqa: E402

GPU = "NVIDIA H100 80GB HBM3"
STEPS = ["split_k", "v1_mma", "v2_ldmatrix", "v3_swizzle", "v4_cp_async", "v5_regs_p", "v6_exp2", "v7_tiles",
         "v8_two_row_tiles", "v9_wgmma_tma", "v10_pingpong"]
BWD_STEPS = ["bwd_v1_mma", "bwd_v2_regs", "bwd_v3_cp_async", "bwd_v4_exp2", "bwd_v5_vec_atomic"]

# The fake program: the --kernel line of the real --help, then one check line per step (what --kernel all runs).
FAKE_PROGRAM = textwrap.dedent("""\
    #!/usr/bin/env python3
    import os, sys
    steps = os.environ["FAKE_STEPS"].split(",")
    bwd_steps = os.environ["FAKE_BWD_STEPS"].split(",")
    if "--help" in sys.argv:
        print("usage: warp_split_q [options]")
        print("  --kernel S      all, or steps separated by commas: " + ", ".join(steps) +
              " (v9_wgmma_tma and v10_pingpong are listed on an sm_90 GPU only), or none with --backward (time only "
              "the backward); default all [all]")
        print("  --backward      also run, check and time the backward steps (both dQ modes) [false]")
        print("  --bwd-kernel S  with --backward: all, or steps separated by commas: " + ", ".join(bwd_steps) +
              " (default all) [all]")
        sys.exit(0)
    d = sys.argv[sys.argv.index("--head-dim") + 1]
    print("problem: B=4 H=%s N=4096 d=%s" % ("32" if d == "64" else "16", d))
    if "--backward" in sys.argv:  # --kernel none: the backward's check lines only, one per step and dQ mode
        assert sys.argv[sys.argv.index("--kernel") + 1] == "none" and "--iters" in sys.argv
        runs = [s + m for s in bwd_steps for m in ("_atomic_dq", "_determ_dq")]
        for r in os.environ.get("FAKE_RAN", ",".join(runs)).split(","):
            print("check:   backward %s, whole kv groups: max |dQ - ref| 1e-3 <= bound 2e-3 vs fp64: ok" % r)
        sys.exit(1 if os.environ.get("FAKE_FAIL") == d else 0)
    ran = os.environ.get("FAKE_RAN", os.environ["FAKE_STEPS"]).split(",")
    for s in ran:
        print("check:   %-12s all rows: max |O - ref| 1e-3 <= bound 2e-3" % s)
        print("chain:   %-12s O and LSE vs 04 (fp32, same rounded inputs): ok" % s)
    sys.exit(1 if os.environ.get("FAKE_FAIL") == d else 0)
    """)
# The fake ncu: --help, --import (prints the report), and a profiling run that runs the program, then writes the
# raw page of chapter 04's forward_kernel and one `kernel` launch per check line (FAKE_LAUNCHES_EXTRA: more).
FAKE_NCU = textwrap.dedent("""\
    #!/usr/bin/env python3
    import os, re, subprocess, sys
    a = sys.argv[1:]
    if a == ["--help"]:
        print("  --print-units arg")
        if not os.environ.get("FAKE_OLD_NCU"):
            print("  --log-file arg")
        sys.exit(0)
    if "--import" in a:
        print(open(a[a.index("--import") + 1]).read(), end="")
        sys.exit(0)
    log = open(a[a.index("--log-file") + 1], "w") if "--log-file" in a else sys.stdout  # ncu's own lines
    metrics = a[a.index("--metrics") + 1].split(",")
    unknown = os.environ.get("FAKE_UNKNOWN")
    if unknown and unknown in metrics:
        print("==ERROR== Failed to find metric " + unknown.split(".")[0], file=log)  # the base name
        sys.exit(1)
    if os.environ.get("FAKE_NO_PERMISSION"):
        print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
              "Counters on the target device 0.", file=log)
    app = a[a.index("--force-overwrite") + 1:]
    print("==PROF== Connected to process 7", file=log)
    p = subprocess.run(app, capture_output=True, text=True)
    print(p.stdout, end="")
    extra = int(os.environ.get("FAKE_LAUNCHES_EXTRA", "0"))
    fwd = "void wsq::(anonymous namespace)::kernel<__half, (int)%d, (int)128, (int)64>(fa::Problem, const __half *, " \
          "const __half *, const __half *, __half *, float *)"
    names = ["void fa2::(anonymous namespace)::forward_kernel<64, false>(fa::Problem, const float *)"]
    if "--backward" not in app:
        n = len(re.findall(r"^check:", p.stdout, re.M)) + extra
        names += [fwd % k for k in range(n)]
    else:  # what the program launches: the forward that makes O, then per step and dQ mode (a memset is no kernel)
        kv = "void wsq::(anonymous namespace)::kv_kernel<__half, (int)64, (bool)%d>(fa::Problem, const __half *, " \
             "const __half *, const __half *, const float *, const __half *, const float *, float *, float *, float *)"
        names.append(fwd % 10)
        d128 = "--head-dim 128" in " ".join(app)
        for m in re.finditer(r"^check:\s+backward\s+(\S+)_(atomic|determ)_dq,", p.stdout, re.M):
            names.append("void wsq::bwd::(anonymous namespace)::rowsum_do_o_kernel<__half>(const __half *, const "
                         "__half *, float *, unsigned long, int)")
            names.append(kv % (m.group(2) == "atomic"))
            dq_in_kv = m.group(1) == "bwd_v14_dq_ordered"  # its dQ in the K/V kernel at both d (DQ_IN_KV)
            if m.group(2) == "determ" and not os.environ.get("FAKE_NO_DQ") and not dq_in_kv:
                names.append("void wsq::bwd::(anonymous namespace)::dq_kernel<__half, (int)64>(fa::Problem, const "
                             "__half *, const __half *, const __half *, const float *, const __half *, const float *, "
                             "float *)")
        names += [kv % 1] * extra
    # ncu's --kernel-name filter, on the function's base name (no namespace, template arguments or parameters)
    def base(name):
        return re.sub(r"<.*", "", name.replace("(anonymous namespace)", "").split("(")[0]).split("::")[-1]
    pattern = a[a.index("--kernel-name") + 1]
    names = [x for x in names if re.search(pattern[len("regex:"):], base(x))]
    units = {"gpu__time_duration.sum": "usecond", "dram__bytes_read.sum": "Mbyte", "dram__bytes_write.sum": "byte",
             "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum": "Kwavefront"}
    with open(a[a.index("--export") + 1] + ".ncu-rep", "w") as f:
        f.write(",".join('"%s"' % c for c in ["ID", "Process ID", "Kernel Name"] + metrics) + "\\n")
        f.write(",".join('"%s"' % units.get(m, "%" if "pct" in m else "") for m in [""] * 3 + metrics) + "\\n")
        for k, name in enumerate(names):
            values = ["{:,}".format(1000 * k + j) for j in range(len(metrics))]
            f.write(",".join('"%s"' % c for c in [str(k), "7", name] + values) + "\\n")
    sys.exit(p.returncode)
    """)


def executable(path, text):
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


class StepCounters(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="test_step_counters.")
        self.bin, self.build = os.path.join(self.dir, "bin"), os.path.join(self.dir, "build")
        os.makedirs(self.bin)
        os.makedirs(os.path.join(self.build, "05_warp_split_q"))
        executable(os.path.join(self.bin, "nvidia-smi"),
                   f'#!/bin/sh\n[ "$1" = -L ] && echo "GPU 0: {GPU} (UUID: GPU-0)" || echo "{GPU}"\n')
        executable(os.path.join(self.bin, "ncu"), FAKE_NCU)
        executable(os.path.join(self.build, "05_warp_split_q", "warp_split_q"), FAKE_PROGRAM)
        self.out = os.path.join(self.dir, "results", "gpu_steps.csv")
        self.env = dict(os.environ, PATH=self.bin + os.pathsep + os.environ["PATH"], NCU=os.path.join(self.bin, "ncu"),
                        FAKE_STEPS=",".join(STEPS), FAKE_BWD_STEPS=",".join(BWD_STEPS), TMPDIR=self.dir)

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def run_script(self, *args, **env):
        return subprocess.run(["bash", SCRIPT, *args], capture_output=True, text=True, env=dict(self.env, **env))

    def rows(self):
        with open(self.out, newline="") as f:
            return list(csv.DictReader(f))

    def assert_failed(self, r, message):
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        self.assertIn(message, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(self.out))

    def test_bad_usage_exits_2(self):
        for args in (["--no-such-flag"], ["a", "b", "c"]):
            self.assertEqual(self.run_script(*args).returncode, 2, args)
        r = self.run_script("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("step_counters.sh [BUILD_DIR] [OUT_CSV]", r.stdout)

    def test_kth_launch_of_kernel_is_the_kth_step(self):
        r = self.run_script(self.build, self.out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        rows = self.rows()
        n = len(step_counters.NAMES)
        self.assertEqual(len(rows), 2 * len(STEPS) * n)  # steps x head dims x metrics
        self.assertEqual(list(rows[0]), ["gpu", "step", "d", "metric", "value", "unit"])
        self.assertEqual({x["gpu"] for x in rows}, {GPU})
        self.assertEqual([x["step"] for x in rows[::n]], STEPS * 2)
        self.assertEqual([x["d"] for x in rows[::n]], ["64"] * len(STEPS) + ["128"] * len(STEPS))
        get = {(x["step"], x["d"], x["metric"]): x for x in rows}
        # v3_swizzle is the 4th launch of `kernel`, ID 4 after 04's forward_kernel (ID 0): value 1000 * 4 + j.
        for m in step_counters.NAMES:
            self.assertIn(("v3_swizzle", "128", m), get)
        pct = get[("v3_swizzle", "64", "sm__warps_active.avg.pct_of_peak_sustained_active")]
        self.assertEqual((float(pct["value"]), pct["unit"]), (4000 + 4, "%"))
        # Units scaled by ncu come back to ns, byte and plain counts.
        t = get[("split_k", "64", "gpu__time_duration.sum")]
        self.assertEqual((float(t["value"]), t["unit"]), (1000 * 1000.0, "ns"))
        rd = get[("v10_pingpong", "128", "dram__bytes_read.sum")]
        self.assertEqual((float(rd["value"]), rd["unit"]), (11012 * 1e6, "byte"))
        wf = get[("v1_mma", "64", "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum")]
        self.assertEqual((float(wf["value"]), wf["unit"]), (2005 * 1e3, "wavefront"))
        # The tables: one per head dim, a row per step in ladder order, a column per metric.
        self.assertIn("d = 64:", r.stdout)
        self.assertIn("d = 128:", r.stdout)
        head = "| step | time (us) | tensor pipe % | HMMA pipe % |"
        self.assertEqual(r.stdout.count(head), 2)
        self.assertIn("| split_k | 1,000 | 1,001.0 |", r.stdout)
        self.assertIn("| v10_pingpong | 11,000 |", r.stdout)
        # DRAM: read (1012 Mbyte) + write (1013 byte) of split_k, in MB.
        self.assertIn("| 1,011.00 | 1,012.0 |\n| v1_mma |", r.stdout)
        # One counter per step: the previous step's value -> this step's (long sb: metric 8; v3 is launch 4).
        self.assertRegex(r.stdout, r"\| v4_cp_async \|[^|]+\|[^|]+\| 4,008.00 → 5,008.00 \| 4,008.00 → 5,008.00 \|")
        self.assertRegex(r.stdout, r"\| split_k \| shared-memory wavefronts[^|]+ \| [^|]+ \| 1.0 \| 1.0 \|")
        self.assertRegex(r.stdout, r"\| v1_mma \| the same \| [^|]+ \| 1.0 → 2.0 \| 1.0 → 2.0 \|")
        self.assertLess(r.stdout.index("One counter per step"), r.stdout.index("Every counter"))
        # The table subcommand prints the same tables from the CSV.
        t = subprocess.run([sys.executable, step_counters.__file__, "table", self.out], capture_output=True, text=True)
        self.assertEqual(t.returncode, 0, t.stderr)
        self.assertIn(t.stdout.strip(), r.stdout)
        self.assertFalse([f for f in os.listdir(self.dir) if f.startswith("step_counters.")])  # temp dir removed

    def test_without_the_hopper_steps_the_table_has_nine_rows(self):
        r = self.run_script(self.build, self.out, FAKE_STEPS=",".join(STEPS[:9]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(sorted({x["step"] for x in self.rows()}), sorted(STEPS[:9]))

    def test_an_ncu_without_log_file_mixes_its_lines_with_the_program_s(self):
        r = self.run_script(self.build, self.out, FAKE_OLD_NCU="1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(self.rows()), 2 * len(STEPS) * len(step_counters.NAMES))

    def test_a_metric_ncu_does_not_know_is_left_out_and_said(self):
        unknown = "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"
        r = self.run_script(self.build, self.out, FAKE_UNKNOWN=unknown)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("left out: " + unknown, r.stdout)
        metrics = {x["metric"] for x in self.rows()}
        self.assertEqual(metrics, set(step_counters.NAMES) - {unknown})
        self.assertIn("| step | time (us) | HMMA pipe % | issue slots % |", r.stdout)  # no tensor pipe column
        self.assertIn("| v10_pingpong | the same |", r.stdout)  # its counter (the tensor pipe): missing, said so
        self.assertIn("| n/a → n/a | n/a → n/a |", r.stdout)

    def test_a_launch_count_that_differs_from_the_steps_is_an_error(self):
        self.assert_failed(self.run_script(self.build, self.out, FAKE_LAUNCHES_EXTRA="1"),
                           "ncu profiled 12 launches of 'kernel' for 11 steps")

    def test_check_lines_that_differ_from_the_steps_are_an_error(self):
        ran = ",".join(STEPS[:3] + STEPS[4:3:-1] + STEPS[3:4] + STEPS[5:])  # v3 and v4 swapped
        self.assert_failed(self.run_script(self.build, self.out, FAKE_RAN=ran), "the program checked the steps")

    def test_no_permission_for_the_counters_is_said(self):
        self.assert_failed(self.run_script(self.build, self.out, FAKE_NO_PERMISSION="1"), "ERR_NVGPUCTRPERM")

    def test_a_failed_program_writes_nothing(self):
        self.assert_failed(self.run_script(self.build, self.out, FAKE_FAIL="128"), "!! ncu run d = 128 failed")

    def test_no_ncu_no_gpu_no_program_exit_1_with_a_message(self):
        self.assert_failed(self.run_script(self.build, self.out, NCU=os.path.join(self.dir, "no-ncu")),
                           "ncu was not found")
        self.assert_failed(self.run_script(os.path.join(self.dir, "nowhere"), self.out), "build first")
        executable(os.path.join(self.bin, "nvidia-smi"), "#!/bin/sh\nexit 9\n")
        self.assert_failed(self.run_script(self.build, self.out), "no NVIDIA GPU found")

    def test_a_help_without_the_kernel_line_is_an_error(self):
        executable(os.path.join(self.build, "05_warp_split_q", "warp_split_q"), "#!/bin/sh\necho usage\n")
        self.assert_failed(self.run_script(self.build, self.out), "no '--kernel ... steps separated by commas")


class BackwardStepCounters(StepCounters):
    """step_counters.sh --backward: every backward step, both dQ modes, and the deterministic mode's dQ kernel."""

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.dir, "results", "gpu_bwd_steps.csv")

    def run_script(self, *args, **env):
        return super().run_script("--backward", *args, **env)

    def test_bad_usage_exits_2(self):
        for args in (["--no-such-flag"], ["a", "b", "c"]):
            self.assertEqual(self.run_script(*args).returncode, 2, args)
        r = self.run_script("--help")
        self.assertEqual(r.returncode, 0)
        self.assertIn("step_counters.sh --backward [BUILD_DIR] [OUT_CSV]", r.stdout)
        self.assertIn("<gpu>_bwd_steps.csv", r.stdout)

    def test_kth_launch_of_kernel_is_the_kth_step(self):
        r = self.run_script(self.build, self.out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("--kernel none --no-previous --backward --bwd-kernel all --iters 0 --dtype fp16", r.stdout)
        rows = self.rows()
        n = len(step_counters.BWD_NAMES)
        keys = [k for s in BWD_STEPS for k in (s + "/atomic_dq", s + "/determ_dq", s + "/determ_dq/dq_kernel")]
        self.assertEqual(len(rows), 2 * len(keys) * n)  # (steps x 3 launches) x head dims x metrics
        self.assertEqual([x["step"] for x in rows[::n]], keys * 2)
        self.assertEqual([x["d"] for x in rows[::n]], ["64"] * len(keys) + ["128"] * len(keys))
        get = {(x["step"], x["d"], x["metric"]): x for x in rows}
        for m in step_counters.BWD_NAMES:
            self.assertIn(("bwd_v5_vec_atomic/determ_dq/dq_kernel", "128", m), get)
        # ncu's filter took kv_kernel and dq_kernel alone (not 04's forward_kernel, the forward step's kernel or the
        # rowsum): bwd_v2_regs's atomic-mode kv_kernel is the 4th profiled launch, ID 3, value 1000 * 3 + j.
        pct = get[("bwd_v2_regs/atomic_dq", "64", "sm__warps_active.avg.pct_of_peak_sustained_active")]
        self.assertEqual((float(pct["value"]), pct["unit"]), (3000 + 4, "%"))
        red = get[("bwd_v5_vec_atomic/atomic_dq", "128", "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum")]
        self.assertEqual(float(red["value"]), 12000 + step_counters.BWD_NAMES.index(red["metric"]))
        dq = get[("bwd_v1_mma/determ_dq/dq_kernel", "64", "gpu__time_duration.sum")]
        self.assertEqual((float(dq["value"]), dq["unit"]), (2000 * 1000.0, "ns"))
        # One counter per step, per dQ mode and head dim: the previous step's value -> this step's (long sb: metric 8;
        # bwd_v3 is launches 6 (atomic) and 7, bwd_v2 launches 3 and 4).
        self.assertIn("| d = 64, atomic | d = 64, determ | d = 128, atomic | d = 128, determ |", r.stdout)
        self.assertRegex(r.stdout, r"\| bwd_v3_cp_async \|[^|]+\|[^|]+\| 3,008.00 → 6,008.00 \| "
                                   r"4,008.00 → 7,008.00 \| 3,008.00 → 6,008.00 \| 4,008.00 → 7,008.00 \|")
        self.assertRegex(r.stdout, r"\| bwd_v1_mma \| warp instructions[^|]+\|[^|]+\| 0.0 \| 0.0 \| 0.0 \| 0.0 \|\n"
                                   r"\|  \| tensor pipe busy \(%\) \|[^|]+\| 1.0 \| 1,001.0 \| 1.0 \| 1,001.0 \|")
        # bwd_v5: atomic requests (red + atom, metrics 15 and 16) and L2 sectors (17 and 18), in millions.
        self.assertRegex(r.stdout, r"\| bwd_v5_vec_atomic \| global atomic requests[^|]+\|[^|]+\| 0.02 → 0.02 \|")
        self.assertRegex(r.stdout, r"\|  \| L2 sectors the atomics touch[^|]+\|[^|]+\| 0.0 → 0.0 \|")
        # Every counter: one table per head dim, the atomic columns after the forward's.
        self.assertEqual(r.stdout.count("| DRAM MB (read + write) | atomic requests (M) | L2 atomic sectors (M) |"), 2)
        self.assertIn("| bwd_v1_mma/atomic_dq | 0 |", r.stdout)
        self.assertIn("| bwd_v5_vec_atomic/determ_dq/dq_kernel | 14,000 |", r.stdout)
        self.assertLess(r.stdout.index("One counter per backward step"), r.stdout.index("Every counter"))
        t = subprocess.run([sys.executable, step_counters.__file__, "table", self.out], capture_output=True, text=True)
        self.assertEqual(t.returncode, 0, t.stderr)
        self.assertIn(t.stdout.strip(), r.stdout)
        self.assertFalse([f for f in os.listdir(self.dir) if f.startswith("step_counters.")])

    def test_a_new_step_in_the_registry_appears_without_an_edit(self):
        r = self.run_script(self.build, self.out, FAKE_BWD_STEPS=",".join(BWD_STEPS + ["bwd_v6_next"]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("bwd_v6_next/determ_dq/dq_kernel", {x["step"] for x in self.rows()})
        self.assertIn("| bwd_v6_next | — | — | — | — | — | — |", r.stdout)  # no counter named for it yet

    def test_without_the_hopper_steps_the_table_has_nine_rows(self):  # here: a registry of three steps
        r = self.run_script(self.build, self.out, FAKE_BWD_STEPS=",".join(BWD_STEPS[:3]))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len({x["step"] for x in self.rows()}), 3 * 3)

    def test_an_ncu_without_log_file_mixes_its_lines_with_the_program_s(self):
        r = self.run_script(self.build, self.out, FAKE_OLD_NCU="1")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertEqual(len(self.rows()), 2 * 3 * len(BWD_STEPS) * len(step_counters.BWD_NAMES))

    def test_a_metric_ncu_does_not_know_is_left_out_and_said(self):
        unknown = "lts__t_sectors_srcunit_tex_op_atom.sum"
        r = self.run_script(self.build, self.out, FAKE_UNKNOWN=unknown)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("left out: " + unknown, r.stdout)
        self.assertEqual({x["metric"] for x in self.rows()}, set(step_counters.BWD_NAMES) - {unknown})
        self.assertNotIn("L2 atomic sectors (M)", r.stdout)  # its column needs both sector counts
        self.assertRegex(r.stdout, r"\|  \| L2 sectors the atomics touch[^|]+\|[^|]+\| n/a → n/a \|")

    def test_a_step_with_dq_in_its_kv_kernel_launches_no_dq_kernel(self):
        steps = BWD_STEPS + ["bwd_v14_dq_ordered"]  # DQ_IN_KV at d = 64 and 128
        r = self.run_script(self.build, self.out, FAKE_BWD_STEPS=",".join(steps))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        got = {(x["step"], x["d"]) for x in self.rows()}
        for d in ("64", "128"):
            self.assertNotIn(("bwd_v14_dq_ordered/determ_dq/dq_kernel", d), got)
            self.assertIn(("bwd_v14_dq_ordered/determ_dq", d), got)
        self.assertIn(("bwd_v5_vec_atomic/determ_dq/dq_kernel", "64"), got)  # the other steps keep theirs

    def test_a_launch_count_that_differs_from_the_steps_is_an_error(self):
        self.assert_failed(self.run_script(self.build, self.out, FAKE_LAUNCHES_EXTRA="1"),
                           "ncu profiled 11 launches of 'kv_kernel' and 5 of 'dq_kernel' for 5 steps x 2 dQ modes")
        self.assert_failed(self.run_script(self.build, self.out, FAKE_NO_DQ="1"),
                           "ncu profiled 10 launches of 'kv_kernel' and 0 of 'dq_kernel'")

    def test_check_lines_that_differ_from_the_steps_are_an_error(self):
        runs = [s + m for s in BWD_STEPS for m in ("_atomic_dq", "_determ_dq")]
        runs[2], runs[3] = runs[3], runs[2]  # bwd_v2's modes swapped: the launches still count right
        self.assert_failed(self.run_script(self.build, self.out, FAKE_RAN=",".join(runs)),
                           "the program checked the backward runs")

    def test_a_help_without_the_kernel_line_is_an_error(self):
        executable(os.path.join(self.build, "05_warp_split_q", "warp_split_q"), "#!/bin/sh\necho usage\n")
        self.assert_failed(self.run_script(self.build, self.out), "no '--bwd-kernel ... steps separated by commas")


class Parsing(unittest.TestCase):
    def test_function_name(self):
        self.assertEqual(step_counters.function_name(
            "void wsq::(anonymous namespace)::kernel<__half, (int)64, (bool)1>(fa::Problem, const __half *)"), "kernel")
        self.assertEqual(step_counters.function_name("forward_kernel"), "forward_kernel")

    def test_units(self):
        n = step_counters.normalise
        self.assertEqual(n(1.5, "msecond"), (1.5e6, "ns"))
        self.assertEqual(n(2.0, "Gbyte"), (2e9, "byte"))
        self.assertEqual(n(3.0, "Mwavefront"), (3e6, "wavefront"))
        self.assertEqual(n(42.0, "%"), (42.0, "%"))
        self.assertEqual(n(0.5, ""), (0.5, ""))

    def test_steps_from_help_stops_at_the_note(self):
        text = ("  --kernel S      all, or steps separated by commas: split_k, v1_mma, v8_two_row_tiles (v9_wgmma_tma "
                "and v10_pingpong are listed on an sm_90 GPU only; default all) [all]\n")
        self.assertEqual(step_counters.steps_from_help(text), ["split_k", "v1_mma", "v8_two_row_tiles"])

    def test_backward_steps_from_help_are_the_bwd_kernel_line(self):
        text = ("  --kernel S      all, or steps separated by commas: split_k, v1_mma (v9_wgmma_tma ...), or none\n"
                "  --bwd-kernel S  with --backward: all, or steps separated by commas: bwd_v1_mma, bwd_v5_vec_atomic "
                "(default all) [all]\n")
        self.assertEqual(step_counters.steps_from_help(text, "--bwd-kernel"), ["bwd_v1_mma", "bwd_v5_vec_atomic"])
        self.assertEqual(step_counters.steps_from_help(text), ["split_k", "v1_mma"])

    def test_backward_check_lines(self):
        log = ("==PROF== Connected\ncheck:   backward bwd_v1_mma_atomic_dq, whole kv groups: ok\n"
               "check:   backward bwd_v1_mma_determ_dq, sampled dQ rows: ok\nspeed:   ...\n")
        self.assertEqual(step_counters.checked_backward(log), ["bwd_v1_mma_atomic_dq", "bwd_v1_mma_determ_dq"])

    def test_a_missing_value_is_n_a_in_the_table(self):
        rows = [["g", "v1_mma", "64", "gpu__time_duration.sum", "", "ns"],
                ["g", "v1_mma", "64", "dram__bytes_read.sum", "2.5e6", "byte"]]
        self.assertIn("| v1_mma | n/a |", step_counters.tables(rows))


if __name__ == "__main__":
    unittest.main()
