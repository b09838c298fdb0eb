"""silu_mul(gate, up) — ``F.silu(gate) * up``, the SwiGLU glue between a gate and an up projection.

diffusers' ``LTX2VideoVaeSwiGLU.forward`` is ``w_down(F.silu(w_gate(x)) * w_up(x))``; this op is the
part between the matmuls. Eager PyTorch rounds twice: ``silu(gate)`` (``x / (1 + exp(-x))`` in fp32)
is rounded to gate's dtype, then the product (in fp32) once more. gate and up have the same shape,
dtype and device (no broadcasting); the output is a new contiguous tensor of that shape and dtype.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from . import _cases as C

NAME = "silu_mul"


# -- signature and checks ------------------------------------------------------------------------
def bind(gate: torch.Tensor, up: torch.Tensor) -> tuple[Any, ...]:
    return (gate, up)


def check(gate: torch.Tensor, up: torch.Tensor) -> None:
    chk.tensor(NAME, "gate", gate, min_dim=0)
    chk.tensor(NAME, "up", up, min_dim=0)
    chk.same_dtype_device(NAME, "up", up, gate, "gate")
    if up.shape != gate.shape:
        raise chk.fail(
            NAME, "up", f"the shape of 'gate' [{', '.join(map(str, gate.shape))}] (no broadcasting)", chk.shape_str(up)
        )


# -- reference -----------------------------------------------------------------------------------
def reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.silu(gate) * up


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    # DiffVAE stage 5's SwiGLU: 16384 tokens, 1024 hidden channels.
    gate = torch.empty(1, 16384, 1024, dtype=dtype, device=device)
    return (gate, torch.empty_like(gate))


def fake(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    check(gate, up)
    return torch.empty_like(gate, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def _extremes(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Gates where exp(-x) overflows or underflows, signed zeros and (for fp32/bf16) subnormals."""
    values = [0.0, -0.0, 1e-40, -1e-40, 1e-30, -87.0, -88.8, -89.0, -100.0, -1e4, 87.0, 88.8, 104.0, 1e4,
              1e30, -1e30, 6e4, -6e4, 0.5, -0.5, 3.0, -3.0, 20.0, -20.0]  # fmt: skip
    return torch.tensor(values, dtype=torch.float32).to(dtype=dtype, device=device).view(2, 12)


def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def r(*shape: int, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
        t = C.randn(*shape, dtype=torch.float32, device=device, seed=seed) * scale
        return t.to(dtype)

    g, u = r(2, 8, 64, scale=4.0), r(2, 8, 64, seed=1)
    huge = 4 * torch.finfo(dtype).max ** 0.5  # finite inputs whose products overflow the dtype
    fused = r(2, 8, 128, seed=2, scale=4.0)  # one [.., 2D] projection split into gate and up
    out = [
        C.Case("[2,8,64]", (g, u)),
        C.Case("odd numel [3,1001]", (r(3, 1001, scale=4.0), r(3, 1001, seed=1))),
        C.Case("one element [1]", (r(1, scale=4.0), r(1, seed=1))),
        C.Case("0-d", (r(1, scale=4.0).view(()), r(1, seed=1).view(()))),
        C.Case("empty [0,8,64]", (r(0, 8, 64), r(0, 8, 64, seed=1))),
        C.Case("5-D channels-last activation", (r(1, 2, 3, 4, 40, scale=4.0), r(1, 2, 3, 4, 40, seed=1))),
        C.Case("padded rows", (C.padded_rows(g), C.padded_rows(u))),
        C.Case("padded gate only", (C.padded_rows(g), u)),
        C.Case("gate and up halves of one projection", tuple(fused.chunk(2, dim=-1))),
        C.Case("transposed up", (r(2, 16, 64, scale=4.0), C.transposed(r(2, 16, 64, seed=1)))),
        C.Case("stride-0 gate", (C.expanded(r(2, 1, 64, scale=4.0), 1, 8), u)),
        C.Case("last-dim stride 2", (C.strided_last(g), u)),
        C.Case("gate is up", (g, g)),
        C.Case("NaN and Inf", (C.with_specials(g), C.with_specials(u))),
        C.Case("exp overflow, underflow, zeros", (_extremes(dtype, device), r(2, 12, seed=1))),
        C.Case("products that overflow", (r(4, 64, scale=huge), r(4, 64, seed=1, scale=huge))),
    ]
    if big:
        gs = r(2, 4096, scale=4.0)
        out.append(C.Case("offset past 2**31", (C.big_offset(gs), r(2, 4096, seed=1))))
        # gate and up rows side by side, rows about 2**30 apart (a fused projection's halves)
        out.append(C.Case("gate and up rows span past 2**31", C.span_past_2_31(r(3, 4096, scale=4.0), r(3, 4096, seed=1))))
    return out


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases)
silu_mul_op = SPEC.custom_op  # xbackend::silu_mul
