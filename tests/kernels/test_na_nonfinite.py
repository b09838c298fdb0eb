"""A non-finite value in V reaches exactly the queries whose window holds its key, in every NA impl.

The op's reference gathers each query's own window, so a key outside a query's window never meets that
query's probabilities. The fused kernels multiply a tile's whole key box (p = 0 for keys outside a
query's window) and SDPA / flex multiply every key of their box or block: 0 * inf would be NaN there.
Each impl must give NaN, +inf and -inf at exactly the reference's positions (the guard's tolerance rule:
non-finite values where the reference has them, finite elsewhere) and the reference's values elsewhere.

CPU: na_triton under Triton's interpreter (its online launch, its shift launch on pointer and TMA tiles,
loose-bound tiles through the online redo, REDO programs of several tiles, a negative scale, a padded
head dim), na_tiled_sdpa and eager na_flex. GPU: na_sm90, na_gluon (64- and 128-query tiles), na_triton
forced and through ``get_op``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import subprocess
import sys
import warnings

import pytest
import torch
from test_na_kernels import _axis_allowed, _patch_triton_interpreter_index, make_qkv

from xbackend.kernels import na_flex, na_tiled_sdpa
from xbackend.ops.neighborhood_attention import reference as op_reference

# (tensor, value, batch, token (spatial index), head, column) to poison: V's infinities and NaN, a +inf
# and a -inf key of V close enough that some windows hold both (NaN there: +inf + -inf), and an
# infinite key (its score is infinite: NaN rows where a window holds it, as the reference's softmax).
_POISON = {
    "+inf": [("v", float("inf"), 0, (2, 4, 5), 1, 3)],
    "-inf": [("v", float("-inf"), 0, (0, 8, 9), 0, 0)],
    "NaN": [("v", float("nan"), 0, (5, 0, 2), 1, 7)],
    "+inf and -inf": [("v", float("inf"), 0, (3, 4, 4), 0, 5), ("v", float("-inf"), 0, (3, 5, 6), 0, 5)],
    "k +inf": [("k", float("inf"), 0, (4, 6, 3), 0, 2)],
}


def poisoned(spatial, heads, dim, dtype, which: str, seed: int = 61, device: str = "cpu"):
    """q, k, v of ``make_qkv`` with ``_POISON[which]`` planted (token coordinates clipped to the grid,
    so 1-D and 2-D grids take the trailing coordinates)."""
    q, k, v = make_qkv(spatial, heads, dim, dtype, seed=seed, device=device)
    for name, value, b, token, h, col in _POISON[which]:
        at = tuple(min(c, n - 1) for c, n in zip(token[-len(spatial):], spatial, strict=True))
        {"k": k, "v": v}[name][(b, *at, h, col % dim)] = value
    return q, k, v


def window_rows(spatial, kernel, dil, causal, stride, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, tokens, heads] bool: the query's window (the op's rule, literally, from test_na_kernels)
    holds a key whose K or V row has a non-finite value in that head."""
    n = len(spatial)
    mask = None
    for a, length in enumerate(spatial):
        m = _axis_allowed(length, kernel[a], dil[a], causal[a], stride[a])
        shape = [1] * (2 * n)
        shape[a], shape[n + a] = length, length
        mask = m.view(shape) if mask is None else mask & m.view(shape)
    tokens = math.prod(spatial)
    allowed = mask.reshape(tokens, tokens).float()
    bad = (~(k.float() + v.float()).isfinite()).any(-1).reshape(v.shape[0], tokens, v.shape[-2]).float()
    return torch.einsum("qk,bkh->bqh", allowed, bad) > 0


def compare(out: torch.Tensor, ref: torch.Tensor) -> tuple[bool, float, int]:
    """(NaN, +inf and -inf at exactly the reference's positions, relative error over the finite rest,
    output rows with a non-finite value)."""
    out, ref = out.float(), ref.float()
    same = (torch.equal(out.isnan(), ref.isnan()) and torch.equal(out.isposinf(), ref.isposinf())
            and torch.equal(out.isneginf(), ref.isneginf()))
    fin = ref.isfinite() & out.isfinite()
    err = float((out[fin] - ref[fin]).norm() / ref[fin].norm())
    return same, err, int((~out.isfinite()).any(-1).sum())


def _interpreted(name: str) -> list:
    """``name()`` of this module under Triton's interpreter: here when TRITON_INTERPRET=1 (the repository
    conftest sets it on a host without CUDA), else in a fresh process with it."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return globals()[name]()
    code = (f"import sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); import json, {__name__.rsplit('.', 1)[-1]} as m;"
            f"print(json.dumps(m.{name}()))")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@contextlib.contextmanager
def _patched(module, **values):
    saved = {name: getattr(module, name) for name in values}
    try:
        for name, value in values.items():
            setattr(module, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(module, name, value)


# na_triton's launch forms on the CPU: (name, spatial, kernel, dilation, causal, stride, head_dim, tiles
# or None (config_for's), tma, shift, q factor, scale, chunked REDO programs).
_TRITON_FORMS = [
    ("online, pointer tiles", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 32, None, False, False,
     1.0, None, False),
    ("online, 2-D dilated causal", (9, 11), (3, 5), (2, 1), (True, False), (1, 1), 32, ((1, 4, 4), (1, 2, 8)),
     False, False, 1.0, None, False),
    ("shift, pointer tiles", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 32, None, False, True,
     1.0, None, False),
    ("shift, TMA tiles", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 32, None, True, True,
     1.0, None, False),
    ("shift, loose bounds (online redo)", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 32, None,
     True, True, 60.0, None, False),
    ("shift, loose bounds, chunked REDO", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 32, None,
     True, True, 60.0, None, True),
    ("online, scale < 0, strided", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (3, 2, 2), 32, None, False,
     False, 1.0, -0.2, False),
    ("shift, head_dim 80 (padded)", (6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), 80, None, False,
     True, 1.0, None, False),
]


_EVERY_POISON = ("online, pointer tiles", "shift, TMA tiles")


def triton_nonfinite_rows() -> list[list]:
    """[form, poison, specials at the reference's positions, finite error, non-finite rows, expected rows]
    for na_triton; needs TRITON_INTERPRET=1 at import."""
    _patch_triton_interpreter_index()
    from xbackend.kernels import na_triton

    rows = []
    for name, spatial, kernel, dil, causal, stride, dim, tiles, tma, shift, q_factor, scale, chunked in _TRITON_FORMS:
        # Every poison on the plain online and shift launches, the two that mix most elsewhere (the
        # interpreter takes seconds a call).
        for which in _POISON if name in _EVERY_POISON else ("NaN", "+inf and -inf"):
            q, k, v = poisoned(spatial, 2, dim, torch.float32, which)
            q = q * q_factor
            if tiles is None:
                cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, dil, causal, stride), num_stages=1)
            else:
                cfg = na_triton.NAConfig(tiles[0], tiles[1], 4, 1)
            cfg = dataclasses.replace(cfg, tma=tma, shift=shift)
            chunks = {"REDO_CHUNK_MAX": 8, "REDO_MIN_PROGRAMS": 1} if chunked else {}
            with _patched(na_triton, **chunks):
                out = na_triton.neighborhood_attention(q, k, v, kernel, dil, causal, scale, stride, config=cfg)
            ref = op_reference(q, k, v, kernel, dil, causal, scale, stride)
            rows.append([name, which, *compare(out, ref), int((~ref.isfinite()).any(-1).sum())])
    return rows


def test_na_triton_non_finite_v_reaches_only_its_windows():
    rows = _interpreted("triton_nonfinite_rows")
    assert len(rows) == len(_EVERY_POISON) * len(_POISON) + (len(_TRITON_FORMS) - len(_EVERY_POISON)) * 2
    for name, which, same, err, got, expected in rows:
        assert same and got == expected and err < 1e-5, (name, which, same, err, got, expected)


def test_the_reference_is_non_finite_exactly_where_a_window_holds_the_key():
    """The premise: the op's reference (each query's own window gathered) has a non-finite output row
    exactly where the literal window rule puts a poisoned value in the query's window, and only there
    for an infinite key (whose score is -inf, a finite row, where q.k is negative)."""
    for spatial, kernel, dil, causal, stride in [((6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1)),
                                                 ((9, 11), (3, 5), (2, 1), (True, False), (1, 1)),
                                                 ((6, 9, 10), (3, 5, 4), (1, 2, 1), (False, True, False), (3, 2, 2))]:
        for which in _POISON:
            q, k, v = poisoned(spatial, 2, 16, torch.float32, which)
            ref = op_reference(q, k, v, kernel, dil, causal, None, stride)
            rows = (~ref.isfinite()).any(-1).reshape(v.shape[0], -1, v.shape[-2])
            windows = window_rows(spatial, kernel, dil, causal, stride, k, v)
            if which.startswith("k "):
                assert not (rows & ~windows).any() and 0 < int(rows.sum()) < int(windows.sum()), (spatial, which)
            else:
                assert torch.equal(rows, windows), (spatial, which)
            assert 0 < int(rows.sum()) < rows.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("which", list(_POISON))
@pytest.mark.parametrize(("spatial", "kernel", "dil", "causal", "stride"), [
    ((6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1)),
    ((9, 11), (3, 5), (2, 1), (True, False), (1, 1)),
    ((6, 9, 10), (3, 5, 4), (1, 2, 1), (False, True, False), (3, 2, 2)),
])
def test_tiled_sdpa_non_finite_v_reaches_only_its_windows(spatial, kernel, dil, causal, stride, which, dtype):
    q, k, v = poisoned(spatial, 2, 16, dtype, which)
    ref = op_reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
    # A small chunk budget: many chunks, and key boxes that hold a poisoned key outside most windows.
    out = na_tiled_sdpa.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, max_chunk_elems=4096)
    same, err, got = compare(out, ref)
    assert same and got > 0, (which, got)
    assert err < (1e-5 if dtype == torch.float32 else 5e-3), err


@pytest.mark.parametrize("which", list(_POISON))
@pytest.mark.parametrize(("spatial", "kernel", "dil", "causal", "stride", "tile"), [
    ((6, 9, 10), (3, 5, 4), (1, 1, 1), (False,) * 3, (1, 1, 1), (2, 4, 4)),
    ((9, 11), (3, 5), (2, 1), (True, False), (1, 1), (4, 8)),
])
def test_flex_non_finite_v_reaches_only_its_windows(spatial, kernel, dil, causal, stride, tile, which):
    q, k, v = poisoned(spatial, 2, 16, torch.float32, which)
    ref = op_reference(q.float(), k.float(), v.float(), kernel, dil, causal, None, stride)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "flex_attention called without torch.compile")
        out = na_flex.neighborhood_attention(q, k, v, kernel, dil, causal, None, stride, tile=tile, compiled=False)
    same, err, got = compare(out, ref)
    assert same and got > 0, (which, got)
    assert err < 1e-5, err


# ---------------------------------------------------------------- GPU


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def _gpu_case(spatial, heads, dim, which, kernel, seed=71):
    """bf16 q, k, v on the GPU with ``_POISON[which]`` and the op's reference (fp32, the guard's)."""
    q, k, v = poisoned(spatial, heads, dim, torch.float32, which, seed=seed)
    q, k, v = (t.to("cuda", torch.bfloat16) for t in (q, k, v))
    n = len(spatial)
    ref = op_reference(q.float(), k.float(), v.float(), kernel, (1,) * n, (False,) * n, None)
    return q, k, v, ref


def _check(out, ref, label):
    same, err, got = compare(out, ref)
    assert same and got > 0 and err < 5e-3, (label, same, err, got)


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("which", list(_POISON))
def test_gpu_na_sm90_flags_non_finite_tiles_for_the_safe_walk(which, monkeypatch):
    """na_sm90's shift launch (4 x 4 x 4 tiles, windows up to 11, ragged tiles): a tile whose
    accumulator ends non-finite is flagged 2 and redone by na_triton's safe walk."""
    from xbackend.kernels import na_sm90, na_triton

    assert na_sm90.available() is None, na_sm90.build_log()
    monkeypatch.setenv(na_sm90.SWITCH, "1")
    monkeypatch.setattr(na_sm90, "pays", lambda *a: None)
    flags = []
    launch = na_sm90.shift_launch
    monkeypatch.setattr(na_sm90, "shift_launch", lambda *a: (flags.append(a[5]), launch(*a)))
    for spatial, kernel in (((13, 17, 19), (11, 11, 11)), ((9, 10, 13), (3, 5, 11))):
        q, k, v, ref = _gpu_case(spatial, 2, 64, which, kernel)
        cfg = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, (False,) * 3), q_tile=(4, 4, 4),
                                  tma=True, shift=True)
        out = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg)
        assert flags, "na_triton did not take na_sm90's shift launch"
        if which.startswith("k "):  # an infinite key: its head's bound is inf, its tiles go online (flag 1)
            assert bool((flags[-1] == 1).any())
        else:
            assert bool((flags[-1] == 2).any())
        _check(out, ref, (spatial, which))


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("which", list(_POISON))
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_na_gluon_non_finite(which, head_dim, monkeypatch):
    """na_gluon's pipelined shift launch (64-query tiles) and the warp-specialized one (128-query)."""
    from xbackend.kernels import na_triton

    spatial, kernel = (10, 24, 24), (5, 9, 11)
    q, k, v, ref = _gpu_case(spatial, 2, head_dim, which, kernel)
    base = dataclasses.replace(na_triton.config_for(q.shape, kernel, (1,) * 3, (False,) * 3), pipelined=True)
    tall = na_triton.choose_config(spatial, kernel, (1,) * 3, head_dim, block_m=128)
    for cfg, ws in ((base, False), (dataclasses.replace(base, q_tile=tall.q_tile, kv_tile=tall.kv_tile), True)):
        monkeypatch.setattr(na_triton, "WARP_SPECIALIZED", ws)
        out = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg)
        _check(out, ref, (which, head_dim, cfg.q_tile))


@pytest.mark.gpu
@pytest.mark.parametrize("which", list(_POISON))
def test_gpu_na_triton_launch_forms_non_finite(which, monkeypatch):
    """na_triton's own launches (na_sm90 off): the shift launch on the launch's TMA descriptors and on
    pointer tiles, loose tiles through the online launch, the online launch alone, a 2-D window."""
    from xbackend.kernels import na_sm90, na_triton

    monkeypatch.setenv(na_sm90.SWITCH, "0")
    spatial, kernel = (10, 24, 24), (5, 9, 11)
    for q_factor in (1.0, 60.0):
        q, k, v, ref = _gpu_case(spatial, 2, 64, which, kernel)
        q = q * q_factor
        ref = op_reference(q.float(), k.float(), v.float(), kernel, (1,) * 3, (False,) * 3, None)
        base = na_triton.config_for(q.shape, kernel, (1,) * 3, (False,) * 3)
        for cfg in (base, dataclasses.replace(base, tma=False), dataclasses.replace(base, tma=False, shift=False)):
            out = na_triton.neighborhood_attention(q, k, v, kernel, (1,) * 3, (False,) * 3, None, config=cfg)
            _check(out, ref, (which, q_factor, cfg))
    q, k, v, ref = _gpu_case((48, 40), 3, 128, which, (7, 9))
    _check(na_triton.neighborhood_attention(q, k, v, (7, 9), (1, 1), (False, False), None), ref, (which, "2-D"))


@pytest.mark.gpu
@pytest.mark.parametrize("which", ["+inf", "+inf and -inf", "NaN"])
def test_gpu_get_op_and_forced_impls_non_finite(which):
    """Through get_op (the guard verifies the first call, in which V already holds the value) and with
    each NA impl forced: the DiffVAE stage-5 tile's layout at a smaller grid, one poisoned key."""
    import xbackend
    from xbackend.testing import fresh_runtime

    op = xbackend.get_op("neighborhood_attention")
    spatial, kernel = (12, 24, 24), (11, 11, 11)
    q, k, v, ref = _gpu_case(spatial, 4, 64, which, kernel)
    args = (kernel, (1, 1, 1), (False,) * 3)
    with fresh_runtime(autoload=True) as rt:  # a first call per key: the guard verifies it
        _check(op(q, k, v, *args), ref, (which, "get_op"))
        ran = [(e.impl, e.status) for e in rt.events]
        assert ran and ran[-1] == ("cuda:na_triton", "verified"), ran
        for impl in ("na_triton", "na_flex", "na_tiled_sdpa"):
            with xbackend.use(neighborhood_attention=impl):
                _check(op(q, k, v, *args), ref, (which, impl))
            assert rt.events[-1].status == "verified", (impl, rt.events[-1])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("which", ["none", *_POISON])
def test_tiled_sdpa_captures_in_a_cuda_graph_without_a_synchronisation(which):
    # Under capture the finiteness check (a synchronisation) would raise: every chunk takes the safe form.
    if which == "none":
        q, k, v = (t.to("cuda", torch.bfloat16) for t in make_qkv((6, 9, 10), 2, 16, torch.float32, seed=5))
        n = 3
        ref = op_reference(q.float(), k.float(), v.float(), (3, 5, 4), (1,) * n, (False,) * n, None)
    else:
        q, k, v, ref = _gpu_case((6, 9, 10), 2, 16, which, (3, 5, 4))

    def call():
        return na_tiled_sdpa.neighborhood_attention(q, k, v, (3, 5, 4), (1, 1, 1), (False,) * 3, None,
                                                    max_chunk_elems=4096)

    call()  # warm-up outside capture (allocator, SDPA's backend choice)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = call()
    graph.replay()
    torch.cuda.synchronize()
    same, err, _ = compare(out, ref)
    assert same and err < 5e-3, (which, same, err)
