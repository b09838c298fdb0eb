"""Shared input analysis for the gated_residual kernels (Triton and CUDA C++).

Both kernels view ``x`` and ``update`` as a contiguous ``rows x D`` matrix and the gate as a set of
"gate rows": x row ``r`` reads gate row ``r // inner``. That one rule covers every gate form the op
promises: full (``inner == 1``), ``[B,1,D]`` (``inner == L``), ``[1,..,1,D]`` (``inner == rows``),
``[B,1,1,1,D]`` on a 5-D x, and the per-token ``[B,L,1]`` (a scalar per gate row). Gates that
broadcast over an *inner* row dim but not an outer one (``[1,L,D]`` on ``[B,L,D]``) do not fit the
rule and are rejected with a reason, as are gates whose rows cannot be walked with one stride.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def promotes(x: torch.Tensor, gate: torch.Tensor) -> bool:
    """A float32 gate under a bf16/fp16 x: eager promotes, so the product and the sum are fp32 and
    rounded once to x's dtype (Wan's fp32 residual)."""
    return gate.dtype == torch.float32 and x.dtype in HALF_DTYPES


@dataclass(frozen=True, slots=True)
class GateLayout:
    """How the gate maps onto the ``rows x d`` view of x."""

    rows: int
    d: int
    per_token: bool  # gate holds one scalar per gate row instead of a D-vector
    inner: int  # consecutive x rows that share one gate row
    gate_row_stride: int  # elements between consecutive gate rows (0: a single gate row)

    @property
    def full(self) -> bool:
        """True when the gate is laid out exactly like x, so one flat index serves all three."""
        if self.per_token or self.inner != 1:
            return False
        return self.rows <= 1 or self.gate_row_stride == self.d


def _gate_row_stride(shape: list[int], strides: list[int]) -> int | str:
    """Collapse the gate's row dims (those with size > 1) into one stride, or explain why not."""
    stride = 0
    expected = None
    for size, st in zip(reversed(shape), reversed(strides), strict=True):
        if size == 1:
            continue
        if expected is None:
            stride = st
        elif st != expected:
            return "gate rows are not evenly strided"
        expected = st * size
    return stride


def analyze(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> GateLayout | str:
    """Return the layout both kernels run on, or a short reason why they cannot take the inputs."""
    if x.dtype not in SUPPORTED_DTYPES:
        return f"dtype {x.dtype} not supported"
    if update.dtype != x.dtype or (gate.dtype != x.dtype and not promotes(x, gate)):
        return "x, update and gate must share one dtype (or a float32 gate under a bf16/fp16 x)"
    if update.device != x.device or gate.device != x.device:
        return "tensors on different devices"
    if x.dim() < 1:
        return "x must have at least one dim"
    if update.shape != x.shape:
        return "update shape differs from x"
    if gate.dim() > x.dim():
        return "gate has more dims than x"
    if not x.is_contiguous():
        return "x must be contiguous"
    if not update.is_contiguous():
        return "update must be contiguous"

    pad = x.dim() - gate.dim()
    gshape = [1] * pad + list(gate.shape)
    gstrides = [0] * pad + list(gate.stride())
    xshape = list(x.shape)
    d = xshape[-1]
    if gshape[-1] == d:
        per_token = False
        if d > 1 and gstrides[-1] != 1:
            return "gate last dim must be contiguous"
    elif gshape[-1] == 1:
        per_token = True
    else:
        return "gate last dim must be D or 1"

    row_dims = xshape[:-1]
    grow_dims = gshape[:-1]
    # The last row dim along which the gate varies: everything before it must match x, everything
    # after it must be broadcast, so gate row = x row // (product of the broadcast dims).
    last = -1
    for i, (gs, xs) in enumerate(zip(grow_dims, row_dims, strict=True)):
        if gs not in (1, xs):
            return "gate does not broadcast to x"
        if gs != 1:
            last = i
    for gs, xs in zip(grow_dims[: max(last, 0)], row_dims[: max(last, 0)], strict=True):
        if gs != xs:
            return "gate broadcasts over an outer dim but not an inner one"
    inner = 1
    for xs in row_dims[last + 1 :]:
        inner *= xs
    rows = 1
    for xs in row_dims:
        rows *= xs
    stride = _gate_row_stride(grow_dims[: last + 1], gstrides[: last + 1])
    if isinstance(stride, str):
        return stride
    return GateLayout(rows=rows, d=d, per_token=per_token, inner=max(inner, 1),
                      gate_row_stride=stride)


def supports(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why the Triton kernel cannot take these inputs, or None when it can. Shapes only (the device is
    the resolver's filter), so it answers for meta tensors and imports no Triton."""
    layout = analyze(x, update, gate)
    return layout if isinstance(layout, str) else None
