"""What every patch shares: the report records, instance overrides that undo cleanly, the run-time
checks that decide between a fused op and the model's own expression, and the RMSNorm module patches.

A patch never edits a class. It sets an attribute on one module instance (``forward``,
``tiled_decode``, an attention ``processor``) and marks it as xbackend's, so `unpatch` finds exactly
what was set, and `patch` called twice recognises its own work. The marks travel with the objects, so a
``copy.deepcopy`` of a patched model is patched in the same way.
"""

from __future__ import annotations

import inspect
import math
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module_mod

from .._api import get_op
from ._sites import fused

# The kinds of site a patch can route through xbackend.
KINDS = ("rmsnorm", "rmsnorm_modulate", "add_rmsnorm", "layernorm_modulate", "add_layernorm", "gated_residual", "rotary_embedding",
         "qk_norm_rope_3d", "neighborhood_attention", "silu_mul", "tiled_decode")

_RMSNORM = get_op("rmsnorm")
_RMSNORM_MODULATE = get_op("rmsnorm_modulate")
_ADD_RMSNORM = get_op("add_rmsnorm")
_GATED_RESIDUAL = get_op("gated_residual")
_ROTARY = get_op("rotary_embedding")
_QK_NORM_ROPE = get_op("qk_norm_rope")
_SILU_MUL = get_op("silu_mul")
_FLOAT = (torch.float32, torch.float16, torch.bfloat16)
_MARK = "_xbackend_patch"

# -- report records ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Site:
    """One expression or module that now runs through xbackend. ``path`` is the module path inside the
    patched model ("" for the model itself); ``new`` is False when an earlier `patch` call set it."""

    kind: str
    path: str
    detail: str
    new: bool = True


@dataclass(frozen=True)
class Skipped:
    """A site patch recognised and left as it was, and why."""

    kind: str
    path: str
    reason: str


@dataclass
class Findings:
    """What one walk over a model found; `PatchReport` is its frozen form."""

    sites: list[Site] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def add(self, kind: str, path: str, detail: str, new: bool = True) -> None:
        self.sites.append(Site(kind, path, detail, new))

    def skip(self, kind: str, path: str, reason: str) -> None:
        self.skipped.append(Skipped(kind, path, reason))


@dataclass(frozen=True)
class PatchOptions:
    """What one `patch` call asks of every site: the kinds to route and the process group a patched
    DiffVAE ``tiled_decode`` spreads its tiles over (None: none, each rank decodes its own latent alone)."""

    kinds: frozenset[str]
    decode_group: Any = None


# A row of the patch table: patch(module, path, found, options), and unpatch(module, path, found) for
# sites that replace more than a module's own methods (a processor), else None.
Patch = Callable[[nn.Module, str, Findings, PatchOptions], None]
Unpatch = Callable[[nn.Module, str, Findings], None]


def join(path: str, name: str) -> str:
    return f"{path}.{name}" if path and name else path or name


# -- instance overrides --------------------------------------------------------------------------
@dataclass(frozen=True)
class Mark:
    """What one override routes and what it left as written; paths relative to the patched module."""

    sites: tuple[Site, ...]
    skipped: tuple[Skipped, ...] = ()

    def report(self, path: str, found: Findings, new: bool) -> None:
        for s in self.sites:
            found.add(s.kind, join(path, s.path), s.detail, new)
        for k in self.skipped:
            found.skip(k.kind, join(path, k.path), k.reason)


def mark(fn: Callable[..., Any], tag: Mark) -> Callable[..., Any]:
    """Tag a replacement function as xbackend's."""
    setattr(fn, _MARK, tag)
    return fn


def clone(fn: types.FunctionType) -> types.FunctionType:
    """A new function object with ``fn``'s code: each patched module gets its own, to carry its mark,
    at no cost per call."""
    # Named "forward": a pickled bound method reloads as getattr(module, "forward").
    new = types.FunctionType(fn.__code__, fn.__globals__, "forward", fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    new.__qualname__ = fn.__qualname__
    return new


def own_override(module: nn.Module, attr: str) -> Mark | None:
    """The mark of xbackend's override of ``attr`` on this instance, or None if there is none."""
    value = module.__dict__.get(attr)
    return getattr(getattr(value, "__func__", None), _MARK, None)


def report_own_override(module: nn.Module, attr: str, path: str, found: Findings) -> bool:
    """Report xbackend's override of ``attr`` here as already patched; True if there was one."""
    existing = own_override(module, attr)
    if existing is not None:
        existing.report(path, found, new=False)
    return existing is not None


def foreign_override(module: nn.Module, attr: str) -> bool:
    """True when something other than xbackend replaced ``attr`` on this instance (accelerate's and
    diffusers' hooks wrap ``forward`` this way): patching over it would drop that wrapper."""
    if attr not in module.__dict__ or own_override(module, attr) is not None:
        return False
    value = module.__dict__[attr]
    # The class's own method bound to this module changes nothing. A pickled patched model reloads
    # that way: pickle stores a bound method as getattr(module, name), which finds the class's.
    stock = isinstance(value, types.MethodType) and value.__self__ is module
    return not (stock and value.__func__ is getattr(type(module), attr, None))


def _installed_key(attr: str) -> str:
    return f"_xbackend_installed_{attr}"


def install(module: nn.Module, attr: str, fn: Callable[..., Any]) -> None:
    # A bound method in the instance dict shadows the class attribute; deleting it restores the class's.
    bound = types.MethodType(fn, module)
    object.__setattr__(module, attr, bound)
    # The bound method itself, beside it: a per-call check compares identities (see ours_or_stock).
    object.__setattr__(module, _installed_key(attr), bound)


def uninstall(module: nn.Module, attr: str) -> None:
    object.__delattr__(module, attr)
    module.__dict__.pop(_installed_key(attr), None)


def ours_or_stock(module: nn.Module, attr: str) -> bool:
    """``attr`` on this instance is the class's or the one `install` put there: nothing wraps it. Two
    identity checks on the instance dict, which torch.compile traces (torch 2.11's dynamo cannot read
    the mark on our function, which ``foreign_override`` needs)."""
    value = module.__dict__.get(attr)
    return value is None or value is module.__dict__.get(_installed_key(attr))


def same_parameters(ours: Callable[..., Any], theirs: Callable[..., Any]) -> bool:
    """Same parameter names, kinds and defaults (annotations aside): a caller that passes arguments by
    position or by name reaches the same values in both."""
    a, b = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
    return [(p.name, p.kind, p.default) for p in a.values()] == [(p.name, p.kind, p.default) for p in b.values()]


def _has_hooks(module: nn.Module) -> bool:
    return bool(module._forward_hooks or module._forward_pre_hooks or module._backward_hooks or module._backward_pre_hooks)


def hookless(module: nn.Module) -> bool:
    """Calling this module's math directly skips nothing: no hooks and no foreign forward wrapper."""
    return not (_has_hooks(module) or foreign_override(module, "forward"))


def hookless_now(module: nn.Module) -> bool:
    """``hookless`` for a check made on every call, in code torch.compile traces: no hooks on the module
    or registered globally (``register_module_forward_hook``), and a ``forward`` that is the class's or
    xbackend's own."""
    if _has_hooks(module) or _module_mod._global_forward_hooks or _module_mod._global_forward_pre_hooks:
        return False
    return ours_or_stock(module, "forward")


# -- run-time checks: when is the fused op the same expression? --------------------------------------
# These mirror the ops' argument checks (xbackend/ops/*.py): where one would raise, the patched code
# runs the model's own expression instead, so a patched model never fails where the stock one works.
def _broadcasts(t: torch.Tensor, shape: torch.Size) -> bool:
    if t.dim() < 1 or t.dim() > len(shape):
        return False
    return all(s == 1 or s == g for s, g in zip(reversed(t.shape), reversed(shape), strict=False))


def _like(t: torch.Tensor, x: torch.Tensor) -> bool:
    return t.dtype == x.dtype and t.device == x.device


def can_rmsnorm(x: torch.Tensor, weight: torch.Tensor | None) -> bool:
    # Under autocast aten runs rms_norm in fp32 (and returns fp32); the written expression keeps that.
    if x.dtype not in _FLOAT or x.dim() < 1 or x.shape[-1] == 0 or torch.is_autocast_enabled(x.device.type):
        return False
    return weight is None or (_like(weight, x) and weight.dim() == 1 and weight.shape[0] == x.shape[-1])


def can_modulate(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, weight: torch.Tensor | None) -> bool:
    return (
        can_rmsnorm(x, weight)
        and _like(scale, x)
        and _like(shift, x)
        and _broadcasts(scale, x.shape)
        and _broadcasts(shift, x.shape)
    )


def can_gate(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> bool:
    return (
        x.dtype in _FLOAT
        and x.dim() >= 1
        and _like(update, x)
        and update.shape == x.shape
        and _like(gate, x)
        and _broadcasts(gate, x.shape)
    )


def _rope_operands(x: torch.Tensor, cos: object, sin: object) -> bool:
    """x [B, S, C] with an even C, cos and sin float tensors of one shape on x's device."""
    return (
        x.dtype in _FLOAT
        and x.dim() == 3
        and x.shape[-1] % 2 == 0
        and isinstance(cos, torch.Tensor)
        and isinstance(sin, torch.Tensor)
        and cos.dtype in _FLOAT
        and sin.dtype in _FLOAT
        and cos.shape == sin.shape
        and cos.device == x.device
        and sin.device == x.device
    )


def can_rope(x: torch.Tensor, cos: object, sin: object) -> bool:
    """diffusers' interleaved RoPE is the op for these inputs (it unflattens dim 2: x is [B, S, C])."""
    return _rope_operands(x, cos, sin) and _broadcasts(cos, x.shape)


def can_rope_split(x: torch.Tensor, cos: object, sin: object) -> bool:
    """diffusers' split RoPE is the op for these inputs: x [B, S, C] against cos [B, H, S, C/(2H)], or a
    cos that broadcasts to x's leading dims and C/2."""
    if not _rope_operands(x, cos, sin):
        return False
    if cos.dim() == 4:
        b, h, t, r = cos.shape
        return tuple(x.shape) == (b, t, h * 2 * r)
    return _broadcasts(cos, (*x.shape[:-1], x.shape[-1] // 2))


# -- the fused expressions -----------------------------------------------------------------------
_DIFFUSERS_RMSNORM = ("diffusers.models.normalization", "RMSNorm")


def still_fusable(norm: nn.Module, flavour: str) -> bool:
    """The norm found fusable at patch time still is, on this call: the same class for its flavour, a
    usable eps, no hooks (on it or global) and no replaced forward."""
    cls = type(norm)
    same = cls is nn.RMSNorm if flavour == "torch" else (cls.__module__, cls.__qualname__) == _DIFFUSERS_RMSNORM
    return same and is_eps(norm.eps) and hookless_now(norm)


def norm_modulate(
    norm: nn.Module, flavour: str | None, x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor
) -> torch.Tensor:
    """``norm(x) * (1 + scale) + shift``. ``flavour`` is the norm's flavour when the norm was found
    fusable at patch time, None to keep the expression as written."""
    if flavour is not None and still_fusable(norm, flavour):
        weight = norm.weight
        # torch's norm checks its normalized_shape against x (diffusers' does not); a mismatch raises there.
        sized = flavour != "torch" or (x.dim() >= 1 and x.shape[-1] == norm.normalized_shape[0])
        if sized and can_modulate(x, scale, shift, weight):
            return fused(_RMSNORM_MODULATE, "rmsnorm_modulate", norm, x, scale, shift, weight, norm.eps, flavour)
    return norm(x) * (1 + scale) + shift


def can_add(x: torch.Tensor, update: torch.Tensor) -> bool:
    """``x + update`` is the op's sum: same dtype, device and shape, both contiguous (eager's sum then
    comes out contiguous, as the op's does; strided inputs can give it other strides)."""
    return (
        x.dtype in _FLOAT
        and x.dim() >= 1
        and _like(update, x)
        and update.shape == x.shape
        and x.is_contiguous()
        and update.is_contiguous()
    )


def add_norm(
    norm: nn.Module, flavour: str | None, x: torch.Tensor, update: torch.Tensor,
    scale: torch.Tensor | None = None, shift: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(h, norm(h))`` with ``h = x + update``, the norm output modulated (``* (1 + scale) + shift``)
    when scale and shift are given: one ``add_rmsnorm`` call, or, where these inputs are not that op,
    the add and then the norm site as it is routed otherwise. ``flavour``: as in `norm_modulate`."""
    if flavour is not None and still_fusable(norm, flavour) and can_add(x, update):
        weight = norm.weight
        sized = flavour != "torch" or x.shape[-1] == norm.normalized_shape[0]
        fits = can_rmsnorm(x, weight) if scale is None else can_modulate(x, scale, shift, weight)
        if sized and fits:
            return fused(_ADD_RMSNORM, "add_rmsnorm", norm, x, update, weight, norm.eps, flavour, scale, shift)
    h = x + update
    return h, (norm(h) if scale is None else norm_modulate(norm, flavour, h, scale, shift))


def can_silu_mul(gate: torch.Tensor, up: torch.Tensor) -> bool:
    return gate.dtype in _FLOAT and _like(up, gate) and up.shape == gate.shape


def silu_mul(gate: torch.Tensor, up: torch.Tensor, site: nn.Module | None = None) -> torch.Tensor:
    """``F.silu(gate) * up`` in the SwiGLU module ``site``."""
    if can_silu_mul(gate, up):
        return fused(_SILU_MUL, "silu_mul", site, gate, up)
    return F.silu(gate) * up


def gated(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, site: nn.Module | None = None) -> torch.Tensor:
    """``x + update * gate``, ``update`` the output of module ``site``. Sites written ``x + gate * update``
    call this too: one multiply of two values commutes exactly in IEEE arithmetic, broadcasting included."""
    if can_gate(x, update, gate):
        return fused(_GATED_RESIDUAL, "gated_residual", site, x, update, gate)
    return x + update * gate


def rope_interleaved(x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor], original: Callable[..., Any], site: nn.Module | None = None) -> torch.Tensor:
    """diffusers' ``apply_interleaved_rotary_emb(x, freqs)`` (``original``) as ``rotary_embedding`` in ``site``."""
    cos, sin = freqs
    if can_rope(x, cos, sin):
        return fused(_ROTARY, "rotary_embedding", site, x, cos, sin, "interleaved")
    return original(x, freqs)


def rope_split(x: torch.Tensor, freqs: tuple[torch.Tensor, torch.Tensor], original: Callable[..., Any], site: nn.Module | None = None) -> torch.Tensor:
    """diffusers' ``apply_split_rotary_emb(x, freqs)`` (``original``) as ``rotary_embedding`` in ``site``."""
    cos, sin = freqs
    if can_rope_split(x, cos, sin):
        return fused(_ROTARY, "rotary_embedding", site, x, cos, sin, "split")
    return original(x, freqs)


def qk_norm_rope(
    norm_q: nn.Module, norm_k: nn.Module, flavour: str, query: torch.Tensor, key: torch.Tensor,
    freqs: tuple[torch.Tensor, torch.Tensor], layout: str = "interleaved", site: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``rope(norm_q(query)), rope(norm_k(key))`` as one ``qk_norm_rope`` call, or None when these inputs
    are not that op (the caller then runs the two norms and two RoPEs). ``flavour`` is both norms'
    flavour, found fusable (and their eps equal) at patch time; ``layout`` the attention's RoPE
    (diffusers' ``rope_type``: "interleaved" or "split"); ``site`` the attention."""
    cos, sin = freqs
    can_rope_layout = can_rope if layout == "interleaved" else can_rope_split
    wq, wk = norm_q.weight, norm_k.weight
    if (
        query.shape != key.shape
        or not _like(key, query)
        or (wq is None) != (wk is None)
        or norm_q.eps != norm_k.eps
        or not (can_rmsnorm(query, wq) and can_rmsnorm(key, wk) and can_rope_layout(query, cos, sin))
        or (flavour == "torch" and not query.shape[-1] == norm_q.normalized_shape[0] == norm_k.normalized_shape[0])
    ):
        return None
    return fused(_QK_NORM_ROPE, "rotary_embedding", site, query, key, wq, wk, cos, sin, norm_q.eps, flavour, layout)


def qk_fusion_flavour(norm_q: nn.Module, norm_k: nn.Module) -> tuple[str | None, str]:
    """(flavour, detail) when the q and k norms can run fused with RoPE, else (None, why not)."""
    fq, why_q = rmsnorm_flavour(norm_q)
    fk, why_k = rmsnorm_flavour(norm_k)
    if fq is None or fk is None:
        return None, f"q/k norms not fused: {why_q if fq is None else why_k}"
    if foreign_override(norm_q, "forward") or foreign_override(norm_k, "forward"):
        return None, "q/k norms not fused: a norm's forward is replaced on the instance (a hook wrapper?)"
    if fq != fk or norm_q.eps != norm_k.eps:
        return None, "q/k norms not fused: their flavours or eps differ"
    if (norm_q.weight is None) != (norm_k.weight is None):
        return None, "q/k norms not fused: one has a weight, the other not"
    return fq, "q/k RMSNorm + RoPE fused (qk_norm_rope)"


# -- RMSNorm modules -----------------------------------------------------------------------------
# The diffusers release whose code the patches reproduce (the "diffusers" RMSNorm flavour included).
DIFFUSERS_VERSION = "0.42.1"


def diffusers_mismatch() -> str | None:
    """Why diffusers-derived sites must stay as written, or None when the installed diffusers is the one
    the patches mirror."""
    try:
        import diffusers
    except ImportError:
        return "diffusers is not installed"
    if diffusers.__version__ != DIFFUSERS_VERSION:
        return f"diffusers {diffusers.__version__} is installed; xbackend.patching mirrors {DIFFUSERS_VERSION}"
    return None


def diffusers_rmsnorm_class() -> type | None:
    try:
        from diffusers.models.normalization import RMSNorm
    except ImportError:
        return None
    return RMSNorm


def is_eps(eps: object) -> bool:
    return isinstance(eps, int | float) and not isinstance(eps, bool) and math.isfinite(eps) and eps >= 0


def _norm_detail(flavour: str, dim: int, eps: float, weight: torch.Tensor | None) -> str:
    return f"flavour={flavour} dim={dim} eps={eps:g} weight={'yes' if weight is not None else 'none'}"


def rmsnorm_flavour(module: nn.Module) -> tuple[str | None, str]:
    """(flavour, detail) when ``module`` is an RMSNorm whose forward the rmsnorm op reproduces exactly,
    else (None, reason). Only the exact classes count: a subclass may override anything."""
    cls = type(module)
    if cls is nn.RMSNorm:
        shape, eps = module.normalized_shape, module.eps
        if len(shape) != 1:
            return None, f"normalizes over {len(shape)} dims {tuple(shape)}; the op normalizes the last dim only"
        if eps is None:
            # Documented as finfo(x.dtype).eps, but aten uses the *opmath* type's epsilon (float32's for
            # bf16/fp16 inputs, measured on CPU), and each device resolves it on its own.
            return None, "eps=None: torch resolves the default eps inside aten per device; left to torch"
        if not is_eps(eps):
            return None, f"eps {eps!r} is not a finite number >= 0"
        return "torch", _norm_detail("torch", shape[0], eps, module.weight)
    if cls is diffusers_rmsnorm_class():
        from diffusers.utils import is_torch_npu_available

        if (problem := diffusers_mismatch()) is not None:
            return None, problem
        if is_torch_npu_available() and module.weight is not None:
            return None, "diffusers routes this norm to torch_npu.npu_rms_norm on an NPU host"
        if module.bias is not None:
            return None, "has a bias: rmsnorm followed by + bias is not the rmsnorm op"
        if len(module.dim) != 1:
            return None, f"dim {tuple(module.dim)} has more than one entry"
        if not is_eps(module.eps):
            return None, f"eps {module.eps!r} is not a finite number >= 0"
        return "diffusers", _norm_detail("diffusers", module.dim[0], module.eps, module.weight)
    return None, "not an RMSNorm xbackend knows"


def _torch_rmsnorm_forward(self: nn.RMSNorm, x: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if x.dim() >= 1 and x.shape[-1] == self.normalized_shape[0] and can_rmsnorm(x, weight):
        return fused(_RMSNORM, "rmsnorm", self, x, weight, self.eps, "torch")
    return type(self).forward(self, x)


def _diffusers_rmsnorm_forward(self: nn.Module, hidden_states: torch.Tensor) -> torch.Tensor:
    weight = self.weight
    if self.bias is None and can_rmsnorm(hidden_states, weight):
        return fused(_RMSNORM, "rmsnorm", self, hidden_states, weight, self.eps, "diffusers")
    return type(self).forward(self, hidden_states)


_NORM_FORWARDS = {"torch": _torch_rmsnorm_forward, "diffusers": _diffusers_rmsnorm_forward}


def patch_rmsnorm(module: nn.Module, path: str, found: Findings, options: PatchOptions) -> None:
    if report_own_override(module, "forward", path, found):
        return
    if "rmsnorm" not in options.kinds:
        return
    flavour, detail = rmsnorm_flavour(module)
    if flavour is None:
        found.skip("rmsnorm", path, detail)
        return
    if foreign_override(module, "forward"):
        found.skip("rmsnorm", path, "forward is already replaced on this instance (a hook wrapper?); left alone")
        return
    tag = Mark((Site("rmsnorm", "", detail),))
    install(module, "forward", mark(clone(_NORM_FORWARDS[flavour]), tag))
    tag.report(path, found, new=True)
