#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention as an outside witness (run on a GPU machine).

  check BUILD   For each chapter program in BUILD: write random q/k/v/do .npy files, run the program
                with --in/--out, and compare its o.npy, lse.npy (and dq/dk/dv.npy) with torch SDPA in
                float64 on the same tensors. Proves the file layout and the semantics (GQA, causal
                alignment, scale) are PyTorch's, independently of our own reference. Fails if a program
                disagrees, or if no program was found to check.
  bench         Time torch SDPA with CUDA events (warm-up, median of --iters, L2 flushed) and append
                rows in the project's CSV format (--csv), so chapter timings have an outside baseline
                measured in the same run. --backend picks the SDPA kernel (flash = FlashAttention-2,
                cudnn, efficient, math; default: the one torch picks); the rows name it in `kernel`
                (sdpa_flash, ...). --q-len fixes the query length (e.g. 1 for decoding) while --sizes
                are the key/value lengths; --kv-heads < --heads runs GQA (enable_gqa).

Decoding baseline (chapter 06), for example:
  torch_sdpa.py bench --q-len 1 --sizes 4096 32768 131072 --batch 8 --heads 32 --kv-heads 8 \\
                --head-dim 128 --dtype fp16 --backend flash --csv rows.csv

Needs PyTorch with CUDA and NumPy; --help works without them. Exit codes: 0 ok, 1 failed check or
no GPU/PyTorch, 2 bad usage.
"""
import argparse
import os
import subprocess
import sys
import tempfile

HEADER = ("gpu,chapter,kernel,pass,dtype,B,H,Hkv,Nq,Nk,d,causal,dropout,ms,tflops,gbps,"
          "model_hbm_bytes,extra_bytes,max_abs_err")
DTYPES = {"fp32": ("float32", 4), "fp16": ("float16", 2), "bf16": ("bfloat16", 2)}
BACKENDS = {"flash": "FLASH_ATTENTION", "cudnn": "CUDNN_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
            "math": "MATH"}
PROGRAMS = [("00_naive/naive", ["--backward"]), ("01_online_softmax/online_softmax", []),
            ("02_fa1_forward/fa1_forward", []), ("03_fa1_backward/fa1_backward", []),
            ("04_fa2/fa2", ["--backward"])]


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
    b.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    b.add_argument("--backend", choices=sorted(BACKENDS) + ["auto"], default="auto")
    b.add_argument("--iters", type=positive, default=20)
    b.add_argument("--warmup", type=non_negative, default=3)
    b.add_argument("--csv", help="append the rows to this CSV file")
    a = ap.parse_args(argv)
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
        sys.exit("torch_sdpa.py: PyTorch is not installed (pip install torch); it is needed for check and bench")
    if not torch.cuda.is_available():
        sys.exit("torch_sdpa.py: PyTorch sees no CUDA GPU; check and bench run on one")
    return torch


def sdpa_reference(torch, q, k, v, causal, scale):
    """Reference semantics: bottom-right causal (key j <= i + Nk - Nq), GQA, empty rows -> 0."""
    nq, nk = q.shape[2], k.shape[2]
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) * scale
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + nk - nq, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # empty rows: 0
    return p @ v, lse


def check(build):
    torch = need_cuda_torch()
    import numpy as np
    found = [(prog, extra) for prog, extra in PROGRAMS if os.path.exists(os.path.join(build, prog))]
    if not found:
        print(f"FAIL no chapter program found in {build} (build first; expected e.g. {build}/{PROGRAMS[0][0]})")
        return False
    torch.manual_seed(0)
    B, H, Hkv, Nq, Nk, d = 2, 4, 2, 97, 203, 64
    ok, compared = True, 0
    for causal in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
            os.makedirs(inp)
            t = {"q": torch.randn(B, H, Nq, d), "k": torch.randn(B, Hkv, Nk, d), "v": torch.randn(B, Hkv, Nk, d),
                 "do": torch.randn(B, H, Nq, d)}
            for name, x in t.items():
                np.save(os.path.join(inp, name + ".npy"), x.numpy())
            q, k, v, do = (t[n].double().cuda().requires_grad_() for n in ("q", "k", "v", "do"))
            o_ref, lse_ref = sdpa_reference(torch, q, k, v, causal, d ** -0.5)
            grads = torch.autograd.grad(o_ref, (q, k, v), do)
            ref = {"o": o_ref, "lse": lse_ref, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            for prog, extra in found:
                args = [os.path.join(build, prog), "--in", inp, "--out", out, "--iters", "0"]
                args += (["--causal"] if causal else []) + extra
                r = subprocess.run(args, capture_output=True, text=True)
                if r.returncode != 0:
                    print(f"FAIL {prog} exited {r.returncode}: {r.stderr.strip()[-300:]}")
                    ok = False
                    continue
                for name in ("o", "lse", "dq", "dk", "dv"):
                    f = os.path.join(out, name + ".npy")
                    if not os.path.exists(f):
                        continue
                    got = torch.from_numpy(np.load(f)).double()
                    want = ref[name].detach().cpu()
                    fin = torch.isfinite(want)
                    err = (got[fin] - want[fin]).abs().max().item()
                    same_inf = torch.equal(torch.isfinite(got), fin)
                    good = err < 1e-3 and same_inf
                    ok &= good
                    compared += 1
                    print(f"{'ok  ' if good else 'FAIL'} {prog:38s} causal={int(causal)} {name:3s} "
                          f"shape {tuple(got.shape)} max|diff| vs torch {err:.2e}")
                    os.remove(f)
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
    flush = torch.empty(2 * 64 * 2**20, dtype=torch.int8, device="cuda")
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
        for pass_ in (["fwd", "bwd"] if a.backward else ["fwd"]):
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
                for _ in range(a.warmup):
                    fn()
                times = []
                for _ in range(a.iters):
                    flush.zero_()
                    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    s.record()
                    fn()
                    e.record()
                    torch.cuda.synchronize()
                    times.append(s.elapsed_time(e))
            except RuntimeError as err:
                print(f"!! {kernel} {pass_} Nq={nq} Nk={nk}: cannot run ({str(err).splitlines()[0][:200]})")
                ok = False
                continue
            ms = sorted(times)[len(times) // 2]
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


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if a.cmd == "check":
        return 0 if check(a.build) else 1
    return 0 if bench(a) else 1


if __name__ == "__main__":
    sys.exit(main())
