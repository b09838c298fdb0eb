"""Triton LayerNorm (+ adaLN modulate, + residual add) kernels against aten's order and the op references.

On CPU the kernels run under TRITON_INTERPRET=1. What the CPU checks exactly: the per-row mean and
rstd equal, bit for bit, a loop-by-loop numpy transliteration of aten's ``vectorized_layer_norm_kernel``
(per-thread Welford updates, shuffle-down tree, warp tree, with nvcc's FMA points), and the fp32 and
fp16 outputs equal the transliteration's (numpy and the interpreter both round fp32->fp16 to nearest).
The interpreter truncates fp32->bf16, so bf16 outputs are compared within a tolerance here and bit for
bit against CUDA eager by the gpu-marked tests:

    python -m pytest -q -m gpu tests/kernels/test_triton_layernorm.py
"""

from __future__ import annotations

import inspect
import os
from fractions import Fraction

import numpy as np
import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

import triton.language as tl
import xbackend_cuda.launch as nvidia
import xbackend_rocm.launch as amd

from xbackend.kernels import layernorm as LN
from xbackend.ops import add_layernorm as add_op
from xbackend.ops import layernorm_modulate as ln_op

HAS_CUDA = torch.cuda.is_available()
DEV = "cuda" if HAS_CUDA else "cpu"
gpu = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
EPS = 1e-6
f32 = np.float32
NUM = amd.LN_NUMERICS if torch.version.hip else nvidia.LN_NUMERICS
NP_DTYPE = {torch.float16: np.float16, torch.float32: np.float32}


def _rand(shape, dtype, seed, scale=1.0, offset=0.0, device=DEV):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (offset + scale * torch.randn(shape, generator=g)).to(device=device, dtype=dtype)


# --------------------------------------------------------------------------------------------------
# aten's order, transliterated (numpy fp32)
# --------------------------------------------------------------------------------------------------


def _fma32(a, b, c) -> np.ndarray:
    """fp32 fma(a, b, c), rounded once: the product is exact in float64; the float64 sum's rounding error
    (TwoSum) decides the one case where rounding that sum to fp32 again goes wrong, a sum that lands
    exactly halfway between two fp32 values."""
    a, b, c = np.broadcast_arrays(*(np.asarray(v, dtype=f32) for v in (a, b, c)))
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    with np.errstate(all="ignore"):
        s = p + c64
        bv = s - p
        err = (p - (s - bv)) + (c64 - bv)
        r = s.astype(f32)
        r64 = r.astype(np.float64)
        other = np.nextafter(r, np.where(s > r64, f32(np.inf), f32(-np.inf)).astype(f32))
        tie = (s != r64) & (s == (r64 + other.astype(np.float64)) / 2) & (err != 0)
        toward_other = (err > 0) == (other.astype(np.float64) > r64)
    return np.where(tie & toward_other, other, r).astype(f32)


def _rcp(c: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return (f32(1) / np.asarray(c, f32)).astype(f32)  # rcp.rn.f32: the correctly rounded reciprocal


def _combine(own, other, fuse_own=False):
    """cuWelfordCombine(dataB=own, dataA=other) as nvcc compiles it (``fuse_own``: the other product fused)."""
    (om, o2, oc), (am, a2, ac) = own, other
    delta = (om - am).astype(f32)
    count = (ac + oc).astype(f32)
    coef = _rcp(count)
    with np.errstate(invalid="ignore"):
        n_a = (ac * coef).astype(f32)
        n_b = (oc * coef).astype(f32)
    if fuse_own:
        mean = _fma32(n_b, om, (n_a * am).astype(f32))
    else:
        mean = _fma32(n_a, am, (n_b * om).astype(f32))
    m2 = _fma32(((delta * delta).astype(f32) * ac).astype(f32), n_b, (a2 + o2).astype(f32))
    pos = count > 0
    return np.where(pos, mean, f32(0)), np.where(pos, m2, f32(0)), count


def _emulate_stats(x: np.ndarray, eps: float, threads: int, warp: int, fuse_own: bool = False,
                   fused_online: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """layer_norm_kernel.cu compute_stats + rsqrt for every row of fp32 x: (mean, rstd). The keyword
    variants are other orders (for the test that shows the comparison can fail)."""
    with np.errstate(all="ignore"):  # rows with NaN and Inf compute NaN, as on the GPU
        return _emulate_stats_rows(x, eps, threads, warp, fuse_own, fused_online)


def _emulate_stats_rows(x, eps, threads, warp, fuse_own, fused_online):
    m, d = x.shape
    nvec = d // 4
    mean, m2 = np.zeros((m, threads), f32), np.zeros((m, threads), f32)
    t = np.arange(threads)
    for k in range(-(-nvec // threads)):  # thread t: vectors t, t + threads, .. (vectorized over t)
        vec = k * threads + t
        live = vec < nvec
        for ii in range(4):  # cuWelfordOnlineSum over the vector's 4 elements; count = j + 1
            j = 4 * k + ii
            v = x[:, np.minimum(vec, nvec - 1) * 4 + ii]
            delta = (v - mean).astype(f32)
            rc = _rcp(f32(j + 1))
            if fused_online:
                new_mean = _fma32(delta, rc, mean)
                new_m2 = _fma32(delta, (v - new_mean).astype(f32), m2)
            else:
                new_mean = (mean + (delta * rc).astype(f32)).astype(f32)
                new_m2 = (m2 + (delta * (v - new_mean).astype(f32)).astype(f32)).astype(f32)
            mean, m2 = np.where(live, new_mean, mean), np.where(live, new_m2, m2)
    count = np.broadcast_to(4 * (np.maximum(nvec - t + threads - 1, 0) // threads), (m, threads)).astype(f32)
    state = [a.reshape(m, threads // warp, warp) for a in (mean, m2, count)]
    off = warp // 2
    while off:  # WARP_SHFL_DOWN offsets warp/2 .. 1: lane l < off merges lane l + off into itself
        own, oth = [a[:, :, :off] for a in state], [a[:, :, off : 2 * off] for a in state]
        state = [a.copy() for a in state]
        for a, new in zip(state, _combine(own, oth, fuse_own), strict=True):
            a[:, :, :off] = new
        off //= 2
    state = [a[:, :, 0] for a in state]
    off = state[0].shape[1] // 2
    while off:  # the upper half of the warps writes to shared memory, the lower half merges
        own, oth = [a[:, :off] for a in state], [a[:, off : 2 * off] for a in state]
        state = [a.copy() for a in state]
        for a, new in zip(state, _combine(own, oth, fuse_own), strict=True):
            a[:, :off] = new
        off //= 2
    mean, m2 = state[0][:, 0], state[1][:, 0]
    var = (m2 / f32(d)).astype(f32)
    rstd = (f32(1) / np.sqrt((var + f32(eps)).astype(f32))).astype(f32)  # the interpreter's rsqrt
    return mean, rstd


def _emulate_affine(x, mean, rstd, w, b) -> np.ndarray:
    """The output expression before its rounding to T: fma(w, rstd * (x - mean), b) and its variants."""
    with np.errstate(all="ignore"):
        d = (x - mean[:, None]).astype(f32)
        n = (rstd[:, None] * d).astype(f32)
        if w is not None and b is not None:
            return _fma32(w[None], n, b[None])
        if w is not None:
            return (w[None] * n).astype(f32)
        if b is not None:
            return _fma32(rstd[:, None], d, b[None])
        return n


def _np(t: torch.Tensor | None, dtype=f32) -> np.ndarray | None:
    return None if t is None else t.detach().cpu().float().numpy().astype(dtype)


def _model(x, scale, shift, w, b, eps, flavour, index, num, stats=None) -> np.ndarray:
    """The op on an fp16/fp32 x as the aten CUDA kernels compute it, every rounding spelled out."""
    d, dt = x.shape[-1], NP_DTYPE[x.dtype]
    xs = _np(x.reshape(-1, d))
    mean, rstd = stats if stats is not None else _emulate_stats(xs, eps, num.threads, num.warp)
    with np.errstate(all="ignore"):
        y = _emulate_affine(xs, mean, rstd, _np(w), _np(b))
        if flavour == "torch":
            y = y.astype(dt)
        if scale is not None:
            sc = _np(ln_op.select(scale, index).expand(x.shape).reshape(-1, d), scale.numpy().dtype)
            sh = _np(ln_op.select(shift, index).expand(x.shape).reshape(-1, d), shift.numpy().dtype)
            if flavour == "torch":
                one = (sc.astype(f32) + f32(1)).astype(dt)
                y = (y.astype(f32) * one.astype(f32)).astype(dt)
                y = (y.astype(f32) + sh.astype(f32)).astype(dt)
            else:
                y = ((y * (sc + f32(1))).astype(f32) + sh).astype(f32)
    return y.astype(dt).reshape(x.shape)


def test_fma32_rounds_once():
    """The helper against exact rational arithmetic, including a sum float64 rounds onto an fp32 midpoint."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(f32)
    b = (rng.standard_normal(3000) * 2.0 ** rng.integers(-30, 30, 3000)).astype(f32)
    c = (rng.standard_normal(3000) * 2.0 ** rng.integers(-60, 60, 3000)).astype(f32)
    a = np.append(a, f32((1 + 2**-20) * 2**-12))
    b = np.append(b, f32((1 - 2**-20) * 2**-12))
    c = np.append(c, f32(1 + 2**-23))  # exact: 1 + 2**-23 + 2**-24 - 2**-64, just below a midpoint
    got = _fma32(a, b, c)

    def exact(ai, bi, ci):
        v = Fraction(float(ai)) * Fraction(float(bi)) + Fraction(float(ci))
        r = f32(float(v))
        other = np.nextafter(r, f32(np.inf) if Fraction(float(r)) < v else f32(-np.inf))
        dr, do = abs(Fraction(float(r)) - v), abs(Fraction(float(other)) - v)
        if do < dr or (do == dr and int(other.view(np.uint32)) % 2 == 0):
            return other
        return r

    want = np.array([exact(*t) for t in zip(a, b, c, strict=True)], f32)
    np.testing.assert_array_equal(got, want)
    assert got[-1] == f32(1 + 2**-23) and f32(np.float64(a[-1]) * np.float64(b[-1]) + np.float64(c[-1])) != got[-1]


# --------------------------------------------------------------------------------------------------
# Statistics: bit for bit the transliteration (CPU)
# --------------------------------------------------------------------------------------------------

STAT_CASES = [
    ((4, 64), NUM),  # 16 vectors: 112 threads read nothing and still combine
    ((3, 1000), NUM),
    ((2, 3072), NUM),  # Qwen-Image
    ((2, 5120), NUM),  # Wan
    ((2, 6144), NUM),  # Flux.2
    ((2, 8192), NUM),
    ((3, 1000), NUM._replace(threads=256)),
    ((2, 3072), LN.ROCM_LN_NUMERICS),  # 1024 threads, wave64 (the interpreter's reciprocal is IEEE)
]


@pytest.mark.parametrize("shape,num", STAT_CASES, ids=str)
def test_statistics_match_the_aten_transliteration(shape, num):
    if HAS_CUDA:
        pytest.skip("rstd is rsqrt.approx on a GPU: the gpu tests compare with aten's own statistics")
    x = _rand(shape, torch.bfloat16, seed=shape[1], scale=1.5, offset=3.0, device="cpu")
    _, mean, rstd = LN.layernorm_stats(x, None, None, EPS, "torch", numerics=num)
    want_mean, want_rstd = _emulate_stats(x.float().numpy(), EPS, num.threads, num.warp)
    np.testing.assert_array_equal(mean.numpy(), want_mean)
    np.testing.assert_array_equal(rstd.numpy(), want_rstd)


def test_statistics_close_to_torch_on_cpu():
    """Another order (CPU's), the same statistics to a few fp32 ulps."""
    x = _rand((64, 3072), torch.float32, seed=5, scale=2.0, offset=-1.0)
    _, mean, rstd = LN.layernorm_stats(x, None, None, EPS, "torch", numerics=NUM)
    _, cpu_mean, cpu_rstd = torch.native_layer_norm(x.cpu(), (3072,), None, None, EPS)
    torch.testing.assert_close(mean.cpu(), cpu_mean.view(-1), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(rstd.cpu(), cpu_rstd.view(-1), rtol=1e-5, atol=0)


def test_transliteration_tells_orders_apart():
    """The checks above can fail: each nearby order gives other bits on the same rows."""
    x = _rand((400, 1000), torch.bfloat16, seed=9, offset=5.0, device="cpu").float().numpy()
    ref = _emulate_stats(x, EPS, 128, 32)
    for variant in ({"fuse_own": True}, {"fused_online": False}):  # the other product fused; no FMA at all
        other = _emulate_stats(x, EPS, 128, 32, **variant)
        assert (ref[0] != other[0]).any() or (ref[1] != other[1]).any(), variant
    assert (ref[0] != _emulate_stats(x, EPS, 256, 32)[0]).any()
    # Threads that read nothing: 41 vectors in one wave64 make a count of 164, and 164 * (1/164) rounds to
    # 1 - 2**-24, so merging the empty waves scales every mean (the tile keeps every thread for that).
    x = x[:, :164]
    assert (_emulate_stats(x, EPS, 1024, 64)[0] != _emulate_stats(x, EPS, 64, 64)[0]).all()


# --------------------------------------------------------------------------------------------------
# Outputs: bit for bit the transliteration in fp32 and fp16 (CPU), close to the reference in bf16
# --------------------------------------------------------------------------------------------------


def _mod(shape, dtype, seed, index=False):
    if index:
        return _rand((2, shape[0], shape[-1]), dtype, seed, 0.3), _rand((2, shape[0], shape[-1]), dtype, seed + 1)
    mod = (shape[0], *[1] * (len(shape) - 2), shape[-1])
    return _rand(mod, dtype, seed, 0.3), _rand(mod, dtype, seed + 1)


OUT_CASES = [
    # (x shape, weight, bias, modulate, index)
    ((2, 5, 64), False, False, False, False),
    ((2, 5, 64), True, True, False, False),
    ((2, 5, 64), True, False, True, False),
    ((2, 5, 64), False, True, True, False),
    ((2, 3, 1000), True, True, True, False),
    ((1, 3, 3072), False, False, True, False),
    ((2, 4, 256), False, False, True, True),
]


@pytest.mark.parametrize("case", OUT_CASES, ids=str)
@pytest.mark.parametrize("flavour", LN.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_outputs_match_the_transliteration(case, flavour, dtype):
    if HAS_CUDA:
        pytest.skip("the gpu tests compare with CUDA eager")
    shape, has_w, has_b, modulate, index = case
    x = _rand(shape, dtype, seed=shape[-1], scale=1.5, offset=0.5)
    wdt = dtype if flavour == "torch" else torch.float32
    w = _rand(shape[-1], wdt, seed=2, scale=0.5, offset=1.0) if has_w else None
    b = _rand(shape[-1], wdt, seed=3, scale=0.2) if has_b else None
    mdt = dtype if flavour == "torch" else torch.float32
    sc, sh = _mod(shape, mdt, seed=4, index=index) if modulate else (None, None)
    idx = (torch.arange(shape[0] * shape[1]).reshape(shape[:2]) % 3 == 0).int() if index else None
    assert LN.supports_layernorm_modulate(x, sc, sh, w, b, EPS, flavour, idx, numerics=NUM) is None
    out = LN.layernorm_modulate(x, sc, sh, w, b, EPS, flavour, idx, numerics=NUM)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    np.testing.assert_array_equal(out.numpy(), _model(x, sc, sh, w, b, EPS, flavour, idx, NUM))


@pytest.mark.parametrize("flavour", LN.FLAVOURS)
@pytest.mark.parametrize("shape", [(2, 5, 64), (1, 3, 5120)])
def test_bf16_close_to_the_reference(flavour, shape):
    x = _rand(shape, torch.bfloat16, seed=7)
    wdt = torch.bfloat16 if flavour == "torch" else torch.float32
    w, b = _rand(shape[-1], wdt, seed=8, scale=0.5, offset=1.0), _rand(shape[-1], wdt, seed=9, scale=0.2)
    sc, sh = _mod(shape, wdt, seed=10)
    out = LN.layernorm_modulate(x, sc, sh, w, b, EPS, flavour, None, numerics=NUM)
    ref = ln_op.reference(x, sc, sh, w, b, EPS, flavour, None)
    # the interpreter truncates each bf16 rounding (up to four in a row in the torch flavour)
    scale = ref.double().abs() + (F.layer_norm(x.float(), shape[-1:], w.float(), b.float(), EPS) * (1 + sc)).abs()
    assert bool(((out.double() - ref.double()).abs() <= 2**-5 * scale + 1e-6).all())


def test_index_selects_per_token_tables():
    """A per-token index reads table 0 where it is 0 and table 1 elsewhere: bit for bit the kernel on the
    tables gathered beforehand (bool and integer indices alike)."""
    x = _rand((2, 6, 128), torch.float16, seed=11)
    sc, sh = _mod(x.shape, torch.float16, seed=12, index=True)
    index = torch.tensor([[0, 1, 1, 0, 2, 0], [1, 0, 0, 0, 1, 1]], device=DEV)
    want = LN.layernorm_modulate(x, ln_op.select(sc, index), ln_op.select(sh, index), None, None, EPS, "torch",
                                 None, numerics=NUM)  # fmt: skip
    for idx in (index, index.bool(), index.to(torch.int8), index.int()):
        assert torch.equal(LN.layernorm_modulate(x, sc, sh, None, None, EPS, "torch", idx, numerics=NUM), want)


@pytest.mark.parametrize("flavour", LN.FLAVOURS)
def test_strided_inputs_equal_contiguous(flavour):
    """Padded and transposed rows, strided [B,1,D] chunks of one modulation table: read in place or
    copied, the bits never change."""
    mdt = torch.float16 if flavour == "torch" else torch.float32
    base = _rand((4, 6, 72), torch.float16, seed=13)
    table = _rand((4, 1, 3 * 64), mdt, seed=14)
    shift, scale, _ = table.chunk(3, dim=-1)
    for x in (base[:, :, :64], base[:, :, 8:72].transpose(0, 1).contiguous().transpose(0, 1)):
        assert not x.is_contiguous()
        got = LN.layernorm_modulate(x, scale, shift, None, None, EPS, flavour, None, numerics=NUM)
        want = LN.layernorm_modulate(x.contiguous(), scale.contiguous(), shift.contiguous(), None, None, EPS,
                                     flavour, None, numerics=NUM)  # fmt: skip
        assert torch.equal(got, want)


def test_empty_rows():
    x = torch.empty(0, 3, 64, dtype=torch.bfloat16, device=DEV)
    s = torch.zeros(1, 1, 64, dtype=torch.bfloat16, device=DEV)
    out = LN.layernorm_modulate(x, s, s, None, None, EPS, "torch", None, numerics=NUM)
    h, y = LN.add_layernorm(x, x, None, None, None, EPS, "torch", s, s, None, numerics=NUM)
    assert out.shape == h.shape == y.shape == x.shape


# --------------------------------------------------------------------------------------------------
# add_layernorm: the stored residual is eager's, the norm is the plain kernel's on it
# --------------------------------------------------------------------------------------------------

ADD_CASES = [
    # (x shape, gate shape or None, gate float32)
    ((2, 5, 64), None, False),
    ((2, 5, 64), (2, 1, 64), False),
    ((2, 5, 64), (2, 1, 64), True),  # Wan: a half residual gated in float32
    ((2, 3, 1000), (1000,), True),
    ((2, 4, 256), (2, 4, 1), False),  # per-token gate
]


@pytest.mark.parametrize("case", ADD_CASES, ids=str)
@pytest.mark.parametrize("flavour", LN.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_add_layernorm_is_the_plain_kernel_on_the_stored_residual(case, flavour, dtype):
    shape, gate_shape, gate32 = case
    if gate32 and dtype == torch.float32:
        pytest.skip("a float32 gate under a float32 x is the plain gate")
    x, u = _rand(shape, dtype, seed=21), _rand(shape, dtype, seed=22)
    gate = _rand(gate_shape, torch.float32 if gate32 else dtype, seed=23) if gate_shape else None
    wdt = dtype if flavour == "torch" else torch.float32
    w, b = _rand(shape[-1], wdt, seed=24, scale=0.5, offset=1.0), _rand(shape[-1], wdt, seed=25, scale=0.2)
    sc, sh = _mod(shape, wdt, seed=26)
    args = (x, u, gate, w, b, EPS, flavour, sc, sh, None)
    assert LN.supports_add_layernorm(*args, numerics=NUM) is None
    h, y = LN.add_layernorm(*args, numerics=NUM)
    assert h.is_contiguous() and y.is_contiguous() and h.dtype == y.dtype == dtype
    assert torch.equal(y, LN.layernorm_modulate(h, sc, sh, w, b, EPS, flavour, None, numerics=NUM))
    want = add_op.residual(x, u, gate, None)
    if dtype != torch.bfloat16 or HAS_CUDA:
        assert torch.equal(h, want)
    else:  # the interpreter truncates: within two bf16 roundings of eager
        assert bool(((h.double() - want.double()).abs() <= 2**-6 * (want.double().abs() + 1)).all())


def test_add_layernorm_index_selects_gate_scale_and_shift():
    x, u = _rand((2, 6, 128), torch.float16, seed=31), _rand((2, 6, 128), torch.float16, seed=32)
    gate = _rand((2, 2, 128), torch.float16, seed=33)
    sc, sh = _mod(x.shape, torch.float16, seed=34, index=True)
    index = torch.tensor([[0, 1, 1, 0, 0, 1], [1, 1, 0, 0, 1, 0]], device=DEV)
    h, y = LN.add_layernorm(x, u, gate, None, None, EPS, "torch", sc, sh, index, numerics=NUM)
    wh, wy = LN.add_layernorm(x, u, ln_op.select(gate, index), None, None, EPS, "torch", ln_op.select(sc, index),
                              ln_op.select(sh, index), None, numerics=NUM)  # fmt: skip
    assert torch.equal(h, wh) and torch.equal(y, wy) and torch.equal(h, add_op.residual(x, u, gate, index))


# --------------------------------------------------------------------------------------------------
# What the kernels take: supports reasons, per-call alignment
# --------------------------------------------------------------------------------------------------


def test_supports_reasons():
    x = _rand((4, 64), torch.bfloat16, seed=41)
    w = _rand(64, torch.bfloat16, seed=42)

    def ln(x, w=None, b=None, flavour="torch", scale=None, shift=None, index=None, **kw):
        return LN.supports_layernorm_modulate(x, scale, shift, w, b, EPS, flavour, index, numerics=NUM, **kw)

    assert ln(x, w, w) is None
    assert "D % 4" in ln(_rand((4, 66), torch.bfloat16, seed=1))
    assert f"D > {LN.MAX_EXACT_D}" in ln(_rand((1, LN.MAX_EXACT_D + 4), torch.bfloat16, seed=1))
    assert "dtype" in ln(x.double())
    assert "flavour" in ln(x, flavour="apex")
    assert "weight" in ln(x, w.float())  # torch flavour: the weight is x's dtype
    assert ln(x, w.float(), flavour="fp32") is None  # FP32LayerNorm: cast to float32, exact
    assert "contiguous" in ln(x, _rand(128, torch.bfloat16, seed=2)[::2])
    misaligned = _rand((4 * 64 + 1,), torch.bfloat16, seed=43)[1:].view(4, 64)
    assert "aligned" in ln(misaligned)
    assert ln(misaligned, alignment=False) is None  # left to the call (NotVectorizable)
    assert ln(misaligned, flavour="fp32") is None  # x.float() of a bf16 x is a fresh, aligned copy
    misaligned32 = _rand((4 * 64 + 1,), torch.float32, seed=48)[1:].view(4, 64)
    assert "aligned" in ln(misaligned32, flavour="fp32")  # ... of an fp32 x, x itself
    padded_off = _rand((4 * 72 + 1,), torch.bfloat16, seed=47)[1:].view(4, 72)[:, :64]
    assert ln(padded_off) is None  # not contiguous: aten normalizes an aligned copy
    w_off = _rand(65, torch.bfloat16, seed=44)[1:]
    assert "aligned" in ln(x, w_off) and "aligned" in ln(x, None, w_off)
    w_off32 = _rand(65, torch.float32, seed=49)[1:]
    assert "aligned" in ln(x, w_off32, flavour="fp32")  # weight.float() of an fp32 weight is the weight
    assert ln(x, w_off, flavour="fp32") is None  # ... of a bf16 one, a fresh aligned copy
    s = _rand((4, 64), torch.bfloat16, seed=45)
    assert "broadcast" in ln(x, scale=s[:3], shift=s[:3])
    u = _rand((4, 64), torch.bfloat16, seed=46)

    def add(x, u, gate=None, w=None, flavour="torch", **kw):
        return LN.supports_add_layernorm(x, u, gate, w, None, EPS, flavour, None, None, None, numerics=NUM, **kw)

    assert add(x, u) is None and add(misaligned, u) is None  # the norm reads the fresh sum
    assert "aligned" in add(x, u, w=w_off)
    assert add(x, u, gate=s[:1].float()) is None  # a float32 gate under a bf16 x
    assert "gate" in add(x.float(), u.float(), gate=s[:1])  # a bf16 gate under an fp32 x
    assert "update" in add(x, u.float())


def test_misaligned_calls_fall_back_per_call_not_per_shape():
    """A misaligned x has an aligned tensor's shapes: the registered impl answers that call with the
    reference (aten's non-vectorized kernels run there) and keeps the kernel for the next aligned call."""
    base = _rand((4 * 64 + 1,), torch.bfloat16, seed=51)
    aligned, misaligned = base[:-1].view(4, 64), base[1:].view(4, 64)
    with pytest.raises(LN.NotVectorizable):
        LN.layernorm_modulate(misaligned, None, None, None, None, EPS, "torch", None, numerics=NUM)
    calls = []

    def reference(*args):
        calls.append(args[0].data_ptr())
        return ln_op.reference(*args)

    impl = LN.layernorm_modulate_with(NUM, reference)
    impl(aligned, None, None, None, None, EPS, "torch", None)
    out = impl(misaligned, None, None, None, None, EPS, "torch", None)
    assert calls == [misaligned.data_ptr()] and torch.equal(out, ln_op.reference(misaligned, None, None, None, None,
                                                                                 EPS, "torch", None))  # fmt: skip
    impl(aligned, None, None, None, None, EPS, "torch", None)
    assert len(calls) == 1


def test_constexpr_record_names_the_kernels_constexprs_in_order():
    """The launch passes every argument by position: the record's fields are the kernel's trailing
    constexpr parameters, in signature order."""
    kernel = LN.exact._layernorm_exact_kernel
    params = list(inspect.signature(getattr(kernel, "fn", kernel)).parameters.values())
    constexprs = [p.name for p in params if p.annotation in (tl.constexpr, "tl.constexpr")]
    assert constexprs == list(LN.exact.ExactConstexprs._fields) == [p.name for p in params[-len(constexprs):]]


def test_the_vendor_launch_modules_serve_both_ops():
    for module, num in ((nvidia, LN.CUDA_LN_NUMERICS), (amd, LN.ROCM_LN_NUMERICS)):
        assert module.LN_NUMERICS is num and callable(module.layernorm_modulate) and callable(module.add_layernorm)
    assert LN.CUDA_LN_NUMERICS.threads == 128 and LN.CUDA_LN_NUMERICS.recip == LN.RCP_IEEE
    assert LN.ROCM_LN_NUMERICS.recip == LN.RCP_AMDGCN and LN.ROCM_LN_NUMERICS.verified_on == ()


@pytest.mark.parametrize("op", ["layernorm_modulate", "add_layernorm"])
def test_every_conformance_case_is_taken_or_refused_with_a_reason(op):
    """Each case of the op's catalogue: refused with a reason, or run; those run in fp32 and fp16 equal
    the transliteration bit for bit (the norm of add_layernorm: on the stored residual)."""
    if HAS_CUDA:
        pytest.skip("the gpu tests run the catalogue against CUDA eager")
    spec = {"layernorm_modulate": ln_op, "add_layernorm": add_op}[op].SPEC
    taken = refused = 0
    for dtype in (torch.float32, torch.float16):
        for case in spec.cases(dtype, torch.device("cpu")):
            fn = LN.supports_layernorm_modulate if op == "layernorm_modulate" else LN.supports_add_layernorm
            reason = fn(*case.args, numerics=NUM)
            if reason is not None:
                assert isinstance(reason, str) and reason, case.name
                refused += 1
                continue
            taken += 1
            if op == "layernorm_modulate":
                out = LN.layernorm_modulate(*case.args, numerics=NUM)
                np.testing.assert_array_equal(out.numpy(), _model(*case.args, NUM), err_msg=case.name)
            else:
                x, u, gate, w, b, eps, flavour, sc, sh, index = case.args
                h, y = LN.add_layernorm(*case.args, numerics=NUM)
                np.testing.assert_array_equal(h.numpy(), add_op.residual(x, u, gate, index).numpy(), err_msg=case.name)
                model = _model(h, sc, sh, w, b, eps, flavour, index if sc is not None else None, NUM)
                np.testing.assert_array_equal(y.numpy(), model, err_msg=case.name)
    assert taken > refused > 0


# --------------------------------------------------------------------------------------------------
# GPU: bit for bit against eager on the same device
# --------------------------------------------------------------------------------------------------

WIDTHS = [(4608, 6144), (6889, 3072), (4096, 5120)]  # Flux.2, Qwen-Image, Wan (rows cut to a few thousand)


def _impl(name):
    return getattr(amd if torch.version.hip else nvidia, name)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows,d", WIDTHS, ids=str)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_gpu_statistics_are_atens_own(rows, d, dtype):
    x = _rand((rows, d), dtype, seed=d, scale=2.0, offset=1.0)
    w, b = _rand(d, dtype, seed=1, scale=0.5, offset=1.0), _rand(d, dtype, seed=2, scale=0.2)
    y, mean, rstd = LN.layernorm_stats(x, w, b, EPS, "torch", numerics=NUM)
    want_y, want_mean, want_rstd = torch.native_layer_norm(x, (d,), w, b, EPS)
    assert torch.equal(mean, want_mean.view(-1)) and torch.equal(rstd, want_rstd.view(-1))
    assert torch.equal(y, want_y)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows,d", WIDTHS, ids=str)
@pytest.mark.parametrize("flavour", LN.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("index", [False, True])
def test_gpu_layernorm_modulate_exact(rows, d, flavour, dtype, affine, index):
    x = _rand((2, rows // 2, d), dtype, seed=d + 3)
    pdt = dtype if flavour == "torch" else torch.float32
    w = _rand(d, dtype, seed=4, scale=0.5, offset=1.0) if affine else None
    b = _rand(d, dtype, seed=5, scale=0.2) if affine else None
    if index:
        sc, sh = _mod(x.shape, pdt, seed=6, index=True)
        idx = torch.rand(x.shape[:2], device=DEV) < 0.5
    else:  # [B,1,D] chunks of one [B,1,3D] projection
        shift, sc, _ = _rand((2, 1, 3 * d), pdt, seed=6, scale=0.3).chunk(3, dim=-1)
        sh, idx = shift, None
    args = (x, sc, sh, w, b, EPS, flavour, idx)
    assert LN.supports_layernorm_modulate(*args, numerics=NUM) is None
    assert torch.equal(_impl("layernorm_modulate")(*args), ln_op.reference(*args))
    plain = (x, None, None, w, b, EPS, flavour, None)
    assert torch.equal(_impl("layernorm_modulate")(*plain), ln_op.reference(*plain))


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("rows,d", WIDTHS, ids=str)
@pytest.mark.parametrize("flavour", LN.FLAVOURS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("gate", ["none", "x dtype", "float32"])
def test_gpu_add_layernorm_exact(rows, d, flavour, dtype, gate):
    if gate == "float32" and dtype == torch.float32:
        pytest.skip("a float32 gate under a float32 x is the 'x dtype' case")
    x, u = _rand((2, rows // 2, d), dtype, seed=d + 7), _rand((2, rows // 2, d), dtype, seed=d + 8)
    pdt = dtype if flavour == "torch" else torch.float32
    table = _rand((2, 1, 3 * d), torch.float32 if gate == "float32" else dtype, seed=9, scale=0.3)
    g = None if gate == "none" else table.chunk(3, dim=-1)[2]
    sc, sh = (t.to(pdt) for t in _rand((2, 2, 1, d), dtype, seed=10, scale=0.3))
    w, b = _rand(d, pdt, seed=11, scale=0.5, offset=1.0), _rand(d, pdt, seed=12, scale=0.2)
    args = (x, u, g, w, b, EPS, flavour, sc, sh, None)
    assert LN.supports_add_layernorm(*args, numerics=NUM) is None
    h, y = _impl("add_layernorm")(*args)
    want_h, want_y = add_op.reference(*args)
    assert torch.equal(h, want_h) and torch.equal(y, want_y)


@pytest.mark.gpu
@gpu
@pytest.mark.parametrize("op", ["layernorm_modulate", "add_layernorm"])
def test_gpu_vendor_impls_pass_the_conformance_kit(op):
    """Every case of the op's catalogue (views, chunks of tables, index tables, NaN/Inf, offsets past
    2**31 where memory allows) through the vendor backend's registered impl, against the device's eager."""
    from xbackend.testing import conformance

    rt, found = conformance.targets("rocm" if torch.version.hip else "cuda")
    mine = [t for t in found if t.impl.op == op and t.device.type == "cuda"]
    assert mine
    failures = [f for t in mine for f in conformance.check(rt, t)[0] if ": SKIP " not in f]
    assert not failures, "\n".join(failures)
