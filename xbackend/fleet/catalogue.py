"""Representative inputs per op, for compiling every kernel specialisation a fleet would launch.

Each entry builds the op's bound arguments (what ``OpSpec.bind`` returns) for a dtype on a device; the
compile path builds them as fake CUDA tensors, so nothing is allocated. The shapes are the models'
own: LTX-2's DiT (video 8160 / 32640 tokens at hidden 4096, 3072-wide variants, the audio stream's
126 tokens at 2048, heads of 128), the DiffVAE's channels-last stage activations ``[1, T, H, W, C]``
(C = 128 .. 1024), and its neighborhood-attention tiles. A kernel specialises on dtypes, the row
width, flavours and the divisibility of sizes and strides, not on the row count, so the lists cover
widths and layouts, with both LTX-2 token counts where the count enters the plan (the diffusers mean
reduce's block shape, 32-bit index limits).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["CATALOGUES", "Shape", "catalogue"]

Make = Callable[[torch.dtype, torch.device], tuple[Any, ...]]


@dataclass(frozen=True)
class Shape:
    """One representative input: a label for reports and the op's bound arguments."""

    label: str
    make: Make


def _t(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def _rmsnorm(shape: tuple[int, ...], flavour: str, label: str) -> Shape:
    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        return (_t(shape, dtype, device), _t(shape[-1:], dtype, device), 1e-6, flavour)

    return Shape(f"{label} {list(shape)} {flavour}", make)


def _modulate(shape: tuple[int, ...], flavour: str, weight: bool, label: str) -> Shape:
    mod = (1,) * (len(shape) - 1) + shape[-1:]  # adaLN's per-sample scale/shift, broadcast over tokens

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        w = _t(shape[-1:], dtype, device) if weight else None
        return (_t(shape, dtype, device), _t(mod, dtype, device), _t(mod, dtype, device), w, 1e-6, flavour)

    return Shape(f"{label} {list(shape)} mod{list(mod)} {flavour}{' w' if weight else ''}", make)


def _add_norm(shape: tuple[int, ...], flavour: str, modulate: bool, label: str) -> Shape:
    mod = (1,) * (len(shape) - 1) + shape[-1:]

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        x, w = _t(shape, dtype, device), _t(shape[-1:], dtype, device)
        sc, sh = (_t(mod, dtype, device), _t(mod, dtype, device)) if modulate else (None, None)
        return (x, _t(shape, dtype, device), w, 1e-6, flavour, sc, sh)

    return Shape(f"{label} {list(shape)}{' mod' + str(list(mod)) if modulate else ''} {flavour}", make)


def _gated(rows: int, d: int, gate: str, label: str) -> Shape:
    gate_shape = {"bcast": (1, 1, d), "full": (1, rows, d), "token": (1, rows, 1)}[gate]

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        return (_t((1, rows, d), dtype, device), _t((1, rows, d), dtype, device), _t(gate_shape, dtype, device))

    return Shape(f"{label} [1,{rows},{d}] gate {list(gate_shape)}", make)


def _rope(rows: int, d: int, label: str) -> Shape:
    # LTX-2 keeps cos/sin in fp32 whatever the activations' dtype.
    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        freqs = _t((1, rows, d), torch.float32, device)
        return (_t((1, rows, d), dtype, device), freqs, freqs, "interleaved")

    return Shape(f"{label} [1,{rows},{d}] interleaved", make)


def _rope_split(rows: int, heads: int, head_dim: int, label: str) -> Shape:
    # LTX-2.3: x [B, T, H*D] against fp32 cos/sin [B, H, T, D/2].
    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        freqs = _t((1, heads, rows, head_dim // 2), torch.float32, device)
        return (_t((1, rows, heads * head_dim), dtype, device), freqs, freqs, "split")

    return Shape(f"{label} [1,{rows},{heads * head_dim}] split h{heads}", make)


def _qk(rows: int, d: int, flavour: str, label: str) -> Shape:
    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        q, w, freqs = _t((1, rows, d), dtype, device), _t((d,), dtype, device), _t((1, rows, d), torch.float32, device)
        return (q, _t((1, rows, d), dtype, device), w, w, freqs, freqs, 1e-6, flavour, "interleaved")

    return Shape(f"{label} [1,{rows},{d}] {flavour} interleaved", make)


def _qk_split(rows: int, heads: int, head_dim: int, label: str) -> Shape:
    d = heads * head_dim

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        q, w = _t((1, rows, d), dtype, device), _t((d,), dtype, device)
        freqs = _t((1, heads, rows, head_dim // 2), torch.float32, device)
        return (q, _t((1, rows, d), dtype, device), w, w, freqs, freqs, 1e-6, "torch", "split")

    return Shape(f"{label} [1,{rows},{d}] torch split h{heads}", make)


def _qk3d(spatial: tuple[int, int, int], heads: int, head_dim: int, flavour: str, label: str) -> Shape:
    # The DiffVAE's attention prelude: heads-last q/k of one tile, the per-head weights, its q scale.
    shape = (1, *spatial, heads, head_dim)

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        w = _t((head_dim,), dtype, device)
        return (_t(shape, dtype, device), _t(shape, dtype, device), w, w, 1e-6, head_dim**-0.5, 10000.0, flavour)

    return Shape(f"{label} {'x'.join(map(str, spatial))} h{heads} d{head_dim} {flavour}", make)


def _layernorm(rows: int, d: int, flavour: str, mod: str, affine: bool, label: str) -> Shape:
    """A DiT block's LayerNorm site: ``mod`` "chunk" is scale and shift as [1,1,D] chunks of one projected
    table (Flux.2's [1,1,3D], Wan's [1,6,D]), "index" two [B,D] tables chunked from Qwen-Image's [2B,3D]
    with a per-token index, "none" the plain norm. Flavour "fp32" modulates in float32."""

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        mdt = dtype if flavour == "torch" else torch.float32
        x, index, sc, sh = _t((1, rows, d), dtype, device), None, None, None
        if mod == "chunk":
            shift, sc, _ = _t((1, 1, 3 * d), mdt, device).chunk(3, dim=-1)
            sh = shift
        elif mod == "index":
            shift, sc, _ = (t.unflatten(0, (2, 1)) for t in _t((2, 3 * d), mdt, device).chunk(3, dim=-1))
            sh, index = shift, _t((1, rows), torch.int64, device)
        w, b = (_t((d,), mdt, device), _t((d,), mdt, device)) if affine else (None, None)
        return (x, sc, sh, w, b, 1e-6, flavour, index)

    return Shape(f"{label} [1,{rows},{d}] {flavour} mod {mod}{' w,b' if affine else ''}", make)


def _add_layernorm(rows: int, d: int, flavour: str, gate: str, mod: str, affine: bool, label: str) -> Shape:
    """A residual add and the LayerNorm that reads it: ``gate`` "x" (x's dtype) or "fp32" (Wan's float32
    gate under a half x), a [1,1,D] chunk of a table; ``mod`` as in ``_layernorm``."""

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        mdt = dtype if flavour == "torch" else torch.float32
        x = _t((1, rows, d), dtype, device)
        g = _t((1, 1, 3 * d), torch.float32 if gate == "fp32" else dtype, device).chunk(3, dim=-1)[2]
        sc = sh = None
        if mod == "chunk":
            sh, sc, _ = _t((1, 1, 3 * d), mdt, device).chunk(3, dim=-1)
        w, b = (_t((d,), mdt, device), _t((d,), mdt, device)) if affine else (None, None)
        return (x, _t((1, rows, d), dtype, device), g, w, b, 1e-6, flavour, sc, sh, None)

    return Shape(f"{label} [1,{rows},{d}] gate {gate} {flavour} mod {mod}{' w,b' if affine else ''}", make)


def _silu_mul(shape: tuple[int, ...], label: str) -> Shape:
    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        return (_t(shape, dtype, device), _t(shape, dtype, device))

    return Shape(f"{label} {list(shape)}", make)


def _na(spatial: tuple[int, ...], heads: int, dim: int, window: tuple[int, ...], label: str,
        stride: tuple[int, ...] | None = None) -> Shape:  # fmt: skip
    n = len(spatial)
    strides = stride or (1,) * n

    def make(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
        q = _t((1, *spatial, heads, dim), dtype, device)
        return (q, _t(q.shape, dtype, device), _t(q.shape, dtype, device), window, (1,) * n, (False,) * n, None,
                strides)  # fmt: skip

    tail = f" s{'x'.join(map(str, stride))}" if stride else ""
    return Shape(f"{label} {'x'.join(map(str, spatial))} h{heads} d{dim} w{'x'.join(map(str, window))}{tail}", make)


CATALOGUES: dict[str, tuple[Shape, ...]] = {
    "rmsnorm": (
        _rmsnorm((1, 32640, 4096), "torch", "dit q/k"),
        _rmsnorm((1, 8160, 4096), "diffusers", "dit"),
        _rmsnorm((1, 32640, 4096), "diffusers", "dit"),
        _rmsnorm((1, 8160, 3072), "torch", "dit"),
        _rmsnorm((1, 126, 2048), "torch", "dit audio"),
        _rmsnorm((1, 16, 48, 80, 128), "torch", "diffvae"),
        _rmsnorm((1, 4, 12, 20, 1024), "torch", "diffvae"),
    ),
    "rmsnorm_modulate": (
        _modulate((1, 32640, 4096), "torch", False, "dit"),
        _modulate((1, 8160, 4096), "diffusers", False, "dit"),
        _modulate((1, 126, 2048), "torch", False, "dit audio"),
        _modulate((1, 40, 96, 96, 256), "torch", True, "diffvae stage 5"),
        _modulate((1, 16, 48, 80, 512), "torch", True, "diffvae"),
    ),
    # A residual add and the norm that reads it: the DiffVAE's blocks at every stage width.
    "add_rmsnorm": (
        _add_norm((1, 40, 96, 96, 256), "torch", True, "diffvae stage 5"),
        _add_norm((1, 20, 48, 48, 512), "torch", False, "diffvae stage 4"),
        _add_norm((1, 10, 24, 24, 1024), "torch", False, "diffvae stage 2"),
        _add_norm((1, 5, 12, 12, 2048), "torch", False, "diffvae stage 1"),
        _add_norm((1, 8160, 4096), "diffusers", False, "dit"),
    ),
    # The LayerNorm DiT blocks: Flux.2 (4608 tokens at 1024x1024, D = 6144), Qwen-Image (6889 tokens at
    # 1328x1328, D = 3072, per-token tables), Wan 2.x (32760 tokens of 5120, FP32LayerNorm).
    "layernorm_modulate": (
        _layernorm(4608, 6144, "torch", "chunk", False, "flux2"),
        _layernorm(6889, 3072, "torch", "index", False, "qwen-image"),
        _layernorm(32760, 5120, "fp32", "chunk", False, "wan"),
        _layernorm(32760, 5120, "fp32", "none", True, "wan cross-attn norm"),
    ),
    "add_layernorm": (
        _add_layernorm(4608, 6144, "torch", "x", "chunk", False, "flux2"),
        _add_layernorm(6889, 3072, "torch", "x", "chunk", False, "qwen-image"),
        _add_layernorm(32760, 5120, "fp32", "fp32", "none", True, "wan"),
    ),
    "gated_residual": (
        _gated(32640, 4096, "bcast", "dit"),
        _gated(8160, 4096, "full", "dit"),
        _gated(8160, 4096, "token", "dit"),
        _gated(8160, 3072, "bcast", "dit"),
        _gated(126, 2048, "full", "dit audio"),
    ),
    "rotary_embedding": (
        _rope(32640, 4096, "dit"),
        _rope(8160, 4096, "dit"),
        _rope_split(32640, 32, 128, "dit ltx-2.3"),
        _rope(126, 2048, "dit audio"),
    ),
    "qk_norm_rope": (
        _qk(32640, 4096, "torch", "dit"),
        _qk(8160, 4096, "diffusers", "dit"),
        _qk_split(32640, 32, 128, "dit ltx-2.3"),
        _qk(126, 2048, "torch", "dit audio"),
    ),
    "qk_norm_rope_3d": (
        _qk3d((40, 96, 96), 4, 64, "torch", "diffvae stage 5"),
        _qk3d((20, 48, 48), 8, 64, "torch", "diffvae stage 4"),
        _qk3d((20, 48, 48), 4, 128, "diffusers", "diffvae"),
    ),
    # SwiGLU's silu(gate) * up over one of diffusers' 16384-token tiles, hidden widths of stages 1-5.
    "silu_mul": (
        _silu_mul((1, 16384, 1024), "diffvae swiglu"),
        _silu_mul((1, 16384, 4096), "diffvae swiglu"),
        _silu_mul((1, 3000, 1000), "odd width"),
    ),
    "neighborhood_attention": (
        _na((40, 96, 96), 4, 64, (11, 11, 11), "diffvae stage 5"),
        _na((30, 48, 80), 24, 128, (18, 24, 24), "video dit"),
        _na((128, 128), 4, 64, (13, 13), "2-d"),
        _na((30, 48, 80), 24, 128, (18, 24, 24), "video dit strided", (2, 4, 8)),
    ),
}


def catalogue(op: str) -> tuple[Shape, ...]:
    """The representative inputs of ``op`` (empty for an op without a catalogue)."""
    return CATALOGUES.get(op, ())
