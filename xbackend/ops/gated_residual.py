"""gated_residual(x, update, gate) — ``x + update * gate``, the gated residual of a DiT block.

For bf16/fp16 eager PyTorch rounds twice: ``round(x + round(update * gate))``. Gates: full,
``[B,1,D]`` (B > 1 too), ``[1,..,1,D]``, per-token ``[B,L,1]``. The output is a new tensor.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _checks as chk
from .._opspec import OpSpec, contiguous, register_reference_autograd

NAME = "gated_residual"


# -- signature and checks ------------------------------------------------------------------------
def bind(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> tuple[Any, ...]:
    return (x, update, gate)


def check(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> None:
    chk.tensor(NAME, "x", x)
    chk.tensor(NAME, "update", update)
    chk.same_dtype_device(NAME, "update", update, x, "x")
    if update.shape != x.shape:
        raise chk.fail(NAME, "update", f"the shape of 'x' [{', '.join(map(str, x.shape))}]", chk.shape_str(update))
    chk.tensor(NAME, "gate", gate)
    chk.same_dtype_device(NAME, "gate", gate, x, "x")
    chk.broadcasts_to(NAME, "gate", gate, x.shape, "x")


# -- reference -----------------------------------------------------------------------------------
def reference(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    return x + update * gate


# -- key and planning example --------------------------------------------------------------------
def key(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> tuple[Any, ...]:
    # Flat, no helper calls: this runs on every call and is most of dispatch's host cost.
    return (NAME, x.shape, x.stride(), x.dtype, x.device, update.shape, update.stride(), update.dtype, update.device,
            gate.shape, gate.stride(), gate.dtype, gate.device)


def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    x = torch.empty(1, 32640, 4096, dtype=dtype, device=device)
    return (x, torch.empty_like(x), torch.empty(1, 1, 4096, dtype=dtype, device=device))


# -- custom op -----------------------------------------------------------------------------------
@torch.library.custom_op("xbackend::gated_residual", mutates_args=())
def gated_residual_op(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    from .._runtime import dispatch

    return contiguous(dispatch(SPEC, (x, update, gate)))  # the layout the fake impl promises


@gated_residual_op.register_fake
def _fake(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    check(x, update, gate)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


register_reference_autograd(gated_residual_op, reference, (0, 1, 2))

SPEC = OpSpec(
    name=NAME,
    bind=bind,
    check=check,
    reference=reference,
    key=key,
    example=example,
    custom_op=gated_residual_op,
    fake=_fake,
    positional_arity=3,
    tensor_args=(0, 1, 2),
    signature="gated_residual(x, update, gate)",
)
