"""Tiled VAE decoding: the `vae_tile_decode` op (serial or spread over a torch.distributed group)."""

from .parallel import TileDecodeError, vae_tile_decode
from .progress import TileProgress
from .tiling import (
    Tile,
    TileGrid,
    assemble_tiles,
    assign_tiles,
    blend_into,
    check_vae_tile_decode_args,
    make_grid,
    resolve_blend,
    tile_intervals,
)

__all__ = [
    "Tile",
    "TileDecodeError",
    "TileGrid",
    "TileProgress",
    "assemble_tiles",
    "assign_tiles",
    "blend_into",
    "check_vae_tile_decode_args",
    "make_grid",
    "resolve_blend",
    "tile_intervals",
    "vae_tile_decode",
]
