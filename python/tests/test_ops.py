"""The PyTorch operators against PyTorch's own attention (pytest, or `python3 test_ops.py` without pytest).

Reference: F.scaled_dot_product_attention's math backend in fp32 on the same (rounded) inputs, and on every shape the
error rule of FlashAttention's tests: our error against that reference at most 2x the error of a plain attention in
the same dtype (the formula written out with PyTorch's operations: products in the dtype, softmax in fp32) plus a
small floor, for O and for each gradient. Shapes: ragged
lengths that are not tile multiples, Nq != Nk both ways, causal (bottom-right), GQA and MQA, batch > 1, a negative
scale, large logits; every forward and backward step the GPU runs; a directional-derivative check of the gradients;
torch.compile of a module that calls the operator; bad arguments refused before any launch.
Skipped (exit 77 standalone, pytest's skip otherwise) where torch, a CUDA GPU or the built library is absent.
"""
import math
import os
import sys

SKIP = 77


def _skip(why):
    if "pytest" in sys.modules:
        import pytest
        pytest.skip(why, allow_module_level=True)
    print(f"SKIPPED: {why}")
    sys.exit(SKIP)


try:
    import torch
    import torch.nn.functional as F
except ImportError:
    _skip("no PyTorch")
if not torch.cuda.is_available():
    _skip("no CUDA GPU visible to PyTorch")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
try:
    import flash_by_steps as fbs
except ImportError as e:
    _skip(str(e))

DEV = "cuda"
FLOOR = {torch.float16: 1e-3, torch.bfloat16: 8e-3}  # the chapters' lowp floors (common/lowp.hpp): a rounding of O


def bottom_right_mask(nq, nk):
    i = torch.arange(nq, device=DEV)[:, None]
    j = torch.arange(nk, device=DEV)[None, :]
    return j <= i + (nk - nq)


def attend(q, k, v, causal, scale):
    """The formula written out (GQA by repeating k, v): S = scale q k^T, the mask, softmax in fp32, P in q's dtype,
    O = P V. A row the causal mask leaves no key (Nq > Nk) gets O = 0, as the kernels define it."""
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (scale * (q @ k.transpose(-1, -2))).float()
    if causal:
        s = s.masked_fill(~bottom_right_mask(q.shape[2], k.shape[2]), float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    p = torch.exp(s - torch.where(torch.isinf(m), torch.zeros_like(m), m))
    l = p.sum(dim=-1, keepdim=True)
    return ((p / torch.where(l == 0, torch.ones_like(l), l)).to(q.dtype) @ v).to(q.dtype)


def reference(q, k, v, causal, scale):
    """The fp32 reference: F.scaled_dot_product_attention's math backend (SDPA gives NaN for a row that sees no key:
    there the written-out formula in fp32)."""
    if causal and q.shape[2] > k.shape[2]:
        return attend(q, k, v, causal, scale)
    from torch.nn.attention import SDPBackend, sdpa_kernel
    g = q.shape[1] // k.shape[1]
    mask = bottom_right_mask(q.shape[2], k.shape[2]) if causal else None
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q, k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1),
                                              attn_mask=mask, scale=scale)


def inputs(B, H, Hkv, nq, nk, d, dtype, seed, magnitude=1.0):
    g = torch.Generator(device=DEV).manual_seed(seed)
    def t(h, n):
        return (magnitude * torch.randn(B, h, n, d, device=DEV, generator=g)).to(dtype).requires_grad_()
    return t(H, nq), t(Hkv, nk), t(Hkv, nk), torch.randn(B, H, nq, d, device=DEV, generator=g).to(dtype)


def max_err(x, ref):
    return (x.float() - ref.float()).abs().max().item()


def check_case(B, H, Hkv, nq, nk, d, dtype, causal, scale=None, magnitude=1.0, step=None, backward_step=None,
               deterministic=False, seed=0):
    q, k, v, do = inputs(B, H, Hkv, nq, nk, d, dtype, seed, magnitude)
    s = scale if scale is not None else 1 / math.sqrt(d)
    # fp32 math reference and PyTorch's own same-dtype attention, forward and gradients
    q32, k32, v32 = (x.detach().float().requires_grad_() for x in (q, k, v))
    ref = reference(q32, k32, v32, causal, s)
    ref.backward(do.float())
    ql, kl, vl = (x.detach().clone().requires_grad_() for x in (q, k, v))
    plain = attend(ql, kl, vl, causal, s)
    plain.backward(do)
    o = fbs.attention(q, k, v, causal, scale, step=step, backward_step=backward_step, deterministic=deterministic)
    o.backward(do)
    what = (f"B {B} H {H}/{Hkv} Nq {nq} Nk {nk} d {d} {dtype} causal {causal} scale {s:.3g} x{magnitude} "
            f"{step or ''} {backward_step or ''}")
    for name, ours, theirs, r in (("O", o, plain, ref), ("dQ", q.grad, ql.grad, q32.grad),
                                  ("dK", k.grad, kl.grad, k32.grad), ("dV", v.grad, vl.grad, v32.grad)):
        assert ours.dtype == dtype and ours.shape == theirs.shape, f"{what}: {name} {ours.dtype} {tuple(ours.shape)}"
        e, e_plain = max_err(ours, r), max_err(theirs, r)
        scale_of = r.abs().max().item()
        bound = 2 * e_plain + FLOOR[dtype] * max(1.0, scale_of)
        assert e <= bound, f"{what}: {name} error {e:.3g} > bound {bound:.3g} (PyTorch {dtype}: {e_plain:.3g})"
    return q, k, v


def test_forward_and_gradients_every_shape():
    for dtype in (torch.float16, torch.bfloat16):
        for d in (64, 128):
            check_case(2, 4, 4, 97, 203, d, dtype, False)            # ragged, Nq < Nk
            check_case(2, 4, 2, 203, 97, d, dtype, True)             # causal with Nq > Nk: rows that see no key
            check_case(1, 8, 1, 113, 113, d, dtype, True)            # MQA, causal, square
            check_case(3, 2, 2, 1, 1023, d, dtype, False, scale=-0.2)  # one query, a negative scale
            check_case(1, 4, 2, 64, 64, d, dtype, False, magnitude=6.0)  # large logits


def test_every_step():
    for p, name, arch, _ in fbs.steps():
        if not fbs._runs_here(arch, torch.device(DEV)):
            continue
        if p == "forward":
            check_case(2, 4, 2, 97, 130, 64, torch.float16, True, step=name, seed=1)
        else:
            for det in (False, True):
                check_case(2, 4, 2, 97, 130, 128, torch.bfloat16, True, backward_step=name, deterministic=det, seed=2)


def test_deterministic_is_bit_reproducible():
    grads = []
    for _ in range(2):
        q, k, v, do = inputs(2, 8, 2, 300, 300, 64, torch.float16, 3)
        fbs.attention(q, k, v, True, deterministic=True).backward(do)
        grads.append((q.grad.clone(), k.grad.clone(), v.grad.clone()))
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_directional_derivative():
    """<dL/dx, u> for x = q, k, v against a central difference of L(x + eps u) = <O, do> computed in fp64: the
    autograd wiring (which gradient goes to which input), independently of the error rule's references."""
    q, k, v, do = inputs(1, 2, 2, 40, 70, 64, torch.float32, 4)
    q, k, v = (x.detach().to(torch.bfloat16).float() for x in (q, k, v))  # values exact in bf16
    for which in range(3):
        xs = [x.clone().to(torch.bfloat16).requires_grad_() for x in (q, k, v)]
        (fbs.attention(*xs).float() * do).sum().backward()
        u = torch.randn_like(q if which == 0 else k)
        eps = 0.05

        def loss(sign):
            ys = [x.clone() for x in (q, k, v)]
            ys[which] = ys[which] + sign * eps * u
            with torch.no_grad():
                return (reference(*[y.double() for y in ys], False, 1 / 8) * do.double()).sum().item()
        fd = (loss(1) - loss(-1)) / (2 * eps)
        an = (xs[which].grad.float() * u).sum().item()
        assert abs(fd - an) <= 0.03 * abs(fd) + 0.05, f"input {which}: autograd {an:.5g}, finite difference {fd:.5g}"


def test_torch_compile():
    class Block(torch.nn.Module):
        def forward(self, q, k, v):
            return fbs.attention(q, k, v, causal=True) * 2
    q, k, v, _ = inputs(2, 4, 2, 128, 128, 64, torch.float16, 5)
    eager = Block()(q, k, v)
    compiled = torch.compile(Block(), fullgraph=True)(q, k, v)
    assert torch.equal(eager, compiled)
    compiled.float().sum().backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_bad_arguments():
    q, k, v, _ = inputs(1, 4, 2, 16, 16, 64, torch.float16, 6)
    bad = [
        (lambda: fbs.attention(q.cpu(), k, v), "CUDA"),
        (lambda: fbs.attention(q.float(), k.float(), v.float()), "float16"),
        (lambda: fbs.attention(q, k.to(torch.bfloat16), v), "one dtype"),
        (lambda: fbs.attention(q[..., :32], k[..., :32], v[..., :32]), "head_dim 32"),
        (lambda: fbs.attention(q, k[:, :1].expand(1, 3, 16, 64), v[:, :1].expand(1, 3, 16, 64)), "divide"),
        (lambda: fbs.attention(q, k, v, dropout_p=0.1), "dropout"),
        (lambda: fbs.attention(q, k, v, scale=float("nan")), "scale"),
        (lambda: fbs.attention(q, k, v, step="v99"), "forward steps"),
        (lambda: fbs.attention(q[0], k[0], v[0]), "4-D"),
        (lambda: fbs.attention(q, k[:, :, :0], v[:, :, :0]), "empty"),
    ]
    for call, words in bad:
        try:
            call()
        except (ValueError, TypeError) as e:
            assert words in str(e), f"message {e!r} does not name {words!r}"
        else:
            raise AssertionError(f"accepted: {words}")
    # non-contiguous is made contiguous: the same answer as the contiguous call
    qt = q.detach().transpose(1, 2).contiguous().transpose(1, 2)
    assert not qt.is_contiguous()
    assert torch.equal(fbs.attention(qt, k, v), fbs.attention(q.detach(), k, v))


if __name__ == "__main__":
    tests = [(n, f) for n, f in sorted(globals().items()) if n.startswith("test_") and callable(f)]
    failed = 0
    for name, f in tests:
        try:
            f()
            print(f"PASSED {name}")
        except Exception as e:  # noqa: BLE001 - report every failure, then exit 1
            failed += 1
            print(f"FAILED {name}: {type(e).__name__}: {e}")
    print(f"{len(tests) - failed} of {len(tests)} passed on {torch.cuda.get_device_name()}")
    sys.exit(1 if failed else 0)
