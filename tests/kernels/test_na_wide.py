"""na_triton on views whose span passes 2**31 elements (q, k and v sliced from one fused qkv buffer):
every offset the kernel forms (a row index times a stride, a dilation times a stride) must be 64-bit.

On the CPU (Triton's interpreter, which wraps int32 arithmetic as the GPU does) the views sit in a
storage of 2**32 + a few fp16 elements that is allocated but mostly never touched: only the rows the
views cover are written, so the test costs a few MiB of memory, not 8 GiB. The views start 2**31
elements into that storage, so a wrapped offset (an element offset past 2**31 - 1 read as negative)
still lands inside the allocation: the kernel then reads the wrong (zero) rows and the output is wrong,
rather than the process faulting. What this proves: the kernel's offset arithmetic, for these launch
forms (pointer tiles, in-kernel TMA descriptors, the shift and online launches, a dilation group
whose stride times dilation passes 2**31, the key-norm pass), is 64-bit where the span needs it. It
does not run the compiled GPU code: the GPU tests below run the real fused-qkv layouts and tensors of
2**31 elements. Last, the grid: batch x heads past 65535 (CUDA's limit on a grid's second axis) takes
a 1-D grid of one program a tile.
"""

from __future__ import annotations

import dataclasses
import math
import os

import pytest
import torch
from test_na_kernels import _patch_triton_interpreter_index, make_qkv, reference, rel_err

from xbackend.kernels import spans

# Axis-0 stride of the fused buffer: 2**30 + 1024 elements (16-byte multiples, so TMA's layout rule
# holds); axis 0 of length 3 puts its last slab 2**31 + 2048 elements from the views' origin.
_SLAB = 2**30 + 1024
_ORIGIN = 2**31


def wide_fused_qkv(spatial: tuple[int, ...], heads: int, dim: int, dtype: torch.dtype, seed: int):
    """(q, k, v) with ``make_qkv``'s values, as the three ``dim``-wide column ranges of one fused
    ``[1, *spatial, heads, 3 * dim]`` buffer whose first spatial axis is ``_SLAB`` elements a step, in
    a storage mostly left untouched (see the module docstring)."""
    dense = make_qkv(spatial, heads, dim, dtype, seed=seed)
    inner = math.prod(spatial[1:]) * heads * 3 * dim
    assert inner <= _SLAB
    storage = torch.empty(_ORIGIN + (spatial[0] - 1) * _SLAB + inner, dtype=dtype)  # virtual: not touched
    rows = torch.empty((*spatial[1:], heads, 3 * dim), device="meta").stride()  # one slab: contiguous
    strides = (_SLAB * spatial[0], _SLAB, *rows)
    fused = storage.as_strided((1, *spatial, heads, 3 * dim), strides, _ORIGIN)
    views = [fused[..., i * dim:(i + 1) * dim] for i in range(3)]
    for view, values in zip(views, dense, strict=True):
        view.copy_(values)
    return views, dense


# (spatial, window, dilation, tiles or None, tma, shift): a 2-D window on pointer tiles (online walk),
# a 3-D window with a dilation group of axis 0 (stride x dilation past 2**31) through in-kernel TMA
# descriptors with the shift launch and its online redo, and the same on pointer tiles.
_CASES = [
    ((3, 24), (3, 5), (1, 1), ((1, 4, 4), (1, 2, 8)), False, False),
    ((3, 6, 8), (1, 3, 5), (2, 1, 1), None, True, True),
    ((3, 6, 8), (1, 3, 5), (2, 1, 1), None, False, True),
]


def wide_errors() -> list[list]:
    """[case, span of q, rel error of the wide views, rel error of compact copies, key norms equal] per
    case; needs TRITON_INTERPRET=1 at import."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton
    from xbackend.kernels.key_norm import max_key_norm

    rows = []
    for spatial, window, dil, tiles, tma, shift in _CASES:
        (q, k, v), dense = wide_fused_qkv(spatial, 2, 32, torch.float16, seed=51)
        causal = (False,) * len(spatial)
        if tiles is None:
            cfg = dataclasses.replace(na_triton.config_for(q.shape, window, dil, causal), num_stages=1)
        else:
            cfg = na_triton.NAConfig(tiles[0], tiles[1], 4, 1)
        cfg = dataclasses.replace(cfg, tma=tma, shift=shift)
        q[0, 0, 0, 0] *= 60.0 if shift else 1.0  # one tile's bound too loose: the online redo runs too
        dense[0][0, 0, 0, 0] *= 60.0 if shift else 1.0
        ref = reference(*(t.double() for t in dense), window, dil, causal)
        got = na_triton.neighborhood_attention(q, k, v, window, dil, causal, None, config=cfg)
        compact = na_triton.neighborhood_attention(*dense, window, dil, causal, None, config=cfg)
        norms = torch.equal(max_key_norm(na_triton._as_3d(k)), max_key_norm(na_triton._as_3d(dense[1])))
        rows.append([f"{spatial} k{window} d{dil} tma {tma} shift {shift}", spans.span(q), rel_err(got, ref),
                     rel_err(compact, ref), norms])
    return rows


def test_wide_views_index_in_64_bits():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter runs this (the GPU tests run the real layouts)")
    for case, span, err, control, norms in wide_errors():
        assert span >= 2**31, (case, span)
        assert control < 2e-3, (case, control)
        assert err < 2e-3, (case, err)
        assert norms, (case, "max_key_norm of the wide keys differs")


# ---------------------------------------------------------------- GPU


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """These tests hold 5-20 GiB each: give it back to the device after each, so the other workers of
    a parallel run (pytest -n) can allocate theirs."""
    yield
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _sample_error(out: torch.Tensor, q, k, v, kernel, seed: int = 0) -> float:
    """Relative Frobenius error of ``out`` against an fp32 softmax over each sampled query's window
    (the op's ``axis_windows``; no dilation, stride or causal axis), for 2048 random queries and the
    last one (whose rows sit furthest from the views' origin). Only the sampled queries' keys are
    gathered and widened: the op's reference widens whole tensors, 8 GiB each at 2**31 elements."""
    from xbackend.ops.neighborhood_attention import axis_windows

    spatial = tuple(q.shape[1:-2])
    tokens = math.prod(spatial)
    idx = torch.randperm(tokens, generator=torch.Generator().manual_seed(seed))[:2048]
    idx = torch.cat([idx, torch.tensor([tokens - 1])]).to(q.device)
    keys = torch.zeros(idx.numel(), 1, dtype=torch.long, device=q.device)
    for a, (n, ks) in enumerate(zip(spatial, kernel, strict=True)):
        step = math.prod(spatial[a + 1:])
        window = axis_windows(n, ks, 1, False, q.device)[0]
        keys = (keys[:, :, None] + window[(idx // step) % n][:, None, :] * step).flatten(1)
    flat = [t.reshape(t.shape[0], tokens, *t.shape[-2:]) for t in (q, k, v, out)]
    qs, got = flat[0][:, idx].float(), flat[3][:, idx].float()
    kw, vw = flat[1][:, keys].float(), flat[2][:, keys].float()  # [B, n, W, H, D]
    p = torch.softmax(torch.einsum("bnhd,bnwhd->bnhw", qs, kw) * q.shape[-1] ** -0.5, -1)
    ref = torch.einsum("bnhw,bnwhd->bnhd", p, vw)
    return float((got - ref).norm() / ref.norm())


def _fused(shape: tuple[int, ...], seed: int) -> list[torch.Tensor]:
    """q, k, v: the three head_dim-wide column ranges of one fused ``[*shape[:-1], 3 * head_dim]`` bf16
    buffer (a qkv projection's output, split on its last axis)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    qkv = torch.randn((*shape[:-1], 3 * shape[-1]), generator=g, device="cuda", dtype=torch.bfloat16)
    d = shape[-1]
    return [qkv[..., i * d:(i + 1) * d] for i in range(3)]


@pytest.mark.gpu
def test_gpu_fused_qkv_2d_through_get_op_and_each_impl():
    """The fused-qkv layout [1, 768, 768, 24, 3 x 64] bf16 split on the last axis: q spans 2.7e9 elements
    from its data pointer while holding 9.1e8. Through get_op (verified on its first call) and with each
    NA impl forced, against the fp32 reference on sampled queries (the last query's rows included)."""
    import xbackend

    q, k, v = _fused((1, 768, 768, 24, 64), seed=1)
    assert q.numel() < 2**31 <= spans.span(q)
    args = ((7, 7), (1, 1), (False, False), None)
    op = xbackend.get_op("neighborhood_attention")
    seen = len(xbackend.report().events)
    out = op(q, k, v, *args)
    ran = [(e.impl, e.status) for e in xbackend.report().events[seen:]]
    assert _sample_error(out, q, k, v, args[0]) < 5e-3, ran
    for impl in ("na_triton", "na_flex", "na_tiled_sdpa"):
        with xbackend.use(neighborhood_attention=impl):
            out = op(q, k, v, *args)
        assert _sample_error(out, q, k, v, args[0], seed=2) < 5e-3, impl


@pytest.mark.gpu
@pytest.mark.parametrize(("shape", "kernel", "pipelined"), [
    ((1, 64, 128, 128, 12, 64), (5, 7, 7), False),  # in-kernel TMA descriptors, the shift and online launches
    ((1, 48, 128, 128, 8, 128), (5, 7, 7), True),  # na_gluon's pipelined shift launch, 64- and 128-query tiles
])
def test_gpu_fused_qkv_3d_launch_forms(shape, kernel, pipelined, monkeypatch):
    """3-D fused-qkv views spanning past 2**31 elements through the TMA tiles (descriptors made in each
    program: heads sit 3 x head_dim apart), the shift launch (loose tiles too: one frame's queries x 60)
    and, at head_dim 128, na_gluon's kernels; and through pointer tiles."""
    from xbackend.kernels import na_triton

    q, k, v = _fused(shape, seed=3)
    q[:, :2] *= 60.0
    assert spans.span(q) >= 2**31
    args = (kernel, (1, 1, 1), (False,) * 3, None)
    base = na_triton.config_for(q.shape, *args[:3])
    assert base.tma and base.shift and base.pipelined == pipelined
    cfgs = [base, dataclasses.replace(base, tma=False)]
    if pipelined:
        tall = na_triton.choose_config(shape[1:4], kernel, (1, 1, 1), shape[-1], block_m=128)
        cfgs.append(dataclasses.replace(base, q_tile=tall.q_tile, kv_tile=tall.kv_tile))
    for cfg in cfgs:
        out = na_triton.neighborhood_attention(q, k, v, *args, config=cfg)
        assert _sample_error(out, q, k, v, kernel) < 5e-3, cfg


@pytest.mark.gpu
def test_gpu_contiguous_tensors_of_2_31_elements():
    """q, k and v of 2**31 elements each (contiguous, 4 GiB in bf16): supports() takes them and the
    kernel's 64-bit offsets reach their last rows."""
    from xbackend.kernels import na_triton

    shape = (1, 8, 1024, 2048, 1, 128)
    g = torch.Generator(device="cuda").manual_seed(4)
    q, k, v = (torch.randn(shape, generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    assert q.numel() == 2**31
    args = ((3, 3, 3), (1, 1, 1), (False,) * 3, None)
    assert na_triton.supports(q, k, v, *args) is None
    out = na_triton.neighborhood_attention(q, k, v, *args)
    assert _sample_error(out, q, k, v, args[0]) < 5e-3


def flat_grid_errors() -> list[list]:
    """[case, rel error with the 3-D grid, with the 1-D grid, outputs equal] of na_triton when batch x
    heads passes the grid's second-axis limit (lowered to 1 here, so small calls take the 1-D grid);
    needs TRITON_INTERPRET=1 at import."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for spatial, window, dil, shift in (((6, 9, 10), (3, 5, 4), (1, 1, 2), True), ((9, 11), (3, 5), (2, 1), False)):
        q, k, v = make_qkv(spatial, 3, 32, torch.float32, seed=52, device="cpu", batch=2)
        q[:, :1] *= 60.0  # loose tiles: the online launch too
        causal = (False,) * len(spatial)
        ref = reference(q.double(), k.double(), v.double(), window, dil, causal)
        cfg = dataclasses.replace(na_triton.config_for(q.shape, window, dil, causal), num_stages=1, shift=shift)
        outs = []
        for limit in (na_triton.GRID_YZ_MAX, 1):
            saved, na_triton.GRID_YZ_MAX = na_triton.GRID_YZ_MAX, limit
            try:
                outs.append(na_triton.neighborhood_attention(q, k, v, window, dil, causal, None, config=cfg))
            finally:
                na_triton.GRID_YZ_MAX = saved
        rows.append([f"{spatial} shift {shift}", rel_err(outs[0], ref), rel_err(outs[1], ref),
                     torch.equal(outs[0], outs[1])])
    return rows


def test_a_grid_past_its_second_axis_limit_takes_one_program_a_tile():
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the interpreter runs this (lab/gpu/na_memcheck.py runs batch x heads = 65536)")
    for case, err, flat_err, same in flat_grid_errors():
        assert err < 1e-5 and flat_err < 1e-5 and same, (case, err, flat_err, same)
