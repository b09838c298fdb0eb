"""neighborhood_attention(q, k, v, kernel_size, dilation=1, is_causal=False, scale=None, stride=1)

Heads-last layout ``[B, *spatial, heads, head_dim]`` with 1, 2 or 3 spatial dims (NATTEN's layout).
Per axis, query i attends to ``k`` keys starting at ``clamp(i - k//2, 0, L - k)``: every query sees
exactly ``k`` positions, shifted inward at the borders (NATTEN's semantics, which diffusers' DiffVAE
shares). Dilation ``d`` splits an axis into ``d`` interleaved groups (``i % d``) and applies the rule
within each group. Causal along an axis: the last ``k`` keys ``j <= i``. ``is_causal=True`` means
causal along the first (time) axis; a tuple gives one flag per axis. ``scale=None`` is
``head_dim ** -0.5``.

Stride ``s`` (strided NA, NATTEN's and Generalized Neighborhood Attention's definition): within a
dilation group, queries ``[s*m, s*m + s)`` share the window of their group's leader ``min(s*m + s//2,
L-1)`` (causal: ``min(s*m + s - 1, L-1)``, each query still seeing only keys ``j <= i``). ``s = 1`` is
plain NA; ``s = k`` tiles the axis into blocks that attend within themselves. ``1 <= s <= k``.

The reference gathers each query's own keys and runs an fp32 softmax over them, a chunk of queries at
a time: memory is bounded by the chunk, never an N×N mask.
"""

from __future__ import annotations

import itertools
import math
import os
from typing import Any

import torch

from .. import _checks as chk
from .._opspec import define_op
from .._precision import Precision, compare
from . import _cases as C

NAME = "neighborhood_attention"
# The relative Frobenius-norm error (bf16 inputs, against the fp32 reference) every impl is held to.
REL_FRO_BOUND = 0.005
# Largest gathered K/V chunk the reference materialises, in elements (fp32): 256 MiB.
_REFERENCE_CHUNK_ELEMS = 1 << 26
# The guard compares the whole output when it has at most GUARD_SAMPLE queries or the reference's work
# (gathered K/V elements: batch * tokens * window * heads * head_dim) is at most GUARD_FULL_ELEMS
# (2**26: the reference gathers ~170 M elements/s on a 2-core CPU, so ~0.4 s there); otherwise a random sample of
# GUARD_SAMPLE queries plus every border region of every axis (``guard_queries``).
GUARD_SAMPLE = 2048
GUARD_FULL_ELEMS = 1 << 26


# -- signature and checks ------------------------------------------------------------------------
def bind(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: int | tuple[int, ...] | list[int],
    dilation: int | tuple[int, ...] | list[int] = 1,
    is_causal: bool | tuple[bool, ...] | list[bool] = False,
    scale: float | None = None,
    stride: int | tuple[int, ...] | list[int] = 1,
) -> tuple[Any, ...]:
    n = q.dim() - 3 if isinstance(q, torch.Tensor) else 0
    return (q, k, v, _per_axis(kernel_size, n), _per_axis(dilation, n), _causal_per_axis(is_causal, n), scale,
            _per_axis(stride, n))


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
    stride: tuple[int, ...] = (1,),
) -> None:
    chk.tensor(NAME, "q", q)
    if not 4 <= q.dim() <= 6:
        raise chk.fail(NAME, "q", "[B, *spatial, heads, head_dim] with 1 to 3 spatial dims (4-D to 6-D)", f"{q.dim()}-D {chk.shape_str(q)}")
    if q.shape[-1] < 1:  # scale=None is head_dim ** -0.5; and an attention over no channels is no call to make
        raise chk.fail(NAME, "q", "a head_dim (last dim) >= 1", chk.shape_str(q))
    for name, t in (("k", k), ("v", v)):
        chk.tensor(NAME, name, t)
        chk.same_dtype_device(NAME, name, t, q, "q")
        if t.shape != q.shape:
            raise chk.fail(NAME, name, f"the shape of 'q' [{', '.join(map(str, q.shape))}]", chk.shape_str(t))
    spatial = tuple(q.shape[1:-2])
    n = len(spatial)
    for name, value in (("kernel_size", kernel_size), ("dilation", dilation), ("stride", stride)):
        expected = f"an int or {n} ints (one per spatial dim of 'q')"
        if not (isinstance(value, tuple) and all(isinstance(i, int) and not isinstance(i, bool) for i in value)):
            raise chk.fail(NAME, name, expected, value, TypeError)
        if len(value) != n:  # ints, but not one per axis
            raise chk.fail(NAME, name, expected, value)
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
    if any(s > ks for s, ks in zip(stride, kernel_size, strict=True)):
        raise chk.fail(NAME, "stride", "values <= kernel_size on every axis (queries grouped by stride share a "
                       "window)", f"stride {stride} against kernel_size {kernel_size}")
    if scale is not None:
        chk.real_number(NAME, "scale", scale)


# -- reference -----------------------------------------------------------------------------------
def axis_windows(length: int, ks: int, dil: int, causal: bool, device: torch.device,
                 stride: int = 1) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Key indices ``[length, ks]`` of each query position on one axis, and which of them are valid
    (only causal windows have invalid slots: before the axis start, or after the query itself)."""
    i = torch.arange(length, device=device)
    group, pos = i % dil, i // dil
    group_len = (length - group + dil - 1) // dil
    base = (pos // stride) * stride
    if causal:
        leader = torch.minimum(base + stride - 1, group_len - 1)
        start = leader - ks + 1
    else:
        leader = torch.minimum(base + stride // 2, group_len - 1)
        start = torch.minimum(torch.clamp(leader - ks // 2, min=0), group_len - ks)
    j = start[:, None] + torch.arange(ks, device=device)
    valid = (j >= 0) & (j <= pos[:, None]) if causal else torch.ones_like(j, dtype=torch.bool)
    return j.clamp(min=0) * dil + group[:, None], valid


def reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
) -> torch.Tensor:
    return attend_fp32(q, k, v, kernel_size, dilation, is_causal, scale, stride).reshape(q.shape).to(q.dtype)


def attend_fp32(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
    query_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """fp32 attention over each query's exact neighborhood, ``[B, queries, heads, head_dim]``. With
    ``query_index`` (flat spatial indices) only those queries are computed."""
    batch, *spatial, heads, dim = q.shape
    scale = dim**-0.5 if scale is None else scale
    tokens = math.prod(spatial)
    stride = stride or (1,) * len(spatial)
    windows = [axis_windows(n, ks, d, c, q.device, s)
               for n, ks, d, c, s in zip(spatial, kernel_size, dilation, is_causal, stride, strict=True)]
    steps = [math.prod(spatial[a + 1 :]) for a in range(len(spatial))]  # flat-index step per axis
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
        for (idx, ok), step, length in zip(windows, steps, spatial, strict=True):
            coord = (flat_q // step) % length
            keys = (keys[:, :, None] + idx[coord][:, None, :] * step).flatten(1)
            valid = (valid[:, :, None] & ok[coord][:, None, :]).flatten(1)
        kw, vw = kf[:, keys], vf[:, keys]  # [B, n, W, H, D]
        scores = torch.einsum("bnhd,bnwhd->bnhw", qf[:, flat_q], kw) * scale
        scores = scores.masked_fill(~valid[None, :, None, :], float("-inf"))
        out[:, lo : lo + chunk] = torch.einsum("bnhw,bnwhd->bnhd", scores.softmax(-1), vw)
    return out


def guard_queries(
    spatial: tuple[int, ...],
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    work: int,
    generator: torch.Generator,
    stride: tuple[int, ...] | None = None,
) -> torch.Tensor | None:
    """Flat query indices the guard compares, or None for all of them.

    All queries when there are at most ``GUARD_SAMPLE`` or the reference's work for all of them
    (``work``: gathered K/V elements) is within ``GUARD_FULL_ELEMS``. Otherwise ``GUARD_SAMPLE`` random
    queries (drawn anew on every verification), plus, on every axis, every coordinate whose window
    is shifted by the border (the first and last ``(k//2 + 1 + s) * dilation`` positions for stride
    ``s``; for a causal axis the first ``(k + s) * dilation``) at random coordinates on the other axes,
    plus every corner."""
    tokens = math.prod(spatial)
    if tokens <= GUARD_SAMPLE or work <= GUARD_FULL_ELEMS:
        return None
    n = len(spatial)
    rows = [torch.stack([torch.randint(0, length, (GUARD_SAMPLE,), generator=generator) for length in spatial], 1)]
    stride = stride or (1,) * n
    for axis, (length, ks, dil, causal, st) in enumerate(zip(spatial, kernel_size, dilation, is_causal, stride,
                                                              strict=True)):
        lead = (ks + st) * dil if causal else (ks // 2 + 1 + st) * dil
        tail = (ks - ks // 2 + st) * dil + dil
        border = sorted(set(range(min(lead, length))) | set(range(max(0, length - tail), length)))
        block = torch.stack([torch.randint(0, length_, (len(border),), generator=generator) for length_ in spatial], 1)
        block[:, axis] = torch.tensor(border)
        rows.append(block)
    rows.append(torch.tensor(list(itertools.product(*[(0, length - 1) for length in spatial])), dtype=torch.long))
    coords = torch.cat(rows)
    steps = torch.tensor([math.prod(spatial[a + 1 :]) for a in range(n)])
    return torch.unique((coords * steps).sum(1))


def verify(out: torch.Tensor, args: tuple[Any, ...], precision: Precision) -> str | None:
    """Compare the output with the fp32 reference: all of it when that is cheap, else the queries
    ``guard_queries`` picks (random ones and every border region)."""
    q, kernel_size = args[0], args[3]
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, reference is a tensor"
    if out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        return f"returned {out.dtype}{list(out.shape)} on {out.device}, reference is {q.dtype}{list(q.shape)} on {q.device}"
    batch, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
    spatial = tuple(q.shape[1:-2])
    tokens = math.prod(spatial)
    work = batch * tokens * math.prod(kernel_size) * heads * dim
    generator = torch.Generator().manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    sample = guard_queries(spatial, kernel_size, args[4], args[5], work, generator, args[7])
    if sample is not None:
        sample = sample.to(q.device)
    ref = attend_fp32(*args, query_index=sample)
    got = out.reshape(batch, tokens, heads, dim)
    if sample is not None:
        got = got[:, sample]
    if precision.kind == "tolerance":
        return compare(got.float(), ref, precision)
    return compare(got, ref.to(out.dtype), precision)


# -- planning example and fake impl ---------------------------------------------------------------
def example(dtype: torch.dtype, device: torch.device) -> tuple[Any, ...]:
    q = torch.empty(1, 40, 96, 96, 4, 64, dtype=dtype, device=device)
    return (q, q, q, (11, 11, 11), (1, 1, 1), (False, False, False), None, (1, 1, 1))


def fake(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel_size: tuple[int, ...], dilation: tuple[int, ...],
         is_causal: tuple[bool, ...], scale: float | None, stride: tuple[int, ...]) -> torch.Tensor:  # fmt: skip
    check(q, k, v, kernel_size, dilation, is_causal, scale, stride)
    return torch.empty_like(q, memory_format=torch.contiguous_format)


# -- conformance cases ---------------------------------------------------------------------------
def cases(dtype: torch.dtype, device: torch.device, big: bool = False) -> list[C.Case]:
    def qkv(*shape: int) -> tuple[torch.Tensor, ...]:
        return tuple(C.randn(*shape, dtype=dtype, device=device, seed=s) for s in range(3))

    return [
        C.Case("1-D window 5", (*qkv(1, 32, 2, 16), (5,), (1,), (False,), None)),
        C.Case("1-D causal", (*qkv(2, 24, 1, 32), (7,), (1,), (True,), None)),
        C.Case("2-D (3,5) dilation (1,2)", (*qkv(1, 12, 12, 2, 16), (3, 5), (1, 2), (False, False), None)),
        C.Case("2-D window = grid", (*qkv(1, 6, 6, 1, 16), (6, 6), (1, 1), (False, False), None)),
        C.Case("3-D (3,3,3)", (*qkv(1, 5, 8, 8, 1, 16), (3, 3, 3), (1, 1, 1), (False, False, False), None)),
        C.Case("3-D causal in time", (*qkv(1, 6, 6, 6, 2, 16), (3, 3, 3), (1, 1, 1), (True, False, False), None)),
        C.Case("head_dim 64, scale 0.1", (*qkv(1, 16, 16, 2, 64), (5, 5), (1, 1), (False, False), 0.1)),
        C.Case("head_dim 96", (*qkv(1, 8, 8, 1, 96), (3, 3), (1, 1), (False, False), None)),
        C.Case("head_dim 128", (*qkv(1, 8, 8, 1, 128), (3, 3), (1, 1), (False, False), None)),
        C.Case("2-D stride (2,3)", (*qkv(1, 12, 12, 1, 16), (5, 5), (1, 1), (False, False), None, (2, 3))),
        C.Case("1-D stride = kernel (blocks)", (*qkv(1, 24, 1, 16), (4,), (1,), (False,), None, (4,))),
        C.Case("2-D causal, strided, dilated", (*qkv(1, 12, 8, 1, 16), (3, 3), (2, 1), (True, False), None, (2, 3))),
    ]


SPEC = define_op(NAME, bind=bind, check=check, reference=reference, fake=fake, example=example, cases=cases,
                 verify=verify, tolerant=True, normalizes=True)
neighborhood_attention_op = SPEC.custom_op  # xbackend::neighborhood_attention
