"""neighborhood_attention(q, k, v, kernel_size, dilation=1, is_causal=False, scale=None)

Heads-last layout ``[B, *spatial, heads, head_dim]`` with 1, 2 or 3 spatial dims (NATTEN's layout).
Per axis, query i attends to ``k`` keys starting at ``clamp(i - k//2, 0, L - k)``: every query sees
exactly ``k`` positions, shifted inward at the borders (NATTEN's semantics, which diffusers' DiffVAE
shares). Dilation ``d`` splits an axis into ``d`` interleaved groups (``i % d``) and applies the rule
within each group. Causal along an axis: the last ``k`` keys ``j <= i``. ``is_causal=True`` means
causal along the first (time) axis; a tuple gives one flag per axis. ``scale=None`` is
``head_dim ** -0.5``.

The reference gathers each query's own keys and runs an fp32 softmax over them, a chunk of queries at
a time: memory is bounded by the chunk, never an N×N mask.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from .. import _checks as chk
from .._opspec import OpSpec, contiguous, register_reference_autograd, tensor_sig
from .._precision import Precision, compare

NAME = "neighborhood_attention"
# The bar every impl is held to against the fp32 reference (bf16 inputs): issue 4.
REL_FRO_BOUND = 0.005
# Largest gathered K/V chunk the reference materialises, in elements (fp32): 256 MiB.
_REFERENCE_CHUNK_ELEMS = 1 << 26
# Queries the guard checks on first use when the full reference would be expensive.
_GUARD_SAMPLE = 2048


# -- signature and checks ------------------------------------------------------------------------
def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: int | tuple[int, ...] | list[int],
    dilation: int | tuple[int, ...] | list[int] = 1,
    is_causal: bool | tuple[bool, ...] | list[bool] = False,
    scale: float | None = None,
) -> tuple[Any, ...]:
    n = q.dim() - 3 if isinstance(q, torch.Tensor) else 0
    return (q, k, v, _per_axis(kernel_size, n), _per_axis(dilation, n), _causal_per_axis(is_causal, n), scale)


def _per_axis(value: Any, n: int) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,) * max(n, 1)
    return tuple(value) if isinstance(value, list | tuple) else value


def _causal_per_axis(value: Any, n: int) -> Any:
    if isinstance(value, bool):
        return (value,) + (False,) * (max(n, 1) - 1)
    return tuple(value) if isinstance(value, list | tuple) else value


def check(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
) -> None:
    chk.tensor(NAME, "q", q)
    if not 4 <= q.dim() <= 6:
        raise chk.fail(NAME, "q", "[B, *spatial, heads, head_dim] with 1 to 3 spatial dims (4-D to 6-D)", f"{q.dim()}-D {chk.shape_str(q)}")
    for name, t in (("k", k), ("v", v)):
        chk.tensor(NAME, name, t)
        chk.same_dtype_device(NAME, name, t, q, "q")
        if t.shape != q.shape:
            raise chk.fail(NAME, name, f"the shape of 'q' [{', '.join(map(str, q.shape))}]", chk.shape_str(t))
    spatial = tuple(q.shape[1:-2])
    n = len(spatial)
    for name, value in (("kernel_size", kernel_size), ("dilation", dilation)):
        if not (isinstance(value, tuple) and len(value) == n and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
            raise chk.fail(NAME, name, f"an int or {n} ints (one per spatial dim of 'q')", value, TypeError if not isinstance(value, tuple) else ValueError)
        if any(i < 1 for i in value):
            raise chk.fail(NAME, name, "values >= 1", value)
    if not (isinstance(is_causal, tuple) and len(is_causal) == n and all(isinstance(c, bool) for c in is_causal)):
        raise chk.fail(NAME, "is_causal", f"a bool or {n} bools (one per spatial dim)", is_causal, TypeError)
    for axis, (length, ks, dil) in enumerate(zip(spatial, kernel_size, dilation, strict=True)):
        if ks * dil > length:
            raise chk.fail(
                NAME, "kernel_size",
                f"kernel_size * dilation <= the spatial size on every axis (axis {axis}: size {length})",
                f"kernel_size {ks} * dilation {dil} = {ks * dil}",
            )
    if scale is not None:
        chk.real_number(NAME, "scale", scale)


# -- reference -----------------------------------------------------------------------------------
def axis_windows(length: int, ks: int, dil: int, causal: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Key indices ``[length, ks]`` of each query position on one axis, and which of them are valid
    (only causal windows near the start have invalid slots)."""
    i = torch.arange(length, device=device)
    group, pos = i % dil, i // dil
    group_len = (length - group + dil - 1) // dil
    if causal:
        start = pos - ks + 1
    else:
        start = torch.minimum(torch.clamp(pos - ks // 2, min=0), group_len - ks)
    j = start[:, None] + torch.arange(ks, device=device)
    valid = j >= 0
    return j.clamp(min=0) * dil + group[:, None], valid


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
) -> torch.Tensor:
    return attend_fp32(q, k, v, kernel_size, dilation, is_causal, scale).reshape(q.shape).to(q.dtype)


def attend_fp32(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    query_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 attention over each query's exact neighborhood, ``[B, queries, heads, head_dim]``. With
    ``query_index`` (flat spatial indices) only those queries are computed."""
    batch, *spatial, heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    tokens = math.prod(spatial)
    windows = [axis_windows(n, ks, d, c, q.device) for n, ks, d, c in zip(spatial, kernel_size, dilation, is_causal, strict=True)]
    strides = [math.prod(spatial[a + 1 :]) for a in range(len(spatial))]
    qf = q.reshape(batch, tokens, heads, dim).float()
    kf = k.reshape(batch, tokens, heads, dim).float()
    vf = v.reshape(batch, tokens, heads, dim).float()
    queries = torch.arange(tokens, device=q.device) if query_index is None else query_index.to(q.device)
    window = math.prod(kernel_size)
    chunk = max(1, _REFERENCE_CHUNK_ELEMS // max(1, batch * window * heads * dim))
    out = torch.empty(batch, queries.numel(), heads, dim, dtype=torch.float32, device=q.device)
    for lo in range(0, queries.numel(), chunk):
        flat_q = queries[lo : lo + chunk]
        keys = torch.zeros(flat_q.numel(), 1, dtype=torch.long, device=q.device)
        valid = torch.ones(flat_q.numel(), 1, dtype=torch.bool, device=q.device)
        for (idx, ok), stride, length in zip(windows, strides, spatial, strict=True):
            coord = (flat_q // stride) % length
            keys = (keys[:, :, None] + idx[coord][:, None, :] * stride).flatten(1)
            valid = (valid[:, :, None] & ok[coord][:, None, :]).flatten(1)
        kw, vw = kf[:, keys], vf[:, keys]  # [B, n, W, H, D]
        scores = torch.einsum("bnhd,bnwhd->bnhw", qf[:, flat_q], kw) * scale
        scores = scores.masked_fill(~valid[None, :, None, :], float("-inf"))
        out[:, lo : lo + chunk] = torch.einsum("bnhw,bnwhd->bnhd", scores.softmax(-1), vw)
    return out


def verify(out: torch.Tensor, args: tuple[Any, ...], precision: Precision) -> str | None:
    """Compare a sample of queries (all of them when few) with the fp32 reference."""
    q = args[0]
    batch, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
    tokens = math.prod(q.shape[1:-2])
    sample = None
    if tokens > _GUARD_SAMPLE:
        gen = torch.Generator().manual_seed(tokens)
        sample = torch.randperm(tokens, generator=gen)[:_GUARD_SAMPLE].sort().values.to(q.device)
    ref = attend_fp32(*args, query_index=sample)
    got = out.reshape(batch, tokens, heads, dim)
    if sample is not None:
        got = got[:, sample]
    if precision.kind == "tolerance":
        return compare(got.float(), ref, precision)
    return compare(got, ref.to(out.dtype), precision)


# -- key and planning example --------------------------------------------------------------------
def key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: Any, dilation: Any, is_causal: Any, scale: Any) -> tuple[Any, ...]:
    return (NAME, tensor_sig(q), tensor_sig(k), tensor_sig(v), kernel_size, dilation, is_causal, scale)


def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    q = torch.empty(1, 40, 96, 96, 4, 64, dtype=dtype, device=device)
    return (q, q, q, (11, 11, 11), (1, 1, 1), (False, False, False), None)


# -- custom op -----------------------------------------------------------------------------------
@torch.library.custom_op("xbackend::neighborhood_attention", mutates_args=())
def neighborhood_attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: list[int],
    dilation: list[int],
    is_causal: list[bool],
    scale: float | None,
) -> torch.Tensor:
    from .._runtime import dispatch

    return contiguous(dispatch(SPEC, (q, k, v, tuple(kernel_size), tuple(dilation), tuple(is_causal), scale)))  # the layout the fake impl promises


@neighborhood_attention_op.register_fake
def _fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: list[int], dilation: list[int], is_causal: list[bool], scale: float | None) -> torch.Tensor:
    check(q, k, v, tuple(kernel_size), tuple(dilation), tuple(is_causal), scale)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


register_reference_autograd(neighborhood_attention_op, reference, (0, 1, 2))

SPEC = OpSpec(
    name=NAME,
    bind=bind,
    check=check,
    reference=reference,
    key=key,
    example=example,
    custom_op=neighborhood_attention_op,
    fake=_fake,
    tensor_args=(0, 1, 2),
    signature="neighborhood_attention(q, k, v, kernel_size, dilation=1, is_causal=False, scale=None)",
    tolerant=True,
    verify=verify,
)
