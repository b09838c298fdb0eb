"""``python -m xbackend.fleet.compile``: plan targets, compile their kernels, print the rows."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from xbackend._device import Device

from ._pool import DEFAULT_TIMEOUT_S, TIMEOUT_ENV, task_bound
from .compile import compile_target


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of ``compile_target`` rows."""
    head = (
        f"{'target':<8} {'op':<22} {'dtype':<9} {'impl':<20} {'kernel':<26} {'regs':>5} {'sgpr':>4} "
        f"{'spill':>5} {'smem':>7} {'warps':>5} {'occ':>13}  {'s':>5}  status / input"
    )
    lines = [head]
    for r in rows:
        occ = f"{r['occupancy']} ({r['occupancy_limiter'][:5]})" if r["occupancy"] is not None else "-"
        kernel = r["kernel"] if len(r["kernel"]) <= 26 else r["kernel"][:25] + "~"
        status = (
            r["status"]
            + (f" [waived: {r['waiver']}]" if r["waiver"] else "")
            + (f" PROBLEM: {r['problem']}" if r["problem"] and r["problem"] not in r["status"] else "")
        )
        lines.append(
            f"{r['target']:<8} {r['op']:<22} {r['dtype']:<9} {r['chosen']:<20} {kernel:<26} {r['registers']:>5} "
            f"{r['sgprs'] or '':>4} {r['spill_bytes']:>5} {r['shared_bytes']:>7} {r['num_warps'] or '':>5} {occ:>13}  "
            f"{r['compile_s']:>5.1f}  {status} / {r['shape']}"
        )
    return "\n".join(lines)


def _plans(target: str, dtypes: Sequence[str], qualities: Sequence[str],
           ops: Sequence[str] | None = None) -> tuple[Device, list[dict[str, Any]]]:
    import torch

    import xbackend
    from xbackend._api import kernel_ops

    device = xbackend.runtime().device(target)
    plans = []
    for dtype in dtypes:
        for quality in qualities:
            for op in ops or kernel_ops():
                row = xbackend.plan(
                    op, device=device, dtype=getattr(torch, dtype), quality=quality, assume_available=True
                ).chosen
                plans.append({"op": op, "dtype": dtype, "quality": quality, "chosen": row.qualname})
    return device, plans


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m xbackend.fleet.compile", description=__doc__)
    ap.add_argument("--targets", default="mi355x,b200", help="comma-separated planning targets")
    ap.add_argument("--dtypes", default="bfloat16")
    ap.add_argument("--qualities", default="lossless,high")
    ap.add_argument("--ops", help="comma-separated ops (default: every kernel op)")
    ap.add_argument("--timeout", type=float, metavar="SECONDS",
                    help=f"the bound on each compile (default: ${TIMEOUT_ENV}, else {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.timeout is not None:
        try:
            task_bound(args.timeout, "--timeout")
        except ValueError as e:
            ap.error(str(e))
    ops = args.ops.split(",") if args.ops else None
    all_rows: list[dict[str, Any]] = []
    start = time.perf_counter()
    for target in args.targets.split(","):
        t0 = time.perf_counter()
        device, plans = _plans(target, args.dtypes.split(","), args.qualities.split(","), ops)
        rows = compile_target(target, device, plans, timeout=args.timeout)
        all_rows += rows
        print(format_rows(rows))
        print(
            f"{target}: {len(rows)} rows, {sum(1 for r in rows if r['problem'])} with a problem, "
            f"{time.perf_counter() - t0:.1f} s wall\n"
        )
    print(f"total {time.perf_counter() - start:.1f} s wall")
    if args.json:
        Path(args.json).write_text(json.dumps(all_rows, indent=1))
    return 1 if any(r["problem"] for r in all_rows) else 0

