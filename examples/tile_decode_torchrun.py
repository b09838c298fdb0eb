"""vae_tile_decode over torch.distributed ranks, runnable anywhere:

    torchrun --nproc_per_node=2 examples/tile_decode_torchrun.py       # gloo on CPU, NCCL on GPUs
    python examples/tile_decode_torchrun.py                             # one process, serial

A toy decoder (upsample + tanh + per-tile noise) stands in for a VAE. Every rank prints the same
checksum, equal to the serial decode's: the tiles are split over ranks by volume, the noise each tile
draws does not depend on which rank decodes it, and the blended output is gathered on every rank.

If a rank hangs or dies, the others raise TileDecodeError after `timeout` (or at once for a dead rank);
the group is then unusable, so each rank destroys it and exits with status 1 instead of hanging.
"""

from __future__ import annotations

import datetime
import os
import sys

import torch
import torch.distributed as dist

import xbackend
from xbackend.vae import TileDecodeError

SCALE = (4, 8, 8)  # latent -> pixel per axis (t, h, w)


def main() -> int:
    distributed = "RANK" in os.environ
    if distributed:
        use_cuda = torch.cuda.is_available()
        dist.init_process_group("nccl" if use_cuda else "gloo")
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    latent = torch.randn(1, 4, 6, 20, 28, generator=torch.Generator().manual_seed(0)).to(device)
    noise_gen = torch.Generator().manual_seed(1)

    def draw_noise(tile):  # called for every tile, in order, on every rank
        shape = (1, 3, *(n * s for n, s in zip(tile.size, SCALE, strict=True)))
        return torch.randn(shape, generator=noise_gen)

    def decode_tile(z, tile, noise):
        x = z[:, :3]
        for dim, s in zip((2, 3, 4), SCALE, strict=True):
            x = x.repeat_interleave(s, dim=dim)
        return torch.tanh(x) + 0.05 * noise.to(x.device)

    rank = dist.get_rank() if distributed else 0
    try:
        video = xbackend.get_op("vae_tile_decode")(
            latent, decode_tile, tile=(3, 8, 8), stride=(2, 6, 6), scale=SCALE, draw_noise=draw_noise,
            progress=not distributed or rank == 0,
            # Shorter than the group's own timeout (30 min by default), so a stuck peer ends the run first.
            timeout=datetime.timedelta(minutes=5),
        )
    except TileDecodeError as exc:
        print(f"rank {rank}: {exc}", file=sys.stderr)
        status = 1
    else:
        print(f"rank {rank}: video {tuple(video.shape)}, checksum {video.double().sum().item():.10f}")
        status = 0
    if distributed:
        dist.destroy_process_group()
    return status


if __name__ == "__main__":
    sys.exit(main())
