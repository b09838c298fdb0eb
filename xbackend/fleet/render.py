"""The fleet's terminal table (at most 100 columns wide) and its Markdown form for a PR comment.

Targets whose plans are identical share one column ("h100 h200"); when the columns do not fit in
100 characters the table is cut into panels of whole columns, each with the row labels again.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Sequence
from typing import Any

from .matrix import TargetResult
from .spec import SHORT, Matrix

__all__ = ["WIDTH", "compile_failures", "markdown", "table"]

WIDTH = 100
_GAP = 2


def _cell(plan: Any) -> str:
    chosen = plan.chosen
    return chosen.qualname + ("*" if chosen.assumed is not None else "")


def _columns(results: Sequence[TargetResult]) -> list[tuple[str, list[str]]]:
    """(header, cells) per group of targets with identical cells, in first-seen order."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for r in results:
        cells = tuple(_cell(p) for p in r.plans)
        label = r.target if r.where in ("", r.target) else f"{r.target} ({r.where})"
        groups.setdefault(cells, []).append(label)
    return [(" ".join(names), list(cells)) for cells, names in groups.items()]


def _rows(matrix: Matrix) -> list[tuple[str, str]]:
    """(op, "dtype quality") per plan, in the order plans are made."""
    return [(op, f"{SHORT.get(dt, dt)} {q}") for op in matrix.ops for dt in matrix.dtypes for q in matrix.qualities]


def _fit(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 1)] + "~"


def _panels(label_width: int, columns: list[tuple[str, list[str]]]) -> list[list[tuple[str, list[str], int]]]:
    room = WIDTH - label_width
    panels: list[list[tuple[str, list[str], int]]] = [[]]
    used = 0
    for header, cells in columns:
        width = min(max(len(header), *(len(c) for c in cells)), room - _GAP)
        if panels[-1] and used + _GAP + width > room:
            panels.append([])
            used = 0
        panels[-1].append((header, cells, width))
        used += _GAP + width
    return panels


def _wrap(text: str, indent: str = "  ", more: str = "      ") -> list[str]:
    return textwrap.wrap(text, WIDTH, initial_indent=indent, subsequent_indent=more, break_on_hyphens=False) or [indent]


def _by_columns(results: Sequence[TargetResult], lines_of: Any) -> list[tuple[str, list[str]]]:
    """Notes per target, targets with the same notes merged."""
    merged: dict[tuple[str, ...], list[str]] = {}
    for r in results:
        notes = tuple(lines_of(r))
        if notes:
            merged.setdefault(notes, []).append(r.target)
    return [(" ".join(names), list(notes)) for notes, names in merged.items()]


def _assumed_lines(r: TargetResult) -> list[str]:
    return [f"{a.impl}: {a.reason}" for a in r.assumed]


def _unverified_lines(r: TargetResult) -> list[str]:
    return [f"lane {u.lane.name}: {u.message}: {', '.join(u.impls)}" for u in r.unverified]


def table(results: Sequence[TargetResult], matrix: Matrix) -> str:
    """The chosen impl of every plan, one column per group of identical targets."""
    if not results:
        return "xbackend fleet: no targets"
    rows = _rows(matrix)
    columns = _columns(results)
    kinds = "as deployed" if any(r.deployed for r in results) else "real availability"
    out = [f"xbackend fleet: {len(results)} target(s) x {len(matrix.ops)} ops x {len(matrix.dtypes)} dtypes x "
           f"{len(matrix.qualities)} qualities = {len(results) * matrix.size} plans ({kinds})"]
    label_width = max(len("  " + r[1]) for r in rows)
    label_width = max(label_width, 12)
    for panel in _panels(label_width, columns):
        out.append("")
        out.append(" " * label_width + "".join(" " * _GAP + _fit(h, w).ljust(w) for h, _, w in panel).rstrip())
        previous = None
        for i, (op, label) in enumerate(rows):
            if op != previous:
                out.append(op)
                previous = op
            cells = "".join(" " * _GAP + _fit(cells[i], w).ljust(w) for _, cells, w in panel)
            out.append(("  " + label).ljust(label_width) + cells.rstrip())
    if assumed := _by_columns(results, _assumed_lines):
        out.append("")
        out.append("* assumed available on the target (planned as deployed); this host's check failed:")
        for names, notes in assumed:
            out += _wrap(f"{names}: {'; '.join(notes)}")
    if flags := _by_columns(results, _unverified_lines):
        out.append("")
        out.append("version skew (Impl.verified_on):")
        for names, notes in flags:
            for note in notes:
                out += _wrap(f"{names} {note}")
    for r in results:
        if r.kernels is not None or r.compile_error is not None:
            out.append("")
            out += compile_summary(r)
    return "\n".join(out)


def _spills(kernel: dict[str, Any]) -> int:
    return int(kernel.get("spills", kernel.get("spill_bytes")) or 0)


def _problem(kernel: dict[str, Any]) -> str:
    if "problem" in kernel:
        return str(kernel["problem"] or "")
    # A record without the field: a failed compile or any spill is a problem (no waiver was applied).
    if str(kernel.get("status", "")).startswith("failed"):
        return str(kernel["status"])
    return f"{_spills(kernel)} bytes spilled" if _spills(kernel) else ""


def compile_failures(result: TargetResult) -> list[dict[str, Any]]:
    return [k for k in result.kernels or () if _problem(k)]


def _base(kernel: str) -> str:
    """A kernel's name without its template or specialisation suffix: one summary line per kernel."""
    return kernel.split("<")[0].split("[")[0].strip() or "?"


def compile_summary(r: TargetResult) -> list[str]:
    """Per kernel of each chosen impl: rows (plan x input x specialisation) ok / failed / skipped and
    the worst registers, spills and shared memory; then every failing row with its problem."""
    head = f"compile {r.target} ({r.device.arch})"
    if r.kernels is None:
        return _wrap(f"{head}: not run: {r.compile_error}", "", "  ")
    statuses = [str(k.get("status", "?")) for k in r.kernels]
    bad = compile_failures(r)
    timed_out = sum(s.startswith("timeout") for s in statuses)
    lines = _wrap(f"{head}: {len(r.kernels)} rows: {statuses.count('ok')} ok, "
                  f"{sum(s.startswith('failed') for s in statuses)} failed, "
                  + (f"{timed_out} timed out, " if timed_out else "")
                  + f"{sum(s.startswith('skipped') for s in statuses)} skipped; {len(bad)} failing "
                  f"(failed, timed out, or spills without a waiver), {sum(bool(k.get('waiver')) for k in r.kernels)} "
                  f"waived", "", "  ")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for k in r.kernels:
        impl = str(k.get("impl") or k.get("chosen") or "?")
        kernel = _base(str(k.get("kernel", "?")))
        if kernel in ("-", "?") and str(k.get("status", "")).startswith("skipped"):
            kernel = str(k["status"])  # no kernel of its own to compile: say why
        groups.setdefault((impl, kernel), []).append(k)
    if groups:
        lines.append(f"  {'impl':<24} {'kernel':<30} {'rows':>4} {'ok':>4} {'fail':>4} {'regs':>4} "
                     f"{'spill':>5} {'smem':>7}")
    for (impl, kernel), rows in groups.items():
        ok = sum(str(k.get("status")) == "ok" for k in rows)
        failed = sum(str(k.get("status", "")).startswith(("failed", "timeout")) for k in rows)
        lines.append(f"  {_fit(impl, 24):<24} {_fit(kernel, 30):<30} {len(rows):>4} {ok:>4} {failed:>4} "
                     f"{_most(rows, 'registers'):>4} {_most(rows, 'spill_bytes', 'spills'):>5} "
                     f"{_most(rows, 'shared_bytes'):>7}")
    for k in bad:
        where = " ".join(str(k.get(f, "")) for f in ("op", "dtype", "shape") if k.get(f))
        lines += _wrap(f"! {k.get('kernel', '?')} ({where}): {_problem(k)}", "    ", "      ")
    return lines


def _most(rows: list[dict[str, Any]], *fields: str) -> str:
    """The worst value of the first field a compiled row has ("-" when no row compiled)."""
    values = [int(v) for k in rows if k.get("status") == "ok"
              for v in [next((k[f] for f in fields if isinstance(k.get(f), int)), None)] if v is not None]
    return str(max(values)) if values else "-"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(results: Sequence[TargetResult], matrix: Matrix, drift_text: str | None = None,
             problems: Iterable[str] = ()) -> str:
    """A PR comment: the chosen-impl table, then the notes in collapsed sections."""
    columns = _columns(results)
    out = [f"### xbackend fleet: {len(results)} target(s), {len(results) * matrix.size} plans", ""]
    if drift_text is not None:
        out += ["```", drift_text, "```", ""]
    out.append("| op | dtype | quality | " + " | ".join(_md(h) for h, _ in columns) + " |")
    out.append("|---" * (3 + len(columns)) + "|")
    for i, (op, label) in enumerate(_rows(matrix)):
        dtype, quality = label.split(" ")
        out.append(f"| {op} | {dtype} | {quality} | " + " | ".join(f"`{_md(c[i])}`" for _, c in columns) + " |")
    sections = [
        ("* assumed available on the target (this host's check failed)",
         [f"- **{n}**: {_md('; '.join(notes))}" for n, notes in _by_columns(results, _assumed_lines)]),
        ("Version skew",
         [f"- **{n}** {_md(note)}" for n, notes in _by_columns(results, _unverified_lines) for note in notes]),
        ("Compile", [line for r in results if r.kernels is not None or r.compile_error is not None
                     for line in ["```", *compile_summary(r), "```"]]),
        ("Problems (--strict fails on these)", [f"- {_md(p)}" for p in problems]),
    ]
    for title, lines in sections:
        if lines:
            out += ["", f"<details><summary>{title}</summary>", "", *lines, "", "</details>"]
    return "\n".join(out)
