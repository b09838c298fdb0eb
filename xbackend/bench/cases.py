"""Benchmark cases: the model shapes the performance tables are stated on."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Case:
    op: str
    name: str
    make: Callable[[torch.device, torch.Generator], tuple[Any, ...]]
    bytes_moved: int = 0  # fewest bytes a kernel must read + write
    flops: float = 0.0  # useful FLOPs (attention)
    small: bool = False  # also time host-inclusive against one eager launch
    bar: bool = False  # a shape a performance bar is stated on (`xbackend bench --quick` runs only these)
    skip_impls: tuple[str, ...] = ()  # impls too slow to time here (lab/gpu/neighborhood_attention.py times them)


BF16 = torch.bfloat16
_E = 2  # bytes per bf16 element


def _rand(shape: tuple[int, ...], device: torch.device, g: torch.Generator, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(BF16)


def _rmsnorm(rows: int, d: int, flavour: str, bar: bool = False) -> Case:
    return Case("rmsnorm", f"rmsnorm {flavour} [1,{rows},{d}]",
                lambda dev, g: (_rand((1, rows, d), dev, g), _rand((d,), dev, g), 1e-6, flavour),
                bytes_moved=2 * rows * d * _E + d * _E, bar=bar)


def _modulate(shape: tuple[int, ...], mod_shape: tuple[int, ...], flavour: str, weight: bool, bar: bool = False) -> Case:
    n, m = math.prod(shape), math.prod(mod_shape)
    d = shape[-1]
    return Case("rmsnorm_modulate", f"modulate {flavour} {list(shape)} mod{list(mod_shape)}{' w' if weight else ''}",
                lambda dev, g: (_rand(shape, dev, g), _rand(mod_shape, dev, g, 0.1), _rand(mod_shape, dev, g, 0.1),
                                _rand((d,), dev, g) if weight else None, 1e-6, flavour),
                bytes_moved=(2 * n + 2 * m + (d if weight else 0)) * _E, bar=bar)


def _add_norm(shape: tuple[int, ...], modulate: bool, bar: bool = False) -> Case:
    n, d = math.prod(shape), shape[-1]
    mod = (1,) * (len(shape) - 1) + (d,)

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        sc, sh = (_rand(mod, dev, g, 0.1), _rand(mod, dev, g, 0.1)) if modulate else (None, None)
        return (_rand(shape, dev, g), _rand(shape, dev, g), _rand((d,), dev, g), 1e-6, "torch", sc, sh)

    # x and update read once, the sum and the norm written once; weight (and scale, shift) once
    return Case("add_rmsnorm", f"add+{'modulate' if modulate else 'rmsnorm'} torch {list(shape)} w", make,
                bytes_moved=(4 * n + d * (3 if modulate else 1)) * _E, bar=bar)


def _table_chunks(dev: torch.device, g: torch.Generator, d: int, parts: int, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """[1,1,D] chunks of one [1,1,parts*D] modulation projection (strided views, as the models chunk it)."""
    t = torch.randn((1, 1, parts * d), generator=g, device=dev, dtype=torch.float32) * 0.1
    return t.to(dtype).chunk(parts, dim=-1)


def _layernorm(name: str, rows: int, d: int, flavour: str, mod: str, affine: bool = False, bar: bool = False) -> Case:
    """A DiT block's LayerNorm + modulate: ``mod`` "chunk" ([1,1,D] chunks of one table), "index" (two
    [1,D] tables and a per-token index, half the tokens each), or "none"."""
    mdt = BF16 if flavour == "torch" else torch.float32
    msize = 2 if flavour == "torch" else 4

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        x, sc, sh, index = _rand((1, rows, d), dev, g), None, None, None
        if mod == "chunk":
            sh, sc, _ = _table_chunks(dev, g, d, 3, mdt)
        elif mod == "index":
            sh, sc = (torch.randn((2, 1, d), generator=g, device=dev).mul(0.1).to(mdt) for _ in range(2))
            index = (torch.arange(rows, device=dev) >= rows // 2).view(1, rows)
        w = b = None
        if affine:
            w, b = (torch.randn((d,), generator=g, device=dev).to(mdt) for _ in range(2))
        return (x, sc, sh, w, b, 1e-6, flavour, index)

    tables = {"chunk": 2 * d, "index": 4 * d, "none": 0}[mod] + (2 * d if affine else 0)
    return Case("layernorm_modulate", f"{name} layernorm {flavour} [1,{rows},{d}] mod {mod}{' w,b' if affine else ''}",
                make, bytes_moved=2 * rows * d * _E + tables * msize, bar=bar)


def _add_layernorm(name: str, rows: int, d: int, flavour: str, gate: str, mod: bool, affine: bool = False,
                   bar: bool = False) -> Case:  # fmt: skip
    """A (gated) residual add and the LayerNorm that reads it: ``gate`` "none", "bf16" or "fp32" (Wan's)."""
    mdt = BF16 if flavour == "torch" else torch.float32

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        x, u = _rand((1, rows, d), dev, g), _rand((1, rows, d), dev, g)
        gt = None if gate == "none" else _table_chunks(dev, g, d, 3, torch.float32 if gate == "fp32" else BF16)[2]
        sh, sc, _ = _table_chunks(dev, g, d, 3, mdt) if mod else (None, None, None)
        w = b = None
        if affine:
            w, b = (torch.randn((d,), generator=g, device=dev).to(mdt) for _ in range(2))
        return (x, u, gt, w, b, 1e-6, flavour, sc, sh, None)

    msize = 2 if flavour == "torch" else 4
    extra = (0 if gate == "none" else d * (4 if gate == "fp32" else 2)) + (2 * d * msize if mod else 0)
    extra += 2 * d * msize if affine else 0
    # x and update read once, the sum and the norm written once; the gate, scale and shift once
    return Case("add_layernorm", f"{name} add+layernorm {flavour} [1,{rows},{d}] gate {gate}{' mod' if mod else ''}"
                f"{' w,b' if affine else ''}", make, bytes_moved=4 * rows * d * _E + extra, bar=bar)


def _gated(name: str, rows: int, d: int, gate: str, small: bool = False, bar: bool = False) -> Case:
    gate_shape = {"bcast": (1, 1, d), "full": (1, rows, d), "token": (1, rows, 1)}[gate]
    return Case("gated_residual", f"{name} {gate} [1,{rows},{d}]",
                lambda dev, g: (_rand((1, rows, d), dev, g), _rand((1, rows, d), dev, g), _rand(gate_shape, dev, g)),
                bytes_moved=(3 * rows * d + math.prod(gate_shape)) * _E, small=small, bar=bar or small)


def _gated_f32(name: str, rows: int, d: int) -> Case:
    """Wan's residual: a bf16 x gated by a [1,1,D] float32 chunk of its [1,6,D] table (one rounding)."""
    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        gate = (torch.randn((1, 6, d), generator=g, device=dev) * 0.1).chunk(6, dim=1)[2]
        return (_rand((1, rows, d), dev, g), _rand((1, rows, d), dev, g), gate)

    return Case("gated_residual", f"{name} fp32 gate [1,{rows},{d}]", make, bytes_moved=3 * rows * d * _E + 4 * d)


def _rope(rows: int, d: int, bar: bool = False) -> Case:
    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        angle = torch.rand((1, rows, d), generator=g, device=dev) * 6.3
        return (_rand((1, rows, d), dev, g), angle.cos(), angle.sin(), "interleaved")

    # x and out in bf16, cos and sin in fp32 (as LTX-2 keeps them)
    return Case("rotary_embedding", f"rope interleaved [1,{rows},{d}] fp32 freqs", make,
                bytes_moved=rows * d * (2 * _E + 2 * 4), bar=bar)


def _rope_split(rows: int, heads: int, head_dim: int, bar: bool = False) -> Case:
    d, half = heads * head_dim, head_dim // 2

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        angle = torch.rand((1, heads, rows, half), generator=g, device=dev) * 6.3
        return (_rand((1, rows, d), dev, g), angle.cos(), angle.sin(), "split")

    # LTX-2.3: x [B, T, H*D] in bf16 against fp32 cos/sin [B, H, T, D/2]
    return Case("rotary_embedding", f"rope split [1,{rows},{d}] h{heads} fp32 freqs", make,
                bytes_moved=rows * d * (2 * _E + 4), bar=bar)


def _qk(rows: int, d: int, bar: bool = False) -> Case:
    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        angle = torch.rand((1, rows, d), generator=g, device=dev) * 6.3
        q, k = _rand((1, rows, d), dev, g), _rand((1, rows, d), dev, g)
        wq, wk = _rand((d,), dev, g, 0.3) + 1, _rand((d,), dev, g, 0.3) + 1
        return (q, k, wq, wk, angle.cos(), angle.sin(), 1e-6, "torch", "interleaved")

    # q, k read and written in bf16, cos and sin (fp32) read once
    return Case("qk_norm_rope", f"q/k norm+rope [1,{rows},{d}] fp32 freqs", make,
                bytes_moved=rows * d * (4 * _E + 2 * 4) + 2 * d * _E, bar=bar)


def _qk_split(rows: int, heads: int, head_dim: int, bar: bool = False) -> Case:
    d, half = heads * head_dim, head_dim // 2

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        angle = torch.rand((1, heads, rows, half), generator=g, device=dev) * 6.3
        q, k = _rand((1, rows, d), dev, g), _rand((1, rows, d), dev, g)
        wq, wk = _rand((d,), dev, g, 0.3) + 1, _rand((d,), dev, g, 0.3) + 1
        return (q, k, wq, wk, angle.cos(), angle.sin(), 1e-6, "torch", "split")

    # LTX-2.3 video self-attention: q, k bf16, cos/sin fp32 [1, H, T, D/2] (half the bytes of interleaved's)
    return Case("qk_norm_rope", f"q/k norm+rope split [1,{rows},{d}] h{heads} fp32 freqs", make,
                bytes_moved=rows * d * (4 * _E + 4) + 2 * d * _E, bar=bar)


def _qk3d(name: str, grid: tuple[int, int, int], heads: int, head_dim: int, bar: bool = False) -> Case:
    shape = (1, *grid, heads, head_dim)

    def make(dev: torch.device, g: torch.Generator) -> tuple[Any, ...]:
        q, k = _rand(shape, dev, g), _rand(shape, dev, g)
        wq, wk = _rand((head_dim,), dev, g, 0.3) + 1, _rand((head_dim,), dev, g, 0.3) + 1
        return (q, k, wq, wk, 1e-6, head_dim**-0.5, 10000.0, "torch")

    # q and k read and written once in bf16; the cos/sin tables are a few KB
    return Case("qk_norm_rope_3d", f"{name} {'x'.join(map(str, grid))} h{heads} d{head_dim}", make,
                bytes_moved=4 * math.prod(shape) * _E + 2 * head_dim * _E, bar=bar)


def _silu_mul(name: str, shape: tuple[int, ...], bar: bool = False) -> Case:
    # gate and up read once, the product written once, all bf16
    return Case("silu_mul", f"{name} {list(shape)}", lambda dev, g: (_rand(shape, dev, g, 4.0), _rand(shape, dev, g)),
                bytes_moved=3 * math.prod(shape) * _E, bar=bar)


def _na(name: str, spatial: tuple[int, ...], heads: int, dim: int, window: tuple[int, ...]) -> Case:
    tokens = math.prod(spatial)
    return Case("neighborhood_attention", f"{name} {'x'.join(map(str, spatial))} h{heads} d{dim} w{'x'.join(map(str, window))}",
                lambda dev, g: (*(_rand((1, *spatial, heads, dim), dev, g) for _ in range(3)), window, (1,) * len(window),
                                (False,) * len(window), None),
                flops=4.0 * tokens * math.prod(window) * dim * heads, bar=True,
                skip_impls=("na_tiled_sdpa",))  # seconds per call at these sizes (lab/gpu/neighborhood_attention.py)


CASES: dict[str, list[Case]] = {
    "rmsnorm": [_rmsnorm(32640, 4096, "torch", True), _rmsnorm(32640, 4096, "diffusers", True), _rmsnorm(8160, 3072, "diffusers"),
                _rmsnorm(368640, 256, "torch", True), _rmsnorm(184320, 512, "torch", True), _rmsnorm(92160, 1024, "torch", True),
                _rmsnorm(1474560, 64, "torch")],
    "rmsnorm_modulate": [
        _modulate((1, 32640, 4096), (1, 1, 4096), "diffusers", False, True),
        _modulate((1, 32640, 4096), (1, 1, 4096), "torch", False, True),
        _modulate((1, 32640, 4096), (1, 1, 4096), "torch", True),
        _modulate((1, 16, 48, 80, 512), (1, 1, 1, 1, 512), "torch", True),
        # The DiffVAE's narrow rows: stage 5 (D = 256) and stage 4 (D = 512) tiles.
        _modulate((1, 40, 96, 96, 256), (1, 1, 1, 1, 256), "torch", True, True),
        _modulate((1, 20, 48, 48, 512), (1, 1, 1, 1, 512), "torch", True, True),
    ],
    # The DiffVAE's residual adds with the norm that reads them: stage 5 (modulated), stages 4 and 2.
    "add_rmsnorm": [_add_norm((1, 40, 96, 96, 256), True, True), _add_norm((1, 20, 48, 48, 512), False, True),
                    _add_norm((1, 10, 24, 24, 1024), False)],
    # The LayerNorm DiT blocks: Flux.2 (4608 tokens of 6144), Qwen-Image (6889 tokens of 3072, per-token
    # tables), Wan 2.x (32760 tokens of 5120, FP32LayerNorm's float32 chain).
    "layernorm_modulate": [
        _layernorm("flux2", 4608, 6144, "torch", "chunk", bar=True),
        _layernorm("qwen-image", 6889, 3072, "torch", "index", bar=True),
        _layernorm("wan", 32760, 5120, "fp32", "chunk", bar=True),
        _layernorm("wan", 32760, 5120, "fp32", "none", affine=True),
    ],
    "add_layernorm": [
        _add_layernorm("flux2", 4608, 6144, "torch", "bf16", True, bar=True),
        _add_layernorm("qwen-image", 6889, 3072, "torch", "bf16", True, bar=True),
        _add_layernorm("wan", 32760, 5120, "fp32", "fp32", False, affine=True, bar=True),
    ],
    # LTX-2.3, Ideogram 4 and FLUX.2 DiT shapes, plus a per-token gate.
    "gated_residual": [
        _gated("ltx2", 32640, 4096, "bcast", bar=True),
        _gated("ltx2", 8160, 4096, "full", bar=True),
        _gated("ideogram4", 4096, 4608, "bcast"),
        _gated("flux2", 4608, 3072, "bcast"),
        _gated("flux2", 4096, 3072, "bcast"),
        _gated("flux2", 512, 3072, "bcast", small=True),
        _gated("ltx2", 126, 2048, "full", small=True),
        _gated("ltx2", 8160, 4096, "token"),
        _gated_f32("wan", 32760, 5120),
    ],
    # LTX-2 queries/keys: video self-attention, and the audio stream's.
    "rotary_embedding": [_rope(32640, 4096, True), _rope_split(32640, 32, 128, True), _rope(8160, 4096),
                         _rope(126, 2048)],
    # LTX-2 video self-attention: norm_q, norm_k and both RoPEs (compile's fused kernel is the one to beat);
    # LTX-2.3's split layout.
    "qk_norm_rope": [_qk(32640, 4096, True), _qk_split(32640, 32, 128, True), _qk(8160, 4096), _qk(126, 2048)],
    # The DiffVAE's attention prelude on one stage-5 and one stage-4 tile.
    "qk_norm_rope_3d": [_qk3d("diffvae-s5", (40, 96, 96), 4, 64, True), _qk3d("diffvae-s4", (20, 48, 48), 8, 64, True)],
    # SwiGLU glue: DiffVAE SwiGLUs (16384 tokens) at three hidden widths, and an LLM MLP's.
    "silu_mul": [_silu_mul("diffvae", (1, 16384, 1024), True), _silu_mul("diffvae", (1, 16384, 2048), True),
                 _silu_mul("diffvae", (1, 16384, 4096), True), _silu_mul("llm-mlp", (8192, 14336))],
    "neighborhood_attention": [
        _na("video-dit", (30, 48, 80), 24, 128, (18, 24, 24)),
        _na("diffvae-s5", (40, 96, 96), 4, 64, (11, 11, 11)),
    ],
}
