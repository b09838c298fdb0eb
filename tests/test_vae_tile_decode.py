"""vae_tile_decode without process groups: grid, blend/crop against an element-wise formula, balancing,
noise order, argument errors, progress bar."""

from __future__ import annotations

import io
import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xbackend.vae import (
    LOCAL,
    Tile,
    TileProgress,
    assemble_tiles,
    assign_tiles,
    check_vae_tile_decode_args,
    make_grid,
    resolve_blend,
    tile_intervals,
    vae_tile_decode,
)

# -- grid ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("length", "tile", "stride", "min_remnant", "whole", "expected"),
    [
        (12, 6, 4, 3, True, [(0, 6), (4, 10), (8, 12)]),
        # 16 - 15 = 1 < 3: the remnant at 15 merges, the last tile runs 10..16 (longer than 6).
        (16, 7, 5, 3, True, [(0, 7), (5, 12), (10, 16)]),
        (16, 7, 5, 1, True, [(0, 7), (5, 12), (10, 16), (15, 16)]),
        # Two remnant starts in a row are both too short: both merge.
        (10, 4, 1, 3, True, [(0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10), (7, 10)]),
        (5, 8, 4, 1, True, [(0, 5)]),
        # Without whole_if_fits an axis that fits still gets cut at every stride (diffusers' autoencoder).
        (5, 8, 4, 1, False, [(0, 5), (4, 5)]),
        (1, 3, 2, 5, True, [(0, 1)]),
        (9, 3, 3, 1, True, [(0, 3), (3, 6), (6, 9)]),
    ],
)
def test_tile_intervals(length, tile, stride, min_remnant, whole, expected):
    assert tile_intervals(length, tile, stride, min_remnant, whole) == expected


@settings(max_examples=200, deadline=None)
@given(
    length=st.integers(1, 60),
    tile=st.integers(1, 20),
    stride_frac=st.floats(0.05, 1.0),
    min_remnant=st.integers(0, 12),
    whole=st.booleans(),
)
def test_tile_intervals_properties(length, tile, stride_frac, min_remnant, whole):
    stride = max(1, round(tile * stride_frac))
    iv = tile_intervals(length, tile, stride, min_remnant, whole)
    starts = [a for a, _ in iv]
    assert starts == [i * stride for i in range(len(iv))]
    assert iv[-1][1] == length
    for a, b in iv[:-1]:
        assert b == min(a + tile, length)
    if len(iv) > 1:
        assert length - iv[-1][0] >= min_remnant
        # Only a merge makes the last tile longer than `tile`, and a merge needs a short remnant.
        if iv[-1][1] - iv[-1][0] > tile:
            assert min_remnant > 1
    # Covered without holes: every tile starts inside (or at the end of) the previous one.
    for (a0, b0), (a1, _) in itertools.pairwise(iv):
        assert a1 <= b0 and a0 < a1


def test_grid_order_and_tiles():
    grid = make_grid((3, 5, 4), tile=(2, 3, 3), stride=(1, 2, 2), min_remnant=(2, 2, 1))
    tiles = grid.tiles()
    assert grid.shape == (2, 2, 2) and len(grid) == 8 == len(tiles)
    # t outermost, then h, then w.
    assert [t.grid_index for t in tiles[:3]] == [(0, 0, 0), (0, 0, 1), (0, 1, 0)]
    last = tiles[-1]
    assert last.start == (1, 2, 2) and last.stop == (3, 5, 4)
    assert last.is_last == (True, True, True) and tiles[0].is_first == (True, True, True)
    assert last.volume == 2 * 3 * 2
    assert all(grid.flat_index(*t.grid_index) == t.index for t in tiles)


# -- blend / crop / assemble against an element-wise formula --------------------------------------------


def _assemble_1d(pieces: list[list[float]], keep_stride: int, lead: int, blend: int) -> list[float]:
    """The blend/crop rule written out on Python floats, one tile after the other, each tile blended
    with the previous tile as already blended."""
    done: list[list[float]] = []
    out: list[float] = []
    for j, raw in enumerate(pieces):
        cur = list(raw)
        if j > 0:
            prev = done[-1]
            e = min(len(prev), len(cur), blend)
            for i in range(e):
                cur[i] = prev[len(prev) - e + i] * (1 - i / e) + raw[i] * (i / e)
        done.append(cur)
        keep = len(cur) if j == len(pieces) - 1 else keep_stride + (lead if j == 0 else 0)
        out.extend(cur[:keep])
    return out


@pytest.mark.parametrize("axis", [0, 1, 2])
@pytest.mark.parametrize(
    ("length", "tile", "stride", "scale", "lead", "blend"),
    [(7, 3, 2, 2, 0, 2), (9, 4, 3, 2, -1, 2), (9, 4, 2, 3, 1, 7), (5, 5, 5, 4, 0, 0), (8, 3, 2, 1, 0, 5)],
)
def test_assemble_matches_formula_per_axis(axis, length, tile, stride, scale, lead, blend):
    extent = [1, 1, 1]
    extent[axis] = length
    tiles_ = [1, 1, 1]
    tiles_[axis] = tile
    strides = [1, 1, 1]
    strides[axis] = stride
    scales = [1, 1, 1]
    scales[axis] = scale
    grid = make_grid(extent, tiles_, strides)
    gen = torch.Generator().manual_seed(axis * 100 + length)
    pieces, decoded = [], []
    for t in grid.tiles():
        n = t.size[axis] * scale
        values = torch.randn(n, generator=gen, dtype=torch.float64)
        pieces.append(values.tolist())
        shape = [2, 1, 1, 1]
        shape[1 + axis] = n
        # Two channels with different data: blending must not mix channels.
        decoded.append(torch.stack([values, -values]).reshape(shape).clone())
    leads, blends = [0, 0, 0], [0, 0, 0]
    leads[axis], blends[axis] = lead, blend
    out = assemble_tiles(decoded, grid, stride=strides, scale=scales, blend=blends, lead=leads)
    expected = torch.tensor(_assemble_1d(pieces, stride * scale, lead, blend), dtype=torch.float64)
    assert torch.equal(out[0].reshape(-1), expected)
    assert torch.equal(out[1].reshape(-1), -expected)


def _field(t: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.sin(0.3 * t + 0.1) + torch.cos(0.17 * h) * 0.5 + 0.01 * w * w


@pytest.mark.parametrize("lead", [(0, 0, 0), (-1, 0, 0), (1, 0, 0)])
def test_assemble_places_every_sample_3d(lead):
    """Tiles cut from one smooth field reassemble to that field: checks offsets, crops and the causal lead."""
    scale, stride, tile = (2, 3, 2), (2, 2, 3), (3, 3, 4)
    grid = make_grid((7, 6, 10), tile, stride, min_remnant=(2, 2, 2))
    assert grid.shape[0] > 1 and grid.shape[1] > 1 and grid.shape[2] > 1
    decoded = []
    for t in grid.tiles():
        starts = [a * s for a, s in zip(t.start, scale, strict=True)]
        # A causal lead changes the first temporal tile's length and so shifts every later one.
        if t.start[0] > 0:
            starts[0] += lead[0]
        sizes = [n * s for n, s in zip(t.size, scale, strict=True)]
        if t.start[0] == 0:
            sizes[0] += lead[0]
        axes = [torch.arange(a, a + n, dtype=torch.float64) for a, n in zip(starts, sizes, strict=True)]
        tt, hh, ww = torch.meshgrid(*axes, indexing="ij")
        decoded.append(_field(tt, hh, ww)[None, None])
    out = assemble_tiles(
        decoded, grid, stride=stride, scale=scale, blend=resolve_blend(tile, stride, scale, (None,) * 3), lead=lead
    )
    frames = 7 * scale[0] + lead[0]
    tt, hh, ww = torch.meshgrid(
        torch.arange(frames, dtype=torch.float64),
        torch.arange(18, dtype=torch.float64),
        torch.arange(20, dtype=torch.float64),
        indexing="ij",
    )
    assert out.shape == (1, 1, frames, 18, 20)
    torch.testing.assert_close(out[0, 0], _field(tt, hh, ww), atol=1e-12, rtol=0)


def test_assemble_crops_to_out_size():
    grid = make_grid((1, 4, 4), (1, 2, 2), (1, 2, 2))
    decoded = [torch.full((1, 1, 1, 4, 4), float(i)) for i in range(len(grid))]
    out = assemble_tiles(decoded, grid, stride=(1, 2, 2), scale=(1, 2, 2), blend=(0, 0, 0), out_size=(None, 6, 5))
    assert out.shape == (1, 1, 1, 6, 5)
    assert out[0, 0, 0, 0, 0] == 0 and out[0, 0, 0, 5, 4] == 3


# -- balancing -----------------------------------------------------------------------------------------


def test_assign_tiles_largest_first():
    assert assign_tiles([5, 9, 7, 3], 2) == [1, 0, 1, 0]  # 9 -> r0, 7 -> r1, 5 -> r1, 3 -> r0
    assert assign_tiles([4, 4, 4], 3) == [0, 1, 2]
    assert assign_tiles([4, 4], 3) == [0, 1]
    assert assign_tiles([1, 2, 3], 1) == [0, 0, 0]


@settings(max_examples=100, deadline=None)
@given(volumes=st.lists(st.integers(1, 100), min_size=1, max_size=40), world=st.integers(1, 8))
def test_assign_tiles_balanced(volumes, world):
    owners = assign_tiles(volumes, world)
    load = [0] * world
    for v, r in zip(volumes, owners, strict=True):
        load[r] += v
    # Greedy largest-first: no rank exceeds the lightest one by more than one tile.
    assert max(load) - min(load) <= max(volumes)
    assert owners == assign_tiles(list(volumes), world)


@settings(max_examples=60, deadline=None)
@given(volumes=st.lists(st.integers(1, 50), min_size=1, max_size=7), world=st.integers(2, 3))
def test_assign_tiles_within_lpt_bound_of_optimum(volumes, world):
    owners = assign_tiles(volumes, world)
    greedy = max(sum(v for v, r in zip(volumes, owners, strict=True) if r == rank) for rank in range(world))
    best = min(
        max(sum(v for v, r in zip(volumes, plan, strict=True) if r == rank) for rank in range(world))
        for plan in itertools.product(range(world), repeat=len(volumes))
    )
    # Graham's bound for largest-processing-time-first scheduling.
    assert greedy <= (4 / 3 - 1 / (3 * world)) * best + 1e-9


# -- the op, one process -----------------------------------------------------------------------------------


def _decoder(scale: tuple[int, int, int]):
    """A toy decoder: nearest upsampling (channels first) plus the tile's noise."""

    def decode(piece: torch.Tensor, tile: Tile, noise: torch.Tensor) -> torch.Tensor:
        out = piece
        for dim, s in zip((2, 3, 4), scale, strict=True):
            out = out.repeat_interleave(s, dim=dim)
        return out + noise

    return decode


def test_serial_decode_noise_order_and_slices():
    scale = (2, 2, 2)
    latent = torch.randn(1, 2, 4, 5, 6, generator=torch.Generator().manual_seed(0))
    seen: list[int] = []
    gen = torch.Generator().manual_seed(3)

    def draw(tile: Tile) -> torch.Tensor:
        seen.append(tile.index)
        shape = (1, 2, *(n * s for n, s in zip(tile.size, scale, strict=True)))
        return torch.randn(shape, generator=gen)

    decode = _decoder(scale)
    slices: dict[int, torch.Tensor] = {}

    def recording_decode(piece, tile, noise):
        slices[tile.index] = piece
        return decode(piece, tile, noise)

    out = vae_tile_decode(latent, recording_decode, tile=(2, 3, 3), stride=(2, 2, 2), scale=scale, draw_noise=draw)
    grid = make_grid((4, 5, 6), (2, 3, 3), (2, 2, 2))
    assert seen == list(range(len(grid)))
    for t in grid.tiles():
        assert torch.equal(slices[t.index], latent[t.slices(5, (2, 3, 4))])
    assert out.shape == (1, 2, 8, 10, 12)

    # The same decode without the op: draw in serial order, assemble.
    gen.manual_seed(3)
    decoded = []
    for t in grid.tiles():
        shape = (1, 2, *(n * s for n, s in zip(t.size, scale, strict=True)))
        decoded.append(decode(latent[t.slices(5, (2, 3, 4))], t, torch.randn(shape, generator=gen)))
    blend = tuple((k - s) * c for k, s, c in zip((2, 3, 3), (2, 2, 2), scale, strict=True))
    assert torch.equal(out, assemble_tiles(decoded, grid, stride=(2, 2, 2), scale=scale, blend=blend))


def test_channels_last_axes_and_no_noise():
    latent = torch.randn(1, 3, 4, 5, 2)  # B, T, H, W, C
    out = vae_tile_decode(
        latent,
        lambda piece, tile: piece.permute(0, 4, 1, 2, 3).clone(),
        tile=(2, 2, 3),
        stride=(1, 2, 2),
        scale=(1, 1, 1),
        blend=(0, 0, 0),
        axes=(1, 2, 3),
    )
    assert torch.equal(out, latent.permute(0, 4, 1, 2, 3))


def test_tile_aliasing_latent_leaves_latent_intact():
    latent = torch.randn(1, 1, 1, 6, 6)
    before = latent.clone()
    out = vae_tile_decode(latent, lambda piece, tile: piece, tile=(1, 4, 4), stride=(1, 2, 2), scale=(1, 1, 1))
    assert torch.equal(latent, before)
    assert out.shape == latent.shape


def test_decode_tile_must_return_tensor():
    with pytest.raises(TypeError, match="^vae_tile_decode: argument 'decode_tile' expected a callable returning a tensor"):
        vae_tile_decode(
            torch.zeros(1, 1, 2, 2, 2), lambda p, t: None, tile=(2, 2, 2), stride=(2, 2, 2), scale=(1, 1, 1)
        )


def test_decode_error_propagates_serially():
    def boom(piece, tile):
        raise RuntimeError("tile exploded")

    with pytest.raises(RuntimeError, match="tile exploded"):
        vae_tile_decode(torch.zeros(1, 1, 2, 2, 2), boom, tile=(2, 2, 2), stride=(2, 2, 2), scale=(1, 1, 1))


# -- argument checks ---------------------------------------------------------------------------------------

_OK = {"tile": (2, 2, 2), "stride": (1, 1, 1), "scale": (1, 1, 1)}


@pytest.mark.parametrize(
    ("latent", "overrides", "exc", "pattern"),
    [
        ([1, 2], {}, TypeError, "argument 'latent' expected a torch.Tensor"),
        (torch.zeros(2, 2), {}, ValueError, "argument 'latent' expected a tensor with at least 3 dims"),
        (torch.zeros(1, 1, 0, 2, 2), {}, ValueError, "argument 'latent'.*length >= 1"),
        (None, {"tile": (2, 2)}, TypeError, "argument 'tile' expected a tuple of 3 ints"),
        (None, {"tile": (2, 0, 2)}, ValueError, "argument 'tile'.*got \\(2, 0, 2\\)"),
        (None, {"stride": (1, 3, 1)}, ValueError, "argument 'stride' expected stride <= tile.*axis h"),
        (None, {"scale": (1.0, 1, 1)}, TypeError, "argument 'scale'"),
        (None, {"min_remnant": (-1, 0, 0)}, ValueError, "argument 'min_remnant'"),
        (None, {"blend": (None, -1, None)}, ValueError, "argument 'blend'"),
        (None, {"lead": (0, "a", 0)}, TypeError, "argument 'lead'"),
        (None, {"out_size": (None, None, 2.5)}, TypeError, "argument 'out_size'"),
        (None, {"axes": (2, 3, 3)}, ValueError, "argument 'axes' expected 3 distinct dims"),
        (None, {"axes": (2, 3, 7)}, ValueError, "argument 'axes'"),
        (None, {"whole_if_fits": 1}, TypeError, "argument 'whole_if_fits'"),
        (None, {"progress": None}, TypeError, "argument 'progress'"),
        (None, {"timeout": 3}, TypeError, "argument 'timeout'"),
        (None, {"draw_noise": 3}, TypeError, "argument 'draw_noise'"),
        (None, {"dst": 1}, ValueError, "argument 'dst' expected a rank of the group, 0..0"),
        (None, {"dst": "0"}, TypeError, "argument 'dst'"),
        (None, {"group": object()}, TypeError,
         "argument 'group' expected None, xbackend.vae.LOCAL or a torch.distributed.ProcessGroup, got 'object'"),
        (None, {"group": LOCAL, "dst": 1}, ValueError, "argument 'dst' expected a rank of the group, 0..0"),
    ],
)
def test_argument_errors(latent, overrides, exc, pattern):
    latent = torch.zeros(1, 1, 3, 3, 3) if latent is None else latent
    kwargs = {**_OK, **overrides}
    with pytest.raises(exc, match=pattern) as info:
        check_vae_tile_decode_args(latent, lambda p, t: p, **kwargs)
    assert str(info.value).startswith("vae_tile_decode: argument ")
    # The op itself runs the same checks before touching anything.
    with pytest.raises(exc, match=pattern):
        vae_tile_decode(latent, lambda p, t: p, **kwargs)


def test_decode_tile_not_callable():
    with pytest.raises(TypeError, match="argument 'decode_tile'"):
        vae_tile_decode(torch.zeros(1, 1, 2, 2, 2), None, **_OK)


# -- progress -----------------------------------------------------------------------------------------------


def test_progress_bar_only_when_enabled(capsys):
    latent = torch.zeros(1, 1, 2, 4, 4)
    kwargs = {"tile": (2, 2, 2), "stride": (2, 2, 2), "scale": (1, 1, 1)}
    vae_tile_decode(latent, lambda p, t: p.clone(), **kwargs)
    assert capsys.readouterr().err == ""
    vae_tile_decode(latent, lambda p, t: p.clone(), progress=True, **kwargs)
    err = capsys.readouterr().err
    assert "4/4 tiles" in err and err.endswith("\n")


def test_progress_bar_draws_in_place():
    stream = io.StringIO()
    with TileProgress(3, "decode", stream=stream, width=6) as bar:
        bar.advance()
        bar.advance(2)
    text = stream.getvalue()
    assert text.count("\r") == 3 and "[######] 3/3" in text and "[##....] 1/3" in text


def test_get_op_serves_the_host_level_op() -> None:
    import xbackend

    op = xbackend.get_op("vae_tile_decode")
    latent = torch.randn(1, 2, 3, 5, 6)
    out = op(latent, lambda z, tile: z.repeat_interleave(2, -1).repeat_interleave(2, -2), tile=(3, 5, 6), stride=(3, 5, 6), scale=(1, 2, 2))
    assert torch.equal(out, latent.repeat_interleave(2, -1).repeat_interleave(2, -2))
    with pytest.raises(ValueError, match="plan: 'vae_tile_decode' is a host-level op"):
        xbackend.plan("vae_tile_decode")
