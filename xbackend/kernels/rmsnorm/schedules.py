"""Launch schedules of the RMSNorm kernels (performance only, never the arithmetic), the vendor
schedule tables keyed by op kind, D range and element size, and a vendor's launch traits: data only,
no Triton import (``launch`` reads them)."""

from __future__ import annotations

from typing import NamedTuple

from xbackend.kernels.rmsnorm.numerics import Numerics


class Schedule(NamedTuple):
    """How a launch is laid out: performance only, never the arithmetic. None: the default."""

    rows_per_program: int | None = None  # a power of two
    num_warps: int | None = None
    arrangement: int | None = None  # exact kernel only: numerics.ARR_ARKB or ARR_MERGED
    # Exact "torch" flavour, rows of at most torch_threads 4-vectors (one loop step): materialise only
    # the next_pow2(D / 4) emulated threads that hold elements. The dropped threads' partial sums are
    # exact zeros that aten's halving trees add to lanes below them, so the statistic is bit-identical
    # (primitives.row_stat); the tile shrinks from 4 * torch_threads to next_pow2(D) elements per row.
    # Exact "diffusers" flavour, D < 128 with one element per accumulator: only the accumulators that
    # hold elements (the others are zeros aten adds last); D = 64 goes from 128 to 64 elements per row.
    trim: bool | None = None
    # Exact modulate whose scale and shift are one [D] row for every row ([1, .., 1, D], [D]): load them
    # once per program, like the weight, instead of once per row (same values; fewer loads and registers).
    flat_mod: bool | None = None


# Op kinds a vendor's schedule table is keyed by (with D and the element size).
OPS = ("rmsnorm-torch", "rmsnorm-diffusers", "modulate-torch", "modulate-diffusers", "qk_norm_rope_3d-torch",
       "qk_norm_rope_3d-diffusers")  # fmt: skip


def op_kind(flavour: str, modulate: bool) -> str:
    return f"{'modulate' if modulate else 'rmsnorm'}-{flavour}"


class ScheduleEntry(NamedTuple):
    """One row of a vendor's schedule table: ``schedule`` for ``op`` at D in [d_min, d_max], ``itemsize``-byte elements."""

    op: str
    d_min: int
    d_max: int
    itemsize: int
    schedule: Schedule


def schedule_table(entries: dict) -> tuple[ScheduleEntry, ...]:
    """``{(op, D or (d_min, d_max), itemsize): Schedule}`` as a ``LaunchTraits.schedules`` tuple (hashable),
    validated and ordered so that the first match is the narrowest D range (ties: the first listed)."""
    rows = []
    for (op, d, itemsize), schedule in entries.items():
        d_min, d_max = (d, d) if isinstance(d, int) else d
        r = schedule.rows_per_program if isinstance(schedule, Schedule) else 0
        pow2 = r is None or (r >= 1 and r & (r - 1) == 0)
        if op not in OPS or not 1 <= d_min <= d_max or itemsize not in (1, 2, 4, 8) or not pow2:
            raise ValueError(f"bad schedule table entry {(op, d, itemsize)!r}: {schedule!r} (rows: a power of two)")
        rows.append(ScheduleEntry(op, d_min, d_max, itemsize, schedule))
    return tuple(sorted(rows, key=lambda e: e.d_max - e.d_min))  # stable: ties keep the listed order


def tuned_schedule(table: tuple[ScheduleEntry, ...], op: str, d: int, itemsize: int) -> Schedule | None:
    """The table's schedule for ``op`` on D-element rows of ``itemsize``-byte elements, or None."""
    for e in table:
        if e.op == op and e.itemsize == itemsize and e.d_min <= d <= e.d_max:
            return e.schedule
    return None


def table_schedule(table: tuple[ScheduleEntry, ...], op: str, d: int, itemsize: int, schedule: Schedule) -> Schedule:
    """The schedule a launch of ``op`` on D-element rows runs: the table's entry where ``schedule`` sets
    neither rows_per_program nor num_warps (its other fields, where set, still win), else ``schedule``."""
    if schedule.rows_per_program is not None or schedule.num_warps is not None or not table:
        return schedule
    tuned = tuned_schedule(table, op, d, itemsize)
    if tuned is None:
        return schedule
    return tuned._replace(**{f: v for f, v in schedule._asdict().items() if v is not None})


class LaunchTraits(NamedTuple):
    """A vendor's launch decisions for the exact kernels, passed as data by its backend."""

    # Programmatic dependent launch from this compute-capability major on (Hopper's griddepcontrol:
    # 9 on CUDA); None: never. Each program waits for the previous grid before its first load, then
    # lets the next PDL launch start, so back-to-back launches overlap launch and tail.
    pdl_min_major: int | None = None
    # Schedules measured faster than the default (``schedule_table``), by op kind, D range and element
    # size. They apply where the caller's schedule sets neither rows_per_program nor num_warps (its
    # other fields, where set, still win); elsewhere the default.
    schedules: tuple[ScheduleEntry, ...] = ()


DEFAULT_TRAITS = LaunchTraits()  # no PDL, no tuned schedules: what an entry point without a vendor gets


class Variant(NamedTuple):
    """One way to launch: which kernel, which PyTorch build's order, which vendor's traits, which schedule."""

    exact: bool
    numerics: Numerics  # the fast kernel reads only its rsqrt
    traits: LaunchTraits = DEFAULT_TRAITS
    schedule: Schedule = Schedule()
