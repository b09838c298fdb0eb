"""What callers use: ``get_op``, ``list_ops``, ``plan`` and ``report``."""

from __future__ import annotations

import inspect
import json
import sys
from dataclasses import dataclass
from typing import Any

import torch

from . import _fastkey
from . import _runtime as _rt
from ._device import Device
from ._opspec import OpSpec, register_inference_op
from ._policy import current_policy
from ._precision import Output
from ._runtime import GUARD_SIGNALS as _GUARD_SIGNALS
from ._runtime import runtime
from .ops import OPS

__all__ = ["Op", "Plan", "PlanRow", "Report", "get_op", "list_ops", "plan", "plugins", "problems", "report"]


_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled


class Op:
    """A callable abstract op. Eager calls go straight to the runtime's per-key dispatch. When autograd
    needs to record, the call goes through the op's ``torch.library`` custom op (gradients of the
    reference); under ``torch.compile`` without gradients, through its inference twin
    ``xbackend::<name>_infer`` (``register_inference_op``). Both are one opaque node with a fake impl,
    so graphs never break."""

    __slots__ = ("_arity", "_bind", "_custom_op", "_infer_op", "_key", "spec")

    def __init__(self, spec: OpSpec) -> None:
        self.spec = spec
        self._bind = spec.bind
        self._custom_op = spec.custom_op
        self._infer_op = register_inference_op(spec, self._eager)  # at run time, the graph node runs _eager
        self._key = spec.key
        self._arity = spec.positional_arity

    def __call__(self, *args: Any, **kwargs: Any) -> Output:
        if not kwargs and len(args) == self._arity:
            a = args
        else:
            try:
                a = self._bind(*args, **kwargs)
            except TypeError:  # bind's own message names neither the op nor its signature
                from ._checks import bad_call

                error = bad_call(self.spec.name, self.spec.signature, self._bind, args, kwargs)
                if error is None:
                    raise
                raise error from None
        if _grad_enabled() and self.spec.needs_grad(a):
            self.spec.check(*a)  # before the dispatcher converts the arguments to its schema's types
            return self._custom_op(*a)
        if _is_compiling():  # a graph node without custom_op's per-call Python layers (no grad to record)
            self.spec.check(*a)  # metadata only: traced once, into guards
            return self._infer_op(*a)
        # The cache-hit path of Runtime.dispatch: the key (C++ or Python, whichever _fastkey fixed for
        # this process), one lookup, the verified callable. Dispatch's host cost is most of a small
        # shape's; anything else (no runtime or cache yet, a miss) goes through dispatch.
        rt = _rt.current()
        if rt is not None:
            try:
                key = self._key(*a)
                fn = rt.lookup(key)  # read once: another thread may reset it
            except Exception:
                fn = None
            if fn is not None:
                try:
                    return fn(*a)
                except _GUARD_SIGNALS:
                    raise
                except Exception as e:
                    return rt.after_failure(self.spec, key, a, e, fn)
        return self._eager(*a)

    def _eager(self, *a: Any) -> Output:
        """Run on real tensors now through the runtime's dispatch (``__call__`` has already tried its
        cache for eager calls). Also the kernel of the inference op, which must not route back to itself
        while a compile is under way (torch.compiler.is_compiling() stays true for a whole compile or
        export session)."""
        return (_rt.current() or runtime()).dispatch(self.spec, a)

    @property
    def name(self) -> str:
        return self.spec.name

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        # Ops hold torch.library handles; models that keep one must still deepcopy and pickle.
        return (get_op, (self.spec.name,))

    def __repr__(self) -> str:
        return f"<xbackend op {self.spec.signature}>"


class HostOp:
    """An op that runs on the host around other ops (``vae_tile_decode``): it takes callables and
    process groups, so it has no custom op and no kernels to resolve."""

    __slots__ = ("_fn", "name", "signature")

    def __init__(self, name: str, fn: Any, signature: str) -> None:
        self.name, self._fn, self.signature = name, fn, signature

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._fn(*args, **kwargs)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (get_op, (self.name,))

    def __repr__(self) -> str:
        return f"<xbackend host op {self.signature}>"


def _host_ops() -> dict[str, HostOp]:
    from .ops import vae_tile_decode

    # A class of its own, as for kernel ops (_documented): help() and inspect.signature show the op.
    cls = type(f"HostOp[{vae_tile_decode.NAME}]", (HostOp,), {
        "__slots__": (), "__doc__": vae_tile_decode.__doc__, "__module__": HostOp.__module__,
        "__signature__": inspect.signature(vae_tile_decode.reference)})
    return {vae_tile_decode.NAME: cls(vae_tile_decode.NAME, vae_tile_decode.reference, vae_tile_decode.SIGNATURE)}


def _documented(spec: OpSpec) -> Op:
    """An :class:`Op` whose class carries the op's own docstring and signature, so ``help(get_op(name))``
    and ``inspect.signature`` show the op rather than the generic class."""
    doc = sys.modules[spec.reference.__module__].__doc__ or spec.signature
    cls = type(f"Op[{spec.name}]", (Op,), {"__slots__": (), "__doc__": doc, "__module__": Op.__module__,
                                           "__signature__": inspect.signature(spec.bind).replace(
                                               return_annotation=inspect.Signature.empty)})
    return cls(spec)


_OPS: dict[str, Op | HostOp] = {name: _documented(spec) for name, spec in OPS.items()} | _host_ops()


def _use_keys(keys: dict[str, Any]) -> None:
    # The one place Op._key changes: when _fastkey fixes the key form (C++ or Python) for the process.
    for op in _OPS.values():
        if isinstance(op, Op):
            op._key = keys[op.spec.name]


_fastkey.subscribe(_use_keys)


class UnknownOpError(KeyError, ValueError):
    """An op name no op has: a KeyError for ``get_op`` (a lookup), a ValueError for ``plan`` and ``use``
    (a bad argument); its text is the message itself, not KeyError's quoted repr."""

    def __str__(self) -> str:
        return str(self.args[0])


def unknown_op(caller: str, name: object, known: list[str]) -> UnknownOpError:
    """The error for ``caller`` given an op name not in ``known``: the close matches, then every name."""
    import difflib

    close = difflib.get_close_matches(name, known, n=1) if isinstance(name, str) else []
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return UnknownOpError(f"{caller}: unknown op {name!r}{hint}; expected one of {', '.join(known)}")


def get_op(name: str) -> Any:
    """The op called ``name`` (see ``list_ops()``): an :class:`Op`, or a :class:`HostOp` for
    ``vae_tile_decode``."""
    op = _OPS.get(name)
    if op is None:
        raise unknown_op("get_op", name, list(_OPS))
    return op


def list_ops() -> list[str]:
    return list(_OPS)


def kernel_ops() -> list[str]:
    """The ops that have impls to resolve (every op but the host-level ones)."""
    return list(OPS)


@dataclass(frozen=True)
class PlanRow:
    """One candidate of a plan. ``reason`` is why it was rejected (None when it is eligible);
    ``verdict`` is the resolver's code for the same (``_resolver.VERDICTS``, or ``chosen``/``tie``/
    ``lower_priority``); ``why`` explains every verdict, eligible ones included."""

    impl: str
    backend: str
    priority: int
    precision: str
    chosen: bool
    reason: str | None
    verdict: str = "chosen"
    lost_to: str | None = None  # "backend:impl" the chosen one, for tie and lower_priority
    lost_to_priority: int | None = None
    assumed: str | None = None  # the host's availability failure, when planned as available on the target
    won_tie_over: str | None = None  # for the chosen row: the first impl it tied with
    needs: str | None = None  # for a "quality" verdict: the first tier that admits the impl's precision

    @property
    def qualname(self) -> str:
        return f"{self.backend}:{self.impl}" if self.backend else self.impl

    @property
    def why(self) -> str:
        if self.reason is not None:
            return self.reason
        if self.verdict == "tie":
            return (f"tie with {self.lost_to} at priority {self.priority}: {self.lost_to} sorts first "
                    "(backend name, then impl name)")
        if self.verdict == "lower_priority":
            return f"lower priority than {self.lost_to} ({self.lost_to_priority} > {self.priority})"
        if self.won_tie_over is not None:
            return f"highest priority eligible; wins the tie with {self.won_tie_over} on backend, then impl name"
        return "highest priority eligible"

    @property
    def brief(self) -> str:
        """``why`` for the text plan, where the row's priority and precision stand in their own columns."""
        if self.chosen:
            return "chosen"
        if self.verdict == "lower_priority":
            return f"lower priority than {self.lost_to}"
        if self.verdict == "tie":
            return f"tie: {self.lost_to} sorts first (backend, then impl name)"
        if self.verdict == "quality" and self.needs is not None:
            return f"needs quality {self.needs!r}"
        return self.why

    def to_dict(self) -> dict[str, Any]:
        return {"impl": self.qualname, "priority": self.priority, "precision": self.precision,
                "verdict": self.verdict, "reason": self.why}


@dataclass(frozen=True)
class Plan:
    op: str
    device: Device
    quality: str
    inputs: str
    rows: tuple[PlanRow, ...]
    dtype: str = ""
    # Why the plan looks as it does beyond its rows (a tier rule that applied, no backend loaded); text only.
    notes: tuple[str, ...] = ()

    @property
    def chosen(self) -> PlanRow:
        return next(r for r in self.rows if r.chosen)

    @property
    def assumed(self) -> tuple[PlanRow, ...]:
        """Rows planned as available on the target although this host's check failed."""
        return tuple(r for r in self.rows if r.assumed is not None)

    def to_dict(self) -> dict[str, Any]:
        """The plan entry of ``xbackend plan --json`` and ``xbackend fleet --json`` (and of goldens):
        nothing in it depends on the host that planned it."""
        return {
            "op": self.op,
            "dtype": self.dtype,
            "quality": self.quality,
            "chosen": self.chosen.qualname,
            "candidates": [r.to_dict() for r in self.rows],
        }

    def __str__(self) -> str:
        """One row per candidate under a column header, every line at most ``TEXT_WIDTH`` characters
        (a long input or reason wraps), then the notes."""
        lines = [f"{self.op} on {self.device} [quality={self.quality}]", *_wrap(self.inputs, "  input: ")]
        name_w = max(len(r.qualname) for r in self.rows)
        prio_w = max(4, *(len(str(r.priority)) for r in self.rows))
        prec_w = max(9, *(len(r.precision) for r in self.rows))
        lines.append(f"     {'impl':<{name_w}}  {'prio':>{prio_w}}  {'precision':<{prec_w}}  verdict")
        for r in self.rows:
            lead = f"  {'->' if r.chosen else '  '} {r.qualname:<{name_w}}  {r.priority:>{prio_w}}  {r.precision:<{prec_w}}  "
            lines += _wrap(r.brief, lead)
            if r.assumed is not None:
                lines += _wrap(f"(assumed available on {self.device.arch}; here: {r.assumed})", " " * len(lead))
        for note in self.notes:
            lines += _wrap(note, "  note: ")
        return "\n".join(lines)


TEXT_WIDTH = 100


def _wrap(text: str, lead: str) -> list[str]:
    """``text`` after ``lead``, wrapped at spaces to ``TEXT_WIDTH``: continuation lines align under the
    text when that takes at most two lines, else under a short indent."""
    import textwrap

    def wrapped(first: str, indent: str) -> list[str]:
        return textwrap.wrap(text, TEXT_WIDTH, initial_indent=first, subsequent_indent=indent,
                             break_long_words=False, break_on_hyphens=False) or [first.rstrip()]

    lines = wrapped(lead, " " * len(lead))
    if len(lines) > 2:
        lines = wrapped(lead, " " * 8) if lead.strip() else wrapped(" " * 8, " " * 8)
    return lines


def plan(
    op: str,
    device: str | torch.device | Device = "cpu",
    *,
    dtype: torch.dtype = torch.bfloat16,
    args: tuple[Any, ...] | None = None,
    quality: str | None = None,
    assume_available: bool = False,
) -> Plan:
    """Ordered candidates for ``op`` on ``device`` (a real device or a simulated target such as
    ``"sm100"``/``"gfx950"``), each chosen or rejected with a one-line reason and a verdict code.

    Without ``args``, a representative input of ``dtype`` (meta tensors) is used. Packages are
    checked on this host unless ``assume_available=True``, which plans as deployed on the target:
    every impl's dependencies count as installed there, and each row whose outcome relied on that
    keeps this host's failed check in ``PlanRow.assumed`` (``xbackend plan``/``fleet`` do this for
    simulated targets).
    """
    from ._opspec import describe_args
    from ._precision import QUALITY_TIERS, TOLERANT_RULE, admits
    from ._resolver import dtype_name

    rt = runtime()
    found = _OPS.get(op)
    if found is None:
        raise unknown_op("plan", op, kernel_ops())
    if isinstance(found, HostOp):
        raise ValueError(f"plan: {op!r} is a host-level op (it decodes through a callable you pass); it has no impls to plan")
    spec = found.spec
    dev = rt.device(device)
    if args is None:
        args = spec.example(dtype, torch.device("meta"))
    else:
        args = spec.bind(*args)
        spec.check(*args)
    if quality is not None and quality not in QUALITY_TIERS:
        raise ValueError(f"plan: quality expected one of {', '.join(QUALITY_TIERS)}, got {quality!r}")
    tier, forced = current_policy()
    policy = (quality or tier, forced)
    decisions = rt.decide(spec, args, dev, policy, assume_available=assume_available)

    def shown(priority: int) -> int:
        return priority if priority > -(2**31) else -1  # the reference's sentinel, printed as -1

    tied = next((d.impl.qualname for d in decisions if d.verdict == "tie"), None)
    rows = []
    for d in decisions:
        # Only rows that got past the availability filter relied on the assumption.
        relied = assume_available and d.verdict not in ("forced", "blocked", "arch", "dtype", "quality")
        rows.append(PlanRow(
            d.impl.name, d.impl.backend, shown(d.impl.priority), str(d.impl.precision), d.verdict == "chosen",
            d.reason, d.verdict,
            d.lost_to.qualname if d.lost_to is not None else None,
            shown(d.lost_to.priority) if d.lost_to is not None else None,
            rt.availability(d.impl) if relied else None,
            tied if d.verdict == "chosen" else None,
            next((t for t in QUALITY_TIERS if admits(t, d.impl.precision, spec.tolerant)), None)
            if d.verdict == "quality" else None,
        ))
    notes = list(rt.notes)
    chosen = next((d.impl.precision for d in decisions if d.verdict == "chosen"), None)
    if chosen is not None and spec.tolerant and not admits(policy[0], chosen, False):
        notes.insert(0, f"{op} {TOLERANT_RULE}")
    return Plan(op, dev, policy[0], describe_args(args), tuple(rows), dtype_name(spec.dtype_of(args)), tuple(notes))


@dataclass(frozen=True)
class Report:
    events: tuple[Any, ...]
    dropped: int = 0  # older events the runtime no longer keeps (it keeps the latest 4096)

    def to_dict(self) -> list[dict[str, str]]:
        return [e.__dict__ for e in self.events]

    def __str__(self) -> str:
        if not self.events:
            return "xbackend report: no op has run yet"
        lines = ["xbackend report: op / input / impl / status"]
        if self.dropped:
            lines.append(f"  ({self.dropped} earlier events not kept)")
        for e in self.events:
            detail = f" ({e.detail})" if e.detail else ""
            lines.append(f"  {e.op:<22} {e.key:<48} {e.impl:<28} {e.status}{detail}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)


def plugins() -> list[Any]:
    """Every plugin the runtime saw, in load order: name, source (entry point and distribution, or
    "explicit"), ``error`` (None when loaded; why it was refused, failed to import or to register) and
    the impls it registered (``op:name``)."""
    return list(runtime().plugins.values())


def problems() -> list[str]:
    """Load-time problems, one line each: plugins refused or failed, unknown names in
    ``XBACKEND_PLUGINS`` / ``XBACKEND_BLOCK``, environment values that are not understood."""
    return runtime().load_problems()


def report() -> Report:
    """What ran, what was verified, and what failed and fell back, in order of first use."""
    rt = runtime()
    events = tuple(rt.events)
    return Report(events, rt.events_total - len(events))
