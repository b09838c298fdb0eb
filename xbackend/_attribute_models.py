"""The bundled models of ``xbackend attribute``: examples/'s tiny LTX-2 DiT and DiffVAE configs (random
weights, nothing downloaded), and the command itself.

examples/ is not installed with the package, so the tiny configs live here too; tests/test_attribute.py
checks that they equal the examples'.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["DIFFVAE_TILING", "DIFFVAE_TINY", "DIT_TINY", "MODELS", "bundled", "cmd_attribute"]

MODELS = ("ltx2-dit", "ltx2-diffvae")
# examples/ltx2_transformer.py's CPU defaults (its TINY row and argument defaults).
DIT_TINY = {"hidden": 64, "heads": 2, "audio_hidden": 32, "audio_heads": 2, "caption": 32, "audio_seq": 5,
            "text_seq": 8, "seq": 60, "layers": 2, "variant": "ltx2.0", "rope_type": "interleaved"}
# examples/ltx2_diffvae.py's TINY_CONFIG and TINY_TILING (a 3x3x3 tile grid), decoding 17 x 48 x 64 pixels.
DIFFVAE_TINY = {
    "latent_channels": 8, "patch_size": 2, "decoder_head_dim": 8, "decoder_stage_channels": (32, 16, 8, 8, 8),
    "decoder_stage_depths": (1, 1, 1, 1, 2), "decoder_stage_kernels": ((3, 3, 3),) * 4,
    "decoder_upsample_channel_reductions": (2, 2, 1, 1), "decoder_stage5_kernel": (3, 3, 3),
    "decoder_t_emb_dim": 32, "spatial_compression_ratio": 16,
}  # fmt: skip
DIFFVAE_TILING = {
    "tile_sample_min_num_frames": 10, "tile_sample_stride_num_frames": 6, "tile_sample_min_height": 24,
    "tile_sample_stride_height": 16, "tile_sample_min_width": 28, "tile_sample_stride_width": 20,
}  # fmt: skip
_DIFFVAE_PIXELS = (17, 48, 64)
_NEEDS = "the bundled models need diffusers 0.42.1: pip install 'xbackend[diffusers]'"


@contextlib.contextmanager
def _quiet_diffusers() -> Iterator[None]:
    """diffusers' advice on `.to(dtype)` is meant for from_pretrained; not for random weights."""
    from diffusers.utils import logging

    level = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(level)


def bundled(name: str, device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    """(unpatched model, positional arguments, keyword arguments) of the bundled model ``name``: what
    examples/ builds with its tiny defaults, seeded the same."""
    if name not in MODELS:
        raise ValueError(f"xbackend attribute: argument 'model' expected one of {', '.join(MODELS)}, got {name!r}")
    try:
        import diffusers  # noqa: F401
    except ImportError:
        raise ImportError(_NEEDS) from None
    with _quiet_diffusers():
        return _dit(device, dtype) if name == "ltx2-dit" else _diffvae(device, dtype)


def _dit(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    from diffusers import LTX2VideoTransformer3DModel

    c = DIT_TINY
    torch.manual_seed(0)
    with torch.device(device):
        model = LTX2VideoTransformer3DModel(
            in_channels=128, out_channels=128, audio_in_channels=128, audio_out_channels=128,
            num_attention_heads=c["heads"], attention_head_dim=c["hidden"] // c["heads"], cross_attention_dim=c["hidden"],
            audio_num_attention_heads=c["audio_heads"], audio_attention_head_dim=c["audio_hidden"] // c["audio_heads"],
            audio_cross_attention_dim=c["audio_hidden"], caption_channels=c["caption"], num_layers=c["layers"],
            rope_type=c["rope_type"],
        )  # fmt: skip
    model = model.to(dtype).eval()
    g = torch.Generator(device).manual_seed(1)
    frames, rows, cols = _video_grid(c["seq"])

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    kwargs = {
        "hidden_states": randn(1, c["seq"], 128), "audio_hidden_states": randn(1, c["audio_seq"], 128),
        "encoder_hidden_states": randn(1, c["text_seq"], c["caption"]),
        "audio_encoder_hidden_states": randn(1, c["text_seq"], c["caption"]),
        "timestep": torch.tensor([0.6], device=device), "sigma": torch.tensor([0.6], device=device),
        "num_frames": frames, "height": rows, "width": cols, "audio_num_frames": c["audio_seq"], "return_dict": False,
    }  # fmt: skip
    return model, (), kwargs


def _video_grid(seq: int) -> tuple[int, int, int]:
    """(frames, height, width) of the latent video: LTX-2's 1088x1920 grid (34 x 60) when it divides."""
    for rows, cols in ((34, 60), (6, 10)):
        if seq % (rows * cols) == 0:
            return seq // (rows * cols), rows, cols
    return 1, 1, seq


def _diffvae(device: torch.device, dtype: torch.dtype) -> tuple[nn.Module, tuple[Any, ...], dict[str, Any]]:
    from diffusers import LTX2VideoDiffusionDecoderModel

    torch.manual_seed(0)
    with torch.device(device):
        model = LTX2VideoDiffusionDecoderModel(**DIFFVAE_TINY)
    for block in model.decoder.diff_blocks:  # the adaLN tables start at zero; random ones make them matter
        block.scale_shift_table.data.normal_(0, 0.5)
    model.enable_tiling(**DIFFVAE_TILING)
    model = model.to(dtype).eval()
    cfg = model.config
    frames, height, width = _DIFFVAE_PIXELS
    shape = (1, cfg.latent_channels, (frames - 1) // cfg.temporal_compression_ratio + 1,
             height // cfg.spatial_compression_ratio, width // cfg.spatial_compression_ratio)
    z = torch.randn(shape, generator=torch.Generator(device).manual_seed(1), device=device).to(dtype)
    return model, (z,), {"generator": torch.Generator(device).manual_seed(7)}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", choices=MODELS, default="ltx2-dit", help="the bundled tiny model (default ltx2-dit)")
    p.add_argument("--quality", choices=["lossless", "high", "fast"], default="fast",
                   help="the tier the fast forwards run at (default fast)")
    p.add_argument("--method", choices=["auto", "bisect", "each"], default="auto",
                   help="each site alone and left out, or bisection (default auto: each up to 8 switchable sites)")
    p.add_argument("--device", default=None, help="default: cuda when visible, else cpu")
    p.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default=None, help="default: bf16 on GPU, fp32 on CPU")
    p.add_argument("--tolerance", type=float, default=None,
                   help="also suggest the smallest change that brings the output within this relative error")
    p.add_argument("--all", action="store_true", help="every site, also those with error 0")
    p.add_argument("--json", action="store_true", help="the JSON document on stdout (schema_version, rows, kinds)")


def cmd_attribute(args: argparse.Namespace) -> int:
    import xbackend

    from ._runtime import runtime
    from .attribute import SCHEMA_VERSION, attribute

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        args.dtype or ("bf16" if device.type == "cuda" else "fp32")]
    try:
        model, margs, mkwargs = bundled(args.model, device, dtype)
    except ImportError as e:
        print(f"xbackend: error: {e}", file=sys.stderr)
        return 2
    xbackend.patch(model)
    found = attribute(model, *margs, quality=args.quality, method=args.method, **mkwargs)
    suggestion = found.suggest(args.tolerance) if args.tolerance is not None else None
    if args.json:
        from .fleet.golden import dumps
        from .fleet.matrix import host_record, plugin_records

        rt = runtime()
        doc = {"schema_version": SCHEMA_VERSION, "command": "attribute", "xbackend": xbackend.__version__,
               "host": host_record(), "plugins": plugin_records(rt), "problems": rt.load_problems(),
               "model": args.model, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
               **found.to_dict()}
        if suggestion is not None:
            doc["suggestion"] = suggestion.to_dict()
        print(dumps(doc), end="")
    else:
        print(found.table(every=args.all))
        if suggestion is not None:
            print(f"suggest({args.tolerance:g}): {suggestion}")
    return 0
