#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention as an outside witness (run on a GPU machine).

  check BUILD   For each chapter program in BUILD: write random q/k/v/do .npy files (float32), run the
                program with --in/--out, and compare its o.npy, lse.npy (and dq/dk/dv.npy) with torch
                SDPA in float64 on the values the program computed with: the float32 tensors for
                chapters 00-04, the tensors rounded to fp16 or bf16 for chapters 05 and 06 (they round
                on load). Proves the file layout and the semantics (GQA, causal alignment, scale) are
                PyTorch's, independently of our own reference. Fails if a program exits non-zero,
                misses an output, writes it in the wrong dtype or disagrees, or if no program was found.
  bench         Time torch SDPA with CUDA events (warm-up, median of --iters, L2 flushed) and append
                rows in the project's CSV format (--csv), so chapter timings have an outside baseline
                measured in the same run. --backend picks the SDPA kernel (flash = FlashAttention-2,
                cudnn, efficient, math; default: the one torch picks); the rows name it in `kernel`
                (sdpa_flash, ...). --q-len fixes the query length (e.g. 1 for decoding) while --sizes
                are the key/value lengths; --kv-heads < --heads runs GQA (enable_gqa).
  gemm          Time one plain GEMM, C = A B^T with A M x K and B N x K, in cuBLAS through PyTorch (fp16 or
                bf16: torch.matmul; fp8: torch._scaled_mm on e4m3 with unit scales, bf16 out), the same way:
                the tensor cores' rate with nothing between the products, the yardstick of 05's FP8.md §17.

Decoding baseline (chapter 06), for example:
  torch_sdpa.py bench --q-len 1 --sizes 4096 32768 131072 --batch 8 --heads 32 --kv-heads 8 \\
                --head-dim 128 --dtype fp16 --backend flash --csv rows.csv

  torch_sdpa.py gemm --size 8192 --dtype fp8

Needs PyTorch with CUDA and NumPy; --help works without them. Exit codes: 0 ok, 1 failed check or
no GPU/PyTorch, 2 bad usage.
"""
import argparse
import collections
import os
import subprocess
import sys
import tempfile

HEADER = ("gpu,chapter,kernel,pass,dtype,B,H,Hkv,Nq,Nk,d,causal,dropout,ms,tflops,gbps,"
          "model_hbm_bytes,extra_bytes,max_abs_err")
DTYPES = {"fp32": ("float32", 4), "fp16": ("float16", 2), "bf16": ("bfloat16", 2)}
BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "math": "MATH"}
FORWARD, ALL = ("o", "lse"), ("o", "lse", "dq", "dk", "dv")  # the .npy files a program writes with --out


class Case(collections.namedtuple("Case", "prog flags dtype shape causal outputs lens", defaults=(None,))):
    """One program run: its path in the build, extra flags, the dtype it computes in, the input shape
    (B, H, Hkv, Nq, Nk, d), the outputs it must write, and (chapter 06) each batch entry's context length
    (None: every entry sees all Nk keys)."""


Chapter = collections.namedtuple("Chapter", "id folder program dtypes head_dim backward")


def read_chapters(path=os.path.join(os.path.dirname(os.path.abspath(__file__)), "chapters.tsv")):
    """The chapters of scripts/chapters.tsv (the project's one list), in reading order."""
    with open(path, encoding="utf-8") as f:
        rows = [line.rstrip("\n").split("\t") for line in f if line[:1].isdigit()]
    return [Chapter(r[0], r[1], r[2], r[3].split(","), int(r[4]), r[5]) for r in rows]


CHAPTERS = read_chapters()


def program_of(c):
    return f"{c.folder}/{c.program}"


def outputs_of(c):
    return FORWARD if c.backward == "no" else ALL


def flags_of(c):
    return ["--backward"] if c.backward == "flag" else []


# Both shapes have GQA, Nq != Nk and lengths that are not tile multiples; causal is bottom-right aligned.
# The fp32 chapters (00-04), every one of them on this shape, causal and not.
FP32_SHAPE = (2, 4, 2, 97, 203, 64)
CASES = [Case(program_of(c), flags_of(c), "fp32", FP32_SHAPE, causal, outputs_of(c))
         for causal in (False, True) for c in CHAPTERS if c.dtypes == ["fp32"]]
# Chapter 05 (head_dim 64 or 128): every forward step and every backward step run; the files hold the last
# forward step's O and LSE and the last backward step's deterministic-dQ gradients.
CASES += [Case("05_warp_split_q/warp_split_q", ["--dtype", dtype, "--backward"], dtype, (2, 4, 2, 97, 203, d),
               causal, ALL)
          for dtype, d, causal in (("fp16", 64, False), ("fp16", 64, True), ("bf16", 64, False), ("bf16", 64, True),
                                   ("fp16", 128, True))]
# Chapter 06 (q_len 1..8, head_dim 64 or 128): one decode step against a cache of capacity Nk (k.npy's length),
# every entry's context full, then ragged contexts (--kv-lens): entry b sees its first n_b keys, causal aligned
# to n_b, so with n_b = 3 < q_len = 4 the first row sees no key and with n_b = 0 none does (O = 0, LSE = -inf).
# Every kernel runs; the files hold the last kernel's (paged) O and LSE.
CASES += [Case("06_flash_decoding/flash_decoding", ["--dtype", dtype], dtype, (2, 8, 2, nq, 203, d), causal,
               FORWARD)
          for dtype, nq, d, causal in (("fp16", 1, 128, False), ("fp16", 4, 64, True), ("bf16", 1, 64, False),
                                       ("bf16", 4, 128, True))]
CASES += [Case("06_flash_decoding/flash_decoding", ["--dtype", "fp16"], "fp16", (3, 8, 2, 4, 203, 64), True,
               FORWARD, (203, 3, 0))]
# A later low-precision chapter with no cases of its own above: each dtype on the fp32 shape at its head_dim.
CASES += [Case(program_of(c), ["--dtype", dtype] + flags_of(c), dtype, FP32_SHAPE[:5] + (c.head_dim,), causal,
               outputs_of(c))
          for c in CHAPTERS if c.dtypes != ["fp32"] and c.id not in ("05", "06")
          for dtype in c.dtypes for causal in (False, True)]

# Tolerances: |got - torch| <= atol + rtol |torch| element-wise, torch being float64 SDPA on the values the
# program computed with. The inputs are N(0, 1): S ~ N(0, 1) at scale d^-1/2 and every row sees 107 to 203 keys,
# so |O| < 1 (std ~0.15), |LSE| < 10 and the gradients are ~0.1 (the largest ~0.5). (The ragged decode entry's
# rows see 0 to 3 keys: |O| up to max |v| ~ 4.5, where half an ulp is still at most 2f, below.)
# fp32 (chapters 00-04): their own checks hold O to 2e-5 and the gradients to 1e-4 (common/testing.hpp); 1e-3
#   is far above any rounding, far below what a wrong head, mask, scale or layout moves (0.1 or more).
# fp16/bf16 (chapters 05, 06), in units of the dtype's floor f = 2^-10 (fp16) or 2^-7 (bf16), twice the unit
#   roundoff u (common/lowp.hpp's lowp_floor):
#   O, written in the dtype: its rounding, at most half an ulp = u at |O| < 2, plus chapter 05's rounding of P
#     to the dtype before the PV product, which moves O_ic by at most u sum_j P_ij |v_jc| (a weighted mean of
#     |v|, ~0.8, never above max |v| ~ 4.5). Worst case 5.5u with every error of one sign; atol 4f = 8u, while a
#     wrong head, mask or scale moves O by 0.1 or more. Chapter 06 keeps P in fp32: only the final rounding.
#   LSE, fp32 from exact products of dtype values (exp/log to ~2^-22): ~1e-6 relative, ~1e-5 at |LSE| = 10;
#     chapter 05's own rule (forward/check.hpp) atol 1e-4 + rtol 1e-5 leaves >5x; leaving out one key moves LSE by
#     its weight P_ij, ~3e-3.
#   dQ, dK, dV, fp32 from dtype inputs (P and dS rounded to the dtype for the tensor-core products, O read in
#     the dtype): chapter 05's program rule (backward/bwd_program.cuh) atol 8f + rtol 2f, its plain backward erring by
#     1-5 f. The program's own fp64 check uses the same rule, so only a semantic difference fails here: a wrong
#     head, mask or transposition moves the largest gradients by about their size, above bf16's 8f = 0.0625.
LOWP_FLOOR = {"fp16": 2.0**-10, "bf16": 2.0**-7}


def tolerance(dtype, name):
    """(atol, rtol) for output `name` of a run in `dtype` (see above)."""
    if dtype == "fp32":
        return 1e-3, 0.0
    f = LOWP_FLOOR[dtype]
    return {"o": (4 * f, 0.0), "lse": (1e-4, 1e-5)}.get(name, (8 * f, 2 * f))


def file_dtype(dtype, name):
    """The .npy dtype a program writes: O in float16 for fp16 runs; everything else float32 (bf16 O exactly
    widened: NumPy has no bf16)."""
    return "float16" if dtype == "fp16" and name == "o" else "float32"


def positive(text):
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {v})")
    return v


def non_negative(text):
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {v})")
    return v


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="torch_sdpa.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="compare every chapter program in BUILD with torch SDPA (fp64)")
    c.add_argument("build", help="the build folder (e.g. build-gpu)")
    b = sub.add_parser("bench", help="time torch SDPA and append rows to --csv")
    b.add_argument("--sizes", type=positive, nargs="+", default=[1024, 4096], help="key/value lengths Nk")
    b.add_argument("--q-len", type=positive, default=None, help="query length Nq (default: Nq = Nk)")
    b.add_argument("--batch", type=positive, default=1)
    b.add_argument("--tokens", type=positive, default=None,
                   help="batch = TOKENS / Nk for each size (FlashAttention's benchmark: 16384 tokens); overrides --batch")
    b.add_argument("--heads", type=positive, default=16)
    b.add_argument("--kv-heads", type=positive, default=None, help="default: --heads (no GQA)")
    b.add_argument("--head-dim", type=positive, default=64)
    b.add_argument("--causal", action="store_true", help="bottom-right aligned, as in every chapter")
    b.add_argument("--backward", action="store_true", help="also time the backward pass")
    b.add_argument("--backward-only", action="store_true", help="time the backward pass alone (no forward rows)")
    b.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    b.add_argument("--backend", choices=sorted(BACKENDS) + ["auto"], default="auto")
    b.add_argument("--iters", type=positive, default=20)
    b.add_argument("--warmup", type=non_negative, default=3)
    b.add_argument("--csv", help="append the rows to this CSV file")
    g = sub.add_parser("gemm", help="time one GEMM in cuBLAS (through PyTorch): the tensor cores' yardstick")
    g.add_argument("--size", type=positive, nargs="+", default=[8192], metavar="S",
                   help="M = N = K = S; or three values M N K (default 8192)")
    g.add_argument("--dtype", choices=["fp16", "bf16", "fp8"], default="fp8")
    g.add_argument("--iters", type=positive, default=20)
    g.add_argument("--warmup", type=non_negative, default=3)
    a = ap.parse_args(argv)
    if a.cmd == "gemm":
        if len(a.size) not in (1, 3):
            ap.error(f"--size takes one value (M = N = K) or three (M N K), got {len(a.size)}")
        if a.dtype == "fp8" and any(x % 16 for x in a.size):
            ap.error(f"--dtype fp8: cuBLAS's e4m3 GEMM needs M, N, K multiples of 16 (got {a.size})")
    if a.cmd == "bench":
        a.kv_heads = a.kv_heads or a.heads
        if a.tokens and any(a.tokens % n for n in a.sizes):
            ap.error(f"--tokens {a.tokens} must be a multiple of every size in --sizes")
        if a.heads % a.kv_heads:
            ap.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads}")
    return a


def need_cuda_torch():
    try:
        import torch
    except ImportError:
        sys.exit("torch_sdpa.py: PyTorch is not installed (pip install torch); it is needed for check, bench and gemm")
    if not torch.cuda.is_available():
        sys.exit("torch_sdpa.py: PyTorch sees no CUDA GPU; check, bench and gemm run on one")
    return torch


def median_ms(torch, fn, warmup, iters, flush):
    """fn's time in ms by CUDA events: warmup calls, then the median of iters, the L2 flushed before each."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return sorted(times)[len(times) // 2]


def new_flush(torch):
    return torch.empty(2 * 64 * 2**20, dtype=torch.int8, device="cuda")  # 128 MiB: more than any L2


def sdpa_reference(torch, q, k, v, causal, scale, lens=None):
    """Reference semantics: batch entry b sees its first n_b = lens[b] keys (default all Nk), bottom-right causal
    (key j <= i + n_b - Nq), GQA, empty rows -> O = 0, LSE = -inf."""
    nb, nq, nk = q.shape[0], q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    n = torch.tensor(lens or [nk] * nb, device=q.device)[:, None, None, None]
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    hidden = (j >= n) | (j > i + n - nq) if causal else j >= n
    s = s.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # empty rows: 0
    return p @ v, lse


def input_shapes(case):
    """The shapes of the float32 .npy files a case writes: q and do [B, H, Nq, d], k and v [B, Hkv, Nk, d]."""
    B, H, Hkv, Nq, Nk, d = case.shape
    return {"q": (B, H, Nq, d), "k": (B, Hkv, Nk, d), "v": (B, Hkv, Nk, d), "do": (B, H, Nq, d)}


def program_args(build, case, inp, out):
    """The command line that runs a case's program on the files in `inp`, writing to `out`, untimed."""
    args = [os.path.join(build, case.prog), "--in", inp, "--out", out, "--iters", "0"]
    args += ["--kv-lens", ",".join(map(str, case.lens))] if case.lens else []
    return args + (["--causal"] if case.causal else []) + case.flags


def compare_output(np, path, want, dtype, name):
    """(good, text): the .npy file at `path` against `want` (float64 NumPy; -inf where a row sees no key)."""
    got = np.load(path)
    atol, rtol = tolerance(dtype, name)
    text = f"{str(got.dtype):7s} shape {tuple(got.shape)}"
    if got.shape != want.shape:
        return False, text + f" but torch's is {tuple(want.shape)}"
    problems = []
    if got.dtype != np.dtype(file_dtype(dtype, name)):
        problems.append(f"expected {file_dtype(dtype, name)}")
    elif dtype == "bf16" and name == "o" and (got.view(np.uint32) & 0xFFFF).any():
        problems.append("values are not bf16 (low 16 bits set)")
    g = got.astype(np.float64)
    fin = np.isfinite(want)
    diff = np.abs(g[fin] - want[fin])
    err = diff.max() if diff.size else 0.0
    if not (diff <= atol + rtol * np.abs(want[fin])).all():  # NaN fails too
        problems.append("beyond tolerance")
    if not (np.array_equal(np.isfinite(g), fin) and np.array_equal(g[~fin], want[~fin])):
        problems.append("infinities differ")
    text += f" max|diff| vs torch {err:.2e} (tol {atol:.1e} + {rtol:.0e} |ref|)"
    return not problems, text + "".join("; " + x for x in problems)


def check(build):
    torch = need_cuda_torch()
    import numpy as np
    cases = [c for c in CASES if os.path.exists(os.path.join(build, c.prog))]
    if not cases:
        print(f"FAIL no chapter program found in {build} (build first; expected e.g. {build}/{CASES[0].prog})")
        return False
    torch.manual_seed(0)
    ok, compared = True, 0
    for c in cases:
        label = f"{c.prog:38s} {c.dtype} causal={int(c.causal)}"
        label += f" kv-lens={','.join(map(str, c.lens))}" if c.lens else ""
        with tempfile.TemporaryDirectory() as tmp:
            inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
            os.makedirs(inp)
            t = {name: torch.randn(shape) for name, shape in input_shapes(c).items()}
            for name, x in t.items():
                np.save(os.path.join(inp, name + ".npy"), x.numpy())
            # The values the program computes with: rounded to its dtype on load (nearest even; fp32: as they
            # are), widened exactly to float64.
            dtype = getattr(torch, DTYPES[c.dtype][0])
            q, k, v, do = (t[n].to(dtype).double().cuda() for n in ("q", "k", "v", "do"))
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            o_ref, lse_ref = sdpa_reference(torch, q, k, v, c.causal, q.shape[-1] ** -0.5, c.lens)
            ref = {"o": o_ref, "lse": lse_ref}
            if "dq" in c.outputs:
                ref.update(zip(("dq", "dk", "dv"), torch.autograd.grad(o_ref, (q, k, v), do)))
            r = subprocess.run(program_args(build, c, inp, out), capture_output=True, text=True)
            if r.returncode != 0:
                print(f"FAIL {label} exited {r.returncode}: {(r.stderr.strip() or r.stdout.strip())[-300:]}")
                ok = False
                continue
            for name in c.outputs:
                f = os.path.join(out, name + ".npy")
                if os.path.exists(f):
                    good, text = compare_output(np, f, ref[name].detach().cpu().numpy(), c.dtype, name)
                    compared += 1
                else:
                    good, text = False, f"missing: the program wrote no {name}.npy"
                ok &= good
                print(f"{'ok  ' if good else 'FAIL'} {label} {name:3s} {text}")
    if compared == 0:
        print("FAIL no output was compared")
    return ok and compared > 0


def bench(a):
    torch = need_cuda_torch()
    import torch.nn.functional as F
    dev = torch.cuda.get_device_name()
    dtype, elem = getattr(torch, DTYPES[a.dtype][0]), DTYPES[a.dtype][1]
    kernel = "sdpa" if a.backend == "auto" else "sdpa_" + a.backend
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {dev}, {a.dtype}, backend {a.backend}")
    if a.backend == "auto":
        import contextlib
        backend_ctx = contextlib.nullcontext
    else:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        backend_ctx = lambda: sdpa_kernel(getattr(SDPBackend, BACKENDS[a.backend]))  # noqa: E731
    flush = new_flush(torch)
    rows, ok = [], True
    for nk in a.sizes:
        nq = a.q_len or nk
        batch = a.tokens // nk if a.tokens else a.batch
        q = (torch.randn(batch, a.heads, nq, a.head_dim, device="cuda") + 0.5).to(dtype)
        k = (torch.randn(batch, a.kv_heads, nk, a.head_dim, device="cuda") + 0.5).to(dtype)
        v = (torch.randn(batch, a.kv_heads, nk, a.head_dim, device="cuda") + 0.5).to(dtype)
        mask, is_causal = None, a.causal and nq == nk
        if a.causal and nq != nk:  # torch's is_causal is top-left aligned; the chapters' is bottom-right
            from torch.nn.attention.bias import causal_lower_right
            mask = causal_lower_right(nq, nk)
        gqa = a.heads != a.kv_heads
        for pass_ in (["bwd"] if a.backward_only else ["fwd", "bwd"] if a.backward else ["fwd"]):
            qq, kk, vv = (x.clone().requires_grad_(pass_ == "bwd") for x in (q, k, v))

            def fwd():
                with backend_ctx():
                    return F.scaled_dot_product_attention(qq, kk, vv, attn_mask=mask, is_causal=is_causal,
                                                          enable_gqa=gqa)
            try:
                if pass_ == "fwd":
                    fn = fwd
                else:
                    o = fwd()
                    do = torch.randn_like(o)

                    def fn():
                        torch.autograd.grad(o, (qq, kk, vv), do, retain_graph=True)
                ms = median_ms(torch, fn, a.warmup, a.iters, flush)
            except RuntimeError as err:
                print(f"!! {kernel} {pass_} Nq={nq} Nk={nk}: cannot run ({str(err).splitlines()[0][:200]})")
                ok = False
                continue
            # Visible (query, key) pairs, bottom-right causal as in formulas.hpp.
            pairs = sum(min(nk, max(0, i + nk - nq + 1)) for i in range(nq)) if a.causal else nq * nk
            flops = 4.0 * batch * a.heads * pairs * a.head_dim * (2.5 if pass_ == "bwd" else 1.0)
            # Each tensor read or written once (Q, K, V, O; and dO, dQ, dK, dV): the least a kernel moves.
            q_bytes, kv_bytes = elem * batch * a.heads * nq * a.head_dim, elem * batch * a.kv_heads * nk * a.head_dim
            bytes_ = (2 * q_bytes + 2 * kv_bytes) * (2 if pass_ == "bwd" else 1)
            rows.append(f'"{dev}",torch,{kernel},{pass_},{a.dtype},{batch},{a.heads},{a.kv_heads},{nq},{nk},'
                        f'{a.head_dim},{int(a.causal)},0,{ms:.6g},{flops / ms / 1e9:.6g},{bytes_ / ms / 1e6:.6g},'
                        f'{bytes_:.0f},0,-1')
            print(f"torch {kernel} {pass_} Nq={nq} Nk={nk} d={a.head_dim} causal={int(a.causal)}: {ms:.4f} ms "
                  f"{flops / ms / 1e9:.2f} TFLOP/s {bytes_ / ms / 1e6:.1f} GB/s")
    if a.csv and rows:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a") as f:
            if new:
                f.write(HEADER + "\n")
            f.write("\n".join(rows) + "\n")
    return ok


def gemm(a):
    torch = need_cuda_torch()
    m, n, k = a.size * 3 if len(a.size) == 1 else a.size
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {torch.cuda.get_device_name()}, {a.dtype}")
    if a.dtype == "fp8":
        # e4m3 operands; cuBLAS wants B column-major (B^T of a row-major N x K), scales as fp32 scalars.
        x = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        fn = lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)  # noqa: E731
        what = "e4m3 x e4m3, fp32 accumulate, bf16 out (torch._scaled_mm)"
    else:
        dtype = getattr(torch, DTYPES[a.dtype][0])
        x, w = torch.randn(m, k, device="cuda", dtype=dtype), torch.randn(n, k, device="cuda", dtype=dtype)
        fn = lambda: torch.matmul(x, w.t())  # noqa: E731
        what = f"{a.dtype} x {a.dtype}, fp32 accumulate (torch.matmul)"
    try:
        ms = median_ms(torch, fn, a.warmup, a.iters, new_flush(torch))
    except RuntimeError as err:
        print(f"!! gemm {a.dtype} {m}x{n}x{k}: cannot run ({str(err).splitlines()[0][:200]})")
        return False
    print(f"torch gemm {a.dtype} M={m} N={n} K={k}, {what}: {ms:.4f} ms {2.0 * m * n * k / ms / 1e9:.1f} TFLOP/s")
    return True


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.cmd == "check":
        return 0 if check(a.build) else 1
    return 0 if (gemm(a) if a.cmd == "gemm" else bench(a)) else 1


if __name__ == "__main__":
    sys.exit(main())
