"""rotary_embedding(x, cos, sin, layout="interleaved") — RoPE as LTX-2 applies it to queries and keys.

``layout="interleaved"`` (LTX-2.0): channel pairs ``(2i, 2i+1)`` rotate together; diffusers'
``apply_interleaved_rotary_emb``: ``(x.float() * cos + rotate(x).float() * sin).to(x.dtype)`` with
``rotate(x)[2i] = -x[2i+1]``, ``rotate(x)[2i+1] = x[2i]``; cos and sin broadcast to x. Every product and
the sum are rounded in fp32, the result once to x's dtype.

``layout="split"`` (LTX-2.3): the first and second halves of each head's channels rotate together;
diffusers' ``apply_split_rotary_emb``, cos and sin ``[..., D/2]`` per head (or ``[B, H, T, D/2]`` against
a ``[B, T, H*D]`` x).

cos and sin may be float16, bfloat16 or float32, whatever x is (LTX-2 keeps them in fp32 while x is
bf16); the output has x's dtype and shape.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C

NAME = "rotary_embedding"
LAYOUTS = ("interleaved", "split")


# -- signature and checks ------------------------------------------------------------------------
def bind(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str = "interleaved") -> tuple[Any, ...]:
    return (x, cos, sin, layout)


def check(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, op: str = NAME, x_name: str = "x") -> None:
    chk.tensor(op, x_name, x)
    chk.choice(op, "layout", layout, LAYOUTS)
    if x.shape[-1] % 2:
        raise chk.fail(op, x_name, "an even last dim (channels rotate in pairs)", chk.shape_str(x))
    chk.tensor(op, "cos", cos)
    chk.tensor(op, "sin", sin)
    for name, t in (("cos", cos), ("sin", sin)):
        if t.device != x.device:
            raise chk.fail(op, name, f"device {x.device} (same as '{x_name}')", t.device)
    if sin.shape != cos.shape:
        raise chk.fail(op, "sin", f"the shape of 'cos' [{', '.join(map(str, cos.shape))}]", chk.shape_str(sin))
    if layout == "interleaved":
        chk.broadcasts_to(op, "cos", cos, x.shape, x_name)
        return
    half = x.shape[-1] // 2
    if x.dim() != 4 and cos.dim() == 4:
        b, h, t, r = cos.shape
        if tuple(x.shape) != (b, t, h * 2 * r):
            raise chk.fail(op, x_name, f"shape [{b}, {t}, {h * 2 * r}] for a [B, H, T, D/2] cos", chk.shape_str(x))
        if 0 in (b, h, t):  # the reference cannot split such an x into heads (its reshape needs B, T and H)
            raise chk.fail(op, x_name, "B, H and T >= 1 for a [B, H, T, D/2] cos",
                           f"{chk.shape_str(x)} against a cos of {chk.shape_str(cos)}")
        return
    chk.broadcasts_to(op, "cos", cos, (*x.shape[:-1], half), f"{x_name}'s leading dims and D/2")


# -- reference -----------------------------------------------------------------------------------
def _interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x_real, x_imag = x.unflatten(-1, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(-2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def _split(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x_dtype = x.dtype
    needs_reshape = x.dim() != 4 and cos.dim() == 4
    if needs_reshape:
        b, h, t, _ = cos.shape
        x = x.reshape(b, t, h, -1).swapaxes(1, 2)
    last = x.shape[-1]
    r = last // 2
    split_x = x.reshape(*x.shape[:-1], 2, r).float()
    first_x, second_x = split_x[..., :1, :], split_x[..., 1:, :]
    cos_u, sin_u = cos.unsqueeze(-2), sin.unsqueeze(-2)
    out = split_x * cos_u
    out[..., :1, :].addcmul_(-sin_u, second_x)
    out[..., 1:, :].addcmul_(sin_u, first_x)
    out = out.reshape(*out.shape[:-2], last)
    if needs_reshape:
        out = out.swapaxes(1, 2).reshape(b, t, -1)
    return out.to(dtype=x_dtype)


def reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """diffusers 0.42.1's ``apply_interleaved_rotary_emb`` / ``apply_split_rotary_emb``, over the last dim."""
    return _interleaved(x, cos, sin) if layout == "interleaved" else _split(x, cos, sin)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(1, 32640, 4096, dtype=dtype, device=device)
    freqs = torch.empty(1, 32640, 4096, dtype=torch.float32, device=device)
    return (x, freqs, freqs, "interleaved")


def fake(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    check(x, cos, sin, layout)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0, dt: torch.dtype = dtype) -> torch.Tensor:
        return C.randn(*shape, dtype=dt, device=device, seed=seed)

    f32 = torch.float32
    x = r(1, 8, 64)
    out = [
        C.Case("interleaved fp32 freqs", (x, r(1, 8, 64, seed=1, dt=f32), r(1, 8, 64, seed=2, dt=f32), "interleaved")),
        C.Case("interleaved freqs in x's dtype", (x, r(1, 8, 64, seed=1), r(1, 8, 64, seed=2), "interleaved")),
        C.Case("interleaved broadcast [L,D] freqs", (r(2, 8, 64), r(8, 64, seed=1, dt=f32), r(8, 64, seed=2, dt=f32), "interleaved")),
        C.Case("interleaved empty", (r(1, 0, 64), r(1, 0, 64, seed=1, dt=f32), r(1, 0, 64, seed=2, dt=f32), "interleaved")),
        C.Case("interleaved padded rows", (C.padded_rows(x), r(1, 8, 64, seed=1, dt=f32), r(1, 8, 64, seed=2, dt=f32), "interleaved")),
        C.Case("interleaved stride-0 freqs", (r(2, 8, 64), C.expanded(r(1, 8, 64, seed=1, dt=f32), 0, 2),
                                              C.expanded(r(1, 8, 64, seed=2, dt=f32), 0, 2), "interleaved")),
        C.Case("interleaved D=2", (r(3, 2), r(3, 2, seed=1, dt=f32), r(3, 2, seed=2, dt=f32), "interleaved")),
        C.Case("interleaved NaN and Inf", (C.with_specials(x), r(1, 8, 64, seed=1, dt=f32), r(1, 8, 64, seed=2, dt=f32), "interleaved")),
        C.Case("split [B,L,D/2] freqs", (x, r(1, 8, 32, seed=1, dt=f32), r(1, 8, 32, seed=2, dt=f32), "split")),
        C.Case("split [B,H,T,D/2] freqs", (r(1, 8, 64), r(1, 2, 8, 16, seed=1, dt=f32), r(1, 2, 8, 16, seed=2, dt=f32), "split")),
        C.Case("split padded rows", (C.padded_rows(x), r(1, 8, 32, seed=1, dt=f32), r(1, 8, 32, seed=2, dt=f32), "split")),
        C.Case("split odd half D=6", (r(2, 6), r(2, 3, seed=1, dt=f32), r(2, 3, seed=2, dt=f32), "split")),
    ]
    if big:
        xs = r(2, 4096)
        out.append(C.Case("interleaved offset past 2**31", (C.big_offset(xs), r(2, 4096, seed=1, dt=f32),
                                                          r(2, 4096, seed=2, dt=f32), "interleaved")))
        out.append(C.Case("interleaved rows span past 2**31", (*C.span_past_2_31(r(3, 4096)), r(3, 4096, seed=1, dt=f32),
                                                             r(3, 4096, seed=2, dt=f32), "interleaved")))
        # per-head cos/sin [1, H, T, D/2] whose heads lie about 2**30 apart
        freqs = C.span_past_2_31(r(1, 3, 2, 32, seed=1, dt=f32), r(1, 3, 2, 32, seed=2, dt=f32), dim=1)
        out.append(C.Case("split [B,H,T,D/2] freqs span past 2**31", (r(1, 2, 3 * 64), *freqs, "split")))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
rotary_embedding_op = SPEC.custom_op  # xbackend::rotary_embedding
