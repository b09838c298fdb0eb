"""Goldens: one JSON file per target holding its plans, the plugin set they were made with and nothing
host- or version-specific, and the readable diff of a run against them.

A golden is written byte for byte the same on every machine and every run (sorted keys are not
needed: every list is in a fixed order, and dicts are built in a fixed order). ``--check`` compares
the plans only; the device record in a golden is there for a reader, its plugin set picks the plugins
a run plans that target with (``plugin_set``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .matrix import SCHEMA_VERSION, TargetResult
from .spec import SHORT, Matrix

__all__ = ["CheckResult", "Drift", "NotHere", "check", "dumps", "golden_doc", "golden_path", "recorded_plugins",
           "render_check", "write"]

PlanKey = tuple[str, str, str]  # op, dtype, quality


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=True) + "\n"


def golden_doc(result: TargetResult, matrix: Matrix) -> dict[str, Any]:
    d = result.device
    return {
        "schema_version": SCHEMA_VERSION,
        "target": result.target,
        "device": {"vendor": d.vendor, "arch": d.arch, "name": d.name},
        "plugins": list(result.plugins),
        "matrix": matrix.to_dict(),
        "plans": [p.to_dict() for p in result.plans],
    }


def golden_path(directory: str | Path, target: str) -> Path:
    return Path(directory) / f"{target}.json"


def write(directory: str | Path, results: Iterable[TargetResult], matrix: Matrix) -> list[Path]:
    Path(directory).mkdir(parents=True, exist_ok=True)
    written = []
    for result in results:
        path = golden_path(directory, result.target)
        path.write_text(dumps(golden_doc(result, matrix)))
        written.append(path)
    return written


def recorded_plugins(directory: str | Path, target: str) -> tuple[str, ...] | None:
    """The plugin set ``directory``'s golden of ``target`` records, or None (no such golden, an
    unreadable one, or one of another schema version)."""
    try:
        doc = json.loads(golden_path(directory, target).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    plugins = doc.get("plugins") if isinstance(doc, dict) and doc.get("schema_version") == SCHEMA_VERSION else None
    return tuple(plugins) if isinstance(plugins, list) and all(isinstance(p, str) for p in plugins) else None


def targets_in(directory: str | Path) -> list[str]:
    """The targets with a golden in ``directory``: the builtin fleet's in its order, then the rest by name."""
    from .._device import BUILTIN_FLEET

    names = [p.stem for p in Path(directory).glob("*.json")]
    order = {name: i for i, name in enumerate(BUILTIN_FLEET)}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


@dataclass(frozen=True)
class Drift:
    """One plan that differs from its golden: ``before``/``after`` are the chosen impls (None: the
    plan is missing on that side), ``why`` the candidate changes that explain it."""

    target: str
    op: str
    dtype: str
    quality: str
    before: str | None
    after: str | None
    why: tuple[str, ...] = ()

    @property
    def headline(self) -> str:
        where = f"{self.target} {self.op} {SHORT.get(self.dtype, self.dtype)} {self.quality}"
        if self.before is None:
            return f"{where}: not in the golden -> {self.after}"
        if self.after is None:
            return f"{where}: {self.before} -> no longer planned"
        if self.before == self.after:
            return f"{where}: {self.after} (unchanged), candidates differ"
        return f"{where}: {self.before} -> {self.after}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "op": self.op, "dtype": self.dtype, "quality": self.quality,
                "from": self.before, "to": self.after, "why": list(self.why)}


@dataclass(frozen=True)
class Missing:
    """A target with no golden file (or an unreadable one)."""

    target: str
    path: Path
    problem: str

    @property
    def headline(self) -> str:
        return f"{self.target}: {self.problem}"

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "path": str(self.path), "problem": self.problem}


def _candidate_changes(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, ...]:
    before = {c["impl"]: c for c in old["candidates"]}
    after = {c["impl"]: c for c in new["candidates"]}
    lines = []
    # The new winner first: it is usually the whole story.
    order = [new["chosen"], old["chosen"]] + [c["impl"] for c in new["candidates"]] + list(before)
    for impl in dict.fromkeys(order):
        b, a = before.get(impl), after.get(impl)
        if b == a:
            continue
        if b is None:
            lines.append(f"+ {impl} (new candidate, priority {a['priority']}): {a['verdict']}: {a['reason']}")
        elif a is None:
            lines.append(f"- {impl} (no longer registered; was {b['verdict']}: {b['reason']})")
        else:
            changes = [f"{k} {b[k]} -> {a[k]}" for k in ("priority", "precision") if b[k] != a[k]]
            verdict = a["verdict"] if a["verdict"] == b["verdict"] else f"{b['verdict']} -> {a['verdict']}"
            lines.append(f"~ {impl}: {'; '.join([*changes, verdict])}: {a['reason']}")
    return tuple(lines)


# Verdicts a candidate reaches only past the availability filter: on a real device such a candidate
# may read "unavailable" instead, where its package is not installed on this machine.
_PAST_AVAILABILITY = frozenset({"lower_priority", "tie", "unsupported", "disabled"})


def _as_deployed(now: dict[str, Any], then: dict[str, Any], notes: dict[str, str]) -> dict[str, Any]:
    """A real device's plan with each fallback that is only missing here put back as the golden has it.

    A golden plans every package as installed. On a real device an impl that is not installed reads
    "unavailable"; where that changes nothing that runs (the same impl is chosen, and the missing one
    was not it), it is a note about this machine, not drift. Everything else is compared as it is.
    """
    if now["chosen"] != then["chosen"]:
        return now
    golden = {c["impl"]: c for c in then["candidates"]}
    candidates = []
    for c in now["candidates"]:
        g = golden.get(c["impl"])
        if c["verdict"] == "unavailable" and g is not None and g["verdict"] in _PAST_AVAILABILITY:
            notes.setdefault(c["impl"], c["reason"].removeprefix("unavailable: "))
            candidates.append(g)
        else:
            candidates.append(c)
    return {**now, "candidates": candidates}


def compare(result: TargetResult, golden: dict[str, Any], matrix: Matrix, known_ops: Iterable[str],
            notes: dict[str, str] | None = None) -> list[Drift]:
    """The plans of ``result`` that differ from ``golden``. For a real device (not planned as
    deployed), fallbacks missing only on this machine go to ``notes`` (impl -> reason) instead."""
    known = set(known_ops)
    notes = {} if notes is None else notes

    def key(p: dict[str, Any]) -> PlanKey:
        return (p["op"], p["dtype"], p["quality"])

    now = {key(d): d for d in (p.to_dict() for p in result.plans)}
    # A golden plan outside this run's matrix is not compared, unless its op no longer exists at all.
    then = {key(p): p for p in golden.get("plans", [])
            if p["dtype"] in matrix.dtypes and p["quality"] in matrix.qualities
            and (p["op"] in matrix.ops or p["op"] not in known)}
    if not result.deployed:
        now = {k: _as_deployed(p, then[k], notes) if k in then else p for k, p in now.items()}
    drift = []
    for k in list(now) + [k for k in then if k not in now]:
        a, b = now.get(k), then.get(k)
        if a == b:
            continue
        why = _candidate_changes(b, a) if a is not None and b is not None else ()
        drift.append(Drift(result.target, *k, b["chosen"] if b else None, a["chosen"] if a else None, why))
    return drift


@dataclass(frozen=True)
class NotHere:
    """A fallback a real device's golden plans as installed, missing on this machine (not drift)."""

    target: str
    impl: str
    reason: str

    def to_dict(self) -> dict[str, str]:
        return {"target": self.target, "impl": self.impl, "reason": self.reason}


@dataclass(frozen=True)
class CheckResult:
    drift: tuple[Drift, ...]
    missing: tuple[Missing, ...]
    not_here: tuple[NotHere, ...]
    checked: int

    @property
    def failed(self) -> bool:
        return bool(self.drift or self.missing)

    def to_dict(self, directory: str | Path) -> dict[str, Any]:
        return {"dir": str(directory), "drift": [d.to_dict() for d in self.drift],
                "missing": [m.to_dict() for m in self.missing], "not_installed_here": [n.to_dict() for n in self.not_here]}


def check(directory: str | Path, results: Iterable[TargetResult], matrix: Matrix,
          known_ops: Iterable[str]) -> CheckResult:
    drift: list[Drift] = []
    missing: list[Missing] = []
    not_here: list[NotHere] = []
    checked = 0
    known = list(known_ops)
    for result in results:
        path = golden_path(directory, result.target)
        try:
            golden = json.loads(path.read_text())
        except FileNotFoundError:
            missing.append(Missing(result.target, path, f"no golden {path} (write it with `xbackend fleet "
                                                        f"--targets {result.target} --update {directory}`)"))
            continue
        except (OSError, json.JSONDecodeError) as e:
            missing.append(Missing(result.target, path, f"unreadable golden {path}: {e}"))
            continue
        if golden.get("schema_version") != SCHEMA_VERSION:
            missing.append(Missing(result.target, path, f"golden {path} has schema_version "
                                   f"{golden.get('schema_version')!r}, this xbackend writes {SCHEMA_VERSION} "
                                   f"(rewrite it with --update {directory})"))
            continue
        notes: dict[str, str] = {}
        drift.extend(compare(result, golden, matrix, known, notes))
        not_here += [NotHere(result.target, impl, reason) for impl, reason in sorted(notes.items())]
        checked += 1
    return CheckResult(tuple(drift), tuple(missing), tuple(not_here), checked)


def render_check(directory: str | Path, result: CheckResult) -> str:
    drift, missing = result.drift, result.missing
    lines = []
    if result.not_here:
        lines.append("not installed on this machine (the goldens plan them as deployed; what runs is unchanged):")
        lines += [f"  {n.target}: {n.impl}: {n.reason}" for n in result.not_here]
    if not drift and not missing:
        lines.append(f"fleet check: {result.checked} target(s) match the goldens in {directory}")
        return "\n".join(lines)
    if missing:
        lines.append(f"fleet check: {len(missing)} target(s) without a usable golden in {directory}:")
        lines += [f"  {m.headline}" for m in missing]
    if drift:
        lines.append(f"fleet check: {len(drift)} plan(s) drifted from the goldens in {directory} "
                     f"(if intended: xbackend fleet --update {directory}):")
        for d in drift:
            lines.append(f"  {d.headline}")
            lines += [f"      {w}" for w in d.why]
    return "\n".join(lines)
