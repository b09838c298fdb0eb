"""Memory-bounded neighborhood attention on top of ``F.scaled_dot_product_attention``.

The fallback that runs anywhere torch runs (CPU, CUDA, ROCm). Queries are processed in chunks
(spatial boxes); each chunk gathers the bounding box of the keys its queries need and runs one SDPA
call with a boolean mask over that box. Peak extra memory is bounded by ``max_chunk_elems``
(query-chunk tokens x key-box tokens x batch x heads), never by N x N.

Dilation is handled by splitting every dilated axis into its ``d`` interleaved groups (strided
views): within a group the problem is an undilated neighborhood attention, so the window rule and
the box arithmetic stay one-dimensional and monotone.

Layout is heads-last ``[B, *spatial, heads, head_dim]`` with 1 to 3 spatial dims; the window rule
per axis is NATTEN's: ``start = clamp(i - k//2, 0, L - k)``, ``end = start + k``; causal axes take
the last ``k`` positions ``j <= i``.

Non-finite keys and values: SDPA applies a boolean mask by adding -inf (an infinite score of a key
outside the window is then inf - inf = NaN) and multiplies every key of the box by its probability
(0 * inf = NaN for a value outside the window). A call whose K or V holds an inf or a NaN (one check,
one device synchronisation a call) computes each chunk by ``_safe_chunk`` instead, the reference's
semantics: masked scores selected, not added, and V's non-finite values zeroed for p.v and restored
where an in-window key holds one. While a CUDA graph is captured (no synchronisation allowed) every
chunk takes ``_safe_chunk``.
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F

__all__ = ["group_lengths", "neighborhood_attention", "supports", "window_bounds"]

_DEFAULT_CHUNK_ELEMS = 1 << 25


def window_bounds(length: int, kernel: int, causal: bool, device: torch.device | None = None, stride: int = 1):
    """Per-position ``[start, end)`` of the key window along one undilated axis of ``length``.

    With ``stride`` s, queries ``[s*m, s*m + s)`` take the window of their leader ``min(s*m + s//2,
    L-1)`` (causal: ``min(s*m + s - 1, L-1)``, ending at the query itself). Both bounds are
    non-decreasing in the query position, which is what lets a contiguous run of queries be served by
    one contiguous box of keys.
    """
    i = torch.arange(length, device=device)
    base = (i // stride) * stride
    if causal:
        leader = (base + stride - 1).clamp_max(length - 1)
        start = (leader - kernel + 1).clamp_min(0)
        end = i + 1
    else:
        leader = (base + stride // 2).clamp_max(length - 1)
        start = (leader - kernel // 2).clamp(0, length - kernel)
        end = start + kernel
    return start, end


def group_lengths(length: int, dilation: int) -> list[int]:
    """Lengths of the ``dilation`` interleaved groups ``i % dilation == g`` of an axis."""
    return [(length - g + dilation - 1) // dilation for g in range(dilation)]


def supports(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
) -> str | None:
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        return f"dtype {q.dtype} not supported"
    if not (k.shape == q.shape and v.shape == q.shape):
        return "q, k, v must share one shape"
    if not 1 <= q.dim() - 3 <= 3:
        return "needs 1 to 3 spatial dims"
    return None


def _chunk_shape(
    lengths: list[int], kernel: tuple[int, ...], batch_heads: int, budget: int
) -> list[int]:
    """Grow a query chunk (innermost axis first) while chunk x key-box x B x H fits the budget."""
    chunk = [1] * len(lengths)

    def cost(c: list[int]) -> int:
        box = [min(ci + ki - 1, li) for ci, ki, li in zip(c, kernel, lengths, strict=True)]
        return math.prod(c) * math.prod(box) * batch_heads

    grown = True
    while grown:
        grown = False
        for a in reversed(range(len(chunk))):
            if chunk[a] >= lengths[a]:
                continue
            trial = list(chunk)
            trial[a] = min(2 * chunk[a], lengths[a])
            if cost(trial) <= budget:
                chunk = trial
                grown = True
    return chunk


def _axis_mask(start: torch.Tensor, end: torch.Tensor, q0: int, q1: int, lo: int, hi: int):
    """[q1-q0, hi-lo] bool: key ``lo + j`` lies in the window of query ``q0 + i``."""
    keys = torch.arange(lo, hi, device=start.device)
    return (keys[None, :] >= start[q0:q1, None]) & (keys[None, :] < end[q0:q1, None])


def _box_mask(masks: list[torch.Tensor]) -> torch.Tensor:
    """Outer AND of per-axis masks into [prod(q extents), prod(k extents)] (the mask separates)."""
    n = len(masks)
    full = None
    for a, m in enumerate(masks):
        shape = [1] * (2 * n)
        shape[a] = m.shape[0]
        shape[n + a] = m.shape[1]
        mv = m.view(shape)
        full = mv if full is None else full & mv
    assert full is not None
    nq = math.prod(m.shape[0] for m in masks)
    nk = math.prod(m.shape[1] for m in masks)
    return full.reshape(nq, nk)


def _safe_chunk(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """One chunk's attention ``[b, h, nq, d]`` (fp32) where K or V may hold an inf or a NaN, as the
    reference computes it over each query's window: scores outside it are -inf by selection (never
    added to an infinite score), p.v runs over V with its non-finite values zeroed (a key outside a
    window adds exact zeros), and 0/1 products over the window restore what the reference's sum has
    there: NaN from a NaN value or from an infinite one whose probability is 0, +inf from +inf with
    p > 0, -inf likewise, NaN from both."""
    q, k, v = q.float(), k.float(), v.float()
    p = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(~mask, float("-inf")), dim=-1)
    bad = ~v.isfinite()
    nan = v.isnan()
    kept = (p > 0).float()
    lost = (mask & (p == 0)).float()  # in the window, probability 0: 0 * inf is NaN
    up = kept @ (v.isposinf() | nan).float() + lost @ bad.float()
    down = kept @ (v.isneginf() | nan).float() + lost @ bad.float()
    special = torch.where((up > 0) & (down > 0), float("nan"),
                          torch.where(up > 0, float("inf"), torch.where(down > 0, float("-inf"), 0.0)))
    return p @ v.masked_fill(bad, 0.0) + special


def _undilated(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    kernel: tuple[int, ...],
    causal: tuple[bool, ...],
    scale: float,
    budget: int,
    compute_dtype: torch.dtype,
    stride: tuple[int, ...],
    safe: bool = False,
) -> None:
    b, heads, dim = q.shape[0], q.shape[-2], q.shape[-1]
    lengths = list(q.shape[1:-2])
    # Host copies give the box limits without a device sync per chunk; the device copies are computed
    # there, not copied: a host-to-device copy from pageable memory raises under CUDA graph capture.
    axes = list(zip(lengths, kernel, causal, stride, strict=True))
    host = [window_bounds(L, kk, c, stride=s) for L, kk, c, s in axes]
    bounds = [window_bounds(L, kk, c, q.device, stride=s) for L, kk, c, s in axes]
    chunk = _chunk_shape(lengths, kernel, b * heads, budget)
    ranges = [range(0, L, c) for L, c in zip(lengths, chunk, strict=True)]
    for starts in itertools.product(*ranges):
        q_sl, k_sl, masks = [], [], []
        for a, s in enumerate(starts):
            e = min(s + chunk[a], lengths[a])
            lo = int(host[a][0][s])
            hi = int(host[a][1][e - 1])
            q_sl.append(slice(s, e))
            k_sl.append(slice(lo, hi))
            masks.append(_axis_mask(bounds[a][0], bounds[a][1], s, e, lo, hi))
        qs = q[(slice(None), *q_sl)]
        q_shape = qs.shape
        qc = qs.reshape(b, -1, heads, dim).transpose(1, 2).to(compute_dtype)
        kc = k[(slice(None), *k_sl)].reshape(b, -1, heads, dim).transpose(1, 2).to(compute_dtype)
        vc = v[(slice(None), *k_sl)].reshape(b, -1, heads, dim).transpose(1, 2).to(compute_dtype)
        if safe:
            oc = _safe_chunk(qc, kc, vc, _box_mask(masks), scale)
        else:
            oc = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=_box_mask(masks), scale=scale)
        out[(slice(None), *q_sl)] = oc.transpose(1, 2).reshape(q_shape).to(out.dtype)


def neighborhood_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    kernel_size: tuple[int, ...],
    dilation: tuple[int, ...],
    is_causal: tuple[bool, ...],
    scale: float | None,
    stride: tuple[int, ...] | None = None,
    *,
    max_chunk_elems: int | None = None,
    upcast: bool | None = None,
) -> torch.Tensor:
    """Neighborhood attention by chunked, box-masked SDPA. Output has q's dtype and shape.

    ``max_chunk_elems`` bounds (query chunk x key box x batch x heads) per SDPA call (default
    2**25 on CPU, 2**27 on GPUs: fewer, larger calls; the box mask plus its additive form then
    take ~400 MB).
    ``upcast`` computes each chunk in fp32 (default: on CPU, whose reduced-precision SDPA path is
    both slow and less accurate; on GPUs the fused kernels already accumulate in fp32).
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if max_chunk_elems is None:
        max_chunk_elems = _DEFAULT_CHUNK_ELEMS if q.device.type == "cpu" else _DEFAULT_CHUNK_ELEMS * 4
    if upcast is None:
        upcast = q.device.type == "cpu"
    compute_dtype = torch.float32 if upcast and q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    # Any inf or NaN in K or V (one pass over each, one synchronisation): every chunk takes _safe_chunk.
    # Under CUDA graph capture a synchronisation raises: take the safe form, right for every input.
    capturing = q.is_cuda and torch.cuda.is_current_stream_capturing()
    safe = capturing or not bool(torch.isfinite(k).all() & torch.isfinite(v).all())
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    groups = [range(d) for d in dilation]
    for g in itertools.product(*groups):
        sl = (slice(None), *(slice(gi, None, d) for gi, d in zip(g, dilation, strict=True)))
        _undilated(q[sl], k[sl], v[sl], out[sl], tuple(kernel_size), tuple(is_causal), scale,
                   max_chunk_elems, compute_dtype, tuple(stride or (1,) * len(kernel_size)), safe)
    return out
