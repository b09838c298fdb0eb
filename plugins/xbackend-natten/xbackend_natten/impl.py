"""Neighborhood attention through NATTEN's public functional API (``natten.na1d/na2d/na3d``).

NATTEN >= 0.20 takes the same heads-last layout as xbackend (``[B, *spatial, heads, head_dim]``)
and per-axis ``kernel_size``, ``stride``, ``dilation``, ``is_causal`` and ``scale``; ``backend``
picks its kernel family (``"blackwell-fna"``, ``"hopper-fna"``, ``"cutlass-fna"``, ``"flex-fna"``;
None lets NATTEN choose for the device). The op's ``stride`` passes through unchanged: queries grouped
by stride share their group leader's window in both.

Window semantics agree with the op's reference for odd kernel sizes (clamped, inward-shifted
windows; dilation groups by ``i % d`` with per-group lengths) and for causal axes (the last ``k``
positions ``j <= i``). Even non-causal kernel sizes are rejected by :func:`supports`: their
placement in NATTEN has not been checked against the reference.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["MIN_VERSION", "available", "neighborhood_attention", "supports"]

MIN_VERSION = (0, 20)
_HEAD_DIMS = (32, 64, 128)


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def available() -> str | None:
    """None when a usable NATTEN imports, else a one-line reason (never raises)."""
    try:
        import natten
    except Exception as exc:  # a CUDA-less or broken build can raise more than ImportError
        return f"natten not importable: {type(exc).__name__}: {exc}"
    version = getattr(natten, "__version__", "0")
    if _version_tuple(version) < MIN_VERSION:
        return f"natten {version} < 0.20 (needs na1d/na2d/na3d with is_causal and scale)"
    missing = [name for name in ("na1d", "na2d", "na3d") if not hasattr(natten, name)]
    if missing:
        return f"natten {version} lacks {', '.join(missing)}"
    return None


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
) -> str | None:
    if q.device.type not in ("cuda", "meta"):
        return "needs a CUDA device"
    if q.dtype not in (torch.float16, torch.bfloat16):
        return f"dtype {q.dtype} not supported (bf16/fp16)"
    if k.dtype != q.dtype or v.dtype != q.dtype or k.shape != q.shape or v.shape != q.shape:
        return "q, k, v must share one shape and dtype"
    if not 1 <= q.dim() - 3 <= 3:
        return "needs 1 to 3 spatial dims"
    if q.shape[-1] not in _HEAD_DIMS:
        return f"head_dim {q.shape[-1]} not in {_HEAD_DIMS}"
    if any(ks % 2 == 0 and not c for ks, c in zip(kernel_size, is_causal, strict=True)):
        return "even non-causal kernel_size (window placement unverified)"
    return None


def _natten_fn(n_spatial: int):
    import natten

    return {1: natten.na1d, 2: natten.na2d, 3: natten.na3d}[n_spatial]


def neighborhood_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
    *,
    backend: str | None = None,
    q_tile_shape: tuple[int, ...] | None = None,
    kv_tile_shape: tuple[int, ...] | None = None,
) -> torch.Tensor:
    """Call ``natten.na{1,2,3}d``. Keyword args are NATTEN's launch knobs, passed only when set, so
    each vendor plugin config can pin a backend (e.g. ``"blackwell-fna"`` on sm100/sm103)."""
    n = q.dim() - 3
    # NATTEN reads scale with `scale or default`, so an explicit value is always passed.
    scale = q.shape[-1] ** -0.5 if scale is None else float(scale)
    kwargs: dict[str, Any] = {
        "kernel_size": tuple(int(x) for x in kernel_size),
        # NATTEN's stride is the op's: queries grouped by stride share their leader's window.
        "stride": tuple(int(x) for x in stride) if stride is not None else (1,) * n,
        "dilation": tuple(int(x) for x in dilation),
        "is_causal": tuple(bool(x) for x in is_causal),
        "scale": scale,
    }
    if backend is not None:
        kwargs["backend"] = backend
    if q_tile_shape is not None:
        kwargs["q_tile_shape"] = tuple(q_tile_shape)
    if kv_tile_shape is not None:
        kwargs["kv_tile_shape"] = tuple(kv_tile_shape)
    out = _natten_fn(n)(q.contiguous(), k.contiguous(), v.contiguous(), **kwargs)
    # Contiguous, in q's dtype: what the op's fake impl promises to a compiled caller.
    return out.to(q.dtype).contiguous()
