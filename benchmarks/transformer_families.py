"""The diffusers transformers that benchmarks/transformer_check.py runs whole: each family's real-size
config (random weights, a given number of layers) and a tiny one of the same shape of model, and the
inputs its forward takes, built as the family's diffusers 0.42.1 pipeline builds them.

| family | class | real size (per the family's released config) | inputs at real size |
|---|---|---|---|
| wan | WanTransformer3DModel | Wan 2.2 14B: 40 heads x 128 = 5120, FFN 13824, text 4096, patch (1,2,2) | 480p x 81 frames: latent (16, 21, 60, 104) -> 32,760 tokens; text 512 |
| flux2 | Flux2Transformer2DModel | Flux.2 dev: 48 heads x 128 = 6144, MLP x3, text 15360, RoPE axes 4 x 32 | 1024^2: 64 x 64 = 4,096 image tokens; text 512 |
| qwen | QwenImageTransformer2DModel | Qwen-Image: 24 heads x 128 = 3072, text 3584, RoPE axes (16, 56, 56) | 1328^2: 83 x 83 = 6,889 image tokens; text 256 |
| ltx2 | LTX2VideoTransformer3DModel | as examples/ltx2_transformer.py builds it (video 4096, audio 2048) | 1088x1920 x 121 frames: 16 x 34 x 60 = 32,640 video tokens |

``layers`` is the depth: Wan, Qwen-Image and LTX-2 get that many blocks; Flux.2 that many double-stream
and that many single-stream blocks.

Weights are cast as ``from_pretrained(torch_dtype=...)`` casts them: every parameter and persistent
buffer to the dtype, except those under a module the class keeps in float32
(``_keep_in_fp32_modules``: Wan's time embedder, modulation tables and norms); non-persistent buffers
(Wan's RoPE tables) keep the dtype they were built in. LTX-2 keeps the example's ``.to(dtype)``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))

FAMILIES = ("wan", "flux2", "qwen", "ltx2")


@dataclass(frozen=True)
class Sizes:
    """The input sizes: ``grid`` is the latent (frames, rows, cols) after patching for the image/video
    stream (Wan's is before its (1, 2, 2) patch embedding), ``text`` the prompt tokens."""

    grid: tuple[int, int, int]
    text: int
    what: str


@dataclass(frozen=True)
class Family:
    name: str
    title: str
    model_class: str
    real: dict[str, Any]
    tiny: dict[str, Any]
    real_sizes: Sizes
    tiny_sizes: Sizes


FAMILY: dict[str, Family] = {
    "wan": Family(
        "wan", "Wan 2.2 14B", "WanTransformer3DModel",
        real={"patch_size": (1, 2, 2), "num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 16,
              "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 13824, "cross_attn_norm": True,
              "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 1024},
        tiny={"patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 24, "in_channels": 4,
              "out_channels": 4, "text_dim": 32, "freq_dim": 32, "ffn_dim": 96, "cross_attn_norm": True,
              "qk_norm": "rms_norm_across_heads", "eps": 1e-6, "rope_max_seq_len": 64},
        real_sizes=Sizes((21, 60, 104), 512, "480p x 81 frames: latent (16, 21, 60, 104), 21 x 30 x 52 = 32,760 tokens"),
        tiny_sizes=Sizes((3, 6, 8), 7, "latent (4, 3, 6, 8): 3 x 3 x 4 = 36 tokens"),
    ),
    "flux2": Family(
        "flux2", "Flux.2 dev", "Flux2Transformer2DModel",
        real={"patch_size": 1, "in_channels": 128, "out_channels": None, "attention_head_dim": 128,
              "num_attention_heads": 48, "joint_attention_dim": 15360, "timestep_guidance_channels": 256,
              "mlp_ratio": 3.0, "axes_dims_rope": (32, 32, 32, 32), "rope_theta": 2000, "eps": 1e-6,
              "guidance_embeds": True},
        tiny={"patch_size": 1, "in_channels": 8, "out_channels": None, "attention_head_dim": 16,
              "num_attention_heads": 2, "joint_attention_dim": 24, "timestep_guidance_channels": 32,
              "mlp_ratio": 3.0, "axes_dims_rope": (4, 4, 4, 4), "rope_theta": 2000, "eps": 1e-6,
              "guidance_embeds": True},
        real_sizes=Sizes((1, 64, 64), 512, "1024 x 1024: 64 x 64 = 4,096 image tokens"),
        tiny_sizes=Sizes((1, 5, 6), 7, "5 x 6 = 30 image tokens"),
    ),
    "qwen": Family(
        "qwen", "Qwen-Image", "QwenImageTransformer2DModel",
        real={"patch_size": 2, "in_channels": 64, "out_channels": 16, "attention_head_dim": 128,
              "num_attention_heads": 24, "joint_attention_dim": 3584, "guidance_embeds": False,
              "axes_dims_rope": (16, 56, 56)},
        tiny={"patch_size": 2, "in_channels": 16, "out_channels": 4, "attention_head_dim": 16,
              "num_attention_heads": 2, "joint_attention_dim": 24, "guidance_embeds": False,
              "axes_dims_rope": (4, 6, 6)},
        real_sizes=Sizes((1, 83, 83), 256, "1328 x 1328: 83 x 83 = 6,889 image tokens"),
        tiny_sizes=Sizes((1, 5, 7), 6, "5 x 7 = 35 image tokens"),
    ),
    "ltx2": Family(
        "ltx2", "LTX-2", "LTX2VideoTransformer3DModel",
        real={}, tiny={},  # examples/ltx2_transformer.py's REAL and TINY
        real_sizes=Sizes((16, 34, 60), 256, "1088x1920 x 121 frames: 16 x 34 x 60 = 32,640 video tokens, 126 audio"),
        tiny_sizes=Sizes((1, 6, 10), 8, "60 video tokens, 5 audio"),
    ),
}  # fmt: skip


def _family(name: str) -> Family:
    if name not in FAMILY:
        raise ValueError(f"transformer family: expected one of {', '.join(FAMILIES)}, got {name!r}")
    return FAMILY[name]


def config(name: str, *, tiny: bool, layers: int) -> dict[str, Any]:
    """The constructor arguments of the family's diffusers class (LTX-2's come from
    examples/ltx2_transformer.py: read them off a built model's ``config``)."""
    fam = _family(name)
    if layers < 1:
        raise ValueError(f"transformer family {name}: argument 'layers' expected >= 1, got {layers}")
    if name == "ltx2":
        raise ValueError("transformer family ltx2: examples/ltx2_transformer.py builds its config; use build()")
    cfg = dict(fam.tiny if tiny else fam.real, num_layers=layers)
    if name == "flux2":
        cfg["num_single_layers"] = layers
    return cfg


def _ltx2_args(*, tiny: bool, layers: int, device: str, dtype: torch.dtype) -> argparse.Namespace:
    import ltx2_transformer as example

    sizes = _family("ltx2").tiny_sizes if tiny else _family("ltx2").real_sizes
    seq = sizes.grid[0] * sizes.grid[1] * sizes.grid[2]
    # The example picks REAL sizes for a "cuda" device and TINY ones otherwise.
    args = example.parse_args(["--device", "cpu" if tiny else "cuda", "--layers", str(layers), "--seq", str(seq),
                               "--text-seq", str(sizes.text), "--compile", "none"])  # fmt: skip
    args.device, args.dtype = device, dtype
    return args


def cast_like_from_pretrained(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """Cast as ``from_pretrained(torch_dtype=dtype)`` loads: parameters and persistent buffers to ``dtype``,
    those under a ``_keep_in_fp32_modules`` name to float32; non-persistent buffers as built."""
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    for prefix, module in model.named_modules():
        for name, tensor in [*module._parameters.items(), *module._buffers.items()]:
            if tensor is None or not tensor.is_floating_point() or name in module._non_persistent_buffers_set:
                continue
            full = f"{prefix}.{name}" if prefix else name
            target = torch.float32 if keep.intersection(full.split(".")) else dtype
            tensor.data = tensor.data.to(target)
    return model


def build(name: str, *, tiny: bool, layers: int, device: str, dtype: torch.dtype) -> nn.Module:
    """The model with random weights (seed 0), in eval mode, built on ``device`` ("meta" builds no
    storage: a check of the config alone)."""
    if name == "ltx2":
        import ltx2_transformer as example

        return example.build_model(_ltx2_args(tiny=tiny, layers=layers, device=device, dtype=dtype))
    import diffusers

    cls = getattr(diffusers, _family(name).model_class)
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(**config(name, tiny=tiny, layers=layers))
    return cast_like_from_pretrained(model, dtype).eval()


def sizes(name: str, *, tiny: bool) -> Sizes:
    fam = _family(name)
    return fam.tiny_sizes if tiny else fam.real_sizes


def tokens(name: str, *, tiny: bool) -> int:
    """Image/video tokens the blocks see (after patching)."""
    s = sizes(name, tiny=tiny)
    if name == "wan":
        return s.grid[0] * (s.grid[1] // 2) * (s.grid[2] // 2)
    return s.grid[0] * s.grid[1] * s.grid[2]


def make_inputs(name: str, model: nn.Module, *, tiny: bool, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """The keyword arguments of one forward (``return_dict=False``), random latents and prompt embeddings
    (seed 1), the conditioning as the family's pipeline passes it."""
    if name == "ltx2":
        import ltx2_transformer as example

        layers = len(model.transformer_blocks)
        return example.make_inputs(_ltx2_args(tiny=tiny, layers=layers, device=device, dtype=dtype))
    cfg = model.config
    s = sizes(name, tiny=tiny)
    g = torch.Generator(device).manual_seed(1)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    frames, rows, cols = s.grid
    if name == "wan":  # WanPipeline: the scheduler's float32 timestep, latents in the transformer's dtype
        return {"hidden_states": randn(1, cfg.in_channels, frames, rows, cols),
                "timestep": torch.tensor([600.0], device=device),
                "encoder_hidden_states": randn(1, s.text, cfg.text_dim), "return_dict": False}  # fmt: skip
    if name == "flux2":  # Flux2Pipeline: ids (t, h, w, l) per token, timestep / 1000 in the latents' dtype
        one = torch.arange(1)
        img_ids = torch.cartesian_prod(one, torch.arange(rows), torch.arange(cols), one).unsqueeze(0)
        txt_ids = torch.cartesian_prod(one, one, one, torch.arange(s.text)).unsqueeze(0)
        return {"hidden_states": randn(1, rows * cols, cfg.in_channels),
                "encoder_hidden_states": randn(1, s.text, cfg.joint_attention_dim),
                "timestep": torch.tensor([0.6], device=device).to(dtype),
                "img_ids": img_ids.to(device), "txt_ids": txt_ids.to(device),
                "guidance": torch.full([1], 4.0, device=device, dtype=torch.float32), "return_dict": False}  # fmt: skip
    if name == "qwen":  # QwenImagePipeline, one prompt: an all-valid mask is passed as None
        return {"hidden_states": randn(1, rows * cols, cfg.in_channels),
                "encoder_hidden_states": randn(1, s.text, cfg.joint_attention_dim),
                "encoder_hidden_states_mask": None, "timestep": torch.tensor([0.6], device=device).to(dtype),
                "img_shapes": [[(frames, rows, cols)]], "return_dict": False}  # fmt: skip
    raise ValueError(f"transformer family: expected one of {', '.join(FAMILIES)}, got {name!r}")


def describe_inputs(inputs: dict[str, Any]) -> dict[str, Any]:
    """Shapes and dtypes of the tensor inputs, the other values as they are (JSON-able)."""
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, torch.Tensor):
            out[key] = {"shape": list(value.shape), "dtype": str(value.dtype).removeprefix("torch.")}
        elif value is None or isinstance(value, (bool, int, float, str, list, tuple)):
            out[key] = value
    return out
