"""Drive diffusers' LTX-2 video decoders through `vae_tile_decode` (serial or over a process group).

Both functions return the same bits as diffusers' own serial tiled decode (diffusers 0.42.1) with the same
inputs and generator, whatever the world size. diffusers is imported lazily: importing this module
does not need it, calling these functions on a diffusers model does.

- `tiled_decode_diffvae`: `LTX2VideoDiffusionDecoderModel.tiled_decode`. Stages 1-3 run on the full
  latent on every rank (cheap, and cheaper than shipping the feature volume); stage 4 + the stage-5
  denoiser run per tile on the tile's owner.
- `tiled_decode_autoencoder_ltx2`: `AutoencoderKLLTX2Video._decode`'s tiling (the temporal
  `_temporal_tiled_decode` when `use_framewise_decoding`, the spatial `tiled_decode` when `use_tiling`).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Callable
from typing import Any

import torch

from ..vae.parallel import vae_tile_decode
from ..vae.tiling import OP_NAME, Tile, group_world_size

_DIFFVAE = "LTX2VideoDiffusionDecoderModel.tiled_decode"
_AUTOENCODER = "AutoencoderKLLTX2Video tiled decode"

# fn(q, k, v, kernel_size, scale=...) on heads-last [B, T, H, W, heads, head_dim], like
# xbackend.get_op("neighborhood_attention").
NeighborhoodAttention = Callable[..., torch.Tensor]


class DiffVAENeighborhoodProcessor:
    """A DiffVAE attention processor that hands q/k/v to any neighborhood-attention function.

    The stock flex processor builds a dense block mask (hundreds of GiB at 1080p) and the NATTEN one
    downloads kernels at run time; this one lets the DiffVAE run on `get_op("neighborhood_attention")`.
    Not being the flex processor, it also stops the decoder from building that mask.
    """

    def __init__(self, attention: NeighborhoodAttention):
        self.attention = attention

    def project_qkv(self, attn: Any, hidden_states: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """q, k, v as ``[B, T, H, W, heads, head_dim]``; here ``attn.project_qkv``."""
        return attn.project_qkv(hidden_states)

    def __call__(self, attn: Any, hidden_states: torch.Tensor, block_mask: Any = None) -> torch.Tensor:
        batch, frames, height, width, channels = hidden_states.shape
        query, key, value = self.project_qkv(attn, hidden_states)
        # The query already carries head_dim**-0.5 (diffusers scales it before the rotary embedding).
        out = self.attention(query, key, value, tuple(attn.kernel_size), scale=1.0)
        return attn.to_out[0](out.reshape(batch, frames, height, width, channels))


def set_diffvae_attention(model: Any, attention: NeighborhoodAttention) -> int:
    """Route every neighborhood attention of a DiffVAE through `attention`; returns how many were set."""
    count = 0
    for module in model.modules():
        if hasattr(module, "project_qkv") and hasattr(module, "set_processor"):
            module.set_processor(DiffVAENeighborhoodProcessor(attention))
            count += 1
    return count


def _context_shape(decoder: Any, tile: Tile, feature_frames: int, num_frames: int) -> tuple[int, int, int]:
    """Stage-4 output grid (T, H, W) of a tile, known before stage 4 runs.

    Every rank needs each tile's noise shape to draw the generator in serial order, but only the owner
    runs stage 4; this follows the stage's own shape rules: the upsample's duplicate leading frame is
    dropped only at t=0, the ghost frames are cropped only by the tile holding the video end.
    """
    s_t, s_h, s_w = decoder.upsamples[-1].stride
    (t0, h0, w0), (t1, h1, w1) = tile.start, tile.stop
    is_trailing = t1 == num_frames
    frames = ((feature_frames if is_trailing else t1) - t0) * s_t
    if s_t == 2 and t0 == 0:
        frames -= 1
    pad = decoder.trailing_pad_latent_frames
    if is_trailing and pad > 0:
        frames = max(frames - pad * decoder.temporal_compression_ratio, 0)
    return frames, (h1 - h0) * s_h, (w1 - w0) * s_w


def tiled_decode_diffvae(
    model: Any,
    z: torch.Tensor,
    generator: torch.Generator | None = None,
    num_inference_steps: int | None = None,
    *,
    group: Any = None,
    dst: int | None = None,
    progress: bool = False,
    timeout: datetime.timedelta | None = None,
) -> torch.Tensor | None:
    """`model.tiled_decode(z, generator, num_inference_steps)` of an `LTX2VideoDiffusionDecoderModel`, tiled
    over `group` (default group when torch.distributed is initialised). Returns None on ranks other than
    `dst` when `dst` is given. Every rank must pass the same `z` and a generator in the same state."""
    from diffusers.utils.torch_utils import randn_tensor

    decoder = model.decoder
    steps = num_inference_steps or decoder.default_num_inference_steps
    patch = decoder.patch_size
    up_stride = decoder.upsamples[-1].stride
    scale = (up_stride[0], up_stride[1] * patch, up_stride[2] * patch)
    tile_px = (model.tile_sample_min_num_frames, model.tile_sample_min_height, model.tile_sample_min_width)
    stride_px = (
        model.tile_sample_stride_num_frames,
        model.tile_sample_stride_height,
        model.tile_sample_stride_width,
    )
    tile = tuple(p // s for p, s in zip(tile_px, scale, strict=True))
    stride = tuple(p // s for p, s in zip(stride_px, scale, strict=True))
    if min(stride) < 1:
        raise ValueError(
            f"op {OP_NAME!r} ({_DIFFVAE}): tile_sample_stride_* {stride_px} must be at least one grid cell {scale}"
        )
    # Both remaining attention kernels must fit a tile: stage 4 sees it as-is, stage 5 upsampled.
    min_remnant = tuple(
        max(k4, -(-k5 // s))
        for k4, k5, s in zip(
            model.config.decoder_stage_kernels[-1], model.config.decoder_stage5_kernel, up_stride, strict=True
        )
    )

    features = decoder.forward_stages_1_to_3(z)
    ghost = decoder.trailing_pad_latent_frames * math.prod(up.stride[0] for up in decoder.upsamples[:-1])
    feature_frames = features.shape[1]
    num_frames = feature_frames - ghost
    height, width = features.shape[2], features.shape[3]
    batch = z.shape[0]

    # Single-step x0 draws fresh noise per tile; multi-step slices one canvas so overlaps share noise.
    single_step_x0 = steps == 1 and decoder.model_output_type == "x0"
    canvas = None
    if not single_step_x0:
        pixel_frames = num_frames * scale[0] - (1 if scale[0] == 2 else 0)
        canvas_shape = (batch, decoder.out_channels, pixel_frames, height * scale[1], width * scale[2])
        canvas = randn_tensor(canvas_shape, generator=generator, device=z.device, dtype=z.dtype)

    def pixel_shape(t: Tile) -> tuple[int, ...]:
        frames, h, w = _context_shape(decoder, t, feature_frames, num_frames)
        return (batch, decoder.out_channels, frames, h * patch, w * patch)

    def draw_noise(t: Tile) -> torch.Tensor:
        shape = pixel_shape(t)
        if canvas is None:
            return randn_tensor(shape, generator=generator, device=z.device, dtype=z.dtype)
        t0, h0, w0 = t.start
        # A tile not at t=0 keeps its duplicate leading frame: it starts one pixel frame early.
        p0 = t0 * scale[0] - (1 if t0 > 0 and scale[0] == 2 else 0)
        return canvas[
            :,
            :,
            p0 : p0 + shape[2],
            h0 * scale[1] : h0 * scale[1] + shape[3],
            w0 * scale[2] : w0 * scale[2] + shape[4],
        ]

    def decode_tile(_piece: torch.Tensor, t: Tile, x_t: torch.Tensor) -> torch.Tensor:
        (t0, h0, w0), (t1, h1, w1) = t.start, t.stop
        is_trailing = t1 == num_frames
        # The tile holding the video end takes the ghost frames (beyond `_piece`) into stage 4.
        context = decoder.forward_stage_4(
            features[:, t0 : feature_frames if is_trailing else t1, h0:h1, w0:w1],
            drop_leading_frame=t0 == 0,
            crop_trailing_ghost=is_trailing,
        )
        expected = pixel_shape(t)
        got = (batch, decoder.out_channels, context.shape[1], context.shape[2] * patch, context.shape[3] * patch)
        if got != expected:
            raise RuntimeError(
                f"op {OP_NAME!r} ({_DIFFVAE}): stage 4 of {t} gave pixel shape {got}, predicted {expected}; "
                "this decoder's stage-4 shape rules differ from the ones the noise plan assumes"
            )
        return decoder.denoise(context, x_t, steps)

    return vae_tile_decode(
        features[:, :num_frames],
        decode_tile,
        tile=tile,
        stride=stride,
        scale=scale,
        min_remnant=min_remnant,
        lead=(-1 if scale[0] == 2 else 0, 0, 0),
        axes=(1, 2, 3),
        draw_noise=draw_noise,
        group=group,
        dst=dst,
        progress=progress,
        timeout=timeout,
    )


def _uses_global_rng_noise(decoder: Any) -> bool:
    return any(getattr(m, "per_channel_scale1", None) is not None for m in decoder.modules())


def _axis_plan(tiled: bool, length: int, tile_px: int, stride_px: int, ratio: int, name: str) -> tuple[int, int, int]:
    """(tile, stride, blend) in latent/latent/output units for one axis of the autoencoder's tiling."""
    if not tiled:
        return length, length, 0
    if stride_px % ratio or stride_px < ratio:
        raise ValueError(
            f"op {OP_NAME!r} ({_AUTOENCODER}): argument 'tile_sample_stride_{name}': expected a positive "
            f"multiple of the compression ratio {ratio}, got {stride_px}"
        )
    return tile_px // ratio, stride_px // ratio, tile_px - stride_px


def tiled_decode_autoencoder_ltx2(
    model: Any,
    z: torch.Tensor,
    temb: torch.Tensor | None = None,
    causal: bool | None = None,
    *,
    group: Any = None,
    dst: int | None = None,
    progress: bool = False,
    timeout: datetime.timedelta | None = None,
) -> torch.Tensor | None:
    """`model._decode(z, temb, causal).sample` of an `AutoencoderKLLTX2Video`, tiled over `group`.

    Same dispatch as diffusers: temporal tiles when `use_framewise_decoding` and the latent is longer than
    `tile_sample_min_num_frames`, spatial tiles when `use_tiling` and it is larger than the spatial tile,
    one tile otherwise. Returns None on ranks other than `dst` when `dst` is given.
    """
    _, _, num_frames, height, width = z.shape
    sr, tr = model.spatial_compression_ratio, model.temporal_compression_ratio
    temporal = model.use_framewise_decoding and num_frames > model.tile_sample_min_num_frames // tr
    spatial = model.use_tiling and (
        width > model.tile_sample_min_width // sr or height > model.tile_sample_min_height // sr
    )
    if group_world_size(group) > 1 and _uses_global_rng_noise(model.decoder):
        raise ValueError(
            f"op {OP_NAME!r} ({_AUTOENCODER}): decoder_inject_noise draws from torch's global RNG in tile order,"
            " which ranks decoding different tiles cannot reproduce; decode on one rank or disable it"
        )
    t_tile, t_stride, t_blend = _axis_plan(
        temporal, num_frames, model.tile_sample_min_num_frames, model.tile_sample_stride_num_frames, tr, "num_frames"
    )
    if temporal:
        # diffusers hands each temporal tile one extra latent frame and drops its last decoded frame
        # (except on the first tile), so a tile is one frame longer than tile_sample_min_num_frames says.
        t_tile += 1
    h_tile, h_stride, h_blend = _axis_plan(
        spatial, height, model.tile_sample_min_height, model.tile_sample_stride_height, sr, "height"
    )
    w_tile, w_stride, w_blend = _axis_plan(
        spatial, width, model.tile_sample_min_width, model.tile_sample_stride_width, sr, "width"
    )

    def decode_tile(piece: torch.Tensor, t: Tile) -> torch.Tensor:
        decoded = model.decoder(piece, temb, causal=causal)
        if temporal and t.start[0] > 0:
            decoded = decoded[:, :, :-1]
        return decoded

    return vae_tile_decode(
        z,
        decode_tile,
        tile=(t_tile, h_tile, w_tile),
        stride=(t_stride, h_stride, w_stride),
        scale=(tr, sr, sr),
        blend=(t_blend, h_blend, w_blend),
        lead=(1 if temporal else 0, 0, 0),
        out_size=(
            (num_frames - 1) * tr + 1 if temporal else None,
            height * sr if spatial else None,
            width * sr if spatial else None,
        ),
        whole_if_fits=False,
        group=group,
        dst=dst,
        progress=progress,
        timeout=timeout,
    )
