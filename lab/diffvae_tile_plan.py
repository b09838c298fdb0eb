"""The DiffVAE decode's tile plan and its ownership balance, on the CPU (meta tensors, nothing decoded):
the benchmark decode's stage-3 feature volume, the tile grid ``tiled_decode_diffvae`` cuts from it and
the per-rank tile volume ``assign_tiles`` gives 2, 4 and 8 ranks.

    python3 lab/diffvae_tile_plan.py [--height 1088 --width 1920 --frames 121]

The tiling parameters are derived here as xbackend/adapters/diffusers_ltx2.py derives them (tile and
stride from the model's tile_sample_* sizes over the last upsample's stride times the patch size,
min_remnant from the stage-4 and stage-5 kernels, the trailing ghost frames cropped). Volume is the
work proxy: the convolutions' and the neighborhood attentions' cost grows with it.
"""

from __future__ import annotations

import argparse
import math

import torch
from diffusers import LTX2VideoDiffusionDecoderModel

import xbackend
from xbackend.vae.tiling import assign_tiles, make_grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--height", type=int, default=1088)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--frames", type=int, default=121)
    a = ap.parse_args()
    with torch.device("meta"):
        model = LTX2VideoDiffusionDecoderModel().to(torch.bfloat16)
    model.enable_tiling()
    xbackend.patch(model, only=("neighborhood_attention",))  # its fake impl runs stages 1-3 on meta
    cfg, decoder = model.config, model.decoder
    z = torch.empty(1, cfg.latent_channels, (a.frames - 1) // cfg.temporal_compression_ratio + 1,
                    a.height // cfg.spatial_compression_ratio, a.width // cfg.spatial_compression_ratio,
                    device="meta", dtype=torch.bfloat16)
    features = decoder.forward_stages_1_to_3(z)
    up = decoder.upsamples[-1].stride
    scale = (up[0], up[1] * decoder.patch_size, up[2] * decoder.patch_size)
    tile_px = (model.tile_sample_min_num_frames, model.tile_sample_min_height, model.tile_sample_min_width)
    stride_px = (model.tile_sample_stride_num_frames, model.tile_sample_stride_height,
                 model.tile_sample_stride_width)
    tile = tuple(p // s for p, s in zip(tile_px, scale, strict=True))
    stride = tuple(p // s for p, s in zip(stride_px, scale, strict=True))
    min_remnant = tuple(max(k4, -(-k5 // s)) for k4, k5, s in
                        zip(cfg.decoder_stage_kernels[-1], cfg.decoder_stage5_kernel, up, strict=True))
    ghost = decoder.trailing_pad_latent_frames * math.prod(u.stride[0] for u in decoder.upsamples[:-1])
    volume = (features.shape[1] - ghost, features.shape[2], features.shape[3])
    tiles = make_grid(list(volume), tile, stride, min_remnant, True).tiles()
    vols = [t.volume for t in tiles]
    print(f"latent {tuple(z.shape)} -> stage-3 features {tuple(features.shape)}; tiled volume {volume}, tile {tile}, "
          f"stride {stride}: {len(tiles)} tiles, volumes {sorted(vols, reverse=True)}")
    for world in (2, 4, 8):
        owners = assign_tiles(vols, world)
        loads = [sum(v for v, o in zip(vols, owners, strict=True) if o == r) for r in range(world)]
        print(f"{world} ranks: tiles {[owners.count(r) for r in range(world)]}, volume {loads}, "
              f"max / mean {max(loads) / (sum(loads) / world):.3f}")


if __name__ == "__main__":
    main()
