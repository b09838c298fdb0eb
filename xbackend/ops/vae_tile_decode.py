"""vae_tile_decode(latent, decode_tile, *, tile, stride, scale, ...) — decode a latent in overlapping
tiles, blend the seams with diffusers' linear rule, crop to the stride and assemble; spread the tiles
over a ``torch.distributed`` group when one is up (``xbackend/vae/``).

A host-level op: it takes a Python callable and a process group, so it is not a ``torch.library``
custom op and has no kernels to resolve. It runs outside compiled regions; the tiles it decodes call
the other ops, which are resolved and guarded as usual. Parallel output is bit-identical to serial.
"""

from __future__ import annotations

from ..vae import check_vae_tile_decode_args as check
from ..vae import vae_tile_decode as reference

NAME = "vae_tile_decode"
SIGNATURE = ("vae_tile_decode(latent, decode_tile, *, tile, stride, scale, min_remnant=(1,1,1), blend=(None,)*3, "
             "lead=(0,0,0), out_size=(None,)*3, axes=(2,3,4), whole_if_fits=True, draw_noise=None, group=None, "
             "dst=None, progress=False, timeout=None)")

__all__ = ["NAME", "SIGNATURE", "check", "reference"]
