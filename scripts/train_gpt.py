#!/usr/bin/env python3
"""Train a small GPT on a synthetic task three times from the same seed - attention by PyTorch's flash backend
(FlashAttention-2), by its cuDNN backend, and by this tutorial's kernels (python/flash_by_steps: chapter 05's last
forward and backward steps) - and write the loss curves and the speed of each. Needs PyTorch with CUDA and the built
operators (docs/pytorch.md). A few minutes on an H100.

The task (generated here, nothing downloaded): the first half of each sequence is a walk on a fixed random graph
(after each token comes one of 4 that it allows), the second half repeats the first. The loss falls from ln(vocab)
to ln(4) = 1.39 as the model learns the graph, and below, towards ln(4)/2 = 0.69, once it learns to copy (predictable
only by attending back half a sequence: an induction head must form).

  scripts/train_gpt.py [--steps N] [--backends flash,cudnn,ours] [--step S] [--csv FILE] ...   (--help: all)

Writes one row per backend and logged step (gpu, backend, step, loss, ms_per_step, tokens_per_step; ours with
--step/--backward-step is named "ours:STEP+BACKWARD_STEP") to --csv (default docs/results/<gpu>_train.csv;
docs/plot.py draws docs/figures/<g>_train_gpt.png from it) and prints a summary: the
final loss of each backend, its tokens per second, and the largest gap between each curve and flash's, next to the
gap between two flash runs (the run-to-run noise: FlashAttention-2's backward adds dQ with atomics).
Exit 0, 1 on a failure (or no GPU), 2 on bad usage.
"""
import argparse
import csv
import math
import os
import re
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", default="flash,flash_rerun,cudnn,ours",
                    help="comma-separated: flash, flash_rerun (flash again: the noise), cudnn, ours [%(default)s]")
    ap.add_argument("--steps", type=int, default=600, help="optimizer steps per backend [%(default)s]")
    ap.add_argument("--layers", type=int, default=6, help="transformer blocks [%(default)s]")
    ap.add_argument("--d-model", type=int, default=768, help="model width [%(default)s]")
    ap.add_argument("--heads", type=int, default=6, help="attention heads (head_dim = d_model / heads) [%(default)s]")
    ap.add_argument("--kv-heads", type=int, default=0, help="key/value heads (GQA; 0 = heads) [%(default)s]")
    ap.add_argument("--seq", type=int, default=2048, help="sequence length [%(default)s]")
    ap.add_argument("--batch", type=int, default=8, help="sequences per step [%(default)s]")
    ap.add_argument("--vocab", type=int, default=512, help="vocabulary size [%(default)s]")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="peak learning rate (AdamW, warm-up then cosine) [%(default)s]")
    ap.add_argument("--seed", type=int, default=0, help="seed of the model and of the data [%(default)s]")
    ap.add_argument("--log-every", type=int, default=5, help="steps between logged losses [%(default)s]")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16", help="autocast dtype [%(default)s]")
    ap.add_argument("--step", default=None, help="ours: the forward step (flash_by_steps.steps()) [the GPU's last]")
    ap.add_argument("--backward-step", default=None, help="ours: the backward step [the last]")
    ap.add_argument("--deterministic", action="store_true", help="ours: dQ by the second kernel, not atomics")
    ap.add_argument("--csv", default=None, help="where the rows go [docs/results/<gpu>_train.csv]")
    a = ap.parse_args()
    backends = a.backends.split(",")
    bad = [b for b in backends if b not in ("flash", "flash_rerun", "cudnn", "ours")]
    if bad or not backends:
        ap.error(f"--backends: unknown {', '.join(bad) or '(none)'}; choose from flash, flash_rerun, cudnn, ours")
    for name in ("steps", "layers", "d_model", "heads", "seq", "batch", "vocab", "log_every"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.d_model % a.heads or (a.d_model // a.heads) not in (64, 128):
        ap.error(f"--d-model / --heads = head_dim must be 64 or 128 (got {a.d_model} / {a.heads})")
    a.kv_heads = a.kv_heads or a.heads
    if a.heads % a.kv_heads:
        ap.error(f"--kv-heads {a.kv_heads} must divide --heads {a.heads}")
    if a.seq % 2:
        ap.error("--seq must be even (a half and its copy)")
    if (a.step or a.backward_step or a.deterministic) and "ours" not in backends:
        ap.error("--step, --backward-step and --deterministic choose our kernels: add ours to --backends")
    if not (a.lr > 0 and math.isfinite(a.lr)):
        ap.error("--lr must be a positive number")
    a.backends = backends
    return a


def main():
    a = parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        print("train_gpt.py: PyTorch is not installed (pip install torch); it is needed for this script only.",
              file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("train_gpt.py: no CUDA GPU visible to PyTorch: there is nothing to train on here.", file=sys.stderr)
        return 1
    fbs = None
    if "ours" in a.backends:
        sys.path.insert(0, os.path.join(REPO, "python"))
        try:
            import flash_by_steps as fbs
        except ImportError as e:
            print(f"train_gpt.py: {e}", file=sys.stderr)
            return 1
    dev = torch.device("cuda")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    gpu = torch.cuda.get_device_name(dev)
    slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    csv_path = a.csv or os.path.join(REPO, "docs", "results", f"{slug}_train.csv")
    hd = a.d_model // a.heads

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(a.d_model, (a.heads + 2 * a.kv_heads) * hd, bias=False)
            self.proj = nn.Linear(a.d_model, a.d_model, bias=False)
            self.backend = "flash"

        def forward(self, x):
            B, N, _ = x.shape
            q, k, v = self.qkv(x).split([a.heads * hd, a.kv_heads * hd, a.kv_heads * hd], dim=-1)
            # [B, N, H, d] -> SDPA's [B, H, N, d] (a strided view; both paths make it contiguous as they need)
            q = q.view(B, N, a.heads, hd).transpose(1, 2)
            k = k.view(B, N, a.kv_heads, hd).transpose(1, 2)
            v = v.view(B, N, a.kv_heads, hd).transpose(1, 2)
            if self.backend == "ours":
                o = fbs.attention(q, k, v, causal=True, step=a.step, backward_step=a.backward_step,
                                  deterministic=a.deterministic)
            else:
                which = SDPBackend.CUDNN_ATTENTION if self.backend == "cudnn" else SDPBackend.FLASH_ATTENTION
                with sdpa_kernel(which):
                    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=a.kv_heads != a.heads)
            return self.proj(o.transpose(1, 2).reshape(B, N, a.d_model))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(a.d_model), nn.LayerNorm(a.d_model)
            self.attn = Attention()
            self.mlp = nn.Sequential(nn.Linear(a.d_model, 4 * a.d_model), nn.GELU(),
                                     nn.Linear(4 * a.d_model, a.d_model))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(a.vocab, a.d_model)
            self.pos = nn.Embedding(a.seq, a.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(a.layers))
            self.ln = nn.LayerNorm(a.d_model)

        def forward(self, idx):
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
            for b in self.blocks:
                x = b(x)
            return self.ln(x) @ self.tok.weight.t()  # tied output embedding

    # The data, the same for every backend: a fixed graph (table[a] = the 4 tokens allowed after a), every step's
    # batch drawn from it once, then each first half repeated.
    g = torch.Generator(device=dev).manual_seed(a.seed)
    table = torch.randint(0, a.vocab, (a.vocab, 4), device=dev, generator=g)
    half = torch.empty(a.steps * a.batch, a.seq // 2, dtype=torch.long, device=dev)
    half[:, 0] = torch.randint(0, a.vocab, (half.shape[0],), device=dev, generator=g)
    for i in range(1, a.seq // 2):
        half[:, i] = table[half[:, i - 1], torch.randint(0, 4, (half.shape[0],), device=dev, generator=g)]
    data = torch.cat([half, half], dim=1).view(a.steps, a.batch, a.seq)

    def batch(step):
        return data[step]

    def lr_at(step):
        warm = max(1, a.steps // 10)
        if step < warm:
            return a.lr * (step + 1) / warm
        return a.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, a.steps - warm)))

    if fbs:  # a bad step name: said before any model is built
        try:
            fbs.attention(*(torch.zeros(1, a.heads if i == 0 else a.kv_heads, 16, hd, device=dev, dtype=dtype)
                            for i in range(3)), step=a.step, backward_step=a.backward_step)
        except ValueError as e:
            print(f"train_gpt.py: {e}", file=sys.stderr)
            return 2
    print(f"train_gpt.py on {gpu}: {a.layers} layers, d_model {a.d_model}, heads {a.heads}/{a.kv_heads} "
          f"(head_dim {hd}), seq {a.seq}, batch {a.batch}, {a.steps} steps, {a.dtype} autocast, seed {a.seed}")
    curves, speed = {}, {}
    rows = []
    for backend in a.backends:
        label = backend  # ours with chosen steps: named by them in the rows
        if backend == "ours" and (a.step or a.backward_step or a.deterministic):
            label = f"ours:{a.step or 'last'}+{a.backward_step or 'last'}{'+deterministic' if a.deterministic else ''}"
        torch.manual_seed(a.seed)
        model = GPT().to(dev)
        for m in model.modules():  # GPT-2's initialisation: small weights, so the first logits are near uniform
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        for m in model.modules():
            if isinstance(m, Attention):
                m.backend = "flash" if backend == "flash_rerun" else backend
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
        losses, times = [], []
        for step in range(a.steps):
            idx = batch(step)
            for grp in opt.param_groups:
                grp["lr"] = lr_at(step)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.autocast("cuda", dtype=dtype):
                logits = model(idx[:, :-1])
            loss = F.cross_entropy(logits.float().reshape(-1, a.vocab), idx[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            value = loss.item()
            if not math.isfinite(value):
                print(f"train_gpt.py: {backend}: loss {value} at step {step}", file=sys.stderr)
                return 1
            losses.append(value)
            if step % a.log_every == 0 or step == a.steps - 1:
                rows.append([gpu, label, step, f"{value:.5f}", f"{1e3 * times[-1]:.3f}", a.batch * (a.seq - 1)])
        timed = sorted(times[10:] or times)
        ms = 1e3 * timed[len(timed) // 2]
        curves[backend], speed[backend] = losses, a.batch * (a.seq - 1) / (ms / 1e3)
        print(f"  {label:12s} final loss {sum(losses[-20:]) / len(losses[-20:]):.4f} (mean of the last 20 steps), "
              f"{ms:.1f} ms/step median, {speed[backend] / 1e3:.0f}k tokens/s")
        del model, opt
        torch.cuda.empty_cache()

    os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
    with open(csv_path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["gpu", "backend", "step", "loss", "ms_per_step", "tokens_per_step"])
        w.writerows(rows)
    print(f"wrote {csv_path}")
    if "flash" in curves:
        ref = curves["flash"]
        for backend, losses in curves.items():
            if backend == "flash":
                continue
            gap = max(abs(x - y) for x, y in zip(losses, ref))
            late = max(abs(x - y) for x, y in zip(losses[-50:], ref[-50:]))
            print(f"  {backend:12s} vs flash: largest loss gap {gap:.4f} over every step, {late:.4f} over the last "
                  f"50; tokens/s {speed[backend] / speed['flash']:.2f}x flash's")
    return 0


if __name__ == "__main__":
    sys.exit(main())
