#!/usr/bin/env python3
"""PyTorch's scaled_dot_product_attention as an outside witness (run on the GPU machine).

  check BUILD   For each chapter program in BUILD: write random q/k/v/do .npy files, run the program
                with --in/--out, and compare its o.npy, lse.npy (and dq/dk/dv.npy) with torch SDPA in
                float64 on the same tensors. Proves the file layout and the semantics (GQA, causal
                alignment, scale) are PyTorch's, independently of our own reference.
  bench         Time torch SDPA (fp32, the backend torch picks) with CUDA events (warm-up, median of
                --iters, L2 flushed) and append rows in the project's CSV format (--csv), so chapter
                timings have an outside baseline measured in the same run.
"""
import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HEADER = ("gpu,chapter,kernel,pass,dtype,B,H,Hkv,Nq,Nk,d,causal,dropout,ms,tflops,gbps,"
          "model_hbm_bytes,extra_bytes,max_abs_err")


def sdpa(q, k, v, causal, scale):
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
    progs = [("00_naive/naive", ["--backward"]), ("01_online_softmax/online_softmax", []),
             ("02_fa1_forward/fa1_forward", []), ("03_fa1_backward/fa1_backward", []), ("04_fa2/fa2", [])]
    torch.manual_seed(0)
    B, H, Hkv, Nq, Nk, d = 2, 4, 2, 97, 203, 64
    ok = True
    for causal in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            inp, out = os.path.join(tmp, "in"), os.path.join(tmp, "out")
            os.makedirs(inp)
            t = {"q": torch.randn(B, H, Nq, d), "k": torch.randn(B, Hkv, Nk, d), "v": torch.randn(B, Hkv, Nk, d),
                 "do": torch.randn(B, H, Nq, d)}
            for name, x in t.items():
                np.save(os.path.join(inp, name + ".npy"), x.numpy())
            q, k, v, do = (t[n].double().cuda().requires_grad_() for n in ("q", "k", "v", "do"))
            o_ref, lse_ref = sdpa(q, k, v, causal, d ** -0.5)
            grads = torch.autograd.grad(o_ref, (q, k, v), do)
            ref = {"o": o_ref, "lse": lse_ref, "dq": grads[0], "dk": grads[1], "dv": grads[2]}
            for prog, extra in progs:
                path = os.path.join(build, prog)
                if not os.path.exists(path):
                    continue
                args = [path, "--in", inp, "--out", out, "--iters", "0"] + (["--causal"] if causal else []) + extra
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
                    print(f"{'ok  ' if good else 'FAIL'} {prog:38s} causal={int(causal)} {name:3s} "
                          f"shape {tuple(got.shape)} max|diff| vs torch {err:.2e}")
                    os.remove(f)
    return ok


def bench(a):
    dev = torch.cuda.get_device_name()
    print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {dev}")
    flush = torch.empty(2 * 64 * 2**20, dtype=torch.int8, device="cuda")
    rows = []
    for n in a.sizes:
        q = torch.randn(a.batch, a.heads, n, a.head_dim, device="cuda") + 0.5
        k = torch.randn(a.batch, a.kv_heads, n, a.head_dim, device="cuda") + 0.5
        v = torch.randn(a.batch, a.kv_heads, n, a.head_dim, device="cuda") + 0.5
        for pass_ in (["fwd", "bwd"] if a.backward else ["fwd"]):
            qq, kk, vv = (x.clone().requires_grad_(pass_ == "bwd") for x in (q, k, v))
            gqa = a.heads != a.kv_heads

            def fwd():
                return F.scaled_dot_product_attention(qq, kk, vv, is_causal=a.causal, enable_gqa=gqa)

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
            ms = sorted(times)[len(times) // 2]
            flops = 4.0 * a.batch * a.heads * n * n * a.head_dim * (0.5 if a.causal else 1.0)
            flops *= 2.5 if pass_ == "bwd" else 1.0
            rows.append(f'"{dev}",torch,sdpa,{pass_},fp32,{a.batch},{a.heads},{a.kv_heads},{n},{n},{a.head_dim},'
                        f'{int(a.causal)},0,{ms:.6g},{flops / ms / 1e9:.6g},0,0,0,-1')
            print(f"torch sdpa {pass_} N={n} d={a.head_dim} causal={int(a.causal)}: {ms:.4f} ms "
                  f"{flops / ms / 1e9:.2f} TFLOP/s")
    if a.csv:
        new = not os.path.exists(a.csv) or os.path.getsize(a.csv) == 0
        with open(a.csv, "a") as f:
            if new:
                f.write(HEADER + "\n")
            f.write("\n".join(rows) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check")
    c.add_argument("build")
    b = sub.add_parser("bench")
    b.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096])
    b.add_argument("--batch", type=int, default=1)
    b.add_argument("--heads", type=int, default=16)
    b.add_argument("--kv-heads", type=int, default=None)
    b.add_argument("--head-dim", type=int, default=64)
    b.add_argument("--causal", action="store_true")
    b.add_argument("--backward", action="store_true")
    b.add_argument("--iters", type=int, default=20)
    b.add_argument("--warmup", type=int, default=3)
    b.add_argument("--csv")
    a = ap.parse_args()
    if a.cmd == "check":
        sys.exit(0 if check(a.build) else 1)
    a.kv_heads = a.kv_heads or a.heads
    bench(a)


if __name__ == "__main__":
    main()
