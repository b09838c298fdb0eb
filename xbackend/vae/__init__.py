"""Tiled VAE decoding: the `vae_tile_decode` op (serial, or spread over a torch.distributed group whose ranks
hold the same latent)."""

from .agree import InputMismatchError, content_digest, require_same_on_ranks
from .parallel import TileDecodeError, vae_tile_decode
from .progress import TileProgress
from .tiling import (
    LOCAL,
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
    "LOCAL",
    "InputMismatchError",
    "Tile",
    "TileDecodeError",
    "TileGrid",
    "TileProgress",
    "assemble_tiles",
    "assign_tiles",
    "blend_into",
    "check_vae_tile_decode_args",
    "content_digest",
    "make_grid",
    "require_same_on_ranks",
    "resolve_blend",
    "tile_intervals",
    "vae_tile_decode",
]
