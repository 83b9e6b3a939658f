"""The tutorial's kernels as PyTorch operators: chapter 05's forward and backward steps, called from a model.

    from flash_by_steps import attention
    o = attention(q, k, v, causal=True)          # q [B, H, Nq, d], k, v [B, Hkv, Nk, d]: SDPA's layout

fp16 or bf16 CUDA tensors, head_dim 64 or 128, Hkv dividing H (GQA), any lengths (Nk >= 1). The forward step is the
last one the GPU runs (v10_pingpong on an H100, v8_two_row_tiles on sm_80..sm_89), the backward the last backward
step the GPU runs (bwd_v14_dq_ordered on an H100: step 13's tile, whose deterministic mode adds dQ in a fixed
order inside the K/V kernel; bwd_v8_kv_frags elsewhere); both can be named
(step=..., backward_step=...), so a student can put any ladder step inside a model. Causal is bottom-right aligned,
as in the chapters and FlashAttention (key j is seen by query i when j <= i + Nk - Nq); with Nq == Nk that is SDPA's
is_causal. Non-contiguous inputs are made contiguous (a copy).

The operators are torch.library custom ops (flash_by_steps::forward, ::backward) with an autograd formula and fake
implementations, so autograd and torch.compile see them. The library is built by CMake with the chapters when
PyTorch is found (python/README.md); FLASH_BY_STEPS_LIB names it if it is not in <repository>/build/python/.
"""
import glob
import os

import torch

__all__ = ["attention", "attention_with_lse", "steps", "library_path"]

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.dirname(os.path.dirname(_HERE))
_NAME = "libflash_by_steps_ops.so"


def library_path():
    """Where the operators' library is: $FLASH_BY_STEPS_LIB, else <repository>/build/python/."""
    path = os.environ.get("FLASH_BY_STEPS_LIB") or os.path.join(_REPO, "build", "python", _NAME)
    if not os.path.isfile(path):
        others = sorted(glob.glob(os.path.join(_REPO, "build*", "python", _NAME)))
        hint = f" (found {', '.join(others)}: set FLASH_BY_STEPS_LIB to one)" if others else ""
        raise ImportError(f"flash_by_steps: {path} not found{hint}. Build it with the chapters where PyTorch is "
                          "installed: cmake -S . -B build -G Ninja && cmake --build build --target flash_by_steps_ops")
    return path


torch.ops.load_library(library_path())
_ops = torch.ops.flash_by_steps


def steps():
    """Every step the library has: a list of (pass, name, arch, idea), pass "forward" or "backward"."""
    return [tuple(line.split("\t")) for line in _ops.list_steps().splitlines()]


def _runs_here(arch, device):
    major, minor = torch.cuda.get_device_capability(device)
    return arch == "any" or (arch == "sm_80+" and major >= 8) or (arch == "sm_90a" and (major, minor) == (9, 0))


def _check_step(name, which, device):
    if name is None:
        return ""
    known = [(n, a) for p, n, a, _ in steps() if p == which]
    for n, a in known:
        if n == name:
            if not _runs_here(a, device):
                raise ValueError(f"{which} step {name!r} needs {a}; {torch.cuda.get_device_name(device)} is "
                                 f"sm_{''.join(map(str, torch.cuda.get_device_capability(device)))}")
            return name
    raise ValueError(f"no {which} step {name!r}; the {which} steps: {', '.join(n for n, _ in known)}")


def _checked(q, k, v, causal, scale, dropout_p, step, backward_step):
    """The arguments as the operators take them, or a ValueError/TypeError naming what is wrong (before any launch)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.device.type != "cuda":
            raise ValueError(f"{name} is on {t.device}; the kernels run on a CUDA device")
        if t.dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"{name} is {t.dtype}; the kernels take torch.float16 or torch.bfloat16")
        if t.dim() != 4:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected 4-D [batch, heads, length, head_dim]")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on {q.device}, {k.device}, {v.device}: they must share one device")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v are {q.dtype}, {k.dtype}, {v.dtype}: they must share one dtype")
    B, H, Nq, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    if k.shape[0] != B or k.shape[3] != d:
        raise ValueError(f"k {tuple(k.shape)} does not match q {tuple(q.shape)} (batch and head_dim must agree)")
    Hkv, Nk = k.shape[1], k.shape[2]
    if d not in (64, 128):
        raise ValueError(f"head_dim {d} is not supported (supported: 64, 128)")
    if Hkv == 0 or H % Hkv:
        raise ValueError(f"{Hkv} key/value heads do not divide {H} query heads (GQA needs Hkv | H)")
    if B == 0 or H == 0 or Nq == 0 or Nk == 0:
        raise ValueError(f"empty problem: q {tuple(q.shape)}, k {tuple(k.shape)} (every size must be >= 1)")
    if dropout_p:
        raise ValueError(f"dropout_p={dropout_p}: the tensor-core steps have no dropout (chapter 05 says why)")
    if scale is None:
        scale = 0.0  # the kernels' 1/sqrt(head_dim)
    elif not (isinstance(scale, (int, float)) and scale == scale and abs(scale) != float("inf") and scale != 0):
        raise ValueError(f"scale={scale!r}: a finite non-zero number, or None for 1/sqrt(head_dim)")
    step = _check_step(step, "forward", q.device)
    backward_step = _check_step(backward_step, "backward", q.device)
    return q.contiguous(), k.contiguous(), v.contiguous(), bool(causal), float(scale), step, backward_step


def attention_with_lse(q, k, v, causal=False, scale=None, *, dropout_p=0.0, step=None, backward_step=None,
                       deterministic=False):
    """(O, LSE): O [B, H, Nq, d] in q's dtype, LSE [B, H, Nq] fp32 (natural log; -inf for a row that sees no key).
    LSE is not differentiable (its gradient is not computed). deterministic: a bit-reproducible dQ instead of
    atomics (a second dQ kernel, or, with bwd_v14_dq_ordered, the K/V blocks adding dQ in a fixed order)."""
    args = _checked(q, k, v, causal, scale, dropout_p, step, backward_step)
    return _ops.forward(*args, bool(deterministic))


def attention(q, k, v, causal=False, scale=None, *, dropout_p=0.0, step=None, backward_step=None,
              deterministic=False):
    """softmax(scale q k^T [+ causal mask]) v, as torch.nn.functional.scaled_dot_product_attention computes it."""
    return attention_with_lse(q, k, v, causal, scale, dropout_p=dropout_p, step=step, backward_step=backward_step,
                              deterministic=deterministic)[0]


@torch.library.register_fake("flash_by_steps::forward")
def _forward_fake(q, k, v, causal, scale, step, bwd_step, deterministic):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.register_fake("flash_by_steps::backward")
def _backward_fake(dout, q, k, v, o, lse, causal, scale, step, deterministic):
    f32 = torch.float32
    return q.new_empty(q.shape, dtype=f32), k.new_empty(k.shape, dtype=f32), v.new_empty(v.shape, dtype=f32)


def _setup_context(ctx, inputs, output):
    q, k, v, causal, scale, _, bwd_step, deterministic = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale, ctx.bwd_step, ctx.deterministic = causal, scale, bwd_step, deterministic
    ctx.mark_non_differentiable(lse)


def _backward(ctx, do, _dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = _ops.backward(do.contiguous(), q, k, v, o, lse, ctx.causal, ctx.scale, ctx.bwd_step,
                               ctx.deterministic)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None


torch.library.register_autograd("flash_by_steps::forward", _backward, setup_context=_setup_context)
