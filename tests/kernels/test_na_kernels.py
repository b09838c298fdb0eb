"""Neighborhood-attention kernels (na_tiled_sdpa, na_flex, na_triton) against an fp32 reference.

The reference here is written independently of the kernels: a dense per-axis window table (from
the rule in the op's definition, evaluated position by position in plain Python), combined into an
N x N mask and fed to an fp32 softmax. Sizes are tiny so N x N is cheap on a CPU.
"""

from __future__ import annotations

import functools
import math
import os

import pytest
import torch

from xbackend.kernels import na_flex, na_flex_tiles, na_tiled_sdpa

Case = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[bool, ...]]


def _axis_allowed(length: int, kernel: int, dilation: int, causal: bool, stride: int = 1) -> torch.Tensor:
    """[L, L] bool: key j is in the window of query i along one axis (the op's rule, literally)."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for i in range(length):
        g, m = i % dilation, i // dilation
        glen = len(range(g, length, dilation))
        first = (m // stride) * stride  # the first query of m's stride group
        if causal:
            leader = min(first + stride - 1, glen - 1)
            lo, hi = max(leader - kernel + 1, 0), m + 1
        else:
            leader = min(first + stride // 2, glen - 1)
            lo = min(max(leader - kernel // 2, 0), glen - kernel)
            hi = lo + kernel
        for mj in range(lo, hi):
            allowed[i, g + mj * dilation] = True
    return allowed


def reference(q, k, v, kernel_size, dilation, is_causal, scale=None, stride=None) -> torch.Tensor:
    spatial = q.shape[1:-2]
    n = len(spatial)
    stride = stride or (1,) * n
    mask = None
    for a, length in enumerate(spatial):
        m = _axis_allowed(length, kernel_size[a], dilation[a], is_causal[a], stride[a])
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = length, length
        m = m.view(shape)
        mask = m if mask is None else mask & m
    tokens = math.prod(spatial)
    mask = mask.reshape(tokens, tokens).to(q.device)
    b, h, d = q.shape[0], q.shape[-2], q.shape[-1]
    scale = d**-0.5 if scale is None else scale
    qf, kf, vf = (t.reshape(b, tokens, h, d).transpose(1, 2).float() for t in (q, k, v))
    # One (batch, head) at a time: the GPU tests run 8 workers, and a [b, h, tokens, tokens] score
    # tensor of the larger 3-D cases is 5 GiB.
    o = torch.empty_like(qf)
    for i in range(b):
        for j in range(h):
            s = (qf[i, j] @ kf[i, j].transpose(-1, -2)) * scale
            o[i, j] = torch.softmax(s.masked_fill(~mask, float("-inf")), dim=-1) @ vf[i, j]
    return o.transpose(1, 2).reshape(q.shape).to(q.dtype)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def make_qkv(spatial, heads, dim, dtype, seed=0, device="cpu", batch=1):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, *spatial, heads, dim)
    return [torch.randn(shape, generator=g).to(device=device, dtype=dtype) for _ in range(3)]


# (spatial, kernel, dilation, causal): 1D/2D/3D, odd sizes, full-extent windows, dilation, causal.
CASES: list[Case] = [
    ((37,), (7,), (1,), (False,)),
    ((37,), (5,), (3,), (True,)),
    ((11, 14), (3, 5), (1, 2), (False, False)),
    ((11, 14), (11, 14), (1, 1), (False, False)),
    ((13, 12, 17), (3, 5, 7), (1, 1, 1), (False, False, False)),
    ((13, 12, 17), (3, 3, 5), (2, 3, 1), (True, False, False)),
    ((6, 7, 9), (6, 7, 9), (1, 1, 1), (False, False, False)),
    ((9, 10, 8), (3, 2, 4), (3, 2, 1), (False, True, True)),
]
IDS = ["x".join(map(str, c[0])) + f"-k{c[1]}-d{c[2]}-c{''.join('1' if x else '0' for x in c[3])}" for c in CASES]


def test_reference_sees_exactly_k_keys():
    # Guards the reference itself: non-causal windows hold exactly k keys, all in the query's group.
    for length, kernel, dil in [(13, 5, 1), (17, 3, 4), (12, 4, 3)]:
        a = _axis_allowed(length, kernel, dil, False)
        assert a.sum(1).eq(kernel).all()
        for i in range(length):
            assert all(j % dil == i % dil for j in a[i].nonzero().flatten().tolist())
    c = _axis_allowed(9, 4, 1, True)
    assert c.sum(1).tolist() == [1, 2, 3, 4, 4, 4, 4, 4, 4]
    assert not c.triu(1).any()


# ---------------------------------------------------------------- na_tiled_sdpa


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_sdpa(case: Case, dtype: torch.dtype):
    spatial, kernel, dil, causal = case
    q, k, v = make_qkv(spatial, 2, 16, dtype)
    ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal)
    # A tiny chunk budget forces many chunks, so chunk edges and box clipping are exercised.
    out = na_tiled_sdpa.neighborhood_attention(q, k, v, kernel, dil, causal, None, max_chunk_elems=4096)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 5e-3)


def test_tiled_sdpa_scale_and_strided_input():
    q, k, v = make_qkv((10, 12), 3, 8, torch.float32, seed=1)
    qt = q.transpose(1, 2).contiguous().transpose(1, 2)  # same values, non-contiguous strides
    args = ((3, 5), (1, 2), (False, False))
    ref = reference(q, k, v, *args, scale=0.3)
    out = na_tiled_sdpa.neighborhood_attention(qt, k, v, *args, 0.3)
    assert rel_err(out, ref) < 1e-5


# ---------------------------------------------------------------- na_flex

# Tiles chosen to force padding (sizes are not multiples) and groups that straddle no tile.
FLEX_TILES = {
    1: (16,),
    2: (4, 8),
    3: (2, 4, 4),
}


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_flex_eager(case: Case, dtype: torch.dtype):
    spatial, kernel, dil, causal = case
    q, k, v = make_qkv(spatial, 2, 16, dtype, seed=2)
    ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal)
    out = na_flex.neighborhood_attention(q, k, v, kernel, dil, causal, None,
                                         tile=FLEX_TILES[len(spatial)], compiled=False)
    assert out.dtype == dtype and out.shape == q.shape
    assert rel_err(out, ref) < (1e-5 if dtype == torch.float32 else 5e-3)


def _permuted_positions(spatial, axes) -> torch.Tensor:
    """Original flat token index (+1) at each permuted slot; 0 marks a padding slot."""
    pos = torch.arange(1, math.prod(spatial) + 1, dtype=torch.float64).reshape(1, *spatial, 1, 1)
    return na_flex._to_tiles(pos, axes).reshape(-1).long()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_flex_block_mask_structure(case: Case):
    """Every block pair holding an allowed (query, key) is listed; every `full` block is all-allowed.

    Eager flex ignores the block lists (it only evaluates mask_mod), so this checks the lists that
    the compiled GPU kernel relies on, against the reference rule.
    """
    spatial, kernel, dil, causal = case
    tile = FLEX_TILES[len(spatial)]
    bm, axes = na_flex.build_block_mask(spatial, kernel, dil, causal, tile, torch.device("cpu"))
    allowed = None
    n = len(spatial)
    for a, length in enumerate(spatial):
        m = _axis_allowed(length, kernel[a], dil[a], causal[a])
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = length, length
        allowed = m.view(shape) if allowed is None else allowed & m.view(shape)
    tokens = math.prod(spatial)
    allowed = allowed.reshape(tokens, tokens)
    perm = _permuted_positions(spatial, axes)
    real = perm > 0
    idx = (perm - 1).clamp_min(0)
    truth = allowed[idx][:, idx] & real[:, None] & real[None, :]
    vol = math.prod(tile)
    nb = truth.shape[0] // vol
    blocks = truth.view(nb, vol, nb, vol)
    # Padded query rows are don't-care: judge blocks on real query rows only.
    qreal = real.view(nb, vol)
    any_ = (blocks & qreal[:, :, None, None]).any(3).any(1)
    all_ = (blocks | ~qreal[:, :, None, None]).all(3).all(1)
    listed = torch.zeros(nb, nb, dtype=torch.bool)
    full = torch.zeros(nb, nb, dtype=torch.bool)
    kvn, kvi = bm.kv_num_blocks[0, 0], bm.kv_indices[0, 0]
    fkn, fki = bm.full_kv_num_blocks[0, 0], bm.full_kv_indices[0, 0]
    for qb in range(nb):
        listed[qb, kvi[qb, : kvn[qb]].long()] = True
        full[qb, fki[qb, : fkn[qb]].long()] = True
    assert not (listed & full).any()
    assert ((listed | full) >= any_).all(), "a block with allowed pairs is missing"
    assert (all_ >= full).all(), "a block marked full has masked pairs"
    if kernel == spatial and dil == (1,) * len(spatial):
        assert full.any(), "full-extent windows must produce full blocks"


def test_flex_tile_choice_is_valid():
    for spatial, kernel in [((30, 48, 80), (18, 24, 24)), ((40, 96, 96), (11, 11, 11)), ((37,), (7,)), ((3, 2, 5), (3, 2, 5))]:
        tile = na_flex.choose_tile(spatial, kernel, (1,) * len(spatial))
        assert math.prod(tile) == 128 and len(tile) == len(spatial)


def test_flex_tile_cost_orders_measured_tiles():
    # H200, (30, 48, 80) window (18, 24, 24), 24 heads x 128: tile (2, 8, 8) ran 132.7 ms and
    # (32, 2, 2) 147.9 ms (lab/gpu/neighborhood_attention.py); the cost model must rank them the same way and by a
    # similar ratio (0.897 measured).
    args = ((30, 48, 80), (18, 24, 24), (1, 1, 1), (False, False, False))
    ratio = na_flex.tile_cost(*args, (2, 8, 8)) / na_flex.tile_cost(*args, (32, 2, 2))
    assert 0.85 < ratio < 0.95


# ---------------------------------------------------------------- na_triton (CPU interpreter)

# Tiny cases with 16-token tiles so the interpreter stays fast; the last uses the default config.
_INTERP_CASES = [
    ((40,), (7,), (1,), (False,), ((1, 1, 16), (1, 1, 16))),
    ((9, 11), (3, 5), (2, 1), (True, False), ((1, 4, 4), (1, 2, 8))),
    ((5, 6, 7), (3, 3, 5), (1, 2, 1), (True, False, False), ((2, 2, 4), (1, 4, 4))),
    ((6, 5, 9), (5, 3, 3), (1, 1, 3), (False, True, False), None),
]


def _patch_triton_interpreter_index() -> None:
    """Triton 3.6's interpreter turns a scalar into a 1-element array and then calls int() on it
    for range() bounds, which NumPy >= 2.3 refuses; make __index__ take the element explicitly."""
    import triton.runtime.interpreter as ti

    if getattr(ti, "_xbackend_index_patch", False):
        return
    original = ti._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    ti._patch_lang_tensor = patched
    ti._xbackend_index_patch = True


def _config(tiles, tma: bool, shape, kernel, dil, causal, stride=None):
    """The case's tiles (4 warps, 1 stage), or the launch's own choice, with TMA loads on or off."""
    import dataclasses

    from xbackend.kernels import na_triton

    if tiles is None:
        return dataclasses.replace(na_triton.config_for(shape, kernel, dil, causal, stride), tma=tma)
    return na_triton.NAConfig(tiles[0], tiles[1], 4, 1, tma=tma)


def triton_interpreter_errors(tma: bool = False) -> list[tuple[str, float, float]]:
    """(case, dtype, rel error) of na_triton vs the reference; needs TRITON_INTERPRET=1 at import.

    fp16 and fp32 only: the interpreter's bf16 tl.dot is broken (it returns garbage even for a
    plain bf16 x bf16 product), so bf16 is covered by the GPU tests.
    """
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for spatial, kernel, dil, causal, tiles in _INTERP_CASES:
        for dtype in (torch.float16, torch.float32):
            # Batch 2 on the 2-D case exercises the batch stride.
            q, k, v = make_qkv(spatial, 2, 16, dtype, seed=4, batch=2 if len(spatial) == 2 else 1)
            config = _config(tiles, tma, q.shape, kernel, dil, causal)
            ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal)
            out = torch.full_like(q, float("nan"))
            na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, config=config, out=out)
            rows.append((f"{spatial}", str(dtype), rel_err(out, ref)))
    return rows


# Head dims besides 16 (the cases above): 32 is a power of two; 80 and 96 run padded to 128.
_INTERP_HEAD_DIM_CASES = {
    32: [
        ((9, 11), (3, 5), (2, 1), (True, False), ((1, 4, 4), (1, 2, 8))),
        ((6, 5, 9), (5, 3, 3), (1, 1, 3), (False, True, False), None),
    ],
    80: [
        ((40,), (7,), (1,), (False,), ((1, 1, 16), (1, 1, 16))),
        ((9, 11), (3, 5), (2, 2), (False, False), ((1, 4, 4), (1, 2, 8))),  # dilated
        ((9, 11), (4, 5), (1, 1), (True, True), ((1, 4, 4), (1, 4, 4))),  # causal
    ],
    96: [
        ((37,), (5,), (3,), (True,), ((1, 1, 16), (1, 1, 16))),
        ((4, 5, 6), (3, 3, 3), (1, 1, 2), (False, True, False), None),
    ],
}

# Elements per (token, head) row of a gapped tensor: past 128, the padded head dim of 80 and 96.
_GAP_ROW = 144


def gapped(t: torch.Tensor, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(view, buffer): t's values in a view whose (token, head) rows are _GAP_ROW elements apart, the
    elements between them set to ``fill``. The kernel's pad columns of 80 and 96 fall in the gap."""
    buf = torch.full((*t.shape[:-1], _GAP_ROW), fill, dtype=t.dtype, device=t.device)
    buf[..., : t.shape[-1]] = t
    return buf[..., : t.shape[-1]], buf


def triton_interpreter_head_dim_errors(head_dim: int, tma: bool = False) -> list[tuple[str, str, float, bool]]:
    """(case, dtype, rel error, gap untouched) of na_triton at ``head_dim`` vs the reference; needs
    TRITON_INTERPRET=1 at import. q/k/v are gapped with NaN (a read of a pad column poisons the
    output) and the output with a sentinel (a write of one changes it)."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for spatial, kernel, dil, causal, tiles in _INTERP_HEAD_DIM_CASES[head_dim]:
        for dtype in (torch.float16, torch.float32):
            dense = make_qkv(spatial, 2, head_dim, dtype, seed=8)
            config = _config(tiles, tma, dense[0].shape, kernel, dil, causal)
            ref = reference(*(t.double() for t in dense), kernel, dil, causal)
            q, k, v = (gapped(t, float("nan"))[0] for t in dense)
            out, obuf = gapped(torch.full_like(dense[0], float("nan")), 7.0)
            na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, config=config, out=out)
            untouched = bool(obuf[..., head_dim:].eq(7.0).all())
            rows.append((f"{spatial} k{kernel} d{dil} c{causal}", str(dtype), rel_err(out, ref), untouched))
    return rows


# Strided windows: (spatial, kernel, dilation, causal, stride, tiles). Stride = kernel (blocks), a
# stride that does not divide the tile (3 against 4- and 8-wide tiles), with dilation and causal axes.
_INTERP_STRIDE_CASES = [
    ((40,), (8,), (1,), (False,), (8,), ((1, 1, 16), (1, 1, 16))),
    ((40,), (7,), (1,), (True,), (3,), ((1, 1, 16), (1, 1, 16))),
    ((9, 11), (3, 5), (2, 1), (True, False), (2, 3), ((1, 4, 4), (1, 2, 8))),
    ((5, 6, 7), (3, 3, 5), (1, 2, 1), (False, False, True), (3, 1, 5), ((2, 2, 4), (1, 4, 4))),
    ((6, 8, 9), (3, 4, 3), (1, 1, 3), (False, True, False), (3, 4, 2), None),
]


def triton_interpreter_stride_errors(tma: bool = False) -> list[tuple[str, str, float]]:
    """(case, dtype, rel error) of na_triton with strided windows vs the reference; needs
    TRITON_INTERPRET=1 at import."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for spatial, kernel, dil, causal, stride, tiles in _INTERP_STRIDE_CASES:
        for dtype in (torch.float16, torch.float32):
            q, k, v = make_qkv(spatial, 2, 16, dtype, seed=11)
            config = _config(tiles, tma, q.shape, kernel, dil, causal, stride)
            ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal, None, stride)
            out = torch.full_like(q, float("nan"))
            na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=config, out=out)
            rows.append((f"{spatial} k{kernel} d{dil} c{causal} s{stride}", str(dtype), rel_err(out, ref)))
    return rows


def _interpreted(name: str, *args: object) -> list:
    """``name(*args)`` of this module with Triton's interpreter: here when TRITON_INTERPRET=1 (the
    repository conftest sets it on a host without CUDA), else in a fresh process (the interpreter is
    chosen when a kernel is decorated)."""
    return _run_with_interpreter(True, name, *args)


def _compiled(name: str, *args: object) -> list:
    """``name(*args)`` of this module with Triton compiling its kernels (no interpreter): here when
    TRITON_INTERPRET is off, else in a fresh process without it."""
    return _run_with_interpreter(False, name, *args)


def _run_with_interpreter(interpret: bool, name: str, *args: object) -> list:
    import json
    import subprocess
    import sys

    if (os.environ.get("TRITON_INTERPRET") == "1") == interpret:
        return globals()[name](*args)
    code = (
        "import importlib.util, json, sys;"
        f"spec = importlib.util.spec_from_file_location('t', {__file__!r});"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m);"
        f"print(json.dumps(m.{name}(*{args!r})))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_triton_interpreter(tma: bool):
    rows = _interpreted("triton_interpreter_errors", tma)
    assert len(rows) == 2 * len(_INTERP_CASES)
    for case, dtype, err in rows:
        assert err < (1e-5 if dtype == "torch.float32" else 2e-3), (case, dtype, err)


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
@pytest.mark.parametrize("head_dim", sorted(_INTERP_HEAD_DIM_CASES))
def test_triton_interpreter_head_dims(head_dim: int, tma: bool):
    rows = _interpreted("triton_interpreter_head_dim_errors", head_dim, tma)
    assert len(rows) == 2 * len(_INTERP_HEAD_DIM_CASES[head_dim])
    for case, dtype, err, untouched in rows:
        assert err < (1e-5 if dtype == "torch.float32" else 2e-3), (head_dim, case, dtype, err)
        assert untouched, (head_dim, case, dtype, "a store wrote past head_dim")


@pytest.mark.parametrize("tma", [False, True], ids=["pointers", "tma"])
def test_triton_interpreter_strided_windows(tma: bool):
    rows = _interpreted("triton_interpreter_stride_errors", tma)
    assert len(rows) == 2 * len(_INTERP_STRIDE_CASES)
    for case, dtype, err in rows:
        assert err < (1e-5 if dtype == "torch.float32" else 2e-3), (case, dtype, err)


def test_strided_reference_rule_matches_the_op_reference():
    """The literal per-position rule here and the op's vectorised axis_windows agree on every axis
    shape the strided tests use, so each checks the other."""
    from xbackend.ops.neighborhood_attention import axis_windows

    for length in (5, 9, 12, 20):
        for kernel in range(1, min(length, 8) + 1):
            for dil in (1, 2, 3):
                if kernel * dil > length:
                    continue
                for stride in range(1, kernel + 1):
                    for causal in (False, True):
                        idx, ok = axis_windows(length, kernel, dil, causal, torch.device("cpu"), stride)
                        table = torch.zeros(length, length, dtype=torch.bool)
                        rows = torch.arange(length)[:, None].expand_as(idx)
                        table[rows[ok], idx[ok]] = True
                        assert torch.equal(table, _axis_allowed(length, kernel, dil, causal, stride)), \
                            (length, kernel, dil, causal, stride)


def test_visited_pairs_is_the_union_of_each_tiles_windows():
    """visited_pairs (the benchmark's computed-FLOP count) against key boxes built from the op
    reference's windows: per axis and dilation group, each Q tile visits the span of its queries'
    valid keys, rounded up to whole KV blocks, for all its (padded) rows."""
    from xbackend.kernels.na_triton import NAConfig, visited_pairs
    from xbackend.ops.neighborhood_attention import axis_windows

    def expected(spatial, kernel, dil, causal, stride, config):
        pad = 3 - len(spatial)
        total = 1
        for a, (length, ks, d, c, s) in enumerate(zip(spatial, kernel, dil, causal, stride, strict=True)):
            tq, tk = config.q_tile[pad + a], config.kv_tile[pad + a]
            idx, ok = axis_windows(length, ks, d, c, torch.device("cpu"), s)
            per_axis = 0
            for g in range(d):
                queries = list(range(g, length, d))
                for first in range(0, len(queries), tq):
                    keys = torch.cat([idx[i][ok[i]] for i in queries[first : first + tq]]) // d
                    box = int(keys.max() - keys.min()) + 1
                    per_axis += tq * -(-box // tk) * tk
            total *= per_axis
        return total

    cases = [
        ((40,), (7,), (1,), (False,), (1,), NAConfig((1, 1, 16), (1, 1, 16), 4, 1)),
        ((40,), (8,), (1,), (False,), (8,), NAConfig((1, 1, 8), (1, 1, 8), 4, 1)),
        ((9, 11), (3, 5), (2, 1), (True, False), (2, 3), NAConfig((1, 4, 4), (1, 2, 8), 4, 1)),
        ((13, 12, 17), (3, 3, 5), (2, 3, 1), (True, False, False), (3, 2, 5), NAConfig((2, 4, 8), (1, 4, 16), 4, 3)),
        ((30, 48, 80), (18, 24, 24), (1, 1, 1), (False,) * 3, (1, 1, 1), NAConfig((2, 4, 8), (1, 2, 32), 4, 3)),
    ]
    for spatial, kernel, dil, causal, stride, config in cases:
        got = visited_pairs(spatial, kernel, dil, causal, stride, config)
        assert got == expected(spatial, kernel, dil, causal, stride, config), (spatial, kernel, stride)
    # Blocks of 8 with 8-wide tiles: no key the kernel visits is outside its query's window.
    assert visited_pairs((40,), (8,), (1,), (False,), (8,), NAConfig((1, 1, 8), (1, 1, 8), 4, 1)) == 40 * 8


def test_triton_config_choice():
    from xbackend.kernels.na_triton import choose_config

    # The exact count's picks, measured fastest on the H200 (lab/gpu/na_tile_model.py --time).
    video = choose_config((30, 48, 80), (18, 24, 24), (1, 1, 1), 128)
    assert (video.q_tile, video.kv_tile) == ((2, 8, 4), (2, 8, 4))
    assert choose_config((16, 64, 112), (9, 15, 15), (1, 1, 1), 128).q_tile == (8, 4, 2)
    assert choose_config((40, 96, 96), (11, 11, 11), (1, 1, 1), 64).kv_tile == (2, 2, 16)
    # A problem smaller than one tile still gets a config (padded), never an error.
    tiny = choose_config((1, 2, 3), (1, 1, 3), (1, 1, 1), 64)
    assert math.prod(tiny.q_tile) == 64 and math.prod(tiny.kv_tile) == 64
    # Stride = kernel size (blocked attention): each Q tile sits inside one block, so its key box is the
    # block itself and every key the kernel visits is in every query's window.
    from xbackend.kernels.na_triton import leader_span

    spatial, kernel = (32, 48, 80), (8, 16, 16)
    blocked = choose_config(spatial, kernel, (1, 1, 1), 128, stride=kernel)
    assert all(k % t == 0 for k, t in zip(kernel, blocked.q_tile, strict=True))
    assert all(k % t == 0 for k, t in zip(kernel, blocked.kv_tile, strict=True))
    assert [min(k + leader_span(t, k), n) for k, t, n in zip(kernel, blocked.q_tile, spatial, strict=True)] == [8, 16, 16]
    assert [leader_span(t, 1) for t in (1, 2, 16)] == [0, 1, 15]  # stride 1: the model of plain NA
    assert leader_span(2, 3) == 3 and leader_span(4, 4) == 0 and leader_span(8, 3) == 9
    # Any stride: the pick computes the fewest query-key pairs of all 64 x 64 tile shapes.
    from xbackend.kernels.na_triton import NAConfig, visited_pairs

    triples = [(1 << a, 1 << b, 1 << (6 - a - b)) for a in range(7) for b in range(7 - a)]
    for spatial, kernel, stride, causal in [((1, 128, 128), (1, 13, 13), (1, 13, 13), (False,) * 3),
                                            ((16, 64, 112), (9, 15, 15), (3, 5, 5), (True, False, False)),
                                            ((30, 48, 80), (18, 24, 24), (2, 4, 8), (False,) * 3),
                                            ((30, 48, 80), (18, 24, 24), (1, 1, 1), (False,) * 3),
                                            ((1, 128, 128), (1, 13, 13), (1, 1, 1), (False,) * 3)]:
        pick = choose_config(spatial, kernel, (1, 1, 1), 128, stride=stride, is_causal=causal)
        count = functools.partial(visited_pairs, spatial, kernel, (1, 1, 1), causal, stride)
        assert count(pick) == min(count(NAConfig(tq, tk, 4, 3)) for tq in triples for tk in triples), spatial
    # 80 and 96 run padded to 128 (128's shared memory and tensor-core work): they get 128's config.
    for args in [((30, 48, 80), (18, 24, 24), (1, 1, 1)), ((21, 30, 22), (5, 7, 3), (2, 3, 1))]:
        for head_dim in (80, 96):
            assert choose_config(*args, head_dim) == choose_config(*args, 128)


def test_triton_supports_reasons():
    from xbackend.kernels import na_triton

    q = torch.zeros(1, 4, 4, 2, 64, dtype=torch.bfloat16)
    assert "CUDA" in na_triton.supports(q, q, q, (3, 3), (1, 1), (False, False), None)
    args = ((3, 3), (1, 1), (False, False), None)
    for head_dim in (32, 64, 80, 96, 128):
        m = torch.empty(1, 4, 4, 2, head_dim, dtype=torch.bfloat16, device="meta")
        assert na_triton.supports(m, m, m, *args) is None, head_dim
    for head_dim in (16, 48, 112, 256):
        m = torch.empty(1, 4, 4, 2, head_dim, dtype=torch.float16, device="meta")
        assert na_triton.supports(m, m, m, *args) == f"head_dim {head_dim} not in (32, 64, 80, 96, 128)"


# ---------------------------------------------------------------- GPU


def _gpu_cases():
    return [
        ((257,), (17,), (1,), (False,)),
        ((33, 47), (7, 9), (1, 2), (False, True)),
        ((13, 12, 17), (13, 12, 17), (1, 1, 1), (False, False, False)),
        ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False)),
    ]


def _check_triton_gpu(head_dim: int, dtype: torch.dtype) -> None:
    from xbackend.kernels import na_triton

    for spatial, kernel, dil, causal in _gpu_cases():
        q, k, v = make_qkv(spatial, 3, head_dim, dtype, seed=5, device="cuda")
        assert na_triton.supports(q, k, v, kernel, dil, causal, None) is None
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal)
        out = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None)
        assert rel_err(out, ref) < 5e-3, (spatial, kernel, dil, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_gpu(head_dim: int, dtype: torch.dtype):
    _check_triton_gpu(head_dim, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 80, 96])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_gpu_head_dims(head_dim: int, dtype: torch.dtype):
    _check_triton_gpu(head_dim, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [32, 80, 96])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_gpu_head_dims_gapped(head_dim: int, dtype: torch.dtype):
    """Rows strided past head_dim with NaN between them in q/k/v and a sentinel in out: the pad columns
    of 80 and 96 (up to 128) are neither read nor written."""
    from xbackend.kernels import na_triton

    for spatial, kernel, dil, causal in _gpu_cases():
        dense = make_qkv(spatial, 3, head_dim, dtype, seed=9, device="cuda", batch=2)
        ref = reference(*(t.float() for t in dense), kernel, dil, causal)
        q, k, v = (gapped(t, float("nan"))[0] for t in dense)
        out, obuf = gapped(torch.full_like(dense[0], float("nan")), 7.0)
        assert na_triton.supports(q, k, v, kernel, dil, causal, None) is None
        na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, out=out)
        assert rel_err(out, ref) < 5e-3, (spatial, kernel, dil, causal)
        assert obuf[..., head_dim:].eq(7.0).all(), (spatial, kernel, dil, causal, "a store wrote past head_dim")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_triton_gpu_strided_windows(head_dim: int, dtype: torch.dtype):
    from xbackend.kernels import na_triton

    cases = [
        ((256,), (16,), (1,), (False,), (16,)),  # blocks
        ((33, 47), (7, 9), (1, 2), (False, True), (3, 4)),
        ((13, 12, 17), (5, 4, 7), (1, 1, 1), (False, False, False), (5, 4, 7)),  # blocks, ragged axes
        ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False), (2, 7, 3)),
        ((16, 32, 32), (8, 8, 8), (1, 1, 1), (False, False, False), (4, 4, 8)),
    ]
    for spatial, kernel, dil, causal, stride in cases:
        q, k, v = make_qkv(spatial, 3, head_dim, dtype, seed=12, device="cuda")
        assert na_triton.supports(q, k, v, kernel, dil, causal, None, stride) is None
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
        out = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride)
        assert rel_err(out, ref) < 5e-3, (spatial, kernel, dil, causal, stride)


@pytest.mark.gpu
def test_triton_gpu_strided_inputs():
    from xbackend.kernels import na_triton

    spatial, kernel, dil, causal = (9, 14, 11), (3, 5, 7), (2, 1, 1), (False, True, False)
    base = torch.randn(1, *spatial, 3, 2, 64, device="cuda", dtype=torch.bfloat16)
    q, k, v = base[..., 0, :], base[..., 1, :], torch.randn(1, *spatial, 3, 64, device="cuda").bfloat16()
    ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal)
    assert rel_err(na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, 0.2 * 8), ref) > 0.01
    assert rel_err(na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None), ref) < 5e-3


@pytest.mark.gpu
def test_flex_compiled_gpu():
    for spatial, kernel, dil, causal in _gpu_cases()[1:]:
        q, k, v = make_qkv(spatial, 2, 64, torch.bfloat16, seed=6, device="cuda")
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal)
        out = na_flex.neighborhood_attention(q, k, v, kernel, dil, causal, None)
        assert rel_err(out, ref) < 5e-3, (spatial, kernel, dil, causal)


@pytest.mark.gpu
def test_tiled_sdpa_gpu():
    for spatial, kernel, dil, causal in _gpu_cases():
        q, k, v = make_qkv(spatial, 2, 64, torch.bfloat16, seed=7, device="cuda")
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal)
        out = na_tiled_sdpa.neighborhood_attention(q, k, v, kernel, dil, causal, None)
        assert rel_err(out, ref) < 5e-3, (spatial, kernel, dil, causal)


@pytest.mark.parametrize("case", CASES[2:6], ids=IDS[2:6])
def test_flex_packed_and_arithmetic_masks_agree(case: Case):
    spatial, kernel, dil, causal = case
    tile = FLEX_TILES[len(spatial)]
    axes = [na_flex_tiles.axis(L, k, d, c, t) for L, k, d, c, t in zip(spatial, kernel, dil, causal, tile, strict=True)]
    tokens = math.prod(ax.padded for ax in axes)
    packed = na_flex._mask_mod_for(axes, torch.device("cpu"), packed=True)
    arith = na_flex._mask_mod_for(axes, torch.device("cpu"), packed=False)
    q_idx = torch.arange(tokens)[:, None]
    kv_idx = torch.arange(tokens)[None, :]
    zero = torch.zeros((), dtype=torch.long)
    assert torch.equal(packed(zero, zero, q_idx, kv_idx), arith(zero, zero, q_idx, kv_idx))


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_outputs_are_contiguous():
    """The op's fake impl promises a contiguous output; a compiled caller asserts those strides."""
    q, k, v = make_qkv((5, 6, 7), 2, 16, torch.float32)  # not tile multiples: flex slices padding off
    args = ((3, 3, 3), (1, 1, 1), (False, False, False), None)
    assert na_flex.neighborhood_attention(q, k, v, *args, tile=(2, 4, 4), compiled=False).is_contiguous()
    assert na_tiled_sdpa.neighborhood_attention(q, k, v, *args).is_contiguous()



@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize(
    ("spatial", "kernel", "dil", "causal", "stride"),
    [((20,), (5,), (1,), (False,), (3,)), ((9, 12), (3, 4), (2, 1), (True, False), (2, 4)),
     ((5, 6, 7), (3, 3, 3), (1, 1, 1), (False, False, True), (3, 2, 3))],
)
def test_strided_windows_in_tiled_sdpa_and_flex(spatial, kernel, dil, causal, stride):
    from xbackend.kernels import na_triton
    from xbackend.ops.neighborhood_attention import reference as op_reference

    q, k, v = make_qkv(spatial, 2, 16, torch.float32, seed=3)
    ref = op_reference(q.double(), k.double(), v.double(), kernel, dil, causal, None, stride)
    tiled = na_tiled_sdpa.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride)
    flex = na_flex.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride,
                                          tile=FLEX_TILES[len(spatial)], compiled=False)
    assert rel_err(tiled, ref) < 1e-5 and rel_err(flex, ref) < 1e-5
    half = torch.empty(*q.shape[:-1], 64, dtype=torch.bfloat16, device="meta")
    assert na_triton.supports(half, half, half, kernel, dil, causal, None, stride) is None


def test_tma_tiles_where_they_measured_faster_and_the_layout_allows():
    from xbackend.kernels import na_triton
    from xbackend.kernels.na_triton_config import tma_pays

    def cfg(shape, kernel):
        n = len(kernel)
        return na_triton.config_for(shape, kernel, (1,) * n, (False,) * n)

    assert cfg((1, 30, 48, 80, 24, 128), (18, 24, 24)).tma and cfg((1, 20, 48, 48, 4, 80), (11, 11, 11)).tma
    assert cfg((1, 40, 96, 96, 4, 64), (11, 11, 11)).tma  # head_dim 64: 4-8% faster on 3-D tiles
    assert not cfg((1, 20, 48, 48, 16, 32), (11, 11, 11)).tma  # head_dim 32: no faster
    assert not cfg((2, 128, 128, 16, 128), (13, 13)).tma  # 2-D: slower
    # The score-bound shift goes with the TMA tiles (measured faster on the same 3-D cases, slower on 2-D).
    assert cfg((1, 30, 48, 80, 24, 128), (18, 24, 24)).shift and not cfg((2, 128, 128, 16, 128), (13, 13)).shift
    assert not tma_pays((1, 48, 80), 128)
    x = torch.zeros(2, 4, 4, 4, 2, 80, dtype=torch.float16)
    assert na_triton.tma_layout_ok(x, x)
    assert not na_triton.tma_layout_ok(torch.zeros(x.numel() + 1, dtype=x.dtype)[1:].view(x.shape))  # 2 B off
    assert not na_triton.tma_layout_ok(torch.zeros(2, 4, 4, 4, 2, 84, dtype=x.dtype)[..., :80])  # 168-byte rows


def triton_interpreter_shift_errors() -> list[tuple[str, float, float]]:
    """(case, shift error, online error) against the reference, fp32 (the interpreter's bf16 dot is
    broken): a tight bound (the shift launch computes every tile), a loose one (q x 60: every tile
    flagged, the online launch), both in one call (a loose slab of queries, and a second head whose
    keys are 40x larger: its tiles alone go online, so a wrong per-head key norm shows), shorter
    dilation groups (programs with nothing to do), and scales 0 and < 0."""
    import dataclasses

    from xbackend.kernels import na_triton

    rows = []
    cases = [((6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, False, None),
             ((6, 9, 10), (3, 5, 4), (1, 1, 2), (True, False, False), True, None),
             ((6, 9, 17), (3, 5, 4), (1, 1, 2), (False,) * 3, True, ((2, 4, 8), (2, 4, 8)))]
    for spatial, kernel, dil, causal, tma, tiles in cases:
        for q_scale, mixed, scale in ((1.0, False, None), (60.0, False, None), (1.0, True, None),
                                      (1.0, False, 0.0), (1.0, False, -0.1)):
            q, k, v = make_qkv(spatial, 2, 64, torch.float32, seed=21)
            q = q * q_scale
            if mixed:
                q[:, :2] *= 60.0  # the first two frames' tiles get loose bounds
                k[..., 1, :] *= 40.0  # head 1's keys: every tile of that head goes online
            ref = reference(q.double(), k.double(), v.double(), kernel, dil, causal, scale)
            cfg = (na_triton.NAConfig(tiles[0], tiles[1], 4, 1, tma=tma) if tiles else
                   dataclasses.replace(na_triton.config_for(q.shape, kernel, dil, causal), tma=tma, num_stages=1))
            got = [na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, scale,
                                                    config=dataclasses.replace(cfg, shift=on)) for on in (True, False)]
            rows.append((f"{spatial} dil {dil} causal {causal} q x {q_scale} mixed {mixed} scale {scale}",
                         rel_err(got[0], ref), rel_err(got[1], ref)))
    # fp16 never takes the shift: a shift config gives the online walk's result bit for bit.
    q, k, v = make_qkv((6, 9, 10), 2, 64, torch.float16, seed=23)
    cfg = na_triton.config_for(q.shape, (3, 5, 4), (1,) * 3, (False,) * 3)
    outs = [na_triton.neighborhood_attention(q, k, v, (3, 5, 4), (1,) * 3, (False,) * 3, None,
                                             config=dataclasses.replace(cfg, shift=on)) for on in (True, False)]
    rows.append(("fp16, shift config == online", 0.0 if torch.equal(outs[0], outs[1]) else 1.0, 0.0))
    # An inf key makes every bound of its head inf: all of that head's tiles go online, bit for bit the
    # online walk's result (NaN where a window holds the inf key, as the reference has); the other head
    # stays on the shift and finite. A NaN key likewise (its head's key norm counts as +inf).
    q, k, v = make_qkv((6, 9, 10), 2, 64, torch.float32, seed=24)
    cfg = na_triton.config_for(q.shape, (3, 5, 4), (1,) * 3, (False,) * 3)
    for bad in ("inf", "NaN"):
        k[0, 1, 2, 3, 0] = float(bad)
        outs = [na_triton.neighborhood_attention(q, k, v, (3, 5, 4), (1,) * 3, (False,) * 3, None,
                                                 config=dataclasses.replace(cfg, shift=on)) for on in (True, False)]
        head0 = [o[..., 0, :].nan_to_num(7.0) for o in outs]
        same = (torch.equal(*head0) and bool(outs[1][..., 0, :].isnan().any())
                and bool(outs[0][..., 1, :].isfinite().all()))
        rows.append((f"{bad} key: its head online bit for bit", 0.0 if same else 1.0,
                     rel_err(outs[0][..., 1, :], outs[1][..., 1, :])))
    return rows


def test_triton_interpreter_shift_and_redo_launches():
    rows = _interpreted("triton_interpreter_shift_errors")
    assert len(rows) == 18
    for case, shift_err, online_err in rows:
        assert shift_err < 1e-5 and online_err < 1e-5, (case, shift_err, online_err)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_gpu_shift_and_redo_launches(head_dim: int):
    """The shift walk (tight bound) and the online walk it hands loose tiles to (q x 60), TMA and
    pointer tiles, against the fp32 reference; fp16 never takes the shift."""
    import dataclasses

    from xbackend.kernels import na_triton

    for spatial, kernel, dil, causal in [((13, 12, 17), (5, 7, 9), (1, 1, 1), (False,) * 3),
                                         ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False))]:
        for q_scale in (1.0, 60.0):
            q, k, v = make_qkv(spatial, 3, head_dim, torch.float32, seed=22, device="cuda", batch=2)
            q, k, v = (q * q_scale).bfloat16(), k.bfloat16(), v.bfloat16()
            ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, None)
            base = na_triton.config_for(q.shape, kernel, dil, causal)
            for tma in (True, False):
                cfg = dataclasses.replace(base, tma=tma, shift=True)
                got = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, config=cfg)
                assert rel_err(got, ref) < 5e-3, (spatial, q_scale, tma)
            half = [t.half() for t in (q, k, v)] if q_scale == 1.0 else None
            if half:
                got = na_triton.neighborhood_attention(*half, kernel, dil, causal, None, config=base)
                assert rel_err(got, ref) < 5e-3, (spatial, "fp16")


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_gpu_pipelined_shift_launch(head_dim: int, monkeypatch):
    """The pipelined shift launches against the fp32 reference, within the Triton shift launch's
    bound, on walks of 1 to many blocks, dilation,
    causal axes, strided windows, partial tiles, windows much larger than the tile, loose-bound tiles
    handed to the online launch (q x 60) and a negative scale: na_gluon at 64- and 128-query tiles,
    na_gluon_ws (warp-specialized) at 128."""
    import dataclasses

    from xbackend.kernels import na_triton

    cases = [((13, 12, 17), (5, 7, 9), (1, 1, 1), (False,) * 3, None, None),
             ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False), None, None),
             ((9, 20, 24), (3, 9, 9), (1, 1, 1), (False,) * 3, (1, 3, 3), None),
             ((4, 8, 8), (3, 3, 3), (1, 1, 1), (False,) * 3, None, -0.05),
             ((2, 8, 4), (1, 1, 1), (1, 1, 1), (False,) * 3, None, None),
             # a window much larger than the tile, and causal
             ((10, 24, 24), (8, 16, 16), (1, 1, 1), (False,) * 3, None, None),
             ((10, 24, 24), (8, 16, 16), (1, 1, 1), (True, False, False), None, -0.1)]
    for spatial, kernel, dil, causal, stride, scale in cases:
        for q_scale in (1.0, 60.0):
            q, k, v = make_qkv(spatial, 3, head_dim, torch.float32, seed=31, device="cuda", batch=2)
            q, k, v = (q * q_scale).bfloat16(), k.bfloat16(), v.bfloat16()
            ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, scale, stride=stride)
            base = na_triton.config_for(q.shape, kernel, dil, causal, stride)
            assert base.shift and base.tma
            tall = na_triton.choose_config(spatial, kernel, dil, head_dim, block_m=128, stride=stride or (1, 1, 1),
                                           is_causal=causal)
            tall = dataclasses.replace(base, pipelined=True, q_tile=tall.q_tile, kv_tile=tall.kv_tile)
            # 64-query tiles; 128-query tiles warp-specialized and as one 8-warp program.
            for cfg, ws in ((dataclasses.replace(base, pipelined=True), False), (tall, True), (tall, False)):
                assert na_triton.na_gluon.gluon_supports(head_dim, cfg.q_tile, cfg.kv_tile), cfg
                monkeypatch.setattr(na_triton, "WARP_SPECIALIZED", ws)
                got = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, scale, stride, config=cfg)
                assert rel_err(got, ref) < 5e-3, (spatial, kernel, q_scale, cfg.q_tile, ws, rel_err(got, ref))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_gpu_schedules_bit_identical(head_dim: int, monkeypatch):
    """Every schedule option of the pipelined kernel gives the shipped option's output to the last bit,
    and that is na_triton's shift launch's output."""
    import dataclasses

    from xbackend.kernels import na_gluon, na_triton

    spatial, kernel = (10, 24, 24), (8, 16, 16)
    q, k, v = make_qkv(spatial, 2, head_dim, torch.bfloat16, seed=32, device="cuda")
    cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, (False,) * 3), pipelined=True)
    shipped = dict(na_gluon.OPTIONS[head_dim])
    outs = []
    for change in ({}, {"Q_REGS": not shipped["Q_REGS"]}, {"DEEP": not shipped["DEEP"]}):
        monkeypatch.setitem(na_gluon.OPTIONS, head_dim, {**shipped, **change})
        outs.append(na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg))
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    # The same walk in the same order as na_triton's shift launch.
    triton_shift = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None,
                                                    config=dataclasses.replace(cfg, pipelined=False))
    assert torch.equal(outs[0], triton_shift), (outs[0].float() - triton_shift.float()).abs().max()


def ws_sass_counts(head_dim: int) -> list:
    """[kernels launched, compile error, spill bytes, registers, HGMMAs, waits for zero outstanding] of
    na_gluon_ws's kernel compiled for sm90 by this host's Triton (kernels compiled, not interpreted)."""
    import dataclasses
    import re
    import subprocess
    import tempfile

    from xbackend.fleet import _capture, _resources, _worker
    from xbackend.kernels import na_triton

    spatial, kernel = (10, 24, 24), (8, 16, 16)
    tall = na_triton.choose_config(spatial, kernel, (1,) * 3, head_dim, block_m=128)
    cfg = dataclasses.replace(tall, tma=True, shift=True, pipelined=True)

    def make(dtype, device):
        return tuple(torch.empty((1, *spatial, 2, head_dim), dtype=dtype, device=device) for _ in range(3))

    def fn(q, k, v):
        return na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg)

    _, launches = _capture.capture("sm90", "cuda", fn, make, torch.bfloat16)
    ws = next((x for x in launches if x.spec.name == "na_fwd_ws_kernel"), None)
    if ws is None:
        return [[x.spec.name for x in launches], "no na_fwd_ws_kernel launch", 0, 0, 0, 0]
    res = _worker.compile_triton(ws.spec, "sm90", stages=("cubin",))
    if res.error is not None:
        return [[x.spec.name for x in launches], res.error, 0, 0, 0, 0]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(res.extra["cubin"])
        f.flush()
        sass = subprocess.run([_resources.nvidia_tool("nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
    return [[x.spec.name for x in launches], None, res.spill_bytes, res.registers,
            len(re.findall(r"\bHGMMA\.", sass)), len(re.findall(r"WARPGROUP\.DEPBAR\.LE gsb0, 0x0", sass))]


@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_warp_specialized_compiles_pipelined_for_sm90(head_dim: int):
    """The warp-specialized kernel compiled for sm90 by this host's Triton (no GPU; a fresh process
    without the interpreter): no spills, and its wgmmas left asynchronous. ptxas serializes every
    wgmma of a kernel whose threads are capped below what the consumers need (a separate load warp
    caps them at 168 registers); then each HGMMA is followed by a wait for zero outstanding."""
    from xbackend.fleet import _resources

    if _resources.nvidia_tool("nvdisasm") is None:
        pytest.skip("no nvdisasm beside this Triton")
    names, error, spills, registers, hgmma, waits = _compiled("ws_sass_counts", head_dim)
    # The shift's key-norm pass, the warp-specialized shift launch, the online launch for flagged tiles
    # and the safe walk for tiles a walk left with an inf or a NaN.
    assert names == ["_max_key_norm_kernel", "na_fwd_ws_kernel", "_na_fwd_kernel", "_na_fwd_kernel"] \
        and error is None, (names, error)
    assert spills == 0 and 0 < registers <= 255, (spills, registers)
    assert hgmma > 0 and waits < hgmma / 2, (hgmma, waits)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gluon_gpu_warp_specialized_bit_identical(head_dim: int, monkeypatch):
    """At 128-query tiles the warp-specialized kernel gives na_gluon's 8-warp kernel's output and
    na_triton's shift launch's, to the last bit (the same walk per query row), with and without
    loose-bound tiles (q x 60, left to the online launch)."""
    import dataclasses

    from xbackend.kernels import na_triton

    for spatial, kernel in (((10, 24, 24), (8, 16, 16)), ((7, 20, 28), (5, 9, 11))):
        for q_scale in (1.0, 60.0):
            q, k, v = make_qkv(spatial, 2, head_dim, torch.float32, seed=33, device="cuda")
            q, k, v = (q * q_scale).bfloat16(), k.bfloat16(), v.bfloat16()
            tall = na_triton.choose_config(spatial, kernel, (1,) * 3, head_dim, block_m=128)
            cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, (False,) * 3),
                                      q_tile=tall.q_tile, kv_tile=tall.kv_tile, pipelined=True)
            outs = []
            for ws in (True, False):
                monkeypatch.setattr(na_triton, "WARP_SPECIALIZED", ws)
                outs.append(na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None,
                                                             config=cfg))
            outs.append(na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None,
                                                         config=dataclasses.replace(cfg, pipelined=False)))
            for o in outs[1:]:
                assert torch.equal(outs[0], o), (spatial, q_scale, (outs[0].float() - o.float()).abs().max())


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_triton_gpu_runs_on_the_tensors_device():
    """Tensors on the second GPU while the first is current: the key-norm pass and both shift
    launches run on the tensors' device and match the same call on the first GPU bit for bit."""
    from xbackend.kernels import na_triton

    q, k, v = make_qkv((10, 24, 24), 2, 128, torch.bfloat16, seed=41, device="cuda:0")
    args = ((8, 16, 16), (1,) * 3, (False,) * 3, None)
    with torch.cuda.device(0):
        here = na_triton.neighborhood_attention(q, k, v, *args)
        there = na_triton.neighborhood_attention(*(t.to("cuda:1") for t in (q, k, v)), *args)
    assert there.device == torch.device("cuda", 1) and torch.equal(here, there.to("cuda:0"))


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_gpu_tma_square_blocks(head_dim: int):
    """KV blocks of as many keys as head_dim columns (64 x 64, 128 x 128) through TMA tiles: the block
    shapes whose V load, placed after the q.k dot, once read wrong data on the H200 (Triton 3.6)."""
    from xbackend.kernels import na_triton

    spatial, kernel = (10, 24, 24), (5, 7, 7)
    q, k, v = make_qkv(spatial, 2, head_dim, torch.bfloat16, seed=13, device="cuda")
    ref = reference(q.float(), k.float(), v.float(), kernel, (1,) * 3, (False,) * 3, None)
    blocks = [(2, 2, 16), (4, 4, 4), (1, 4, 16)] if head_dim == 64 else [(1, 4, 32), (2, 2, 32), (2, 4, 16)]
    for kv_tile in blocks:
        cfg = na_triton.NAConfig((2, 4, 8), kv_tile, 4, 3, tma=True)
        got = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg)
        assert rel_err(got, ref) < 5e-3, kv_tile


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 80, 128])
def test_triton_gpu_tma_and_pointer_tiles_agree(head_dim: int):
    """3-D windows (dilated, causal, strided) through the TMA tiles and the pointer tiles of one config:
    both within the op's tolerance; a q one element off alignment takes the pointer tiles."""
    import dataclasses

    from xbackend.kernels import na_triton

    for spatial, kernel, dil, causal, stride in [((13, 12, 17), (5, 7, 9), (1, 1, 1), (False,) * 3, (1, 1, 1)),
                                                 ((21, 30, 22), (5, 7, 3), (2, 3, 1), (True, False, False), (1, 1, 1)),
                                                 ((16, 24, 40), (6, 8, 8), (1, 1, 1), (False,) * 3, (2, 4, 8))]:  # fmt: skip
        q, k, v = make_qkv(spatial, 3, head_dim, torch.bfloat16, seed=12, device="cuda", batch=2)
        ref = reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
        cfg = na_triton.config_for(q.shape, kernel, dil, causal, stride)
        assert cfg.tma
        got_tma = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, config=cfg)
        got_ptr = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride,
                                                   config=dataclasses.replace(cfg, tma=False))  # fmt: skip
        assert rel_err(got_tma, ref) < 5e-3 and rel_err(got_ptr, ref) < 5e-3, (spatial, kernel)
        off = torch.empty(q.numel() + 1, dtype=q.dtype, device="cuda")[1:].view(q.shape)
        off.copy_(q)
        assert not na_triton.tma_layout_ok(off)
        got_off = na_triton.neighborhood_attention(off, k, v, kernel, dil, causal, None, stride, config=cfg)
        assert rel_err(got_off, ref) < 5e-3, (spatial, kernel)


def test_host_descriptor_and_redo_chunk_rules(monkeypatch):
    """Which calls take the launch's TMA descriptors, and how many tiles a REDO program takes."""
    from xbackend.kernels import na_triton

    monkeypatch.setattr(na_triton, "REDO_CHUNK_MAX", 8)

    one = torch.empty(1, 4, 6, 8, 3, 64, dtype=torch.bfloat16)
    assert na_triton.host_descriptors_ok((1, 1, 1), 64, one, one)
    assert not na_triton.host_descriptors_ok((1, 1, 2), 64, one)  # a dilation group is its own sub-grid
    assert na_triton.host_descriptors_ok((1, 1, 1), 64, torch.empty(2, 4, 6, 8, 3, 64))  # batch: its own axis
    padded = torch.empty(1, 4, 6, 8, 3, 80)
    assert not na_triton.host_descriptors_ok((1, 1, 1), 80, padded)  # a 128-wide box reads the next head
    heads_apart = torch.empty(1, 3, 4, 6, 8, 64).permute(0, 2, 3, 4, 1, 5)  # heads a volume apart
    assert not na_triton.host_descriptors_ok((1, 1, 1), 64, heads_apart)
    assert na_triton.host_descriptors_ok((1, 1, 1), 64, torch.empty(1, 4, 6, 8, 1, 64))
    floor = na_triton.REDO_MIN_PROGRAMS
    assert [na_triton.redo_chunk(n) for n in (1, 2 * floor - 1, 2 * floor, 4 * floor, 23040, 10**7)] == [1, 1, 2, 4, 8, 8]


def launch_form_outputs(device: str = "cpu", dtype: str = "float32", head_dim: int = 16) -> list[list]:
    """(case, host == in-kernel descriptors, chunked == one-tile REDO programs, rel error) for calls
    whose loose-bound tiles (the first frames' queries x 60) go to the REDO launch; batch 2 on the
    strided case (a box past one batch's last frame must read zeros, not the next batch's keys). On
    the CPU it needs TRITON_INTERPRET=1 at import."""
    import dataclasses

    if device == "cpu":
        _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for spatial, kernel, causal, stride, batch in [((5, 6, 9), (3, 3, 4), (False,) * 3, (1, 1, 1), 1),
                                                   ((6, 8, 12), (3, 4, 6), (True, False, False), (3, 2, 2), 2)]:  # fmt: skip
        q, k, v = make_qkv(spatial, 2, head_dim, torch.float32, seed=31, device=device, batch=batch)
        q[:, :2] *= 60.0
        if batch > 1:
            k[1, 0] = float("inf")  # batch 1's first frame: batch 0's boxes past its end must not see it
        q, k, v = (t.to(getattr(torch, dtype)) for t in (q, k, v))
        ref = reference(q.double(), k.double(), v.double(), kernel, (1,) * 3, causal, None, stride)
        cfg = na_triton.config_for(q.shape, kernel, (1,) * 3, causal, stride)
        cfg = dataclasses.replace(cfg, tma=True, shift=True, pipelined=False)
        if device == "cpu":
            cfg = dataclasses.replace(cfg, num_stages=1)
        assert na_triton.host_descriptors_ok((1, 1, 1), head_dim, q, k, v)
        outs = {}
        names = ("HOST_DESCRIPTORS", "REDO_CHUNK_MAX", "REDO_MIN_PROGRAMS")
        saved = [getattr(na_triton, n) for n in names]
        try:
            # (host descriptors, REDO_CHUNK_MAX, REDO_MIN_PROGRAMS): one-tile REDO programs but for "chunked".
            for name, switches in (("host", (True, 1, 1)), ("in-kernel", (False, 1, 1)), ("chunked", (True, 8, 1))):
                for n, value in zip(names, switches, strict=True):
                    setattr(na_triton, n, value)
                outs[name] = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, causal, None, stride,
                                                              config=cfg)
        finally:
            for n, value in zip(names, saved, strict=True):
                setattr(na_triton, n, value)
        host, same = outs["host"], (lambda a, b: torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0)))
        # Batch 0 against the reference; NaN exactly where the reference has it (batch 1's inf keys).
        err = rel_err(host[:1], ref[:1]) if torch.equal(host.isnan(), ref.isnan()) else float("inf")
        rows.append([f"{spatial} k{kernel} c{causal} s{stride} batch {batch}", same(host, outs["in-kernel"]),
                     same(host, outs["chunked"]), err])
    return rows


def test_triton_interpreter_launch_forms():
    for case, same_desc, same_chunk, err in _interpreted("launch_form_outputs"):
        assert same_desc and same_chunk and err < 1e-5, (case, same_desc, same_chunk, err)


@pytest.mark.gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_triton_gpu_launch_forms_bit_identical(head_dim: int):
    """On the GPU, bf16: the launch's TMA descriptors against descriptors built in every program, and
    REDO programs of several tiles against one tile each, bit for bit, within the op's tolerance."""
    for case, same_desc, same_chunk, err in launch_form_outputs("cuda", "bfloat16", head_dim):
        assert same_desc and same_chunk and err < 5e-3, (case, same_desc, same_chunk, err)
