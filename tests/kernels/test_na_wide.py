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
does not run the compiled GPU code: the GPU tests below run the real fused-qkv layouts.
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
