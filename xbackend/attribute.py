"""``xbackend.attribute(model, *args, **kwargs)``: which patched site makes a patched model's output drift
from its all-reference forward, which impl ran there, and by how much at the output.

Every call a patched site makes goes through ``patching._sites.fused``, naming its report entry (kind
and module). While an attribution runs, an observer answers those calls of this model:

- the recording forward runs each call through the runtime as usual (the impl the tier picks), then the
  op's reference on the same inputs, and keeps per site the impl, its declared precision and the
  error (relative Frobenius, max |diff|, max ulp), then lets the inputs go;
- every later forward runs a chosen set of sites on the runtime and every other site on the op's
  reference. The all-reference forward is the baseline, run twice (a difference is the noise floor).

A site's output error is the model output's relative error with only that site fast ("leave one in").
``method="each"`` measures it per site and also leaves each site out (every site fast but it): 2N
forwards for N sites that ran a non-reference impl. ``method="bisect"`` measures each site kind, then
halves a group while its output error exceeds the noise floor: about 2k·log2(N/k) forwards for k
drifting sites among N. A site whose every call ran the reference has output error 0 without a
forward. Nothing of a forward is kept but its output's distance to the baseline, whose output is the
one copy held.
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from typing import Any

from torch import nn

from ._attribute_session import (
    REFERENCE_IMPL,
    Progress,
    Session,
    SiteKey,
    Tally,
    distance,
    observing,
    random_state,
)
from ._policy import current_policy
from ._precision import QUALITY_TIERS
from .patching import patch as _patch

__all__ = ["METHODS", "SCHEMA_VERSION", "Attribution", "KindRow", "SiteRow", "Suggestion", "attribute"]

SCHEMA_VERSION = 1  # of the to_dict() / `xbackend attribute --json` document
METHODS = ("auto", "bisect", "each")
# "auto" runs each site alone (and left out) up to this many switchable sites, and bisects beyond. On
# examples/'s tiny LTX-2 DiT (76 sites; CPU, one thread) bisection took 41, 33, 21 and 11 forwards where
# "each" took 43, 115, 103 and 115, for 20 of 20, 12 of 52, 6 of 46 and 0 of 52 switchable sites
# drifting, with the same per-site output errors; below 8 sites the two cost about the same, and "each"
# also leaves each site out.
EACH_UP_TO = 8
_SHOW_PROGRESS_FROM = 5  # forwards: below this a progress bar is noise


# -- results --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SiteRow:
    """One patched site. ``local_error``: the relative Frobenius error of the impl's outputs against the
    op's reference on the same inputs, over the site's calls in the all-fast forward (``local_max_abs``,
    ``local_max_ulp`` in the output dtype alike). ``output_error``: the model output's relative
    Frobenius error against the all-reference forward with only this site fast; ``output_without``: with
    every site fast but this one (``method="each"`` only). ``impl`` is ``"-"`` for a site that made no
    call; several impls or ops are joined with ``+``."""

    site: str
    kind: str
    op: str
    impl: str
    precision: str
    calls: int
    local_error: float
    local_max_abs: float
    local_max_ulp: int | None
    output_error: float
    output_without: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: _json_number(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class KindRow:
    """Every site of one kind together (what ``patch(exclude=...)`` takes): ``output_error`` with only
    this kind's sites fast, ``output_without`` with every other kind's sites fast; ``local_error`` is the
    largest of its sites'."""

    kind: str
    ops: tuple[str, ...]
    impls: tuple[str, ...]
    sites: int
    local_error: float
    output_error: float
    output_without: float

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else _json_number(v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class Suggestion:
    """The smallest change found: ``with xbackend.use(**use)`` (each op on the first exact impl that
    could run every recorded call of it, else the reference), or the coarser ``patch(model,
    exclude=exclude)`` of the same kinds. ``output_error`` is measured with ``use`` applied
    (``forwards`` of them); ``exclude`` gives the same output where those kinds' ops have an exact
    reference (every op but neighborhood_attention, whose unpatched expression is diffusers')."""

    tolerance: float
    use: dict[str, str]
    exclude: tuple[str, ...]
    output_error: float
    met: bool
    forwards: int

    def __str__(self) -> str:
        if not self.use:
            return f"no change: the output error {_fmt(self.output_error)} is within {self.tolerance:g}"
        mapping = ", ".join(f"{op}={impl!r}" for op, impl in self.use.items())
        verdict = "within" if self.met else "still above"
        return (f"with xbackend.use({mapping}):  # or xbackend.patch(model, exclude={self.exclude!r})\n"
                f"  output error {_fmt(self.output_error)}, {verdict} {self.tolerance:g} "
                f"(measured by {self.forwards} forward{'s' * (self.forwards != 1)})")

    def to_dict(self) -> dict[str, Any]:
        return {"tolerance": self.tolerance, "use": dict(self.use), "exclude": list(self.exclude),
                "output_error": _json_number(self.output_error), "met": self.met, "forwards": self.forwards}


def _json_number(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v  # null: a NaN or inf moved


def _fmt(v: float | None) -> str:
    return "-" if v is None else ("0" if v == 0 else f"{v:.2e}")


class Attribution:
    """What `attribute` found. ``rows``: one per patched site, largest output error first;
    ``divergence``: the whole patched model's output error (relative Frobenius, ``divergence_max_abs``
    its max |diff|) against the all-reference forward; ``noise``: between two all-reference forwards."""

    def __init__(self, *, model_name: str, rows: tuple[SiteRow, ...], kinds: tuple[KindRow, ...],
                 divergence: tuple[float, float], noise: float, quality: str, method: str, forwards: int,
                 seconds: float, notes: tuple[str, ...], session: Session | None) -> None:
        self.model_name = model_name
        self.rows = rows
        self._kinds = kinds
        self.divergence, self.divergence_max_abs = divergence
        self.noise = noise
        self.quality = quality
        self.method = method
        self.forwards = forwards
        self.seconds = seconds
        self.notes = notes
        self._session = session  # the model, its inputs and the baseline output, for suggest()

    def by_kind(self) -> tuple[KindRow, ...]:
        """One row per site kind that ran a non-reference impl, largest output error first."""
        return self._kinds

    def suggest(self, tolerance: float) -> Suggestion:
        """The fewest site kinds to put on an exact impl so the output is within ``tolerance`` (relative
        Frobenius) of the all-reference forward: kinds in order of their output error, until the
        others' errors add up to at most ``tolerance``; then one forward with that ``use`` mapping
        measures it (and, while it is still above, the next kind joins and one more forward runs)."""
        if not (isinstance(tolerance, (int, float)) and not isinstance(tolerance, bool) and tolerance >= 0):
            raise ValueError(f"Attribution.suggest: argument 'tolerance' expected a number >= 0, got {tolerance!r}")
        if self.divergence <= tolerance:
            return Suggestion(float(tolerance), {}, (), self.divergence, True, 0)
        if self._session is None:
            raise RuntimeError("Attribution.suggest: this attribution no longer holds its model")
        ranked = [k for k in self._kinds if k.output_error > self.noise]
        chosen: list[KindRow] = []
        forwards, measured = 0, self.divergence
        for i, row in enumerate(ranked):
            chosen.append(row)
            rest = sum(k.output_error for k in ranked[i + 1:])
            if rest > tolerance and i + 1 < len(ranked):
                continue
            mapping = self._session.exact_mapping([k.kind for k in chosen])
            measured = self._session.verify(mapping)
            forwards += 1
            if measured <= tolerance:
                break
        mapping = self._session.exact_mapping([k.kind for k in chosen])
        return Suggestion(float(tolerance), mapping, tuple(k.kind for k in chosen), measured,
                          measured <= tolerance, forwards)

    def table(self, every: bool = False) -> str:
        """The text report: the model's divergence, the sites with a non-zero output or local error (all
        of them with ``every``), then the kinds."""
        lines = [f"xbackend attribute: {self.model_name}, quality {self.quality}, {len(self.rows)} sites, "
                 f"{self.forwards} forwards ({self.method}) in {self.seconds:.2f} s",
                 f"model output: relative error {_fmt(self.divergence)} (max |diff| {_fmt(self.divergence_max_abs)}) "
                 f"against the all-reference forward; noise floor {_fmt(self.noise)}"]
        shown = [r for r in self.rows if every or r.output_error or r.local_error]
        if shown:
            wide = max(len(r.site or "<model>") for r in shown)
            lines.append(f"  {'output err':>10}  {'w/o site':>9}  {'local err':>9}  {'max ulp':>7}  {'calls':>5}  "
                         f"{'kind':<22}  {'site':<{wide}}  impl (precision)")
            for r in shown:
                ulps = "-" if r.local_max_ulp is None else str(r.local_max_ulp)
                lines.append(f"  {_fmt(r.output_error):>10}  {_fmt(r.output_without):>9}  {_fmt(r.local_error):>9}  "
                             f"{ulps:>7}  {r.calls:>5}  {r.kind:<22}  {r.site or '<model>':<{wide}}  "
                             f"{r.impl} ({r.precision})")
        hidden = len(self.rows) - len(shown)
        if hidden:
            idle = sum(r.calls == 0 for r in self.rows if r not in shown)
            lead = f"{hidden} more sites" if shown else f"all {hidden} sites"
            lines.append(f"  {lead}: output and local error 0 ({idle} made no call)")
        if self._kinds:
            lines.append("by kind (only that kind fast / every other kind fast):")
            for k in self._kinds:
                lines.append(f"  {_fmt(k.output_error):>10}  {_fmt(k.output_without):>9}  {_fmt(k.local_error):>9}  "
                             f"{k.kind:<22}  {k.sites} sites  {' + '.join(k.impls)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    __str__ = table

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": SCHEMA_VERSION, "model_class": self.model_name, "quality": self.quality,
            "method": self.method, "forwards": self.forwards, "seconds": round(self.seconds, 3),
            "divergence": _json_number(self.divergence), "divergence_max_abs": _json_number(self.divergence_max_abs),
            "noise": _json_number(self.noise), "rows": [r.to_dict() for r in self.rows],
            "kinds": [k.to_dict() for k in self._kinds], "notes": list(self.notes),
        }  # fmt: skip


# -- the measurement ---------------------------------------------------------------------------------------
def attribute(model: nn.Module, *args: Any, quality: str | None = None, method: str = "auto", seed: int = 0,
              progress: bool | None = None, **kwargs: Any) -> Attribution:
    """Which patched site of ``model`` (patched with `xbackend.patch`) makes ``model(*args, **kwargs)``
    drift from its all-reference forward, and by how much: see `Attribution` and the module docs.

    ``quality``: the tier the fast forwards run at (default: the one in effect); ``method``: "each"
    (every site alone, and left out), "bisect" (groups halved while they drift) or "auto" ("each" up
    to 8 switchable sites); ``seed``: ``torch.manual_seed`` before every forward, and every
    ``torch.Generator`` among the arguments restarts from its state at the call, so random draws
    (a DiffVAE's noise) are the same in each; ``progress``: a progress line on stderr (default: when
    stderr is a terminal and more than a few forwards run). Runs under ``torch.no_grad()``; the model,
    its patches and the process's random state are left as they were. Other keyword arguments go to
    the model. The observer serves every patched model of the process: run nothing else patched
    meanwhile."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"xbackend.attribute: argument 'model' expected a torch.nn.Module, got {type(model).__name__}")
    if quality is not None and quality not in QUALITY_TIERS:
        raise ValueError(f"xbackend.attribute: argument 'quality' expected one of "
                         f"{', '.join(map(repr, QUALITY_TIERS))}, got {quality!r}")
    if method not in METHODS:
        raise ValueError(f"xbackend.attribute: argument 'method' expected one of {', '.join(map(repr, METHODS))}, "
                         f"got {method!r}")
    tier = quality or current_policy()[0]
    report = _patch(model, only=())  # what is patched, changing nothing
    sites = [(s.path, s.kind) for s in report.sites if s.kind != "tiled_decode"]
    if not sites:
        raise ValueError(f"xbackend.attribute: argument 'model' ({type(model).__name__}) has no patched site "
                         f"whose op can switch; call xbackend.patch(model) first")
    start = time.perf_counter()
    session = Session(model, args, kwargs, tier, seed)
    try:
        with random_state(model), observing(session):
            kind_rows, alone, without, divergence, noise, chosen = _run(session, sites, method, progress)
    finally:
        session.progress.close()
        session.restore_generators()
    rows = _site_rows(session, sites, alone, without)
    notes = _notes(session, sites, report)
    return Attribution(model_name=type(model).__name__, rows=rows, kinds=kind_rows, divergence=divergence,
                       noise=noise, quality=tier, method=chosen, forwards=session.forwards,
                       seconds=time.perf_counter() - start, notes=notes, session=session)


def _run(session: Session, sites: list[SiteKey], method: str, progress: bool | None) -> tuple[Any, ...]:
    full = session.forward(sites, "recording", record=True)  # every site fast; kept to the next lines
    session.baseline = session.forward((), "all reference")
    divergence = distance(full, session.baseline)
    del full
    noise = session.distance((), "all reference again")
    switchable = [k for k in sites if set(session.tallies.get(k, Tally()).impls) - {REFERENCE_IMPL}]
    chosen = method if method != "auto" else ("each" if len(switchable) <= EACH_UP_TO else "bisect")
    kinds = list(dict.fromkeys(k for _, k in switchable))
    # Forwards still to run: known for "each"; bisection runs at least one a drifting site.
    expected = 2 * len(kinds) * (len(kinds) > 1) + (2 * len(switchable) if chosen == "each" else len(switchable))
    enabled = progress if progress is not None else sys.stderr.isatty() and expected >= _SHOW_PROGRESS_FROM
    session.progress = Progress(enabled, session.forwards, session.forwards + expected if chosen == "each" else None)
    kind_rows, alone, without = _measure(session, switchable, kinds, chosen, divergence[0], noise)
    return kind_rows, alone, without, divergence, noise, chosen


def _measure(session: Session, switchable: list[SiteKey], kinds: list[str], method: str, divergence: float,
             noise: float) -> tuple[tuple[KindRow, ...], dict[SiteKey, float], dict[SiteKey, float]]:
    by_kind = {k: [s for s in switchable if s[1] == k] for k in kinds}
    kind_alone: dict[str, float] = {}
    kind_without: dict[str, float] = {}
    for kind, members in by_kind.items():
        if len(kinds) == 1:  # only that kind fast is everything fast; everything but it, the baseline
            kind_alone[kind], kind_without[kind] = divergence, noise
            continue
        kind_alone[kind] = session.distance(members, f"{kind} alone")
        kind_without[kind] = session.distance([s for s in switchable if s[1] != kind], f"all but {kind}")
    alone: dict[SiteKey, float] = {}
    without: dict[SiteKey, float] = {}
    for kind, members in by_kind.items():
        if method == "each":
            for s in members:
                alone[s] = kind_alone[kind] if len(members) == 1 else session.distance([s], f"{s[0]} alone")
                rest = [o for o in switchable if o != s]
                without[s] = kind_without[kind] if len(members) == 1 else session.distance(rest, f"all but {s[0]}")
        else:
            _bisect(session, members, kind_alone[kind], noise, alone)
    tallies = session.tallies
    rows = [KindRow(kind, tuple(dict.fromkeys(op for s in m for op in tallies[s].ops)),
                    tuple(dict.fromkeys(i for s in m for i in tallies[s].impls)), len(m),
                    max(tallies[s].err.relative for s in m), kind_alone[kind], kind_without[kind])
            for kind, m in by_kind.items()]
    rows.sort(key=lambda r: -r.output_error)
    return tuple(rows), alone, without


def _bisect(session: Session, group: list[SiteKey], error: float, noise: float, found: dict[SiteKey, float]) -> None:
    """Each site's output error alone, for a group whose sites fast together give ``error``: a group
    within the noise floor holds none that drifts (each gets 0), a single site's is its own, and any
    other group is halved and each half measured."""
    if error <= noise:
        found.update(dict.fromkeys(group, 0.0))
        return
    if len(group) == 1:
        found[group[0]] = error
        return
    half = len(group) // 2
    for part in (group[:half], group[half:]):
        what = f"{len(part)} {part[0][1]} sites" if len(part) > 1 else f"{part[0][0]} alone"
        _bisect(session, part, session.distance(part, what), noise, found)


def _site_rows(session: Session, sites: list[SiteKey], alone: dict[SiteKey, float],
               without: dict[SiteKey, float]) -> tuple[SiteRow, ...]:
    rows = []
    for order, key in enumerate(sites):
        t = session.tallies.get(key)
        if t is None:
            rows.append((order, SiteRow(key[0], key[1], "-", "-", "-", 0, 0.0, 0.0, None, 0.0)))
            continue
        rows.append((order, SiteRow(
            key[0], key[1], "+".join(t.ops), "+".join(t.impls), "+".join(dict.fromkeys(t.impls.values())), t.calls,
            t.err.relative, t.err.max_abs, t.err.max_ulp, alone.get(key, 0.0), without.get(key),
        )))
    rows.sort(key=lambda r: (-r[1].output_error, -r[1].local_error, r[0]))
    return tuple(r for _, r in rows)


def _notes(session: Session, sites: list[SiteKey], report: Any) -> tuple[str, ...]:
    notes = [f"tiled_decode at {s.path or '<model>'}: a host-level op (no impl to switch); the sites its tiles "
             "run are attributed" for s in report.sites if s.kind == "tiled_decode"]
    idle = [k for k in sites if k not in session.tallies]
    if idle:
        notes.append(f"{len(idle)} sites made no call through their op in the recording forward (their module did "
                     "not run, or its inputs took the written expression)")
    if session.unlabelled:
        text = (f"{session.unlabelled} fused calls named no site (a patch that passes none): they ran on the "
                "runtime in every forward, so the baseline is not all-reference there")
        notes.append(text)
        warnings.warn(f"xbackend.attribute: {text}", stacklevel=3)
    return tuple(notes)
