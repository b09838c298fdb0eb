"""The one rule for integer offsets in xbackend's Triton kernels.

A kernel forms an element's address as ``base + sum(index_i * stride_i)``. Triton computes that in
32 bits when every operand is 32-bit (program ids, ``tl.arange``, integer arguments below 2**31), and a
product past 2**31 - 1 wraps silently: the load reads another row, or an address outside the tensor.
What matters is not a tensor's ``numel()`` but its **span**: the largest offset, in elements, that any
of its elements sits at from its data pointer, plus one. A view sliced from a larger buffer (q, k and v
taken from one fused qkv projection, a row-padded activation, one column of a modulation table) spans
more than it holds.

The rule every kernel follows: compute ``wide(*tensors, extra=...)`` on the host over every tensor whose
offsets the kernel forms in 32 bits (inputs with their strides, broadcast operands, outputs), pass it as
a ``tl.constexpr`` ``WIDE``, and when it is true promote to int64 every index that meets a stride
before it does: the row index, and also a column index times a column stride or a head index times a
head stride. A kernel whose row index is 64-bit always (the RMSNorm kernels, the q/k norm + RoPE
kernels) still applies the rule to its other indices. Where 32-bit offsets are all a kernel has, its
``supports`` refuses a span of 2**31 or more with ``span_reason``. Either way the decision is a
function of shapes and strides, which the runtime key holds, so a verified call and every later call
with its key take the same path.

Lanes past the end of a tile that a mask compares by *index* (``r < rows``) may form wrapped offsets:
their address is never dereferenced. A mask computed from the offset itself (a flat kernel's
``offs < n``) is only as good as that offset, so such a kernel passes its grid's extent (programs x
block) as ``extra``. An output the kernel allocates contiguous spans its ``numel()``: also ``extra``.
"""

from __future__ import annotations

import torch

__all__ = ["INT32_LIMIT", "span", "span_reason", "wide"]

# Offsets at or past this need 64-bit arithmetic.
INT32_LIMIT = 2**31


def span(t: torch.Tensor) -> int:
    """The largest element offset of ``t`` from its data pointer, plus one: ``1 + sum((size - 1) *
    stride)`` over its dims (0 for an empty tensor). A contiguous tensor's span is its ``numel()``; a
    broadcast (stride-0) dim adds nothing. Negative strides (which torch tensors do not have) would
    count as their magnitude."""
    if t.numel() == 0:
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(t.shape, t.stride(), strict=True))


def wide(*tensors: torch.Tensor | None, extra: int = 0) -> bool:
    """Whether any tensor's span, or ``extra`` (one past the largest offset the kernel forms without a
    tensor: a contiguous output's ``numel()``, a flat grid's programs x block), reaches 2**31: the
    kernel must then index in 64 bits. ``None`` (an absent optional operand) spans nothing."""
    return max((span(t) for t in tensors if t is not None), default=0) >= INT32_LIMIT or extra >= INT32_LIMIT


def span_reason(**tensors: torch.Tensor) -> str | None:
    """For a kernel with 32-bit offsets only: why these tensors are out of its reach, or None."""
    for name, t in tensors.items():
        s = span(t)
        if s >= INT32_LIMIT:
            return f"{name} spans {s} elements from its data pointer (>= 2**31; the kernel's offsets are 32-bit)"
    return None
