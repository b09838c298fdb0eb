"""Precision contracts an impl declares, the quality tiers that admit them, and the comparisons the
guard runs against the reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["EXACT", "QUALITY_TIERS", "Output", "Precision", "admits", "compare", "tolerance", "ulp", "ulp_distance"]

# What an op (its reference and every impl) returns: most ops one tensor; some (qk_norm_rope's
# ``(q, k)``) several, compared element by element.
Output = torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor]


@dataclass(frozen=True)
class Precision:
    """``exact``: torch.equal to the reference on the same device. ``ulp``: at most ``ulps`` units in
    the last place of the output dtype. ``tolerance``: relative Frobenius error at most ``rel_fro``
    (against a reference computed in fp32), and no non-finite value where the reference is finite."""

    kind: str = "exact"
    ulps: int = 0
    rel_fro: float = 0.0

    def __str__(self) -> str:
        if self.kind == "ulp":
            return f"ulp({self.ulps})"
        if self.kind == "tolerance":
            return f"tolerance(rel_fro<{self.rel_fro:g})"
        return "exact"


EXACT = Precision()


def ulp(n: int) -> Precision:
    if n < 0:
        raise ValueError(f"ulp(n): expected n >= 0, got {n}")
    return EXACT if n == 0 else Precision("ulp", ulps=n)


def tolerance(rel_fro: float) -> Precision:
    if not rel_fro > 0:
        raise ValueError(f"tolerance(rel_fro): expected > 0, got {rel_fro}")
    return Precision("tolerance", rel_fro=rel_fro)


# Quality tier -> the largest ULP distance it admits (None: any). Tolerance contracts are admitted by
# any tier for ops whose own reference is defined up to a tolerance (attention), else only by "fast".
QUALITY_TIERS: dict[str, int | None] = {"lossless": 0, "high": 1, "fast": None}


def admits(tier: str, precision: Precision, op_is_tolerant: bool) -> bool:
    limit = QUALITY_TIERS[tier]
    if precision.kind == "tolerance":
        return op_is_tolerant or limit is None
    return limit is None or precision.ulps <= limit


_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in representable values between two same-dtype float tensors."""
    view = _INT_VIEW.get(a.dtype)
    if view is None:
        raise TypeError(f"ulp_distance: expected float16, bfloat16 or float32, got {a.dtype}")

    def ordered(t: torch.Tensor) -> torch.Tensor:
        i = t.contiguous().view(view).to(torch.int64)
        sign_bit = 1 << (torch.finfo(t.dtype).bits - 1)
        # Map the sign-magnitude encoding onto a monotonic integer line (-0 and +0 coincide).
        return torch.where(i < 0, -(i & (sign_bit - 1)), i)

    return (ordered(a) - ordered(b)).abs()


def compare(out: Output, ref: Output, precision: Precision) -> str | None:
    """None when ``out`` meets ``precision`` against ``ref``, else a one-line reason. A tuple (or
    list) ``ref`` needs an ``out`` of the same length, every element meeting ``precision``; the reason
    names the first element that does not."""
    if isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(out) != len(ref):
            return f"returned {_count(out)} output(s), reference has {len(ref)}"
        for i, (o, r) in enumerate(zip(out, ref, strict=True)):
            reason = compare(o, r, precision)
            if reason is not None:
                return f"output {i}: {reason}"
        return None
    if isinstance(out, (tuple, list)):
        return f"returned {len(out)} output(s), reference has 1"
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, reference is a tensor"
    if out.shape != ref.shape or out.dtype != ref.dtype:
        return f"returned {out.dtype}{list(out.shape)}, reference is {ref.dtype}{list(ref.shape)}"
    if precision.kind == "exact":
        if torch.equal(out, ref):
            return None
        differ = int((out != ref).sum()) - int((out.isnan() & ref.isnan()).sum())
        if differ == 0:  # only NaNs at the same places (torch.equal says NaN != NaN)
            return None
        return f"not bit-identical: {differ} of {ref.numel()} elements differ{_max_ulp_note(out, ref)}"
    if precision.kind == "ulp":
        if out.numel() == 0:
            return None
        same_nan = out.isnan() == ref.isnan()
        if not bool(same_nan.all()):
            return "NaN where the reference has none (or the reverse)"
        dist = ulp_distance(out.nan_to_num(0.0), ref.nan_to_num(0.0))
        worst = int(dist.max())
        return None if worst <= precision.ulps else f"max {worst} ulp > {precision.ulps}"
    ref32, out32 = ref.float(), out.float()
    if bool((ref32.isfinite() & ~out32.isfinite()).any()):
        return "non-finite values where the reference is finite"
    denom = float(ref32.norm())
    err = float((out32 - ref32).norm()) / (denom if denom > 0 else 1.0)
    return None if err <= precision.rel_fro else f"relative Frobenius error {err:.3g} > {precision.rel_fro:g}"


def _count(out: object) -> int:
    return len(out) if isinstance(out, (tuple, list)) else 1


def _max_ulp_note(out: torch.Tensor, ref: torch.Tensor) -> str:
    if out.dtype not in _INT_VIEW:
        return ""
    finite = out.isfinite() & ref.isfinite()
    if not bool(finite.any()):
        return ""
    return f", max {int(ulp_distance(out[finite], ref[finite]).max())} ulp"
