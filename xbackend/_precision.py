"""Precision contracts an impl declares, the quality tiers that admit them, and the comparisons the
guard runs against the reference."""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["ADMITTED", "EXACT", "QUALITY_TIERS", "TOLERANT_RULE", "Output", "Precision", "admits", "compare", "tolerance", "ulp", "ulp_distance"]

# What an op (its reference and every impl) returns: most ops one tensor; some (qk_norm_rope's
# ``(q, k)``) several, compared element by element.
Output = torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor]


@dataclass(frozen=True)
class Precision:
    """``exact``: bit-identical to the reference on the same device (``-0.0`` is not ``+0.0``; NaNs
    at the same positions, of any payload). ``ulp``: at most ``ulps`` units in
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


# Quality tiers, loosest last (a rejected impl's reason names the first tier that admits it).
QUALITY_TIERS: dict[str, int | None] = {"lossless": 0, "high": 1, "fast": None}

# What each tier admits, by the kind of op, as (largest ulp distance, tolerance contracts); None: any.
# An exact op's reference fixes one right bit pattern per input and dtype, and the tiers trade distance
# from it for speed. A tolerant op (``OpSpec.tolerant``: neighborhood_attention) has no such pattern:
# its reference is one fp32 evaluation of softmax sums whose order no two kernels share, so no fast
# kernel can match it bit for bit; every tier admits every contract there, and the guard checks each
# impl's contract against the fp32 reference.
ADMITTED: dict[tuple[str, bool], tuple[int | None, bool]] = {
    ("lossless", False): (0, False),
    ("high", False): (1, False),
    ("fast", False): (None, True),
    ("lossless", True): (None, True),
    ("high", True): (None, True),
    ("fast", True): (None, True),
}
TOLERANT_RULE = ("is tolerant (no kernel can match its fp32 reference bit for bit), so every tier admits "
                 "every contract; the guard checks each against the fp32 reference")


def admits(tier: str, precision: Precision, op_is_tolerant: bool) -> bool:
    max_ulps, tolerance_ok = ADMITTED[tier, op_is_tolerant]
    if precision.kind == "tolerance":
        return tolerance_ok
    return max_ulps is None or precision.ulps <= max_ulps


_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32}
_WIDE_VIEW = {torch.float64: torch.int64, torch.int64: torch.int64, torch.int32: torch.int32,
              torch.int16: torch.int16, torch.uint8: torch.uint8, torch.int8: torch.int8, torch.bool: torch.bool}


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
    if out.device != ref.device:
        return f"returned a tensor on {out.device}, reference is on {ref.device}"
    if precision.kind == "exact":
        differ = _bits_differ(out, ref)
        if differ == 0:
            return None
        return f"not bit-identical: {differ} of {ref.numel()} elements differ{_max_ulp_note(out, ref)}"
    if precision.kind == "ulp":
        if out.numel() == 0:
            return None
        special = _specials_differ(out, ref)
        if special is not None:
            return special
        dist = ulp_distance(out.nan_to_num(0.0), ref.nan_to_num(0.0))
        worst = int(dist.max())
        return None if worst <= precision.ulps else f"max {worst} ulp > {precision.ulps}"
    ref32, out32 = ref.float(), out.float()
    finite = ref32.isfinite()
    if bool((finite & ~out32.isfinite()).any()):
        return "non-finite values where the reference is finite"
    if not bool(finite.all()):  # NaN/Inf must sit where the reference has them; the error is over the rest
        special = _specials_differ(out32, ref32)
        if special is not None:
            return special
        ref32, out32 = ref32[finite], out32[finite]
    denom = float(ref32.norm())
    err = float((out32 - ref32).norm()) / (denom if denom > 0 else 1.0)
    return None if err <= precision.rel_fro else f"relative Frobenius error {err:.3g} > {precision.rel_fro:g}"


def _bits_differ(out: torch.Tensor, ref: torch.Tensor) -> int:
    """Elements whose bit patterns differ (so -0.0 against +0.0 differs), counting a NaN against a
    NaN of any payload as equal: NaN positions must match, NaN payloads need not."""
    view = _INT_VIEW.get(out.dtype) or _WIDE_VIEW.get(out.dtype)
    if view is None:  # no float dtype of this width to view as bits: fall back to values
        return int((out != ref).sum()) - int((out.isnan() & ref.isnan()).sum())
    same = out.view(view) == ref.view(view)
    if out.is_floating_point():
        same |= out.isnan() & ref.isnan()
    return int((~same).sum())


def _specials_differ(out: torch.Tensor, ref: torch.Tensor) -> str | None:
    """NaNs and infinities must sit where the reference has them (a ulp distance would call the
    largest finite value and inf one ulp apart)."""
    if not bool((out.isnan() == ref.isnan()).all()):
        return "NaN where the reference has none (or the reverse)"
    if not bool((out.isposinf() == ref.isposinf()).all() and (out.isneginf() == ref.isneginf()).all()):
        return "infinite where the reference is finite (or the reverse)"
    return None


def _count(out: object) -> int:
    return len(out) if isinstance(out, (tuple, list)) else 1


def _max_ulp_note(out: torch.Tensor, ref: torch.Tensor) -> str:
    if out.dtype not in _INT_VIEW:
        return ""
    finite = out.isfinite() & ref.isfinite()
    if not bool(finite.any()):
        return ""
    worst = int(ulp_distance(out[finite], ref[finite]).max())
    if worst:
        return f", max {worst} ulp"
    signed_zeros = bool(((out == 0) & (ref == 0) & (out.signbit() != ref.signbit())).any())
    return ", zeros of the other sign" if signed_zeros else ", NaN or Inf where the reference differs"
