"""The shift walk's window test on the tensor cores (``na_window_mma``): the layout rules, the table
against the window rule evaluated position by position, and the launch bit for bit against the
compare-and-select form (interpreter in fp32; GPU in bf16)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_na_kernels import _patch_triton_interpreter_index, _run_with_interpreter, make_qkv, reference, rel_err

from xbackend.kernels.na_triton_config import NAConfig, _window, pad3
from xbackend.kernels.na_window_mma import PENALTY, mask_layout, mask_table

# (spatial, kernel, dilation, stride, (q_tile, kv_tile) or None for the launch's choice): border tiles
# on every axis, dilation groups of unequal length, strided windows, partial Q tiles, the DiffVAE
# tiles' shape.
CASES = [
    ((7, 12, 13), (5, 5, 5), (1, 1, 1), (1, 1, 1), ((4, 4, 4), (2, 2, 16))),
    ((9, 12, 13), (5, 5, 5), (1, 1, 1), (2, 3, 1), ((4, 4, 4), (2, 2, 16))),
    ((6, 9, 17), (3, 5, 4), (1, 1, 2), (1, 1, 1), ((2, 4, 8), (2, 4, 8))),
    ((6, 9, 10), (3, 5, 4), (1, 1, 1), (3, 1, 2), None),
    ((12, 14), (11, 5), (1, 1), (1, 1), None),
]


def _case_config(spatial, kernel, dil, stride, tiles, tma: bool) -> NAConfig:
    from xbackend.kernels import na_triton

    causal = (False,) * len(spatial)
    if tiles:
        return NAConfig(tiles[0], tiles[1], 4, 1, tma=tma, shift=True)
    shape = (1, *spatial, 2, 64)
    return dataclasses.replace(na_triton.config_for(shape, kernel, dil, causal, stride), tma=tma, shift=True,
                               num_stages=1, pipelined=False)


def test_layout_rules():
    # The DiffVAE stage-5 tile: 4 row types an axis, one 16-wide product, 7 x 7 x 1 table entries.
    lay = mask_layout((4, 4, 4), (2, 2, 16), (11, 11, 11), (1, 1, 1), (False,) * 3)
    assert (lay.k, lay.types, lay.blocks) == (16, (4, 4, 4), (7, 7, 1))
    assert lay.strides == (7 * 1024 // 2, 1024 // 2, 1024 // 16)
    # A causal axis keeps the select form; so do more than 32 row types and an oversized table.
    assert mask_layout((4, 4, 4), (2, 2, 16), (11, 11, 11), (1, 1, 1), (True, False, False)) is None
    assert mask_layout((1, 1, 64), (1, 1, 64), (1, 1, 33), (1, 1, 1), (False,) * 3) is None
    assert mask_layout((1, 8, 8), (1, 8, 8), (1, 4000, 4000), (1, 1, 1), (False,) * 3) is None
    # 17..32 row types take a 32-wide product; strides widen the types by the leader span.
    assert mask_layout((1, 8, 8), (1, 8, 8), (1, 9, 9), (1, 1, 1), (False,) * 3).k == 32
    assert mask_layout((4, 4, 4), (2, 2, 16), (9, 9, 9), (1, 5, 1), (False,) * 3).types == (4, 6, 4)


@pytest.mark.parametrize("case", [((4, 4, 4), (2, 2, 16), (11, 11, 11), (1, 1, 1)),
                                  ((2, 4, 8), (2, 4, 8), (3, 5, 4), (1, 3, 2))])
def test_table_is_the_window_rule(case):
    """Every (tile, KV block, row, key) of small problems with border, interior and partial tiles: the
    query's one-hot row times the block's table entry is 0 exactly where the key is in the query's
    window (the op's rule, ``_window``), and at most PENALTY elsewhere."""
    q_tile, kv_tile, kernel, stride = case
    spatial = tuple(k + 2 * t + 3 for k, t in zip(kernel, q_tile, strict=True))
    lay = mask_layout(q_tile, kv_tile, kernel, stride, (False,) * 3)
    table = mask_table(lay, kv_tile, kernel, torch.float32, torch.device("cpu"))
    block_n = table.shape[1]
    n = torch.arange(block_n)
    key_off = torch.stack([n // (kv_tile[1] * kv_tile[2]), (n // kv_tile[2]) % kv_tile[1], n % kv_tile[2]], 1)
    win = [torch.tensor([_window(m, ln, k, s, False) for m in range(ln)])
           for ln, k, s in zip(spatial, kernel, stride, strict=True)]  # [L, 2] per axis
    blocks = 0
    for a0 in range(0, spatial[0], q_tile[0]):
        for a1 in range(0, spatial[1], q_tile[1]):
            for a2 in range(0, spatial[2], q_tile[2]):
                first = (a0, a1, a2)
                ranges = [torch.arange(a, min(a + t, ln)) for a, t, ln in zip(first, q_tile, spatial, strict=True)]
                m = torch.cartesian_prod(*ranges)  # [rows, 3]
                lo = [int(win[x][first[x], 0]) for x in range(3)]
                hi = [int(win[x][ranges[x][-1], 1]) for x in range(3)]
                starts = torch.stack([win[x][m[:, x], 0] for x in range(3)], 1)
                ends = torch.stack([win[x][m[:, x], 1] for x in range(3)], 1)
                s_rel = starts - torch.tensor(lo)
                bases = torch.tensor([0, lay.types[0], lay.types[0] + lay.types[1]])
                assert bool(((s_rel >= 0) & (s_rel < torch.tensor(lay.types))).all())
                onehot = torch.zeros(len(m), lay.k)
                onehot.scatter_(1, s_rel + bases, 1.0)
                for c in torch.cartesian_prod(*[torch.arange(lo[x], hi[x], kv_tile[x]) for x in range(3)]):
                    off = sum(int(c[x] - lo[x]) * lay.strides[x] for x in range(3))
                    assert off % (lay.k * block_n) == 0
                    pen = onehot @ table[off // block_n:off // block_n + lay.k]
                    keys = c + key_off  # [BLOCK_N, 3]
                    inside = ((keys[None] >= starts[:, None]) & (keys[None] < ends[:, None])).all(-1)
                    assert torch.equal(pen == 0, inside), (first, c.tolist())
                    assert bool((pen[~inside] <= PENALTY).all())
                    blocks += 1
    assert blocks > 100


def window_mma_bit_for_bit(device: str, dtype_name: str, tma: bool) -> list[list]:
    """[case, equal, error of the product form vs the fp32 reference] per case: the shift launch with
    the window test as a tensor-core product (each table load form and order) against the select form,
    batch 2."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    dtype = getattr(torch, dtype_name)
    rows = []
    # The interpreter (about 10 s a launch on 2 cores) runs one table form and one case per
    # descriptor mode: dilation groups with pointer tiles, strides and the launch's own tiles with TMA.
    # The GPU runs every form and case.
    forms = [(False, False), (True, False), (False, True), (True, True)] if device == "cuda" else [(tma, tma)]
    cases = CASES if device == "cuda" else [CASES[3] if tma else CASES[2]]
    for spatial, kernel, dil, stride, tiles in cases:
        q, k, v = make_qkv(spatial, 2, 64, torch.float32, seed=41, device=device, batch=2)
        q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
        cfg = _case_config(spatial, kernel, dil, stride, tiles, tma)
        causal = (False,) * len(spatial)
        lay = mask_layout(cfg.q_tile, cfg.kv_tile, pad3(kernel, 1), pad3(stride, 1), pad3(causal, False))
        assert lay is not None, (spatial, cfg)
        saved = (na_triton.WINDOW_MMA, na_triton.WINDOW_MMA_TMA, na_triton.WINDOW_MMA_FIRST)
        try:
            na_triton.WINDOW_MMA = False
            base = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=cfg)
            ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
            for by_tma, first in forms:
                na_triton.WINDOW_MMA, na_triton.WINDOW_MMA_TMA, na_triton.WINDOW_MMA_FIRST = True, by_tma, first
                out = torch.full_like(q, float("nan"))
                na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=cfg, out=out)
                rows.append([f"{spatial} k{kernel} d{dil} s{stride} {cfg.q_tile}/{cfg.kv_tile} tma-table {by_tma}"
                             f" first {first}", bool(torch.equal(out, base)), rel_err(out, ref)])
        finally:
            na_triton.WINDOW_MMA, na_triton.WINDOW_MMA_TMA, na_triton.WINDOW_MMA_FIRST = saved
    return rows


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_window_mma_interpreter_bit_for_bit(tma: bool):
    rows = _run_with_interpreter(True, "window_mma_bit_for_bit", "cpu", "float32", tma, path=__file__)
    assert len(rows) == 1
    for case, equal, err in rows:
        assert equal and err < 1e-5, (case, equal, err)


def test_window_mma_falls_back_where_it_cannot_mask():
    """A causal call and a tiny scale (a penalty that would not reach exp2's zero) take the select
    form; the launch still matches the reference (interpreter, fp32)."""
    rows = _run_with_interpreter(True, "window_mma_fallbacks", path=__file__)
    for case, err in rows:
        assert err < 1e-5, (case, err)


def window_mma_fallbacks() -> list[list]:
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    saved = na_triton.WINDOW_MMA
    na_triton.WINDOW_MMA = True
    try:
        for kernel, causal, scale in (((3, 5, 4), (True, False, False), None), ((3, 5, 4), (False,) * 3, 1e-31)):
            q, k, v = make_qkv((6, 9, 10), 2, 64, torch.float32, seed=42)
            cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, causal), tma=True, shift=True,
                                      num_stages=1)
            out = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, causal, scale, config=cfg)
            ref = reference(q.double(), k.double(), v.double(), kernel, (1,) * 3, causal, scale)
            rows.append([f"causal {causal} scale {scale}", rel_err(out, ref)])
    finally:
        na_triton.WINDOW_MMA = saved
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_window_mma_gpu_bit_for_bit(tma: bool):
    for case, equal, err in window_mma_bit_for_bit("cuda", "bfloat16", tma):
        assert equal and err < 5e-3, (case, equal, err)
