"""Triton add_rmsnorm (the exact RMSNorm kernel with ``RESIDUAL``) against the op's reference.

On CPU the kernel runs under TRITON_INTERPRET=1, whose fp32->bf16 cast truncates. What the CPU checks
exactly: the stored sum is eager's ``x + update`` (fp32, and fp16 whose cast numpy rounds to nearest),
and the normalized output is, bit for bit, the plain kernel's on that stored sum in every dtype (the
fusion changes which rows are normalized, never how). The GPU tests compare both outputs with CUDA
eager bit for bit on the DiffVAE's shapes.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import xbackend_cuda.launch as nvidia
import xbackend_rocm.launch as amd

from xbackend.kernels import rmsnorm as K
from xbackend.ops.add_rmsnorm import reference

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
NUM, TRAITS = (amd.NUMERICS, amd.LAUNCH) if torch.version.hip else (nvidia.NUMERICS, nvidia.LAUNCH)
EPS = 1e-6


def _rand(shape, dtype, seed, scale=1.0, offset=0.0, device=DEV):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (offset + scale * torch.randn(shape, generator=g)).to(device=device, dtype=dtype)


def _operands(shape, dtype, seed, modulate, mod_shape=None):
    d = shape[-1]
    x, u = _rand(shape, dtype, seed), _rand(shape, dtype, seed + 1)
    w = _rand(d, dtype, seed + 2, scale=0.5, offset=1.0)
    if not modulate:
        return x, u, w, None, None
    mod_shape = mod_shape or (*([1] * (len(shape) - 1)), d)
    return x, u, w, _rand(mod_shape, dtype, seed + 3, scale=0.3), _rand(mod_shape, dtype, seed + 4)


def _plain(h, w, scale, shift, flavour):
    if scale is None:
        return K.rmsnorm(h, w, EPS, flavour, numerics=NUM, traits=TRAITS)
    return K.rmsnorm_modulate(h, scale, shift, w, EPS, flavour, numerics=NUM, traits=TRAITS)


SHAPES = [(3, 64), (2, 5, 256), (2, 3, 1000), (1, 2, 3, 4, 512), (2, 1024)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize("modulate", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_is_the_plain_kernel_on_the_stored_sum(shape, flavour, modulate, dtype):
    x, u, w, sc, sh = _operands(shape, dtype, seed=len(shape) + shape[-1], modulate=modulate)
    h, y = K.add_rmsnorm(x, u, w, EPS, flavour, sc, sh, numerics=NUM, traits=TRAITS)
    assert h.shape == y.shape == x.shape and h.is_contiguous() and y.is_contiguous()
    assert torch.equal(y, _plain(h, w, sc, sh, flavour))
    if dtype != torch.bfloat16 or HAS_CUDA:
        assert torch.equal(h, x + u)
    else:  # the interpreter truncates: h is x + u rounded toward zero, within one bf16 ulp of eager
        want = (x.float() + u.float()).to(torch.float64)
        assert bool(((h.double() - want).abs() <= (want.abs() * 2.0**-7)).all())


@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_strided_inputs_equal_contiguous(flavour):
    """Padded rows and a transposed update are read in place or copied; the bits do not change."""
    x, u, w, sc, sh = _operands((16, 256), torch.float32, seed=7, modulate=True)
    want = K.add_rmsnorm(x, u, w, EPS, flavour, sc, sh, numerics=NUM)
    padded = torch.zeros(16, 264, device=DEV)[:, :256]
    padded.copy_(x)
    ut = u.t().contiguous().t()
    got = K.add_rmsnorm(padded, ut, w, EPS, flavour, sc, sh, numerics=NUM)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


def test_a_misaligned_x_is_fine_a_misaligned_weight_falls_back():
    """aten vectorizes on the sum it allocates (always aligned), so x's offset does not matter; a
    torch-flavour weight off its 4-element alignment sends aten to its Welford kernel, which the
    registered impl leaves to the reference."""
    base = _rand((4 * 256 + 1,), torch.float32, seed=3)
    x = base[1:].view(4, 256)  # 4 bytes past an aligned start
    u = _rand((4, 256), torch.float32, seed=4)
    wbase = _rand((257,), torch.float32, seed=5)
    w_ok, w_off = wbase[:256].clone(), wbase[1:]
    with pytest.raises(K.NotVectorizable):  # x itself is off aten's alignment
        K.rmsnorm(x, w_ok, EPS, "torch", numerics=NUM)
    h, y = K.add_rmsnorm(x, u, w_ok, EPS, "torch", numerics=NUM)
    assert torch.equal(y, K.rmsnorm(h, w_ok, EPS, "torch", numerics=NUM))
    with pytest.raises(K.NotVectorizable):
        K.add_rmsnorm(x, u, w_off, EPS, "torch", numerics=NUM)
    seen = []

    def fallback(*args):
        seen.append(args)
        return reference(*args)

    fixed = K.add_rmsnorm_with(NUM, fallback, TRAITS)
    got = fixed(x, u, w_off, EPS, "torch", None, None)
    assert len(seen) == 1 and all(torch.equal(a, b) for a, b in zip(got, reference(x, u, w_off, EPS, "torch", None, None), strict=True))
    # the diffusers flavour reads the weight elementwise: no alignment condition
    assert K.supports_add_rmsnorm(x, u, w_off, EPS, "diffusers", None, None, numerics=NUM) is None


@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_empty_rows(flavour):
    x = torch.empty(0, 8, 64, device=DEV)
    h, y = K.add_rmsnorm(x, x, None, EPS, flavour, numerics=NUM)
    assert h.shape == y.shape == (0, 8, 64)


def test_supports_reasons():
    x = torch.zeros(2, 64, device=DEV)

    def why(*args, **kw):
        return K.supports_add_rmsnorm(*args, numerics=NUM, **kw)

    assert why(x, x, None, EPS, "torch", None, None) is None
    assert why(x, x[:1], None, EPS, "torch", None, None) == "update's shape differs from x"
    assert why(x, x.half(), None, EPS, "torch", None, None) == "update's dtype or device differs from x"
    assert "D % 4" in why(torch.zeros(2, 6, device=DEV), torch.zeros(2, 6, device=DEV), None, EPS, "torch", None, None)
    assert why(x, x, None, EPS, "torch", x[:1], None) == "scale and shift come together"
    assert why(x, x, None, EPS, "torch", torch.zeros(3, 64, device=DEV), x[:1]) == "scale does not broadcast to x"


def test_the_fast_kernel_takes_no_residual():
    x = torch.zeros(2, 64, device=DEV)
    with pytest.raises(ValueError, match="exact kernel only"):
        K.launch.launcher(K.launch.Variant(False, NUM))(x, None, None, None, EPS, "torch", None, x)


# -- GPU: bit for bit against CUDA eager ------------------------------------------------------------
# The DiffVAE's rows: stage-5 tile modulated (D = 256), stage 4 (D = 512), earlier stages (D = 1024).
GPU_CASES = [((1, 40, 96, 96, 256), True), ((1, 20, 48, 48, 512), False), ((1, 10, 24, 24, 1024), False),
             ((4, 1024, 4096), True), ((8192, 64), False), ((3, 4099, 1000), True)]  # fmt: skip


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("shape,modulate", GPU_CASES)
@pytest.mark.parametrize("flavour", K.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_gpu_add_rmsnorm_exact(shape, modulate, flavour, dtype):
    x, u, w, sc, sh = _operands(shape, dtype, seed=shape[-1], modulate=modulate)
    got = K.add_rmsnorm(x, u, w, EPS, flavour, sc, sh, numerics=NUM, traits=TRAITS)
    want = reference(x, u, w, EPS, flavour, sc, sh)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("flavour", K.FLAVOURS)
def test_gpu_misaligned_and_strided_inputs_exact(flavour):
    base = _rand((4096 * 512 + 1,), torch.bfloat16, seed=9)
    x = base[1:].view(4096, 512)  # 2 bytes past an aligned start: aten still vectorizes on the sum
    u = _rand((512, 4096), torch.bfloat16, seed=10).t()
    w = _rand(512, torch.bfloat16, seed=11, scale=0.5, offset=1.0)
    got = K.add_rmsnorm(x, u, w, EPS, flavour, numerics=NUM, traits=TRAITS)
    want = reference(x, u, w, EPS, flavour, None, None)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.gpu
@gpu
def test_gpu_specials_and_overflowing_sums_exact():
    dt = torch.bfloat16
    x = _rand((64, 256), dt, seed=12)
    x[0, :4] = torch.tensor([float("inf"), float("-inf"), float("nan"), 0.0])
    big = torch.full((64, 256), torch.finfo(dt).max * 0.75, dtype=dt, device=DEV)
    for a, b in ((x, _rand((64, 256), dt, seed=13)), (big, big), (big, -big)):
        got = K.add_rmsnorm(a, b, None, EPS, "torch", numerics=NUM, traits=TRAITS)
        want = reference(a, b, None, EPS, "torch", None, None)
        for g, t in zip(got, want, strict=True):
            assert torch.equal(g.nan_to_num(), t.nan_to_num()) and torch.equal(g.isnan(), t.isnan())
