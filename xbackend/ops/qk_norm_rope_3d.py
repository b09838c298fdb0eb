"""qk_norm_rope_3d(q, k, q_weight, k_weight, eps=1e-6, q_scale=1.0, base=10000.0, flavour="torch")

The attention prelude of a video VAE's neighborhood attention (diffusers' LTX-2 DiffVAE,
``LTX2VideoVaeNeighborhoodAttention.project_qkv`` after its projections): per-head RMSNorm of the
query and the key, the query scaled, then the 3-D axial RoPE of both:

    q_out = rope3d(rmsnorm(q, q_weight, eps, flavour) * q_scale)
    k_out = rope3d(rmsnorm(k, k_weight, eps, flavour))

q and k are heads-last ``[B, T, H, W, heads, head_dim]``; every result is rounded to q's dtype where
eager rounds it (after the norm, after the scale, after each axis's rotation). ``rope3d`` is
``LTX2VideoVaeRotaryPosEmbed3D`` (diffusers 0.42.1): head_dim (a multiple of 8) splits into
``(dim_t, dim_hw, dim_hw)`` channels, ``dim_t = head_dim // 4`` rounded down to even and shrunk by 2
while ``dim_hw`` would be odd; each chunk's channel pairs ``(2i, 2i + 1)`` rotate in fp32 by
``position * inv_freq[i]`` along its own axis (the tensor's 0-based T, H or W index), with
``inv_freq = (1 / base ** (arange(0, dim, 2) / dim))`` built in float64 and cast to fp32 once.
Returns ``(q_out, k_out)``.

Why one op: eager reads and writes q and k eleven times on the way (norm, scale, the fp32 casts,
three rotations, stack, cast, cat); fused, each is read once and written once.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C
from . import rmsnorm as _rmsnorm

NAME = "qk_norm_rope_3d"


def rope_dim_split(head_dim: int) -> tuple[int, int, int]:
    """Channels of the T, H and W chunks for ``head_dim`` (a multiple of 8), as diffusers splits them."""
    dim_t = (head_dim // 4) // 2 * 2
    dim_hw = (head_dim - dim_t) // 2
    if dim_hw % 2:
        dim_t -= 2
        dim_hw = (head_dim - dim_t) // 2
    return dim_t, dim_hw, dim_hw


# -- signature and checks ------------------------------------------------------------------------
def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    eps: float = 1e-6,
    q_scale: float = 1.0,
    base: float = 10000.0,
    flavour: str = "torch",
) -> tuple[Any, ...]:
    return (q, k, q_weight, k_weight, eps, q_scale, base, flavour)


def check(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
          eps: float, q_scale: float, base: float, flavour: str) -> None:  # fmt: skip
    chk.tensor(NAME, "q", q)
    if q.dim() != 6:
        raise chk.fail(NAME, "q", "6 dims [B, T, H, W, heads, head_dim]", chk.shape_str(q))
    chk.tensor(NAME, "k", k)
    if k.shape != q.shape:
        raise chk.fail(NAME, "k", f"the shape of 'q' [{', '.join(map(str, q.shape))}]", chk.shape_str(k))
    chk.same_dtype_device(NAME, "k", k, q, "q")
    head_dim = q.shape[-1]
    if head_dim == 0 or head_dim % 8:
        raise chk.fail(NAME, "q", "a head_dim that is a positive multiple of 8 (three chunks of channel pairs)",
                       chk.shape_str(q))  # fmt: skip
    for name, x, w in (("q", q, q_weight), ("k", k, k_weight)):
        if w is not None:
            chk.tensor(NAME, f"{name}_weight", w)
            if tuple(w.shape) != (head_dim,):
                raise chk.fail(NAME, f"{name}_weight", f"shape [{head_dim}] (head_dim of '{name}')", chk.shape_str(w))
            chk.same_dtype_device(NAME, f"{name}_weight", w, x, name)
    chk.real_number(NAME, "eps", eps, minimum=0.0)
    chk.real_number(NAME, "q_scale", q_scale)
    if chk.real_number(NAME, "base", base) <= 0:
        raise chk.fail(NAME, "base", "a positive RoPE base", base)
    chk.choice(NAME, "flavour", flavour, _rmsnorm.FLAVOURS)


# -- reference -----------------------------------------------------------------------------------
def inv_freqs(dim: int, base: float, device: torch.device) -> torch.Tensor:
    """diffusers' ``_inv_freqs``: float64 exponents, one cast to fp32."""
    exponents = torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim
    return (1.0 / base**exponents).to(torch.float32)


def axis_angles(length: int, dim: int, base: float, device: torch.device) -> torch.Tensor:
    """``[length, dim // 2]`` fp32 angles ``position * inv_freq`` of one axis, as diffusers multiplies them."""
    positions = torch.arange(length, dtype=torch.float32, device=device)
    # unsqueeze, not [:, None]: the same product, and FakeTensor indexing needs CUDA in a CPU build of torch
    return positions.unsqueeze(1) * inv_freqs(dim, base, device).unsqueeze(0)


def _rotate_axis(x: torch.Tensor, angles: torch.Tensor, axis: int) -> torch.Tensor:
    pairs = x.reshape(*x.shape[:-1], x.shape[-1] // 2, 2)
    even, odd = pairs[..., 0].float(), pairs[..., 1].float()
    shape = [1, 1, 1, 1, 1, angles.shape[1]]
    shape[axis] = angles.shape[0]
    angles = angles.reshape(shape)
    cos, sin = angles.cos(), angles.sin()
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1)
    return rotated.reshape(x.shape).to(x.dtype)


def rope3d(x: torch.Tensor, base: float) -> torch.Tensor:
    """``LTX2VideoVaeRotaryPosEmbed3D.forward`` (diffusers 0.42.1), operation for operation."""
    dim_t, dim_h, dim_w = rope_dim_split(x.shape[-1])
    lengths = x.shape[1:4]
    chunks = (x[..., :dim_t], x[..., dim_t : dim_t + dim_h], x[..., dim_t + dim_h :])
    return torch.cat([_rotate_axis(c, axis_angles(n, d, base, x.device), axis)
                      for axis, (c, n, d) in enumerate(zip(chunks, lengths, (dim_t, dim_h, dim_w), strict=True), 1)], dim=-1)  # fmt: skip


def reference(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
              eps: float, q_scale: float, base: float, flavour: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """diffusers' order: norm (rounded), the query times ``q_scale`` (rounded), then each axis rotated."""
    qn = _rmsnorm.reference(q, q_weight, eps, flavour) * q_scale
    kn = _rmsnorm.reference(k, k_weight, eps, flavour)
    return rope3d(qn, base), rope3d(kn, base)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # One DiffVAE stage-5 tile: 40 x 96 x 96 tokens, 4 heads of 64.
    q = torch.empty(1, 40, 96, 96, 4, 64, dtype=dtype, device=device)
    w = torch.empty(64, dtype=dtype, device=device)
    return (q, q, w, w, 1e-6, 0.125, 10000.0, "torch")


def fake(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
         eps: float, q_scale: float, base: float, flavour: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    check(q, k, q_weight, k_weight, eps, q_scale, base, flavour)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))  # fmt: skip


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0) -> torch.Tensor:
        return C.randn(*shape, dtype=dtype, device=device, seed=seed)

    q, k, w = r(1, 3, 4, 5, 2, 64), r(1, 3, 4, 5, 2, 64, seed=1), r(64, seed=2) + 1
    out = []
    for f in _rmsnorm.FLAVOURS:
        out += [
            C.Case(f"{f}/DiffVAE head", (q, k, w, w, 1e-6, 0.125, 10000.0, f)),
            C.Case(f"{f}/no weights, scale 1", (q, k, None, None, 1e-6, 1.0, 10000.0, f)),
            C.Case(f"{f}/head_dim 32, batch 2", (r(2, 2, 3, 3, 1, 32), r(2, 2, 3, 3, 1, 32, seed=1), r(32, seed=2),
                                                r(32, seed=3), 1e-5, 32**-0.5, 500.0, f)),
            C.Case(f"{f}/head_dim 24 (dim_t shrinks)", (r(1, 2, 2, 3, 3, 24), r(1, 2, 2, 3, 3, 24, seed=1), None,
                                                        None, 1e-6, 24**-0.5, 10000.0, f)),
            C.Case(f"{f}/empty", (r(1, 0, 4, 5, 2, 64), r(1, 0, 4, 5, 2, 64, seed=1), w, w, 1e-6, 0.125, 10000.0, f)),
            C.Case(f"{f}/q is k", (q, q, w, w, 1e-6, 0.125, 10000.0, f)),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(q), k, w, w, 1e-6, 0.125, 10000.0, f)),
        ]
    if big:  # q and k head rows side by side, W positions about 2**30 apart (one fused projection)
        qs, ks = C.span_past_2_31(r(1, 1, 1, 3, 1, 64), r(1, 1, 1, 3, 1, 64, seed=1), dim=3)
        out.append(C.Case("torch/head rows span past 2**31", (qs, ks, w, w, 1e-6, 0.125, 10000.0, "torch")))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
qk_norm_rope_3d_op = SPEC.custom_op  # xbackend::qk_norm_rope_3d
