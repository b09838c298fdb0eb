"""The pointwise Triton kernels on views that hold few elements but span 2**31 or more from their data
pointer (``xbackend.kernels.spans``: a row sliced from a fused projection, a column of a modulation
table). Each kernel must give, bit for bit, what it gives on contiguous copies of the same values.

Every strided view here starts 2**31 elements into a buffer that is allocated but never written
outside the view: on Linux a CPU allocation is mapped lazily and the interpreter touches only the
elements it indexes (a few MB resident per test), and an offset a kernel wraps to 32 bits lands
inside the buffer, on values that are not the view's: a wrong output, not a fault. On a GPU the
same tests run the compiled kernels with the buffers in device memory (8 GiB per strided bf16 view,
up to four per test; a test skips where the device has less free).
"""

from __future__ import annotations

import functools
import math
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

from xbackend.kernels import layernorm, rmsnorm  # noqa: E402
from xbackend.kernels import triton_gated_residual as gated  # noqa: E402
from xbackend.kernels import triton_qk_norm_rope as qk  # noqa: E402
from xbackend.kernels import triton_qk_norm_rope_3d as qk3d  # noqa: E402
from xbackend.kernels import triton_rotary as rotary  # noqa: E402
from xbackend.kernels import triton_silu_mul as silu  # noqa: E402
from xbackend.kernels.rmsnorm.launch import Schedule  # noqa: E402
from xbackend.kernels.spans import INT32_LIMIT, span  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
NUM = rmsnorm.ROCM_NUMERICS if torch.version.hip else rmsnorm.CUDA_NUMERICS
LN_NUM = layernorm.ROCM_LN_NUMERICS if torch.version.hip else layernorm.CUDA_LN_NUMERICS
EPS = 1e-6
BF16 = torch.bfloat16
# Row strides just past 2**30: three rows span 2**31 + a few hundred elements. A multiple of 16 keeps
# every row 16-byte aligned (the exact RMSNorm kernels follow aten's vectorized order only there).
ROWS_APART = 2**30 + 64


def _buffer(elements: int, dtype: torch.dtype) -> torch.Tensor:
    if HAS_CUDA:
        torch.cuda.empty_cache()  # the previous test's buffers, still held by the caching allocator
        need = elements * torch.empty((), dtype=dtype).element_size()
        if torch.cuda.mem_get_info()[0] < need + (2 << 30):
            pytest.skip(f"needs {need / 2**30:.1f} GiB of free device memory")
    try:
        return torch.empty(elements, dtype=dtype, device=DEVICE)
    except RuntimeError as e:  # a host that refuses to reserve the address space
        pytest.skip(f"cannot allocate a {elements}-element buffer: {e}")


def spread(shape: tuple[int, ...], strides: tuple[int, ...], dtype: torch.dtype = BF16, seed: int = 0) -> torch.Tensor:
    """Random values in a ``shape`` view with ``strides`` that spans 2**31 elements or more (checked),
    starting 2**31 elements into its own buffer (module docstring)."""
    view = torch.empty_strided(shape, strides, device="meta")
    assert view.numel() < INT32_LIMIT <= span(view), (shape, strides)
    t = _buffer(INT32_LIMIT + span(view), dtype).as_strided(shape, strides, INT32_LIMIT)
    g = torch.Generator().manual_seed(seed)
    t.copy_(torch.randn(shape, generator=g))
    return t


def rand(*shape: int, dtype: torch.dtype = BF16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(dtype=dtype, device=DEVICE)


def dense(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    return [None if t is None else t.contiguous() for t in tensors]


def assert_same(got, want) -> None:
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        bad = int((g != w).sum())
        assert bad == 0, f"{bad} of {w.numel()} elements differ from the contiguous inputs' result"


# -- kernels whose offsets wrapped: a 32-bit column or head index times a stride ------------------------

D = 64
COL_APART = math.ceil(INT32_LIMIT / (D - 1))  # a [D] column of a [D, COL_APART] table: spans >= 2**31


def _modulate_variants():
    plain = functools.partial(rmsnorm.rmsnorm_modulate, numerics=NUM)
    flat = functools.partial(rmsnorm.rmsnorm_modulate, numerics=NUM, schedule=Schedule(flat_mod=True))
    fast = functools.partial(rmsnorm.rmsnorm_modulate_fast, numerics=NUM)

    def add(x, scale, shift, w, eps, flavour):
        return rmsnorm.add_rmsnorm(x, rand(*x.shape, seed=7), w, eps, flavour, scale, shift, numerics=NUM)

    return {"exact": plain, "exact-flat": flat, "fast": fast, "add": add}


MODULATE = _modulate_variants()


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("variant", list(MODULATE))
def test_rmsnorm_modulate_scale_and_shift_with_a_wide_column_stride(variant: str, flavour: str) -> None:
    """scale and shift [D] read with their column stride: the column index meets that stride."""
    fn = MODULATE[variant]
    x, w = rand(2, 3, D, seed=1), rand(D, seed=2)
    scale, shift = spread((D,), (COL_APART,), seed=3), spread((D,), (COL_APART,), seed=4)
    assert_same(fn(x, scale, shift, w, EPS, flavour), fn(x, *dense(scale, shift), w, EPS, flavour))


@pytest.mark.parametrize("flavour", ["torch", "fp32"])
def test_layernorm_scale_shift_and_gate_with_a_wide_column_stride(flavour: str) -> None:
    """scale, shift and the gate [D] read with their column stride: the column index meets that stride."""
    mdt = BF16 if flavour == "torch" else torch.float32
    x, u = rand(2, 3, D, seed=1), rand(2, 3, D, seed=2)
    scale, shift = spread((D,), (COL_APART,), mdt, seed=3), spread((D,), (COL_APART,), mdt, seed=4)
    gate = spread((D,), (COL_APART,), seed=5)
    run = functools.partial(layernorm.layernorm_modulate, numerics=LN_NUM)
    assert_same(run(x, scale, shift, None, None, EPS, flavour), run(x, *dense(scale, shift), None, None, EPS, flavour))
    add = functools.partial(layernorm.add_layernorm, numerics=LN_NUM)
    got = add(x, u, gate, None, None, EPS, flavour, scale, shift)
    assert_same(got, add(x, u, *dense(gate), None, None, EPS, flavour, *dense(scale, shift)))


def _split_inputs(heads_apart: int):
    """q, k [1, 2, 3*64] and split-RoPE cos/sin [1, 3 heads, 2 tokens, 32] whose heads sit
    ``heads_apart`` elements apart (per-head tables sliced from a larger one)."""
    q, k = rand(1, 2, 3 * 64, seed=1), rand(1, 2, 3 * 64, seed=2)
    wq, wk = rand(3 * 64, seed=3), rand(3 * 64, seed=4)
    shape, strides = (1, 3, 2, 32), (3 * heads_apart, heads_apart, 32, 1)
    return q, k, wq, wk, spread(shape, strides, seed=5), spread(shape, strides, seed=6)


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_qk_norm_rope_split_cos_heads_a_wide_stride_apart(flavour: str) -> None:
    """cos/sin's head index meets the head stride: head 2 of three 2**30 + 64 apart is past 2**31."""
    q, k, wq, wk, cos, sin = _split_inputs(ROWS_APART)
    run = functools.partial(qk.qk_norm_rope, eps=EPS, flavour=flavour, layout="split", numerics=NUM)
    assert qk.supports(q, k, wq, wk, cos, sin, EPS, flavour, "split", numerics=NUM) is None
    assert_same(run(q, k, wq, wk, cos, sin), run(q, k, wq, wk, *dense(cos, sin)))


# -- kernels that were already right: regression guards --------------------------------------------------


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_rmsnorm_rows_and_row_broadcast_scale_a_wide_stride_apart(flavour: str) -> None:
    """x rows and the scale/shift rows of a [B, 1, D] broadcast: 64-bit row indices (always)."""
    x = spread((3, 128), (ROWS_APART, 1), seed=1)
    w = rand(128, seed=2)
    got = rmsnorm.rmsnorm(x, w, EPS, flavour, numerics=NUM)
    assert_same(got, rmsnorm.rmsnorm(x.contiguous(), w, EPS, flavour, numerics=NUM))
    xs = rand(3, 5, 128, seed=3)
    scale = spread((3, 1, 128), (ROWS_APART, 128, 1), seed=4)
    shift = spread((3, 1, 128), (ROWS_APART, 128, 1), seed=5)
    for fn in MODULATE.values():
        assert_same(fn(xs, scale, shift, w, EPS, flavour), fn(xs, *dense(scale, shift), w, EPS, flavour))


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_qk_norm_rope_interleaved_rows_a_wide_stride_apart(flavour: str) -> None:
    """q, k and cos/sin rows 2**30 + 64 apart (q and k sliced from one fused projection)."""
    q, k = spread((3, 64), (ROWS_APART, 1), seed=1), spread((3, 64), (ROWS_APART, 1), seed=2)
    cos, sin = spread((3, 64), (ROWS_APART, 1), seed=3), spread((3, 64), (ROWS_APART, 1), seed=4)
    wq, wk = rand(64, seed=5), rand(64, seed=6)
    run = functools.partial(qk.qk_norm_rope, eps=EPS, flavour=flavour, layout="interleaved", numerics=NUM)
    assert_same(run(q, k, wq, wk, cos, sin), run(*dense(q, k), wq, wk, *dense(cos, sin)))


@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
def test_qk_norm_rope_3d_head_rows_a_wide_stride_apart(flavour: str) -> None:
    shape, strides = (1, 1, 1, 3, 1, 64), (3 * ROWS_APART, 3 * ROWS_APART, 3 * ROWS_APART, ROWS_APART, 64, 1)
    q, k = spread(shape, strides, seed=1), spread(shape, strides, seed=2)
    wq, wk = rand(64, seed=3), rand(64, seed=4)
    run = functools.partial(qk3d.qk_norm_rope_3d, eps=EPS, q_scale=0.125, base=10000.0, flavour=flavour, numerics=NUM)
    assert qk3d.supports(q, k, wq, wk, EPS, 0.125, 10000.0, flavour, numerics=NUM) is None
    assert_same(run(q, k, wq, wk), run(*dense(q, k), wq, wk))


# The kernel walks a gate's rows with one stride: 15 rows this far apart span 2**31 + a few hundred.
GATE_ROWS_APART = 16 * math.ceil(INT32_LIMIT / 14 / 16)
GATES = {  # gate form -> (shape, strides) against x [3, 5, 64]
    "full": ((3, 5, 64), (5 * GATE_ROWS_APART, GATE_ROWS_APART, 1)),
    "bcast": ((3, 1, 64), (ROWS_APART, 64, 1)),
    "token": ((3, 5, 1), (5 * GATE_ROWS_APART, GATE_ROWS_APART, 1)),
}


@pytest.mark.parametrize("flavour", ["torch", "fp32"])
def test_layernorm_rows_and_row_broadcast_tables_a_wide_stride_apart(flavour: str) -> None:
    """x, update rows and the [B, 1, D] scale, shift and gate rows 2**30 + 64 apart: 64-bit row indices."""
    mdt = BF16 if flavour == "torch" else torch.float32
    x, u = spread((3, 128), (ROWS_APART, 1), seed=1), spread((3, 128), (ROWS_APART, 1), seed=2)
    run = functools.partial(layernorm.layernorm_modulate, numerics=LN_NUM)
    assert_same(run(x, None, None, None, None, EPS, flavour), run(x.contiguous(), None, None, None, None, EPS, flavour))
    xs, us = rand(3, 5, 128, seed=3), rand(3, 5, 128, seed=4)
    scale = spread((3, 1, 128), (ROWS_APART, 128, 1), mdt, seed=5)
    shift = spread((3, 1, 128), (ROWS_APART, 128, 1), mdt, seed=6)
    gate = spread((3, 1, 128), (ROWS_APART, 128, 1), torch.float32, seed=7)
    assert_same(run(xs, scale, shift, None, None, EPS, flavour), run(xs, *dense(scale, shift), None, None, EPS, flavour))
    add = functools.partial(layernorm.add_layernorm, numerics=LN_NUM)
    got = add(x, u, None, None, None, EPS, flavour)
    assert_same(got, add(*dense(x, u), None, None, None, EPS, flavour))
    got = add(xs, us, gate, None, None, EPS, flavour, scale, shift)
    assert_same(got, add(xs, us, *dense(gate), None, None, EPS, flavour, *dense(scale, shift)))


@pytest.mark.parametrize("form", list(GATES))
def test_gated_residual_gate_rows_a_wide_stride_apart(form: str) -> None:
    x, update = rand(3, 5, 64, seed=1), rand(3, 5, 64, seed=2)
    gate = spread(*GATES[form], seed=3)
    assert gated.supports(x, update, gate) is None
    assert_same(gated.gated_residual(x, update, gate), gated.gated_residual(x, update, gate.contiguous()))


def test_silu_mul_rows_a_wide_stride_apart() -> None:
    gate, up = spread((3, 96), (ROWS_APART, 1), seed=1), spread((3, 96), (ROWS_APART, 1), seed=2)
    assert silu.supports(gate, up) is None
    assert_same(silu.silu_mul(gate, up), silu.silu_mul(*dense(gate, up)))


def test_rotary_rows_a_wide_stride_apart() -> None:
    x = spread((3, 64), (ROWS_APART, 1), seed=1)
    cos, sin = spread((3, 64), (ROWS_APART, 1), seed=2), spread((3, 64), (ROWS_APART, 1), seed=3)
    for layout in ("interleaved", "split"):
        half = (3, 32) if layout == "split" else (3, 64)
        c, s = cos[..., : half[1]], sin[..., : half[1]]
        got = rotary.rotary_embedding(x, c, s, layout)
        assert_same(got, rotary.rotary_embedding(*dense(x, c, s), layout))


def test_rotary_split_cos_heads_a_wide_stride_apart() -> None:
    q, _, _, _, cos, sin = _split_inputs(ROWS_APART)
    assert_same(rotary.rotary_embedding(q, cos, sin, "split"), rotary.rotary_embedding(q, *dense(cos, sin), "split"))
