"""na_sm90 (neighborhood attention's sm90a shift launch): its input rules on the CPU, its compile for
sm_90a where nvcc is installed, and on an sm90 GPU its outputs against the independent fp32 reference
of test_na_kernels and against na_triton's own shift launch."""

from __future__ import annotations

import dataclasses
import logging
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from test_na_kernels import make_qkv, reference, rel_err

from xbackend import _cache
from xbackend.kernels import na_sm90
from xbackend.testing import fresh_runtime

SRC = Path(na_sm90.__file__).with_name("na_sm90.cu")
OK = ((11, 11, 11), (1, 1, 1), (False, False, False), (1, 1, 1), 0.125, (4, 4, 4))


def _views(spatial=(12, 16, 16), heads=2, dim=64, dtype=torch.bfloat16):
    q, k, v = make_qkv(spatial, heads, dim, dtype)
    return q, k, v, torch.empty_like(q)


def _args(**change):
    names = ("kernel_size", "dilation", "is_causal", "stride", "scale", "q_tile")
    values = dict(zip(names, OK, strict=True))
    values.update(change)
    return tuple(values[n] for n in names)


def test_layout_accepts_the_diffvae_tiles():
    assert na_sm90.layout_reason(*_views(), *_args()) is None
    assert na_sm90.layout_reason(*_views((13, 17, 19)), *_args(kernel_size=(7, 9, 11))) is None


@pytest.mark.parametrize(("views", "change", "expected"), [
    ({}, {"q_tile": (2, 4, 8)}, "q_tile"),
    ({"dtype": torch.float16}, {}, "bf16 only"),
    ({"dim": 128}, {}, "head_dim 128"),
    ({}, {"dilation": (1, 2, 1)}, "dilation"),
    ({}, {"stride": (1, 1, 2)}, "stride"),
    ({}, {"is_causal": (True, False, False)}, "causal"),
    ({}, {"scale": -0.125}, "positive"),
    ({}, {"kernel_size": (11, 11, 12)}, "axis 2: window 12"),
    ({"spatial": (8, 16, 16)}, {}, "axis 0: window 11 over 8"),
    ({"heads": 0}, {}, "batch * heads 0"),
])
def test_layout_reasons(views: dict, change: dict, expected: str):
    reason = na_sm90.layout_reason(*_views(**views), *_args(**change))
    assert reason is not None and expected in reason


def test_layout_needs_contiguous_tensors():
    q, k, v, o = _views()
    reason = na_sm90.layout_reason(q, k.transpose(2, 3), v, o, *_args())
    assert reason is not None and "contiguous" in reason


@pytest.mark.parametrize(("value", "enabled"), [(None, True), ("", True), ("0", False), ("false", False), (" Off", False),
                                               ("no", False), ("1", True), ("TRUE", True)])
def test_switched_on_unless_turned_off(value: str | None, enabled: bool, monkeypatch, caplog):
    monkeypatch.delenv(na_sm90.SWITCH, raising=False)
    if value is not None:
        monkeypatch.setenv(na_sm90.SWITCH, value)
    with caplog.at_level(logging.WARNING, "xbackend"), fresh_runtime():  # a Runtime reads the switch once
        assert na_sm90.switched_on() is enabled
    assert not caplog.records


def test_a_switch_value_that_is_not_a_boolean_warns_once_and_leaves_it_on(monkeypatch, caplog):
    monkeypatch.setattr(_cache, "_warned", set())
    monkeypatch.setenv(na_sm90.SWITCH, "disabled-please")
    with caplog.at_level(logging.WARNING, "xbackend"), fresh_runtime():
        assert na_sm90.switched_on() and na_sm90.switched_on()
    assert [r.getMessage() for r in caplog.records] == [
        "xbackend: XBACKEND_NA_SM90='disabled-please' is not a boolean (1/true/yes/on or 0/false/no/off); taken as true"]


@pytest.mark.parametrize(("spatial", "kernel", "kv_tile", "taken"), [
    ((40, 96, 96), (11, 11, 11), (2, 2, 16), True),  # the DiffVAE stage-5 tile, where it was timed
    ((9, 10, 13), (3, 5, 11), (4, 1, 16), True),
    ((32, 32, 32), (9, 9, 9), (4, 4, 4), False),
    ((40, 96, 96), (5, 5, 5), (1, 8, 8), False),
])
def test_pays_only_where_it_computes_no_more_pairs_than_na_triton(spatial, kernel, kv_tile, taken):
    reason = na_sm90.pays(spatial, kernel, kv_tile)
    assert (reason is None) is taken, reason
    assert taken or "na_triton's query-key pairs" in reason


def test_supports_needs_an_sm90_gpu():
    assert "sm90" in na_sm90.supports(*_views(), *_args())


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_kernel_compiles_for_sm90a_in_four_ctas_an_sm(tmp_path: Path):
    """ptxas -v on the kernel: no spills, at most 128 registers a thread, so four 128-thread CTAs fit
    an SM's 64 Ki registers (what its 54 KiB of dynamic shared memory a CTA allows too), and no wgmma
    serialized (ptxas's "wgmma.mma_async instructions are serialized" warnings: each then waits for
    the one before)."""
    res = subprocess.run(["nvcc", "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3", "--fmad=false",
                          "-Xptxas", "-v", "-o", str(tmp_path / "na.cubin"), str(SRC)],
                         capture_output=True, text=True, check=True)
    regs = int(re.search(r"Used (\d+) registers", res.stderr).group(1))
    assert regs <= 128, res.stderr
    assert "0 bytes spill stores" in res.stderr, res.stderr
    assert "serialized" not in res.stderr, res.stderr


CXX = shutil.which("c++") or shutil.which("g++")
WALK = Path(__file__).with_name("na_sm90_walk.cpp")


def _walk_shapes() -> list[tuple[int, ...]]:
    """Every extent 1-23 with every window 1-11 that fits it, along each axis in turn (the other two
    axes 7 with window 5, or 4 with window 4: an even window), plus random 3-D shapes."""
    shapes = []
    for axis in range(3):
        for other_n, other_ks in ((7, 5), (4, 4)):
            for n in range(1, 24):
                for ks in range(1, min(11, n) + 1):
                    ns, kss = [other_n] * 3, [other_ks] * 3
                    ns[axis], kss[axis] = n, ks
                    shapes.append((*ns, *kss))
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        ns = torch.randint(1, 21, (3,), generator=gen).tolist()
        shapes.append((*ns, *(int(torch.randint(1, min(11, n) + 1, (1,), generator=gen)) for n in ns)))
    return shapes


@pytest.mark.skipif(CXX is None, reason="no C++ compiler")
def test_walk_masks_each_stored_row_to_its_reference_window(tmp_path: Path):
    """The kernel's index math (na_sm90_walk.cuh) run on the host over every tile, thread and row: the
    ring loads blocks in the order they are consumed, each stored row's masked columns are one key box
    of in-range keys, each key once, and the box starts where the op's reference window starts."""
    from xbackend.ops.neighborhood_attention import axis_windows

    exe = tmp_path / "walk"
    subprocess.run([CXX, "-std=c++17", "-O2", f"-I{SRC.parent}", str(WALK), "-o", str(exe)], check=True)
    shapes = _walk_shapes()
    res = subprocess.run([str(exe)], input="".join(" ".join(map(str, s)) + "\n" for s in shapes),
                         capture_output=True, text=True, check=True, timeout=300)
    lines = res.stdout.splitlines()
    assert len(lines) == len(shapes)
    for shape, line in zip(shapes, lines, strict=True):
        head, *axes = line.split(" | ")
        assert tuple(map(int, head.split())) == shape
        assert not axes[0].startswith("error"), f"{shape}: {axes[0]}"
        for axis, got in enumerate(axes):
            want = axis_windows(shape[axis], shape[3 + axis], 1, False, torch.device("cpu"))[0][:, 0]
            assert list(map(int, got.split())) == want.tolist(), f"{shape}: axis {axis}"


def _sm90() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


CASES = [
    # spatial, heads, kernel, batch
    ((12, 16, 16), 2, (11, 11, 11), 1),
    ((13, 17, 19), 3, (11, 11, 11), 2),  # ragged tiles at every axis end
    ((11, 20, 14), 2, (7, 9, 11), 1),  # a window as long as its axis; unequal windows
    ((16, 16, 16), 1, (3, 5, 1), 1),
    ((1, 9, 13), 2, (1, 5, 7), 1),  # an axis of one token (a 2-D input)
    ((1, 10, 13), 2, (1, 2, 10), 1),  # even windows: off-centre, box ks + 3 wide
    ((5, 6, 7), 3, (3, 5, 7), 2),
    ((1, 2, 9), 2, (1, 1, 5), 1),  # one key block: a prologue of one load, no refill
    ((1, 4, 9), 2, (1, 1, 5), 1),  # two key blocks
    ((9, 10, 3), 2, (3, 5, 3), 1),  # an axis shorter than a tile
]


PLAIN = ((1, 1, 1), (False, False, False))  # dilation, causal


def _call(q, k, v, kernel, monkeypatch, switch="1"):
    """na_triton's call with 4 x 4 x 4 tiles and the shift launch, the switch as given; with na_sm90's
    shift launch recorded: (out, the flags buffer of each na_sm90 launch)."""
    from xbackend.kernels import na_triton

    monkeypatch.setenv(na_sm90.SWITCH, switch)
    config = dataclasses.replace(na_triton.config_for(q.shape, kernel, *PLAIN), q_tile=(4, 4, 4), tma=True,
                                 shift=True)
    flags = []
    launch = na_sm90.shift_launch
    monkeypatch.setattr(na_sm90, "shift_launch", lambda *a: (flags.append(a[5]), launch(*a)))
    monkeypatch.setattr(na_sm90, "pays", lambda *a: None)  # correctness at every window, paying or not
    with fresh_runtime():  # the switch is read once per Runtime: a new one reads this value
        return na_triton.neighborhood_attention(q, k, v, kernel, *PLAIN, None, config=config), flags


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize(("spatial", "heads", "kernel", "batch"), CASES)
def test_gpu_against_reference_and_na_triton(spatial, heads, kernel, batch, monkeypatch):
    assert na_sm90.available() is None, na_sm90.build_log()
    q, k, v = make_qkv(spatial, heads, 64, torch.bfloat16, seed=3, device="cuda", batch=batch)
    out, flags = _call(q, k, v, kernel, monkeypatch)
    assert len(flags) == 1, "na_triton did not take the sm90 shift launch"
    assert rel_err(out, reference(q.float(), k.float(), v.float(), kernel, *PLAIN)) < 5e-3
    triton_out, flags = _call(q, k, v, kernel, monkeypatch, switch="0")
    assert not flags
    assert rel_err(out, triton_out) < 2e-3


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize("spatial", [(12, 16, 16), (13, 17, 19)])
def test_gpu_flagged_tiles_take_the_online_walk(spatial, monkeypatch):
    """Large queries in some tiles push their bound past SHIFT_MAX: those tiles are flagged, walk
    nothing here and are redone by na_triton's online launch; the result is right everywhere."""
    kernel = (11, 11, 11)
    q, k, v = make_qkv(spatial, 2, 64, torch.bfloat16, seed=4, device="cuda")
    q[:, :4, :4] *= 40.0  # the first tiles' rows
    out, flags = _call(q, k, v, kernel, monkeypatch)
    assert len(flags) == 1, "na_triton did not take the sm90 shift launch"
    assert 0 < int(flags[0].sum()) < flags[0].numel()
    assert rel_err(out, reference(q.float(), k.float(), v.float(), kernel, *PLAIN)) < 5e-3
    assert torch.isfinite(out).all()


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU")
@pytest.mark.parametrize(("spatial", "kernel"), [((9, 10, 13), (3, 5, 11)), ((1, 2, 9), (1, 1, 5)),
                                                 ((1, 4, 9), (1, 1, 5))])
def test_gpu_every_tile_flagged_exits_and_is_redone(spatial, kernel, monkeypatch):
    """shift_max 0: every tile's bound exceeds it, so every CTA takes the early exit (after its first
    loads land, one or two of them where the walk is that short) and na_triton's online launch
    computes the whole output."""
    from xbackend.kernels import na_triton

    monkeypatch.setattr(na_triton, "SHIFT_MAX", 0.0)
    q, k, v = make_qkv(spatial, 2, 64, torch.bfloat16, seed=6, device="cuda", batch=2)
    out, flags = _call(q, k, v, kernel, monkeypatch)
    assert len(flags) == 1 and bool((flags[0] == 1).all()), flags
    assert rel_err(out, reference(q.float(), k.float(), v.float(), kernel, *PLAIN)) < 5e-3
