"""Tile grid, linear seam blending, stride cropping and assembly for tiled VAE decoding.

Pure torch, no process groups: `parallel.py` decides who decodes which tile, this module decides what a
tile is and how decoded tiles become one output.

Axes are always (t, h, w). The grid lives in latent units; decoded tiles are `[..., T, H, W]` tensors in
output units, `scale` output samples per latent sample. The assembly reproduces diffusers' tiled decoders
operation for operation (same blend expression, same in-place order, same crops), because bit-identity
with them is the contract, and a rounding step moved anywhere breaks it.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

OP_NAME = "vae_tile_decode"


class _Local:
    """The type of `LOCAL`."""

    def __repr__(self) -> str:
        return "xbackend.vae.LOCAL"

    def __reduce__(self) -> str:
        # Pickled and deep-copied as the module's one instance.
        return "LOCAL"


# `group=LOCAL`: decode on this process alone, also while torch.distributed is initialised (where
# `group=None` means the default group). What a data-parallel job passes: each rank its own latent.
LOCAL = _Local()

# Output dims of the three tiled axes in every decoded tile and in the result.
_OUT_DIMS = (-3, -2, -1)


def _arg_error(kind: type[Exception], name: str, expected: str, got: Any) -> Exception:
    # The same shape as every other op's errors (xbackend/_checks.py).
    return kind(f"{OP_NAME}: argument {name!r} expected {expected}, got {got!r}")


def _shape(t: torch.Tensor) -> str:
    return f"shape [{', '.join(map(str, t.shape))}]"


@dataclass(frozen=True)
class Tile:
    """One tile of the grid. `start`/`stop` are latent indices per axis (t, h, w), stop exclusive."""

    index: int
    grid_index: tuple[int, int, int]
    start: tuple[int, int, int]
    stop: tuple[int, int, int]
    grid_shape: tuple[int, int, int]

    @property
    def size(self) -> tuple[int, int, int]:
        return tuple(b - a for a, b in zip(self.start, self.stop, strict=True))  # type: ignore[return-value]

    @property
    def volume(self) -> int:
        return math.prod(self.size)

    @property
    def is_first(self) -> tuple[bool, bool, bool]:
        return tuple(i == 0 for i in self.grid_index)  # type: ignore[return-value]

    @property
    def is_last(self) -> tuple[bool, bool, bool]:
        return tuple(i == n - 1 for i, n in zip(self.grid_index, self.grid_shape, strict=True))  # type: ignore[return-value]

    def slices(self, ndim: int, axes: tuple[int, int, int]) -> tuple[slice, ...]:
        """Index that cuts this tile out of a latent whose (t, h, w) dims are `axes`."""
        index = [slice(None)] * ndim
        for axis, a, b in zip(axes, self.start, self.stop, strict=True):
            index[axis] = slice(a, b)
        return tuple(index)


def tile_intervals(
    length: int, tile: int, stride: int, min_remnant: int = 1, whole_if_fits: bool = True
) -> list[tuple[int, int]]:
    """Overlapping `[start, stop)` intervals covering `[0, length)`, starts `stride` apart.

    A trailing remnant shorter than `min_remnant` is merged into the previous tile (its last interval then
    runs to `length`, longer than `tile`); `min_remnant <= 1` never merges. With `whole_if_fits`, an axis
    no longer than `tile` is one interval; without it the starts are cut even then, which is what
    diffusers' `AutoencoderKLLTX2Video.tiled_decode` does on an axis that fits while the other one does not.
    """
    if whole_if_fits and length <= tile:
        return [(0, length)]
    starts = list(range(0, length, stride))
    while len(starts) > 1 and length - starts[-1] < min_remnant:
        starts.pop()
    return [(s, min(s + tile, length)) for s in starts[:-1]] + [(starts[-1], length)]


@dataclass(frozen=True)
class TileGrid:
    """All tiles in serial order: t outermost, then h, then w (the order diffusers decodes them in)."""

    intervals: tuple[tuple[tuple[int, int], ...], tuple[tuple[int, int], ...], tuple[tuple[int, int], ...]]

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(len(iv) for iv in self.intervals)  # type: ignore[return-value]

    def __len__(self) -> int:
        return math.prod(self.shape)

    def flat_index(self, it: int, ih: int, iw: int) -> int:
        _, nh, nw = self.shape
        return (it * nh + ih) * nw + iw

    def tiles(self) -> list[Tile]:
        out: list[Tile] = []
        shape = self.shape
        for it, (t0, t1) in enumerate(self.intervals[0]):
            for ih, (h0, h1) in enumerate(self.intervals[1]):
                for iw, (w0, w1) in enumerate(self.intervals[2]):
                    out.append(Tile(len(out), (it, ih, iw), (t0, h0, w0), (t1, h1, w1), shape))
        return out


def make_grid(
    extent: Sequence[int],
    tile: Sequence[int],
    stride: Sequence[int],
    min_remnant: Sequence[int] = (1, 1, 1),
    whole_if_fits: bool = True,
) -> TileGrid:
    """The (t, h, w) tile grid of a latent whose tiled axes have lengths `extent`."""
    return TileGrid(
        tuple(  # type: ignore[arg-type]
            tuple(tile_intervals(n, k, s, m, whole_if_fits))
            for n, k, s, m in zip(extent, tile, stride, min_remnant, strict=True)
        )
    )


def blend_into(a: torch.Tensor, b: torch.Tensor, extent: int, dim: int) -> torch.Tensor:
    """Blend the tail of `a` into the head of `b` along `dim`, in place on `b`, and return `b`.

    For i < e: b[i] = a[-e + i] * (1 - i / e) + b[i] * (i / e), with e clipped to both lengths. One slice
    per step with Python-float weights, exactly diffusers' blend_t/blend_v/blend_h: a vectorised weight
    tensor would promote bf16 products to fp32 and round once instead of after each multiply.
    """
    e = min(a.shape[dim], b.shape[dim], extent)
    for i in range(e):
        b.select(dim, i)[...] = a.select(dim, -e + i) * (1 - i / e) + b.select(dim, i) * (i / e)
    return b


def _keep(axis_stride: int, scale: int, lead: int, k: int, n: int) -> int | None:
    """Output samples a tile at grid position k of n keeps; None keeps all (the last tile)."""
    if k == n - 1:
        return None
    return axis_stride * scale + (lead if k == 0 else 0)


def assemble_tiles(
    decoded: Sequence[torch.Tensor],
    grid: TileGrid,
    *,
    stride: Sequence[int],
    scale: Sequence[int],
    blend: Sequence[int],
    lead: Sequence[int] = (0, 0, 0),
    out_size: Sequence[int | None] = (None, None, None),
) -> torch.Tensor:
    """Blend, crop and concatenate decoded tiles (serial order) into one `[..., T, H, W]` tensor.

    Per temporal row of tiles: blend each tile with the one above (h), then the one to its left (w), in
    place, crop non-last tiles to `stride * scale`, concatenate. Then blend each temporal group with the
    previous one (t), crop and concatenate. Blending is in place, so a neighbour already carries its own
    blends when it is blended into the next tile, as in diffusers. `blend[axis]` is the seam width in
    output samples (see `resolve_blend`); `lead[axis]` is added to the first tile's kept length (causal video
    decoders: DiffVAE's first frame group is one frame short, -1; AutoencoderKLLTX2Video keeps one
    extra, +1); `out_size[axis]` crops the result.

    Tiles are modified in place.
    """
    if len(decoded) != len(grid):
        raise ValueError(f"op {OP_NAME!r}: {len(decoded)} decoded tiles for a grid of {len(grid)}")
    extents = list(blend)
    nt, nh, nw = grid.shape
    groups: list[torch.Tensor] = []
    for it in range(nt):
        rows = [[decoded[grid.flat_index(it, ih, iw)] for iw in range(nw)] for ih in range(nh)]
        result_rows = []
        for ih, row in enumerate(rows):
            result_row = []
            for iw, piece in enumerate(row):
                if ih > 0:
                    piece = blend_into(rows[ih - 1][iw], piece, extents[1], _OUT_DIMS[1])
                if iw > 0:
                    piece = blend_into(row[iw - 1], piece, extents[2], _OUT_DIMS[2])
                keep_h = _keep(stride[1], scale[1], lead[1], ih, nh)
                keep_w = _keep(stride[2], scale[2], lead[2], iw, nw)
                result_row.append(piece[..., :keep_h, :keep_w])
            result_rows.append(torch.cat(result_row, dim=_OUT_DIMS[2]))
        groups.append(torch.cat(result_rows, dim=_OUT_DIMS[1]))

    result = []
    for k, group in enumerate(groups):
        if k > 0:
            group = blend_into(groups[k - 1], group, extents[0], _OUT_DIMS[0])
        keep_t = _keep(stride[0], scale[0], lead[0], k, nt)
        result.append(group[..., :keep_t, :, :])
    out = torch.cat(result, dim=_OUT_DIMS[0])
    crop = tuple(slice(None, n) for n in out_size)
    return out[(..., *crop)]


def resolve_blend(
    tile: Sequence[int], stride: Sequence[int], scale: Sequence[int], blend: Sequence[int | None]
) -> tuple[int, int, int]:
    """Seam width per axis in output samples: `blend[axis]`, or `(tile - stride) * scale` where None."""
    return tuple(  # type: ignore[return-value]
        b if b is not None else (k - s) * c for b, k, s, c in zip(blend, tile, stride, scale, strict=True)
    )


def assign_tiles(volumes: Sequence[int], world_size: int) -> list[int]:
    """Owner rank per tile: largest tile first to the least-loaded rank (ties: lower tile, lower rank).

    Deterministic from the volumes alone, so every rank computes the same plan without talking.
    """
    owners = [0] * len(volumes)
    load = [0] * world_size
    for index in sorted(range(len(volumes)), key=lambda i: (-volumes[i], i)):
        rank = min(range(world_size), key=lambda r: (load[r], r))
        owners[index] = rank
        load[rank] += volumes[index]
    return owners


# ----------------------------------------------------------------------------------------------------
# Argument checks (the op's public contract; the core calls these before dispatch).


def _as_axes3(name: str, value: Any, *, minimum: int | None, allow_none: bool = False) -> tuple:
    bound = "" if minimum is None else f" >= {minimum}"
    expected = f"a tuple of 3 ints{bound} (t, h, w)" + (" or None entries" if allow_none else "")
    if not isinstance(value, (tuple, list)) or len(value) != 3:
        raise _arg_error(TypeError, name, expected, value)
    for v in value:
        if v is None and allow_none:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise _arg_error(TypeError, name, expected, value)
        if minimum is not None and v < minimum:
            raise _arg_error(ValueError, name, expected, value)
    return tuple(value)


def normalize_axes(latent: torch.Tensor, axes: Any) -> tuple[int, int, int]:
    """The latent's (t, h, w) dims as non-negative, distinct indices."""
    expected = f"3 distinct dims of a {latent.ndim}-D latent"
    if not isinstance(axes, (tuple, list)) or len(axes) != 3:
        raise _arg_error(TypeError, "axes", expected, axes)
    out = []
    for a in axes:
        if isinstance(a, bool) or not isinstance(a, int) or not -latent.ndim <= a < latent.ndim:
            raise _arg_error(ValueError, "axes", expected, axes)
        out.append(a % latent.ndim)
    if len(set(out)) != 3:
        raise _arg_error(ValueError, "axes", expected, axes)
    return tuple(out)  # type: ignore[return-value]


def check_vae_tile_decode_args(
    latent: Any,
    decode_tile: Any,
    *,
    tile: Any,
    stride: Any,
    scale: Any,
    min_remnant: Any = (1, 1, 1),
    blend: Any = (None, None, None),
    lead: Any = (0, 0, 0),
    out_size: Any = (None, None, None),
    axes: Any = (2, 3, 4),
    whole_if_fits: Any = True,
    draw_noise: Any = None,
    group: Any = None,
    dst: Any = None,
    progress: Any = False,
    timeout: Any = None,
) -> None:
    """Raise TypeError/ValueError naming op, argument, what was expected and what came, or return None."""
    if not isinstance(latent, torch.Tensor):
        raise _arg_error(TypeError, "latent", "a torch.Tensor", type(latent).__name__)
    if latent.ndim < 3:
        raise _arg_error(ValueError, "latent", "a tensor with at least 3 dims", tuple(latent.shape))
    if not callable(decode_tile):
        raise _arg_error(TypeError, "decode_tile", "a callable (latent_tile, tile[, noise]) -> Tensor", decode_tile)
    if draw_noise is not None and not callable(draw_noise):
        raise _arg_error(TypeError, "draw_noise", "None or a callable (tile) -> noise", draw_noise)
    dims = normalize_axes(latent, axes)
    extent = tuple(latent.shape[d] for d in dims)
    if min(extent) < 1:
        raise _arg_error(ValueError, "latent", "every tiled axis (t, h, w) of length >= 1", extent)
    tile = _as_axes3("tile", tile, minimum=1)
    stride = _as_axes3("stride", stride, minimum=1)
    _as_axes3("scale", scale, minimum=1)
    _as_axes3("min_remnant", min_remnant, minimum=0)
    _as_axes3("blend", blend, minimum=0, allow_none=True)
    lead = _as_axes3("lead", lead, minimum=None)
    _as_axes3("out_size", out_size, minimum=0, allow_none=True)
    for axis, (k, s) in enumerate(zip(tile, stride, strict=True)):
        if s > k:
            raise _arg_error(
                ValueError, "stride", f"stride <= tile on every axis (tile={tile}); axis {'thw'[axis]}", stride
            )
    kept = tuple(s * c for s, c in zip(stride, scale, strict=True))
    for axis, (d, n) in enumerate(zip(lead, kept, strict=True)):
        # The first tile keeps stride * scale + lead samples; none or fewer would crop from its far end.
        if d <= -n:
            raise _arg_error(
                ValueError,
                "lead",
                f"lead > -stride * scale on every axis, so the first tile keeps at least one sample "
                f"(stride * scale = {kept}); axis {'thw'[axis]}",
                lead,
            )
    if not isinstance(whole_if_fits, bool):
        raise _arg_error(TypeError, "whole_if_fits", "a bool", whole_if_fits)
    if not isinstance(progress, bool):
        raise _arg_error(TypeError, "progress", "a bool", progress)
    if timeout is not None and not isinstance(timeout, datetime.timedelta):
        raise _arg_error(TypeError, "timeout", "None or a datetime.timedelta", timeout)
    if dst is not None and (isinstance(dst, bool) or not isinstance(dst, int)):
        raise _arg_error(TypeError, "dst", "None or a group rank (int)", dst)
    if dst is not None and dst < 0:
        raise _arg_error(ValueError, "dst", "None or a group rank >= 0", dst)
    _check_group(group, dst)


def check_decoded_tile(
    out: Any,
    tile: Tile,
    *,
    latent_ndim: int,
    stride: Sequence[int],
    scale: Sequence[int],
    lead: Sequence[int],
) -> None:
    """Raise TypeError/ValueError unless `out` is a decoded `tile` the assembly can place.

    H and W must be the tile's latent size times `scale`. T is left free (causal decoders return fewer
    or more frames than size * scale), but a tile that is not the last along an axis must be at least as
    long as what the assembly keeps of it (`stride * scale`, + `lead` for the first), or the result
    would come out short without a word.
    """
    where = f"tile {tile.index} at grid {tile.grid_index}"
    hw = tuple(n * c for n, c in zip(tile.size[1:], scale[1:], strict=True))
    spatial = f"H, W = {hw} (latent tile {tile.size} x scale {tuple(scale)}) for {where}"
    if not isinstance(out, torch.Tensor):
        raise TypeError(
            f"{OP_NAME}: argument 'decode_tile' expected a callable returning a tensor [..., T, H, W] "
            f"({latent_ndim} dims, like the latent), got {type(out).__name__} for {where}"
        )
    if out.ndim != latent_ndim:
        raise ValueError(
            f"{OP_NAME}: argument 'decode_tile' expected a decoded tile with {latent_ndim} dims like the latent, "
            f"[..., T, H, W] with {spatial}, got {_shape(out)}"
        )
    if tuple(out.shape[-2:]) != hw:
        raise ValueError(
            f"{OP_NAME}: argument 'decode_tile' expected a decoded tile [..., T, H, W] with {spatial}, "
            f"got {_shape(out)}"
        )
    for axis, dim in enumerate(_OUT_DIMS):
        keep = _keep(stride[axis], scale[axis], lead[axis], tile.grid_index[axis], tile.grid_shape[axis])
        if keep is not None and out.shape[dim] < keep:
            raise ValueError(
                f"{OP_NAME}: argument 'decode_tile' expected a decoded tile with {'THW'[axis]} >= {keep} "
                f"({where} is not the last along {'thw'[axis]}: the assembly keeps {keep} samples of it, "
                f"stride * scale plus `lead` on the first tile; check `lead` and the decoder's length), got {_shape(out)}"
            )


def _check_group(group: Any, dst: int | None) -> None:
    if group is not None and group is not LOCAL:
        if not dist.is_available():
            expected = "None or xbackend.vae.LOCAL (this torch build has no torch.distributed)"
            raise _arg_error(ValueError, "group", expected, type(group).__name__)
        if not isinstance(group, dist.ProcessGroup):
            raise _arg_error(
                TypeError, "group", "None, xbackend.vae.LOCAL or a torch.distributed.ProcessGroup", type(group).__name__
            )
        if not dist.is_initialized():
            raise _arg_error(
                ValueError, "group", "a process group of an initialised torch.distributed", "a group, no init"
            )
        if dist.get_rank(group) < 0:
            raise _arg_error(ValueError, "group", "a group this rank belongs to", "a group without this rank")
    world = group_world_size(group)
    if dst is not None and dst >= world:
        raise _arg_error(ValueError, "dst", f"a rank of the group, 0..{world - 1}", dst)


def group_world_size(group: Any) -> int:
    """Ranks in `group`; 1 for `LOCAL`, and when torch.distributed is not initialised and no group is given."""
    if group is LOCAL or (group is None and not (dist.is_available() and dist.is_initialized())):
        return 1
    return dist.get_world_size(group)
