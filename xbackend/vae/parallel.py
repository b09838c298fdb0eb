"""`vae_tile_decode`: decode a latent tile by tile, spread over the ranks of a torch.distributed group.

Every rank cuts the same grid and computes the same ownership plan (largest tile first to the least
loaded rank), so nobody negotiates. That holds only if every rank was given the same latent and
arguments, so the ranks first all-gather a fingerprint of them (`agree.py`), and if one differs, all
raise InputMismatchError naming it. Each rank decodes its own tiles in serial order, then one all-reduce
carries both every tile's shape/dtype and a failure flag per rank: a rank whose decode raised still joins
it, so the others raise too instead of waiting forever in the next collective. Tiles then travel from
their owner to every rank (broadcast) or to `dst` only (send/recv), and each receiving rank runs the same
serial assembly, so the result is bit-identical whatever the world size.

Noise: `draw_noise(tile)` is called for every tile, in serial order, on every rank, whether it owns the
tile or not, right before the tile would be decoded serially. A generator shared by the tiles therefore
advances exactly as in a one-process decode, and a tile's noise does not depend on who decodes it. Each
rank digests the noise it drew and the status all-reduce carries the digests: ranks whose generators
were in different states raise InputMismatchError on every rank before any tile travels.

Failures, and what the caller does after them:

- A rank's decode raises (or returns a tile of the wrong shape): that rank re-raises its own error, every
  other rank raises TileDecodeError naming it. Every rank took part in the status all-reduce, so the group
  stays usable and the next call may run on it.
- A rank hangs or dies: the others raise TileDecodeError after `timeout` (default: the group's timeout),
  or at once when the dead rank's connection closes, naming the rank and what it was doing. The group is
  then unusable on every rank (NCCL communicators aborted, gloo connections closed): call
  `torch.distributed.destroy_process_group()` and create a new group, or return from main; the process
  exits normally. A hung rank that wakes later raises too, at once. `collective.py` says how.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from .agree import InputMismatchError, NoiseDigest, mismatch_message, require_same
from .collective import GroupLink, TileDecodeError
from .progress import TileProgress
from .tiling import (
    LOCAL,
    OP_NAME,
    Tile,
    _Local,
    assemble_tiles,
    assign_tiles,
    check_decoded_tile,
    check_vae_tile_decode_args,
    group_world_size,
    make_grid,
    normalize_axes,
    resolve_blend,
)

__all__ = ["LOCAL", "InputMismatchError", "TileDecodeError", "vae_tile_decode"]

# Tile metadata sent in the status all-reduce: dtype code, ndim, then up to _MAX_DIMS sizes.
_MAX_DIMS = 8
_META = 2 + _MAX_DIMS
_DTYPES = (
    torch.float32,
    torch.bfloat16,
    torch.float16,
    torch.float64,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.bool,
)
_LABEL = f"op {OP_NAME!r}"
_HINT = (
    "Every rank of the group decodes the same latent together (group=None is the default group while "
    "torch.distributed is initialised); to decode each rank's own latent on its own, pass group=xbackend.vae.LOCAL."
)


def vae_tile_decode(
    latent: torch.Tensor,
    decode_tile: Callable[..., torch.Tensor],
    *,
    tile: tuple[int, int, int],
    stride: tuple[int, int, int],
    scale: tuple[int, int, int],
    min_remnant: tuple[int, int, int] = (1, 1, 1),
    blend: tuple[int | None, int | None, int | None] = (None, None, None),
    lead: tuple[int, int, int] = (0, 0, 0),
    out_size: tuple[int | None, int | None, int | None] = (None, None, None),
    axes: tuple[int, int, int] = (2, 3, 4),
    whole_if_fits: bool = True,
    draw_noise: Callable[[Tile], Any] | None = None,
    group: dist.ProcessGroup | _Local | None = None,
    dst: int | None = None,
    progress: bool = False,
    timeout: datetime.timedelta | None = None,
) -> torch.Tensor | None:
    """Decode `latent` in overlapping tiles and blend them into one `[..., T, H, W]` output.

    Grid (latent units, per axis t, h, w of `latent` dims `axes`): starts `stride` apart, tiles `tile`
    long; a trailing remnant shorter than `min_remnant` merges into the previous tile; an axis no longer
    than `tile` is one tile unless `whole_if_fits=False`.

    `decode_tile(latent_tile, tile)` (or `(latent_tile, tile, noise)` when `draw_noise` is given) returns
    the decoded tile, `[..., T, H, W]` in output units (`scale` per latent sample). It may read beyond
    `latent_tile` through a closure; `tile` carries the latent `start`/`stop` and grid position. The
    decoded tile is blended in place, so it must not be a view of something the caller still needs.

    Blend/crop: seams `blend` output samples wide (None: `(tile - stride) * scale`) with diffusers'
    linear rule, non-last tiles cropped to `stride * scale` (+ `lead` on the first), the result cropped
    to `out_size`.

    Distributed: `group` (or the default group when torch.distributed is initialised) splits the tiles
    over its ranks; every rank (or only group rank `dst`) gets the result, the others get None.
    `group=LOCAL` decodes on this process alone. Every rank of the group must pass the same latent, tile
    arguments and `dst`, and draw the same noise: otherwise every rank raises InputMismatchError naming
    the ranks that differ (one all-gather of a few int64s before decoding; the noise digests ride on the
    status all-reduce), and the group stays usable. A failure on any rank raises on every rank; a rank
    that never answers makes the others raise after `timeout` (default: the group's timeout; it bounds
    every collective of the call), and one that died makes them raise at once. After a hung or dead rank
    the group is unusable: destroy it and make a new one, or exit (module docstring). Decoding all tiles on one process and on N ranks gives the same bits.

    `decode_tile`'s output is checked on every tile: as many dims as the latent, H and W equal to the tile's
    latent size times `scale`, and a tile that is not last along an axis at least as long as the part kept
    of it. `lead` must leave the first tile at least one sample (`lead > -stride * scale`).
    """
    check_vae_tile_decode_args(
        latent,
        decode_tile,
        tile=tile,
        stride=stride,
        scale=scale,
        min_remnant=min_remnant,
        blend=blend,
        lead=lead,
        out_size=out_size,
        axes=axes,
        whole_if_fits=whole_if_fits,
        draw_noise=draw_noise,
        group=group,
        dst=dst,
        progress=progress,
        timeout=timeout,
    )
    dims = normalize_axes(latent, axes)
    grid = make_grid([latent.shape[d] for d in dims], tile, stride, min_remnant, whole_if_fits)
    tiles = grid.tiles()
    world = group_world_size(group)
    distributed = world > 1
    rank = dist.get_rank(group) if distributed else 0
    owners = assign_tiles([t.volume for t in tiles], world)
    link = GroupLink(group, rank, world, latent.device, timeout) if distributed else None
    noise_digest = NoiseDigest(latent.device) if distributed and draw_noise is not None else None
    if link is not None:
        link.note("check")
        inputs = {
            "latent": latent,
            "tile": tuple(tile),
            "stride": tuple(stride),
            "scale": tuple(scale),
            "min_remnant": tuple(min_remnant),
            "blend": tuple(blend),
            "lead": tuple(lead),
            "out_size": tuple(out_size),
            "axes": dims,
            "whole_if_fits": whole_if_fits,
            "dst": dst,
            "draw_noise": draw_noise is not None,
        }
        with link:
            require_same(link, inputs, label=_LABEL, hint=_HINT)
        link.note("decoding")
    shape_args = {"latent_ndim": latent.ndim, "stride": stride, "scale": scale, "lead": lead}

    mine: dict[int, torch.Tensor] = {}
    error: BaseException | None = None
    label = f"{OP_NAME} rank 0/{world}"
    with TileProgress(owners.count(rank), label, enabled=progress and rank == 0) as bar:
        try:
            for t in tiles:
                noise = draw_noise(t) if draw_noise is not None else None
                if noise_digest is not None:
                    noise_digest.add(noise)
                if owners[t.index] != rank:
                    continue
                mine[t.index] = _decode_one(
                    latent, decode_tile, t, dims, noise, draw_noise is not None, distributed, shape_args
                )
                bar.advance()
        except Exception as exc:
            # Distributed: the other ranks must hear of it (status all-reduce) before this one re-raises.
            if not distributed:
                raise
            error = exc

    if link is not None:
        with link:
            noise = None if noise_digest is None else noise_digest.value
            decoded = _exchange(tiles, owners, mine, error, noise, link=link, dst=dst, device=latent.device)
        if decoded is None:
            return None
    else:
        decoded = [mine[i] for i in range(len(tiles))]
    return assemble_tiles(
        decoded,
        grid,
        stride=stride,
        scale=scale,
        blend=resolve_blend(tile, stride, scale, blend),
        lead=lead,
        out_size=out_size,
    )


def _decode_one(
    latent: torch.Tensor,
    decode_tile: Callable[..., torch.Tensor],
    tile: Tile,
    dims: tuple[int, int, int],
    noise: Any,
    with_noise: bool,
    distributed: bool,
    shape_args: dict[str, Any],
) -> torch.Tensor:
    piece = latent[tile.slices(latent.ndim, dims)]
    out = decode_tile(piece, tile, noise) if with_noise else decode_tile(piece, tile)
    # Every tile, not only the first: a cheap shape test, and a wrong tile anywhere misplaces the rest.
    check_decoded_tile(out, tile, **shape_args)
    if out.untyped_storage().data_ptr() == latent.untyped_storage().data_ptr():
        # Blending writes into tiles; a tile that is a view of the latent would overwrite the input.
        out = out.clone()
    if distributed:
        if out.device != latent.device:
            raise ValueError(
                f"op {OP_NAME!r}: decode_tile returned a tile on {out.device}, the latent is on {latent.device};"
                " a distributed decode receives tiles on the latent's device"
            )
        out = out.contiguous()
    return out


def _encode_meta(tiles: Sequence[Tile], mine: dict[int, torch.Tensor], world: int) -> torch.Tensor:
    # Per tile its metadata, then per rank a failure flag and a noise digest.
    meta = torch.zeros(len(tiles) * _META + 2 * world, dtype=torch.int64)
    for index, out in mine.items():
        if out.dtype not in _DTYPES or out.ndim > _MAX_DIMS:
            raise TypeError(f"op {OP_NAME!r}: cannot send a decoded tile of dtype {out.dtype} and {out.ndim} dims")
        row = [_DTYPES.index(out.dtype) + 1, out.ndim, *out.shape]
        meta[index * _META : index * _META + len(row)] = torch.tensor(row, dtype=torch.int64)
    return meta


def _decode_meta(meta: torch.Tensor, index: int) -> tuple[torch.dtype, tuple[int, ...]]:
    row = meta[index * _META : (index + 1) * _META].tolist()
    ndim = row[1]
    return _DTYPES[row[0] - 1], tuple(row[2 : 2 + ndim])


def _raise_collective_failure(error: BaseException | None, failed: list[int], link: GroupLink) -> None:
    # Every rank knows a failure happened, so all of them join this gather: it cannot hang on its own.
    messages: list[Any] = [None] * link.world
    mine = None if error is None else f"{type(error).__name__}: {error}"[:2000]
    try:
        dist.all_gather_object(messages, mine, group=link.group)
    except Exception:
        # The messages are a courtesy; the failure itself must surface either way.
        messages = [None] * link.world
    if error is not None:
        raise error
    detail = "; ".join(f"rank {r}: {messages[r]}" for r in failed if messages[r])
    raise TileDecodeError(
        f"op {OP_NAME!r}: tile decode failed on rank(s) {failed}" + (f" ({detail})" if detail else "")
    )


def _exchange(
    tiles: Sequence[Tile],
    owners: Sequence[int],
    mine: dict[int, torch.Tensor],
    error: BaseException | None,
    noise: torch.Tensor | None,
    *,
    link: GroupLink,
    dst: int | None,
    device: torch.device,
) -> list[torch.Tensor] | None:
    """Agree on success and on the noise drawn, then deliver every tile to every rank (or to `dst`).
    Raises on every rank on failure."""
    rank, world = link.rank, link.world
    flags = len(tiles) * _META
    meta = torch.zeros(flags + 2 * world, dtype=torch.int64)
    if error is None:
        try:
            meta = _encode_meta(tiles, mine, world)
        except Exception as exc:
            # An undeliverable tile is reported like a failed decode.
            error = exc
    if error is not None:
        meta.zero_()
        meta[flags + rank] = 1
    # NCCL only reduces device tensors, gloo takes either: the latent's device suits both.
    meta_dev = meta.to(device)
    if noise is not None and error is None:
        # Each rank fills its own slot, the sum is every rank's digest: an all-gather inside the all-reduce.
        meta_dev[flags + world + rank] = noise
    link.note("exchange")
    link.all_reduce(meta_dev, own_error=error)
    meta = meta_dev.cpu()
    failed = [r for r in range(world) if meta[flags + r] > 0]
    if failed:
        _raise_collective_failure(error, failed, link)
    digests = meta[flags + world :].tolist()
    if len(set(digests)) > 1:
        raise InputMismatchError(
            mismatch_message(
                [(d,) for d in digests],
                lambda *_: "'draw_noise' (the noise it returned: generators in different states, or one that "
                "decode_tile draws from too, on the tile's owner only)",
                label=_LABEL,
                hint=_HINT,
            )
        )

    receives = dst is None or rank == dst
    out: list[torch.Tensor] = []
    for t in tiles:
        owner = owners[t.index]
        dtype, shape = _decode_meta(meta, t.index)
        if rank == owner:
            buf = mine[t.index]
        elif receives:
            buf = torch.empty(shape, dtype=dtype, device=device)
        else:
            continue
        if buf.numel() > 0:
            if dst is None:
                link.broadcast(buf, owner)
            elif owner != dst and rank == owner:
                link.send(buf, dst)
            elif owner != dst and rank == dst:
                link.recv(buf, owner)
        out.append(buf)
    link.finish()
    return out if receives else None
