"""The packed key walk of na_triton's shift launch (``na_packed``): the layout rules, the box
origin against every query's window, the window table against the window rule key by key, the int32
guard, the computed-pair count, and the launch against the reference and the box walk
(interpreter in fp32; GPU in bf16)."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_na_kernels import _patch_triton_interpreter_index, _run_with_interpreter, make_qkv, reference, rel_err

from xbackend.kernels.na_packed import PENALTY, offsets_fit, packed_layout, window_table
from xbackend.kernels.na_triton_config import NAConfig, _window, pad3, visited_pairs

# (spatial, kernel, dilation, stride, (q_tile, kv_tile) or None for the launch's choice): border tiles
# on every axis, a box as long as its axis, dilation groups, strided windows, partial Q tiles, a 2-D
# window, a head dim that pads.
CASES = [
    ((7, 12, 13), (5, 5, 5), (1, 1, 1), (1, 1, 1), ((4, 4, 4), (2, 2, 16))),
    ((9, 12, 13), (5, 5, 5), (1, 1, 1), (2, 3, 1), ((4, 4, 4), (2, 2, 16))),
    ((6, 9, 16), (3, 5, 4), (1, 1, 2), (1, 1, 1), ((2, 4, 8), (2, 4, 8))),
    ((6, 9, 10), (3, 5, 4), (1, 1, 1), (3, 1, 2), None),
    ((12, 14), (11, 5), (1, 1), (1, 1), None),
]
STAGE5 = ((40, 96, 96), (4, 4, 4), 64, (11, 11, 11), (1, 1, 1), (1, 1, 1), (False,) * 3)


def test_layout_rules():
    # The DiffVAE stage-5 tile: a 14^3 box, 4 row types an axis in one 16-wide product, 43 blocks.
    lay = packed_layout(*STAGE5)
    assert (lay.box, lay.types, lay.k, lay.blocks) == ((14, 14, 14), (4, 4, 4), 16, 43)
    # A causal axis keeps the box walk; so do dilation groups of unequal length shorter than the box,
    # more than 32 row types and an oversized table.
    assert packed_layout((40, 96, 96), (4, 4, 4), 64, (11, 11, 11), (1, 1, 1), (1, 1, 1), (True, False, False)) is None
    assert packed_layout((15, 96, 96), (4, 4, 4), 64, (5, 11, 11), (2, 1, 1), (1, 1, 1), (False,) * 3) is None
    assert packed_layout((1, 64, 64), (1, 1, 64), 64, (1, 1, 33), (1, 1, 1), (1, 1, 1), (False,) * 3) is None
    assert packed_layout((1, 4096, 4096), (1, 8, 8), 64, (1, 1000, 1000), (1, 1, 1), (1, 1, 1), (False,) * 3) is None
    # Groups of equal length shorter than the box: the box is the whole group.
    lay = packed_layout((16, 96, 96), (4, 4, 4), 64, (5, 11, 11), (2, 1, 1), (1, 1, 1), (False,) * 3)
    assert lay.box == (8, 14, 14) and lay.types == (4, 4, 4)
    # 17..32 row types take a 32-wide product; strides widen the types by the leader span.
    assert packed_layout((1, 64, 64), (1, 8, 8), 64, (1, 9, 9), (1, 1, 1), (1, 1, 1), (False,) * 3).k == 32
    lay = packed_layout((40, 96, 96), (4, 4, 4), 64, (9, 9, 9), (1, 1, 1), (1, 5, 1), (False,) * 3)
    assert lay.types == (4, 6, 4) and lay.box == (12, 14, 12)


@pytest.mark.parametrize("n,tq,ks,d,s", [(n, tq, ks, d, s) for n in (5, 11, 16, 23) for tq in (1, 2, 4, 8)
                                          for ks in (1, 3, 5) for d in (1, 2, 3) for s in (1, 2, 3) if s <= ks])
def test_box_origin_covers_every_window(n, tq, ks, d, s):
    """Along one axis, for every dilation group and Q tile (rows past the group's end stand in for
    its last query, as in the kernel): ``min(lo, N - U)`` places every row's window inside the box
    and its start among the row types."""
    lay = packed_layout((n, n, n), (tq, tq, tq), 64, (ks,) * 3, (d,) * 3, (s,) * 3, (False,) * 3)
    if ks * d > n or lay is None:
        return
    u, r = lay.box[0], lay.types[0]
    for g in range(d):
        glen = -(-(n - g) // d)
        if glen < ks:
            continue
        for a in range(0, glen, tq):
            lo = _window(a, glen, ks, s, False)[0]
            origin = min(lo, glen - u)
            assert origin >= 0
            for m in range(a, a + tq):
                start, end = _window(min(m, glen - 1), glen, ks, s, False)
                assert 0 <= start - origin < r and end <= origin + u, (g, a, m)


@pytest.mark.parametrize("case", [STAGE5, ((9, 12, 13), (4, 4, 4), 64, (5, 5, 5), (1, 1, 1), (2, 3, 1), (False,) * 3),
                                  ((1, 20, 20), (1, 8, 8), 64, (1, 9, 9), (1, 1, 1), (1, 1, 1), (False,) * 3)])
def test_window_table_is_the_window_rule(case):
    """Every row type combination (s0, s1, s2) and walk position: the one-hot row times the block's
    table entry is 0 exactly where the key is in the box and inside [s, s + KS) on every axis, and at
    most PENALTY elsewhere."""
    lay = packed_layout(*case)
    kernel = case[3]
    table = window_table(lay, kernel, torch.float32, torch.device("cpu"))
    assert table.shape == (lay.blocks * lay.k, lay.block_n)
    u0, u1, u2 = lay.box
    p = torch.arange(lay.blocks * lay.block_n)
    coords = torch.stack([p // (u1 * u2), (p // u2) % u1, p % u2], 1)
    in_box = p < u0 * u1 * u2
    combos = torch.tensor(list(itertools.product(*(range(r) for r in lay.types))))  # [rows, 3]
    bases = torch.tensor([0, lay.types[0], lay.types[0] + lay.types[1]])
    onehot = torch.zeros(len(combos), lay.k)
    onehot.scatter_(1, combos + bases, 1.0)
    pen = torch.cat([onehot @ table[j * lay.k:(j + 1) * lay.k] for j in range(lay.blocks)], 1)  # [rows, positions]
    d = coords[None] - combos[:, None]
    inside = ((d >= 0) & (d < torch.tensor(kernel))).all(-1) & in_box[None]
    assert torch.equal(pen == 0, inside)
    assert bool((pen[~inside] <= PENALTY).all())


def test_offsets_fit_and_computed_pairs():
    lay = packed_layout(*STAGE5)
    assert offsets_fit(lay, (96 * 96 * 256, 96 * 256, 256))
    assert not offsets_fit(lay, (2**28, 1, 1))  # 13 * 2**28 is past int32: the box walk runs
    cfg = NAConfig((4, 4, 4), (2, 2, 16), 4, 3, tma=True, shift=True)
    packed = dataclasses.replace(cfg, packed=True)
    tiles = 10 * 24 * 24
    assert visited_pairs((40, 96, 96), (11, 11, 11), (1, 1, 1), (False,) * 3, (1, 1, 1), packed) == tiles * 64 * 43 * 64
    assert visited_pairs((40, 96, 96), (11, 11, 11), (1, 1, 1), (False,) * 3, (1, 1, 1), cfg) > tiles * 64 * 43 * 64
    # Dilation: every group's tiles (groups of 8, 8 | 48, 48 | 48, 48 along the axes).
    assert visited_pairs((16, 96, 96), (5, 11, 11), (2, 2, 2), (False,) * 3, (1, 1, 1), packed) == (
        8 * 2 * 12 * 12 * 64 * (-(-8 * 14 * 14 // 64)) * 64)


def _case_config(spatial, kernel, dil, stride, tiles) -> NAConfig:
    from xbackend.kernels import na_triton

    causal = (False,) * len(spatial)
    if tiles:
        return NAConfig(tiles[0], tiles[1], 4, 1, tma=True, shift=True, packed=True)
    shape = (1, *spatial, 2, 64)
    return dataclasses.replace(na_triton.config_for(shape, kernel, dil, causal, stride), tma=True, shift=True,
                               num_stages=1, pipelined=False, packed=True)


def packed_errors(device: str, dtype_name: str, which: list[int], head_dim: int = 64) -> list[list]:
    """[case, error vs the fp32 reference, difference from the box walk] per case (batch 2)."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    dtype = getattr(torch, dtype_name)
    rows = []
    for i in which:
        spatial, kernel, dil, stride, tiles = CASES[i]
        q, k, v = (t.to(dtype) for t in make_qkv(spatial, 2, head_dim, torch.float32, seed=41, device=device, batch=2))
        cfg = _case_config(spatial, kernel, dil, stride, tiles)
        causal = (False,) * len(spatial)
        lay = packed_layout(pad3(spatial, 1), cfg.q_tile, math.prod(cfg.kv_tile), pad3(kernel, 1), pad3(dil, 1),
                            pad3(stride, 1), pad3(causal, False))
        assert lay is not None, (spatial, cfg)
        box = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride,
                                               config=dataclasses.replace(cfg, packed=False))
        out = torch.full_like(q, float("nan"))
        na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=cfg, out=out)
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
        rows.append([f"{spatial} k{kernel} d{dil} s{stride} {cfg.q_tile}/{cfg.kv_tile} box {lay.box}",
                     rel_err(out, ref), rel_err(out, box)])
    return rows


# The interpreter (about 10 s a launch on 2 cores) takes two cases: dilation groups with fixed tiles
# and a box as long as its axis, strides with the launch's own tiles. The GPU takes every case.
@pytest.mark.parametrize("which", [2, 3])
def test_packed_walk_interpreter(which: int):
    for case, err, diff in _run_with_interpreter(True, "packed_errors", "cpu", "float32", [which], path=__file__):
        assert err < 1e-5 and diff < 1e-5, (case, err, diff)


def test_packed_walk_falls_back_where_it_cannot_mask():
    """A causal call and a tiny scale (a penalty that would not reach exp2's zero) take the box walk;
    the launch still matches the reference (interpreter, fp32)."""
    for case, err in _run_with_interpreter(True, "packed_fallbacks", path=__file__):
        assert err < 1e-5, (case, err)


def packed_fallbacks() -> list[list]:
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for kernel, causal, scale in (((3, 5, 4), (True, False, False), None), ((3, 5, 4), (False,) * 3, 1e-31)):
        q, k, v = make_qkv((6, 9, 10), 2, 64, torch.float32, seed=42)
        cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, causal), tma=True, shift=True,
                                  num_stages=1, packed=True)
        out = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, causal, scale, config=cfg)
        ref = reference(q.double(), k.double(), v.double(), kernel, (1,) * 3, causal, scale)
        rows.append([f"causal {causal} scale {scale}", rel_err(out, ref)])
    return rows


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 96])
def test_packed_walk_gpu(head_dim: int):
    for case, err, diff in packed_errors("cuda", "bfloat16", list(range(len(CASES))), head_dim):
        assert err < 5e-3 and diff < 5e-3, (case, err, diff)
