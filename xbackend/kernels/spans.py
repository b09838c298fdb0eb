"""The one rule for integer offsets in xbackend's Triton kernels.

A kernel forms an element's address as ``base + sum(index_i * stride_i)``. Triton computes that in
32 bits when every operand is 32-bit (program ids, ``tl.arange``, integer arguments below 2**31), and a
product past 2**31 - 1 wraps silently: the load reads another row, or an address outside the tensor.
What matters is not a tensor's ``numel()`` but its **span**: the largest offset, in elements, that any
of its elements sits at from its data pointer. A view sliced from a larger buffer (q, k and v taken
from one fused qkv projection, a row-padded activation) spans more than it holds.

The rule every kernel follows: compute ``wide(*tensors)`` on the host, pass it as a ``tl.constexpr``,
and promote the index (the program id or the row index) to int64 before it meets a stride when it is
true. Where 32-bit offsets are all a kernel has, its ``supports`` refuses a span of 2**31 or more with
``span_reason``. Either way the decision is a function of shapes and strides, which the runtime key
holds, so a verified call and every later call with its key take the same path.
"""

from __future__ import annotations

import torch

__all__ = ["INT32_LIMIT", "span", "span_reason", "wide"]

# Offsets at or past this need 64-bit arithmetic.
INT32_LIMIT = 2**31


def span(t: torch.Tensor) -> int:
    """The largest element offset of ``t`` from its data pointer, plus one: ``1 + sum((size - 1) *
    stride)`` over its dims (0 for an empty tensor). A contiguous tensor's span is its ``numel()``.
    Negative strides (which torch tensors do not have) would count as their magnitude."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))


def wide(*tensors: torch.Tensor, extra: int = 0) -> bool:
    """Whether any tensor's span, or ``extra`` (an offset the kernel forms itself, such as a grid
    index times a block size), reaches 2**31: the kernel must then index in 64 bits."""
    return max((span(t) for t in tensors), default=0) >= INT32_LIMIT or extra >= INT32_LIMIT


def span_reason(**tensors: torch.Tensor) -> str | None:
    """For a kernel with 32-bit offsets only: why these tensors are out of its reach, or None."""
    for name, t in tensors.items():
        s = span(t)
        if s >= INT32_LIMIT:
            return f"{name} spans {s} elements from its data pointer (>= 2**31; the kernel's offsets are 32-bit)"
    return None
