"""xbackend impls over Liger-Kernel's Triton forward kernels (liger-kernel >= 0.8).

Which liger kernel serves which op, and with which of its casting modes:

* ``rmsnorm`` flavour ``"torch"`` (``F.rms_norm``: fp32 statistics, ``x * rstd * w`` in fp32, one
  rounding) is liger's ``casting_mode="gemma"`` with ``offset=0``: x and w upcast to fp32, one cast at
  the end. Flavour ``"diffusers"`` (``round(round(x * rstd) * w)``: rounded to the weight dtype, then
  again after ``* w``) is ``casting_mode="llama"``: ``(x * rstd).to(x.dtype)``, then ``* (0 + w)``
  with the product exact in fp32 and rounded once at the store. Without a weight both modes, like both
  flavours, round ``x * rstd`` once. ``"none"`` (arithmetic in bf16) matches neither flavour.
  What is not reproduced is PyTorch's reduction: liger's ``tl.sum(x * x) / n`` sums in another order
  (and divides rather than multiplying by ``1/n``), so rstd can differ in its last fp32 bits. A
  relative fp32 difference far below half a bf16/fp16 ulp moves one rounding by at most one ulp:
  <= 1 ulp for the torch flavour (one rounding), <= 2 ulp for diffusers (the second rounding of
  ``h * w`` sees an ``h`` up to one ulp off, < 2 ulp of ``h * w``). In fp32 output the same
  differences are several fp32 ulps, so fp32 is not registered.
* ``rmsnorm_modulate`` is liger's fused ``modulated_rms_norm`` (``rmsnorm(x) * (1 + scale) + shift``),
  same casting modes. In gemma mode it rounds as eager does; in llama mode with a weight it keeps the
  normalized product in fp32. Either way the ``+ shift`` cancels near zero, where one ulp of the norm
  is many ulps of the output: a tolerance contract.
* ``rotary_embedding`` layout ``"split"`` (rotate_half: channel ``i`` pairs with ``i + D/2`` within a
  head) is liger's ``_triton_rope`` kernel (the HF Llama RoPE), launched directly with ``rotary_dim =
  D`` so it reads ``cos``/``sin`` of width ``D/2`` (the op's layout) instead of HF's duplicated width
  D, and with no key heads. It computes in fp32 when cos/sin are fp32 (they are upcast here when
  half), but as ``x1 * c - x2 * s`` contracted by LLVM into one FMA with the *other* product rounded
  than eager's ``fma(-s, x2, round(x1 * c))``: rounding differs near cancellation, so a tolerance
  contract. The kernel rotates in place, so the impl rotates a copy. Liger has no interleaved-pair
  RoPE for cos/sin given per channel (its llama4 kernel takes one complex frequency per pair).
* ``qk_norm_rope`` layout ``"split"``: the two rmsnorms above, then one rope launch that rotates both
  normalized tensors in place (liger's kernel takes q and k together).

Not covered: ``gated_residual`` (liger's fused_add_rms_norm adds a residual before a norm, no gate),
``neighborhood_attention`` (liger's fused NA is 1-D, materializes an S x S mask and clamps windows at
the borders where the op's reference shifts them inward), ``vae_tile_decode``.

``supports`` takes the op's normalized arguments and returns a reason for what liger cannot take; on
CPU tensors it accepts only under ``TRITON_INTERPRET=1`` (tests; see ``xbackend_liger.interpreter``).
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
from types import SimpleNamespace

import torch

__all__ = [
    "MIN_VERSION",
    "available",
    "qk_norm_rope",
    "rmsnorm",
    "rmsnorm_modulate",
    "rotary_embedding",
    "supports_qk_norm_rope",
    "supports_rmsnorm_diffusers",
    "supports_rmsnorm_modulate",
    "supports_rmsnorm_torch",
    "supports_rotary_embedding",
    "version",
]

MIN_VERSION = (0, 8)
HALF = (torch.bfloat16, torch.float16)
FLOAT = (torch.bfloat16, torch.float16, torch.float32)
MAX_D = 65536  # liger's calculate_settings: one row in one block of at most 64K elements
MAX_ROTARY_WIDTH = 16384  # the rope kernel holds a head's two halves in one tile
MAX_HEADS_PER_ROW = 64  # heads one rope program rotates (its tile is next_pow2(heads) x D/2)
CASTING_MODE = {"torch": "gemma", "diffusers": "llama"}

# What the impls call; available() checks they are there with these parameters.
_RMS_PARAMS = ("X", "W", "eps", "offset", "casting_mode", "row_mode")
_MOD_PARAMS = ("X", "W", "scale", "shift", "eps", "offset", "casting_mode")
_ROPE_ARGS = ("q_ptr", "q_row_stride", "k_ptr", "k_row_stride", "cos", "cos_row_stride", "sin", "sin_row_stride",
              "sl", "bs", "cos_bs", "n_qh", "n_kh", "hd", "pad_n_qh", "pad_n_kh", "pad_hd", "pad_rd", "rd",
              "BLOCK_SIZE", "BACKWARD_PASS")  # fmt: skip


# -- availability --------------------------------------------------------------------------------
def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def version() -> str | None:
    """The installed liger-kernel's version, or None."""
    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _lk() -> SimpleNamespace:
    from liger_kernel.ops.modulated_rms_norm import modulated_rms_norm_forward
    from liger_kernel.ops.rms_norm import rms_norm_forward
    from liger_kernel.ops.rope import _triton_rope

    return SimpleNamespace(rms_norm_forward=rms_norm_forward, modulated_rms_norm_forward=modulated_rms_norm_forward,
                           triton_rope=_triton_rope)  # fmt: skip


def available() -> str | None:
    """None when a usable liger-kernel imports, else a one-line reason (never raises)."""
    try:
        import liger_kernel  # noqa: F401
    except ModuleNotFoundError as exc:
        if exc.name == "liger_kernel":
            return "liger-kernel not installed"
        return f"liger-kernel not importable: ModuleNotFoundError: {exc}"
    except Exception as exc:  # a broken install or a Triton without a backend can raise anything
        return f"liger-kernel not importable: {type(exc).__name__}: {exc}"
    found = version() or "0"
    if _version_tuple(found) < MIN_VERSION:
        return f"liger-kernel {found} < 0.8 (needs modulated_rms_norm and rope's rotary_dim)"
    try:
        lk = _lk()
    except Exception as exc:
        return f"liger-kernel {found} not importable: {type(exc).__name__}: {exc}"
    import inspect

    for name, params in (("rms_norm_forward", _RMS_PARAMS), ("modulated_rms_norm_forward", _MOD_PARAMS)):
        got = tuple(inspect.signature(getattr(lk, name)).parameters)
        if got != params:
            return f"liger-kernel {found}: {name}{got} is not the {params} this plugin calls"
    got = tuple(getattr(lk.triton_rope, "arg_names", ()))
    if got != _ROPE_ARGS:
        return f"liger-kernel {found}: rope kernel arguments {got} are not the ones this plugin passes"
    return None


# -- shared checks -------------------------------------------------------------------------------
def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def _device_reason(t: torch.Tensor) -> str | None:
    # CUDA/ROCm, meta (planning for another device), or the interpreter on CPU (tests).
    if t.is_cuda or t.is_meta or (t.device.type == "cpu" and _interpreting()):
        return None
    return "needs a CUDA/ROCm tensor (liger's kernels are Triton)"


def _rows_reason(x: torch.Tensor, name: str = "x") -> str | None:
    """liger views x as [rows, D] and indexes rows by one stride with unit column stride."""
    d = x.shape[-1]
    if d > MAX_D:
        return f"D = {d} > {MAX_D} (liger normalizes a row in one block)"
    if x.numel() == 0:
        return None
    try:
        v = x.view(-1, d)
    except RuntimeError:
        return f"{name}'s rows are not one stride apart (liger views it as [rows, D])"
    if d > 1 and v.stride(1) != 1:
        return f"{name}'s last dim is not contiguous"
    return None


def _weight_reason(x: torch.Tensor, weight: torch.Tensor | None, name: str = "weight") -> str | None:
    if weight is None:
        return None
    if weight.dtype != x.dtype:
        return f"{name} dtype differs from x"
    if x.shape[-1] > 1 and weight.stride(0) != 1:
        return f"{name} is not contiguous (liger reads it with unit stride)"
    return None


def _norm_reason(x: torch.Tensor, weight: torch.Tensor | None, dtypes: tuple[torch.dtype, ...],
                 name: str = "x", weight_name: str = "weight") -> str | None:  # fmt: skip
    if x.dtype not in dtypes:
        return f"dtype {x.dtype} not in {', '.join(str(d).removeprefix('torch.') for d in dtypes)}"
    if x.dim() == 0:
        return "needs at least one dimension"
    return _device_reason(x) or _rows_reason(x, name) or _weight_reason(x, weight, weight_name)


def _empty_like(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# -- rmsnorm -------------------------------------------------------------------------------------
def supports_rmsnorm_torch(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """``rmsnorm:liger`` (casting mode gemma) is registered for flavour "torch" only (ulp(1))."""
    if flavour != "torch":
        return "registered for flavour 'torch' only (liger_diffusers takes 'diffusers')"
    return _norm_reason(x, weight, HALF)


def supports_rmsnorm_diffusers(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> str | None:
    """``rmsnorm:liger_diffusers`` (casting mode llama) is registered for flavour "diffusers" only (ulp(2))."""
    if flavour != "diffusers":
        return "registered for flavour 'diffusers' only (liger takes 'torch')"
    return _norm_reason(x, weight, HALF)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor | None, eps: float, flavour: str) -> torch.Tensor:
    """liger's ``rms_norm_forward`` in the flavour's casting mode (no autograd: the op's reference
    provides gradients)."""
    if x.numel() == 0:
        return _empty_like(x)
    y, *_ = _lk().rms_norm_forward(x, weight, float(eps), 0.0, CASTING_MODE[flavour], None)
    return y


# -- rmsnorm_modulate ----------------------------------------------------------------------------
def _padded(t: torch.Tensor, n: int) -> tuple[int, ...]:
    return (1,) * (n - t.dim()) + tuple(t.shape)


def _modulation_rows(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> int | str:
    """How many leading dims of x the modulation varies over (liger reads modulation row ``r //
    rows_per_modulation`` for x row r, so scale/shift must be x's leading dims then all ones), or why not."""
    n, d = x.dim(), x.shape[-1]
    j = 0
    for name, t in (("scale", scale), ("shift", shift)):
        p = _padded(t, n)
        if d > 1 and p[-1] != d:
            return f"{name} broadcasts over D (liger reads a full row of modulation per row of x)"
        lead = [i for i in range(n - 1) if p[i] != 1]
        if not lead:
            continue
        last = lead[-1]
        if any(p[i] != x.shape[i] for i in range(last + 1)):
            return (f"{name} {list(t.shape)} is broadcast over a leading dim of x before one it varies over "
                    "(liger maps x row r to modulation row r // rows_per_modulation)")
        j = max(j, last + 1)
    return j


def supports_rmsnorm_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None,
                              eps: float, flavour: str) -> str | None:  # fmt: skip
    reason = _norm_reason(x, weight, FLOAT)
    if reason is not None:
        return reason
    if flavour not in CASTING_MODE:
        return f"unknown flavour {flavour!r}"
    for name, t in (("scale", scale), ("shift", shift)):
        if t.dtype != x.dtype:
            return f"{name} dtype differs from x"
    j = _modulation_rows(x, scale, shift)
    return j if isinstance(j, str) else None


def rmsnorm_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None,
                     eps: float, flavour: str) -> torch.Tensor:  # fmt: skip
    """liger's fused ``modulated_rms_norm_forward``. scale and shift are brought to one shape, x's
    first j dims then ones (a copy only when they differ or are strided: [B,1,D] and [D] together)."""
    if x.numel() == 0:
        return _empty_like(x)
    j = _modulation_rows(x, scale, shift)
    if isinstance(j, str):  # supports() rejects these; a direct caller gets the reason
        raise ValueError(f"rmsnorm_modulate:liger: {j}")
    target = (*x.shape[:j], *(1,) * (x.dim() - 1 - j), x.shape[-1])
    sc = scale.expand(target).contiguous()
    sh = shift.expand(target).contiguous()
    y, *_ = _lk().modulated_rms_norm_forward(x, weight, sc, sh, float(eps), 0.0, CASTING_MODE[flavour])
    return y


# -- rotary_embedding (split) --------------------------------------------------------------------
def _freq_reason(cos: torch.Tensor, sin: torch.Tensor) -> str | None:
    for name, t in (("cos", cos), ("sin", sin)):
        if t.dtype not in FLOAT:
            return f"{name} dtype {t.dtype} (the kernel computes in fp32: bf16/fp16/fp32 cos and sin)"
    return None


def _split_reason(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, name: str = "x") -> str | None:
    if layout != "split":
        return "liger's RoPE is the split (rotate_half) layout; interleaved pairs are not covered"
    if x.dtype not in FLOAT:
        return f"dtype {x.dtype} not in bfloat16, float16, float32"
    reason = _device_reason(x) or _freq_reason(cos, sin)
    if reason is not None:
        return reason
    width = 2 * cos.shape[-1] if (x.dim() != 4 and cos.dim() == 4) else x.shape[-1]
    if width > MAX_ROTARY_WIDTH:
        return f"rotary width {width} > {MAX_ROTARY_WIDTH} (liger loads a head in one tile)"
    return None


def supports_rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> str | None:
    return _split_reason(x, cos, sin, layout)


class _Rows:
    """How the rope kernel walks a tensor: ``bs * sl`` programs, each one row of ``heads`` heads of
    ``hd`` channels (row ``pid`` at ``pid * heads * hd``), its cos/sin row ``(pid % sl)`` when
    ``cos_bs == 1``, else ``pid`` (cos/sin contiguous [cos_bs, sl, hd/2])."""

    def __init__(self, bs: int, sl: int, heads: int, hd: int, cos: torch.Tensor, sin: torch.Tensor, cos_bs: int) -> None:
        self.bs, self.sl, self.heads, self.hd, self.cos, self.sin, self.cos_bs = bs, sl, heads, hd, cos, sin, cos_bs


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.float()  # exact: the reference upcasts them too


def _broadcast_rows(lead: tuple[int, ...], cos: torch.Tensor, sin: torch.Tensor, hd: int) -> _Rows:
    """x's leading dims ``lead`` (x contiguous) against cos/sin broadcasting to ``(*lead, hd/2)``:
    trailing dims cos does not vary over become heads, leading ones it does not vary over become
    batches (cos_bs 1), the rest sequence rows. cos/sin are copied only for broadcasts in between."""
    n = len(lead)
    c = _padded(cos, n + 1)[:-1]
    inner = n
    while inner > 0 and (c[inner - 1] == 1 or lead[inner - 1] == 1):
        inner -= 1
    heads = math.prod(lead[inner:])
    if heads > MAX_HEADS_PER_ROW:
        inner, heads = n, 1
    outer = 0
    while outer < inner and (c[outer] == 1 or lead[outer] == 1):
        outer += 1
    bs, sl = math.prod(lead[:outer]), math.prod(lead[outer:inner])
    target = (*(1,) * outer, *lead[outer:inner], *(1,) * (n - inner), hd // 2)

    def rows(t: torch.Tensor) -> torch.Tensor:
        return _f32(t).expand(target).reshape(1, sl, hd // 2).contiguous()

    return _Rows(bs, sl, heads, hd, rows(cos), rows(sin), 1)


def _launch_rope(q: torch.Tensor, k: torch.Tensor | None, rows: _Rows) -> None:
    """liger's ``_triton_rope`` forward, in place on contiguous q (and k, same shape; None: no k heads)."""
    import triton

    hd, heads = rows.hd, rows.heads
    pad_heads = triton.next_power_of_2(heads)
    pad_rd = triton.next_power_of_2(hd)
    n_kh = 0 if k is None else heads
    _lk().triton_rope[(rows.bs * rows.sl,)](
        q, heads * hd, q if k is None else k, heads * hd,
        rows.cos, rows.cos.stride(-2), rows.sin, rows.sin.stride(-2),
        rows.sl, rows.bs, rows.cos_bs, heads, n_kh, hd,
        pad_heads, max(1, triton.next_power_of_2(n_kh)), pad_rd, pad_rd, hd,
        BLOCK_SIZE=pad_heads, BACKWARD_PASS=False,
    )  # fmt: skip


def _is_head_split(x: torch.Tensor, cos: torch.Tensor) -> bool:
    return x.dim() != 4 and cos.dim() == 4  # LTX-2.3: x [B, T, H*D] against cos [B, H, T, D/2]


def rotary_embedding(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str) -> torch.Tensor:
    """Split-layout RoPE by liger's kernel on a copy of x (the kernel rotates in place)."""
    if x.numel() == 0:
        return _empty_like(x)
    if _is_head_split(x, cos):
        b, h, t, r = cos.shape
        # One row per (b, h, t), one head each: x's heads moved in front of its tokens (this copy is
        # the one the in-place kernel needs anyway), cos/sin rows in their own order.
        out = x.reshape(b, t, h, 2 * r).permute(0, 2, 1, 3).contiguous()
        rows = _Rows(b, h * t, 1, 2 * r, _f32(cos).reshape(b, h * t, r).contiguous(),
                     _f32(sin).reshape(b, h * t, r).contiguous(), b)  # fmt: skip
        _launch_rope(out, None, rows)
        return out.permute(0, 2, 1, 3).reshape(b, t, h * 2 * r)
    out = x.contiguous() if not x.is_contiguous() else x.clone()
    _launch_rope(out, None, _broadcast_rows(tuple(x.shape[:-1]), cos, sin, x.shape[-1]))
    return out


# -- qk_norm_rope (split) ------------------------------------------------------------------------
def supports_qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                          cos: torch.Tensor, sin: torch.Tensor, eps: float, flavour: str, layout: str) -> str | None:  # fmt: skip
    reason = _split_reason(q, cos, sin, layout, "q")
    if reason is not None:
        return reason
    if flavour not in CASTING_MODE:
        return f"unknown flavour {flavour!r}"
    return (_norm_reason(q, q_weight, FLOAT, "q", "q_weight")
            or _norm_reason(k, k_weight, FLOAT, "k", "k_weight"))  # fmt: skip


def qk_norm_rope(q: torch.Tensor, k: torch.Tensor, q_weight: torch.Tensor | None, k_weight: torch.Tensor | None,
                 cos: torch.Tensor, sin: torch.Tensor, eps: float, flavour: str,
                 layout: str) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """liger rmsnorm of q and of k (fresh contiguous tensors), then one liger rope launch rotating both
    in place."""
    if q.numel() == 0:
        return _empty_like(q), _empty_like(k)
    qn, kn = rmsnorm(q, q_weight, eps, flavour), rmsnorm(k, k_weight, eps, flavour)
    if _is_head_split(q, cos):
        b, h, t, r = cos.shape
        # Rows (b, t, h), one head each, in q's own order: cos/sin [B, H, T, D/2] reordered to
        # [B, T, H, D/2] once for both q and k (cheaper than moving q and k).
        def rows_of(f: torch.Tensor) -> torch.Tensor:
            return _f32(f).permute(0, 2, 1, 3).reshape(b, t * h, r).contiguous()

        rows = _Rows(b, t * h, 1, 2 * r, rows_of(cos), rows_of(sin), b)
    else:
        rows = _broadcast_rows(tuple(q.shape[:-1]), cos, sin, q.shape[-1])
    _launch_rope(qn, kn, rows)
    return qn, kn
