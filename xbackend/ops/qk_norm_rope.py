"""qk_norm_rope(q, k, q_weight, k_weight, cos, sin, eps=1e-6, flavour="torch", layout="interleaved")

What a DiT attention does to its projections before SDPA (LTX-2's ``LTX2Attention``): RMSNorm of the
query and of the key over their full width, then RoPE of both with the same frequencies:

    q_out = rotary_embedding(rmsnorm(q, q_weight, eps, flavour), cos, sin, layout)
    k_out = rotary_embedding(rmsnorm(k, k_weight, eps, flavour), cos, sin, layout)

each op with its own reference semantics (``rmsnorm.py``, ``rotary_embedding.py``): the normalized
values are rounded to q's dtype before the rotation, as eager rounds them. Returns ``(q_out, k_out)``.

Why one op for four: at a [1, 32640, 4096] video query the separate ops move q and k through memory
twice and LTX-2's fp32 cos and sin (534 MB each) twice; fused, everything is read once and written
once (~2.1 GB instead of ~4.3 GB per attention). q and k must have one shape (self-attention); cross
attention with keys of another length calls the two ops.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C
from . import rmsnorm as _rmsnorm
from . import rotary_embedding as _rotary

NAME = "qk_norm_rope"


# -- signature and checks ------------------------------------------------------------------------
def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor | None,
    k_weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-6,
    flavour: str = "torch",
    layout: str = "interleaved",
) -> tuple[Any, ...]:
    return (q, k, q_weight, k_weight, cos, sin, eps, flavour, layout)


def check(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
          cos: torch.Tensor, sin: torch.Tensor, eps: float, flavour: str, layout: str) -> None:  # fmt: skip
    chk.tensor(NAME, "q", q)
    chk.tensor(NAME, "k", k)
    if k.shape != q.shape:
        shape = ", ".join(map(str, q.shape))
        raise chk.fail(NAME, "k", f"the shape of 'q' [{shape}] (self-attention; call rmsnorm and rotary_embedding "
                       "for keys of another length)", chk.shape_str(k))  # fmt: skip
    chk.same_dtype_device(NAME, "k", k, q, "q")
    if q.shape[-1] == 0:
        raise chk.fail(NAME, "q", "a last (normalized) dimension of size >= 1", chk.shape_str(q))
    for name, x, w in (("q", q, q_weight), ("k", k, k_weight)):
        if w is not None:
            chk.tensor(NAME, f"{name}_weight", w)
            if tuple(w.shape) != (x.shape[-1],):
                raise chk.fail(NAME, f"{name}_weight", f"shape [{x.shape[-1]}] (the last dim of '{name}')", chk.shape_str(w))
            chk.same_dtype_device(NAME, f"{name}_weight", w, x, name)
    chk.real_number(NAME, "eps", eps, minimum=0.0)
    chk.choice(NAME, "flavour", flavour, _rmsnorm.FLAVOURS)
    _rotary.check(q, cos, sin, layout, op=NAME, x_name="q")


# -- reference -----------------------------------------------------------------------------------
def reference(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
              cos: torch.Tensor, sin: torch.Tensor, eps: float, flavour: str,
              layout: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """The two references composed: ``rmsnorm`` then ``rotary_embedding``, for q and for k."""
    return (_rotary.reference(_rmsnorm.reference(q, q_weight, eps, flavour), cos, sin, layout),
            _rotary.reference(_rmsnorm.reference(k, k_weight, eps, flavour), cos, sin, layout))  # fmt: skip


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    q = torch.empty(1, 32640, 4096, dtype=dtype, device=device)
    w = torch.empty(4096, dtype=dtype, device=device)
    freqs = torch.empty(1, 32640, 4096, dtype=torch.float32, device=device)
    return (q, q, w, w, freqs, freqs, 1e-6, "torch", "interleaved")


def fake(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
         cos: torch.Tensor, sin: torch.Tensor, eps: float, flavour: str,
         layout: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    check(q, k, q_weight, k_weight, cos, sin, eps, flavour, layout)
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format))  # fmt: skip


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0, dt: torch.dtype = dtype) -> torch.Tensor:
        return C.randn(*shape, dtype=dt, device=device, seed=seed)

    f32 = torch.float32
    q, k, w = r(1, 8, 64), r(1, 8, 64, seed=1), r(64, seed=2)
    cos, sin = r(1, 8, 64, seed=3, dt=f32), r(1, 8, 64, seed=4, dt=f32)
    cos2, sin2 = r(1, 8, 32, seed=3, dt=f32), r(1, 8, 32, seed=4, dt=f32)
    out = []
    for f in _rmsnorm.FLAVOURS:
        out += [
            C.Case(f"{f}/interleaved", (q, k, w, w, cos, sin, 1e-6, f, "interleaved")),
            C.Case(f"{f}/no weights", (q, k, None, None, cos, sin, 1e-6, f, "interleaved")),
            C.Case(f"{f}/split", (q, k, w, w, cos2, sin2, 1e-6, f, "split")),
            C.Case(f"{f}/split [B,H,T,D/2] freqs", (q, k, w, w, r(1, 2, 8, 16, seed=3, dt=f32),
                                                     r(1, 2, 8, 16, seed=4, dt=f32), 1e-6, f, "split")),
            C.Case(f"{f}/empty", (r(1, 0, 64), r(1, 0, 64, seed=1), w, w, r(1, 0, 64, seed=3, dt=f32),
                                  r(1, 0, 64, seed=4, dt=f32), 1e-6, f, "interleaved")),
            C.Case(f"{f}/padded rows", (C.padded_rows(q), C.padded_rows(k), w, w, cos, sin, 1e-6, f, "interleaved")),
            C.Case(f"{f}/freqs in q's dtype", (q, k, w, w, cos.to(dtype), sin.to(dtype), 1e-6, f, "interleaved")),
            C.Case(f"{f}/q is k", (q, q, w, w, cos, sin, 1e-6, f, "interleaved")),
            C.Case(f"{f}/NaN and Inf", (C.with_specials(q), k, w, w, cos, sin, 1e-6, f, "interleaved")),
        ]
    if big:
        # q and k rows side by side, rows about 2**30 apart (one fused projection)
        qs, ks = C.span_past_2_31(r(3, 64), r(3, 64, seed=1))
        out.append(C.Case("torch/q, k rows span past 2**31", (qs, ks, w, w, r(3, 64, seed=3, dt=f32),
                                                               r(3, 64, seed=4, dt=f32), 1e-6, "torch", "interleaved")))
        # per-head split cos/sin [1, H, T, D/2] whose heads lie about 2**30 apart
        freqs = C.span_past_2_31(r(1, 3, 2, 32, seed=3, dt=f32), r(1, 3, 2, 32, seed=4, dt=f32), dim=1)
        w3 = r(3 * 64, seed=2)
        out.append(C.Case("torch/split [B,H,T,D/2] freqs span past 2**31", (r(1, 2, 3 * 64), r(1, 2, 3 * 64, seed=1),
                                                                             w3, w3, *freqs, 1e-6, "torch", "split")))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
qk_norm_rope_op = SPEC.custom_op  # xbackend::qk_norm_rope
