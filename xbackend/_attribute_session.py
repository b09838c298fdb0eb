"""The machinery of ``xbackend.attribute``: the observer that records and switches a patched model's
sites, the error sums, the random state every forward starts from."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from . import _active
from ._policy import quality as quality_tier
from ._policy import use
from ._precision import EXACT, ulp_distance
from ._runtime import runtime
from .patching import _sites

REFERENCE_IMPL = "xbackend:reference"
SiteKey = tuple[str, str]  # (module path, kind), as PatchReport lists a site
_ULP_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class Tally:
    """What the recording forward saw at one site, over all its calls."""

    calls: int = 0
    ops: dict[str, None] = field(default_factory=dict)  # ordered sets
    impls: dict[str, str] = field(default_factory=dict)  # qualname -> declared precision
    err: ErrorSum = field(default_factory=lambda: ErrorSum())


@dataclass
class ErrorSum:
    """A running relative Frobenius error (squared sums over every compared tensor), max |diff| and max
    ulp; ``nonfinite`` when a NaN or infinity differs from the reference's."""

    sq_diff: float = 0.0
    sq_ref: float = 0.0
    max_abs: float = 0.0
    max_ulp: int | None = None
    nonfinite: bool = False

    def add(self, out: Any, ref: Any) -> None:
        outs, refs = tensors_of(out), tensors_of(ref)
        if len(outs) != len(refs):
            raise ValueError(f"xbackend.attribute: compared outputs differ in structure: {len(outs)} tensors against {len(refs)}")
        for o, r in zip(outs, refs, strict=True):
            if o.shape != r.shape:
                raise ValueError(f"xbackend.attribute: compared outputs differ in shape: {list(o.shape)} against {list(r.shape)}")
            if not (o.is_floating_point() and r.is_floating_point()):
                self.nonfinite |= not torch.equal(o, r)
                continue
            if o.dtype == r.dtype and torch.equal(o, r):  # most calls: one comparison, then the norm
                norm = float(torch.linalg.vector_norm(r.float()))
                if math.isfinite(norm):
                    self.sq_ref += norm**2
                    self.max_ulp = max(self.max_ulp or 0, 0) if o.dtype in _ULP_DTYPES else self.max_ulp
                    continue
            o32, r32 = o.float(), r.float()
            finite = o32.isfinite() & r32.isfinite()
            same_special = (o32 == r32) | (o32.isnan() & r32.isnan())
            if not bool((finite | same_special).all()):
                self.nonfinite = True
            d = (o32 - r32)[finite]
            if d.numel():
                self.sq_diff += float(torch.linalg.vector_norm(d)) ** 2
                self.max_abs = max(self.max_abs, float(d.abs().max()))
            self.sq_ref += float(torch.linalg.vector_norm(r32[finite])) ** 2
            if o.dtype == r.dtype and o.dtype in _ULP_DTYPES and d.numel():
                worst = int(ulp_distance(o[finite], r[finite]).max())
                self.max_ulp = max(self.max_ulp or 0, worst)

    @property
    def relative(self) -> float:
        if self.nonfinite:
            return math.inf
        return math.sqrt(self.sq_diff) / math.sqrt(self.sq_ref) if self.sq_ref > 0 else math.sqrt(self.sq_diff)


def tensors_of(out: Any) -> list[torch.Tensor]:
    """The tensors of a model or op output, in order: tuples, lists, dicts (diffusers' BaseOutput is
    one) and dataclasses are walked."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for item in out for t in tensors_of(item)]
    if isinstance(out, dict):
        return [t for item in out.values() for t in tensors_of(item)]
    if hasattr(out, "__dataclass_fields__"):
        return [t for name in out.__dataclass_fields__ for t in tensors_of(getattr(out, name))]
    return []


def distance(out: Any, ref: Any) -> tuple[float, float]:
    e = ErrorSum()
    e.add(out, ref)
    return e.relative, e.max_abs



class Progress:
    """One line on stderr, rewritten each forward; ``done`` and ``total`` count every forward of the run."""

    def __init__(self, enabled: bool, done: int = 0, total: int | None = None) -> None:
        self.enabled, self.done, self.total, self.start = enabled, done, total, time.perf_counter()

    def step(self, what: str) -> None:
        self.done += 1
        if self.enabled:
            total = f"/{self.total}" if self.total else ""
            sys.stderr.write(f"\rxbackend attribute: forward {self.done}{total} ({what})"[:100].ljust(100))
            sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write(f"\rxbackend attribute: {self.done} forwards".ljust(100) + "\n")


class Session:
    def __init__(self, model: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], tier: str, seed: int) -> None:
        self.model, self.args, self.kwargs, self.tier, self.seed = model, args, kwargs, tier, seed
        self.paths = {id(m): p for p, m in model.named_modules()}
        self.generators = [(g, g.get_state()) for g in generators_in((args, kwargs))]
        self.recording = False
        self.fast: frozenset[SiteKey] = frozenset()
        self.tallies: dict[SiteKey, Tally] = {}
        self.exact: dict[str, list[str]] = {}  # op -> the exact impls that could run every recorded call of it
        self._exact_memo: dict[Any, list[str]] = {}
        self.unlabelled = 0
        self.baseline: Any = None
        self.progress = Progress(False)  # enabled once the number of forwards is known
        self.forwards = 0

    # The observer: every fused call of every patched model in the process comes here while it is installed.
    def __call__(self, op: Any, kind: str, site: nn.Module | None, args: tuple[Any, ...]) -> Any:
        path = self.paths.get(id(site)) if site is not None else None
        if path is None:
            self.unlabelled += site is None
            return op(*args)
        key = (path, kind)
        if self.recording:
            return self._record(key, op, args)
        if key in self.fast:
            return op(*args)
        spec = op.spec
        return spec.reference(*(args if len(args) == spec.positional_arity else spec.bind(*args)))

    def _record(self, key: SiteKey, op: Any, args: tuple[Any, ...]) -> Any:
        spec = op.spec
        out = op(*args)
        a = args if len(args) == spec.positional_arity else spec.bind(*args)
        rt = _active.current() or runtime()
        entry = rt._entry(op._key(*a))
        impl = entry.impl if entry is not None and entry.impl is not None else rt.reference(spec.name)
        tally = self.tallies.setdefault(key, Tally())
        tally.calls += 1
        tally.ops[spec.name] = None
        tally.impls[impl.qualname] = str(impl.precision)
        tally.err.add(out, spec.reference(*a))  # the reference's output is dropped right after
        exact = self._exact_impls(rt, spec, a)
        known = self.exact.get(spec.name)
        self.exact[spec.name] = exact if known is None else [n for n in known if n in exact]
        return out

    def _exact_impls(self, rt: Any, spec: Any, a: tuple[Any, ...]) -> list[str]:
        """The impls with an exact contract that could run this call, in the resolver's order (the
        reference last): what ``use(op=...)`` may force on it."""
        memo_key = (spec.name, id(rt), spec.key(*a))
        found = self._exact_memo.get(memo_key)
        if found is None:
            decisions = rt.decide(spec, a, rt.device(spec.device_of(a)), ("lossless", ()))
            found = [("reference" if d.impl.qualname == REFERENCE_IMPL else d.impl.qualname) for d in decisions
                     if d.reason is None and d.impl.precision == EXACT]
            self._exact_memo[memo_key] = found
        return found

    def forward(self, fast: Iterable[SiteKey], what: str, record: bool = False) -> Any:
        """One model call, every site in ``fast`` on the runtime and every other on the reference (with
        ``record``: every site on the runtime, recorded), from the same random state."""
        self.fast, self.recording = frozenset(fast), record
        self.forwards += 1
        try:
            return self._call()
        finally:
            self.recording = False
            self.progress.step(what)

    def restore_generators(self) -> None:
        """Every torch.Generator among the arguments back at its state when the attribution began."""
        for g, state in self.generators:
            g.set_state(state)

    def _call(self) -> Any:
        self.restore_generators()
        torch.manual_seed(self.seed)
        with torch.no_grad(), quality_tier(self.tier):
            return self.model(*self.args, **self.kwargs)

    def distance(self, fast: Iterable[SiteKey], what: str) -> float:
        return distance(self.forward(fast, what), self.baseline)[0]

    def exact_mapping(self, kinds: list[str]) -> dict[str, str]:
        ops = {op: None for key, t in self.tallies.items() if key[1] in kinds for op in t.ops}
        return {op: (self.exact.get(op) or ["reference"])[0] for op in ops}

    def verify(self, mapping: dict[str, str]) -> float:
        """The model output's error against the baseline with ``mapping`` forced and no observer: the
        suggestion as a user would apply it."""
        try:
            with random_state(self.model), use(**mapping):
                out = self._call()
        finally:
            self.restore_generators()
        return distance(out, self.baseline)[0]


def generators_in(obj: Any) -> list[torch.Generator]:
    if isinstance(obj, torch.Generator):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [g for item in obj for g in generators_in(item)]
    if isinstance(obj, dict):
        return [g for item in obj.values() for g in generators_in(item)]
    return []


@contextlib.contextmanager
def random_state(model: nn.Module) -> Iterator[None]:
    """Leave the process's random state (CPU and the model's CUDA devices) as it was."""
    devices = sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        yield


@contextlib.contextmanager
def observing(session: Session) -> Iterator[None]:
    previous = _sites.observe(session)
    if previous is not None:
        _sites.observe(previous)
        raise RuntimeError("xbackend.attribute: another attribution is running in this process; one at a time")
    try:
        yield
    finally:
        _sites.observe(None)

