"""``xbackend fleet``: plan a mixed NVIDIA/AMD fleet in one process, check it against goldens,
compile its kernels per target, and fail CI on drift or on a quietly broken plugin.

Exit codes: 0 fine; 1 drift from the goldens, a missing golden, or a failing compile; 2 a usage
error; 3 a ``--strict`` problem (checked last, so its output comes with the rest).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

from .._api import kernel_ops
from .._device import BUILTIN_FLEET
from .._runtime import runtime
from . import golden
from .matrix import SCHEMA_VERSION, Envelope, TargetResult, envelope, plan_device, plan_local, plan_target
from .plugin_set import PluginSets
from .render import compile_failures, markdown, table
from .spec import FleetSpec, Matrix, load_fleet, parse_dtypes, parse_ops, parse_qualities, parse_targets
from .strict import STRICT_EXIT, fn_problems, load_problems, strict_requested

__all__ = ["add_parser", "cmd_fleet", "run_compile"]

COMPILE_MISSING = "compile.py missing: xbackend/fleet/compile.py is not installed, so no kernel was compiled"


def add_parser(sub: Any) -> argparse.ArgumentParser:
    f = sub.add_parser(
        "fleet", help="plan every op for a fleet of GPU types in one process; check goldens; compile",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = f.add_mutually_exclusive_group()
    where.add_argument("--targets", action="append", metavar="LIST",
                       help=f"comma-separated GPU types or arches (default: {','.join(BUILTIN_FLEET)}; with "
                            "--check/--update: the goldens in DIR)")
    where.add_argument("--fleet", metavar="FILE", help="a fleet TOML ([[gpu]] type, count, lanes)")
    where.add_argument("--local", action="store_true",
                       help="plan this host's real device(s) with real availability, each as the target it "
                            "probes as (with --check: against that target's golden)")
    f.add_argument("--op", metavar="LIST", help="comma-separated ops (default: every kernel op)")
    f.add_argument("--dtype", metavar="LIST", help="comma-separated dtypes (default: bf16,fp16,fp32)")
    f.add_argument("--quality", metavar="LIST", help="comma-separated quality tiers (default: lossless,high)")
    out = f.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help=f"the JSON document (schema_version {SCHEMA_VERSION}) on stdout")
    out.add_argument("--markdown", action="store_true", help="a Markdown summary for a PR comment")
    gold = f.add_mutually_exclusive_group()
    gold.add_argument("--check", metavar="DIR", help="compare the plans with DIR/<target>.json; exit 1 on drift")
    gold.add_argument("--update", metavar="DIR", help="rewrite DIR/<target>.json from this run")
    f.add_argument("--all-plugins", action="store_true",
                   help="with --check/--update: plan with every installed plugin, not only the plugin set each "
                        "golden records (--update then records them all)")
    f.add_argument("--compile", action="store_true",
                   help="compile each target's planned kernels (xbackend.fleet.compile); exit 1 on a failure "
                        "or an unwaived spill")
    f.add_argument("--strict", action="store_true",
                   help="exit 3 on a plugin that failed to load, an unknown XBACKEND_PLUGINS/XBACKEND_BLOCK "
                        "name, an impl whose fn does not import, or a repeated target (also XBACKEND_STRICT=1)")
    f.set_defaults(func=cmd_fleet)
    return f


def _spec(args: argparse.Namespace) -> FleetSpec:
    if args.fleet:
        return load_fleet(args.fleet)
    if args.targets:
        return parse_targets(args.targets)
    directory = args.check or args.update
    if directory and (found := golden.targets_in(directory)):
        return parse_targets(",".join(found))
    return parse_targets(None)


def _matrix(args: argparse.Namespace) -> Matrix:
    return Matrix(parse_ops(args.op, kernel_ops()), parse_dtypes(args.dtype), parse_qualities(args.quality))


def _plan_all(rt: Any, args: argparse.Namespace, matrix: Matrix,
              sets: PluginSets) -> tuple[list[TargetResult], FleetSpec]:
    if args.local:
        goldens = tuple(golden.targets_in(args.check)) if args.check and Path(args.check).is_dir() else ()
        # A device whose name matches no golden but whose arch has one is checked against that.
        return plan_local(rt, matrix, preferred=goldens, runtime_for=sets.runtime_for), FleetSpec(())
    spec = _spec(args)
    for target in spec.targets:
        rt.device(target.name)  # every name checked before any plan runs: a typo is one clear error
    return [plan_target(sets.runtime_for(t.name), t, matrix) for t in spec.targets], spec


def run_compile(results: list[TargetResult]) -> list[TargetResult]:
    """Each target's kernels through ``xbackend.fleet.compile.compile_target``, imported only here so
    planning works where that module (or its compiler) is absent."""
    try:
        from . import compile as fleet_compile  # type: ignore[attr-defined]
    except ModuleNotFoundError as e:
        error = COMPILE_MISSING if e.name == f"{__package__}.compile" else f"compile.py failed to import: {e}"
        return [dataclasses.replace(r, compile_error=error) for r in results]
    except Exception as e:
        return [dataclasses.replace(r, compile_error=f"compile.py failed to import: {type(e).__name__}: {e}")
                for r in results]
    out = []
    for r in results:
        plans = [{**p.to_dict(), "inputs": p.inputs} for p in r.plans]
        try:
            kernels = tuple(fleet_compile.compile_target(r.target, r.device, plans))
        except Exception as e:  # one target's toolchain must not lose the others' results
            out.append(dataclasses.replace(r, compile_error=f"compile_target raised {type(e).__name__}: {e}"))
            continue
        out.append(dataclasses.replace(r, kernels=kernels))
    return out


def _say(text: str, to_stderr: bool) -> None:
    print(text, file=sys.stderr if to_stderr else sys.stdout)


def cmd_fleet(args: argparse.Namespace) -> int:
    rt = runtime()
    strict = strict_requested(args.strict)
    matrix = _matrix(args)
    # Each target is planned with the plugin set its golden records (all loaded plugins without one).
    sets = PluginSets(rt, args.check or args.update, every_plugin=args.all_plugins)
    results, spec = _plan_all(rt, args, matrix, sets)
    if args.update and (refused := sets.missing_for_update()):
        for line in refused:
            _say(f"xbackend fleet: {line}", True)
        return 1
    if args.compile:
        results = run_compile(results)

    problems = load_problems(rt)
    problems += [f"target {name!r} is listed more than once; list each GPU type once" for name in spec.duplicates]
    if strict:
        problems += fn_problems(rt, matrix.ops)

    extra: dict[str, Any] = {}
    drift_text = None
    failed = False
    machine = args.json or args.markdown  # stdout carries the document; notes go to stderr
    if args.check:
        checked = golden.check(args.check, results, matrix, kernel_ops())
        drift_text = golden.render_check(args.check, checked)
        extra["check"] = {**checked.to_dict(args.check), "plugins": sets.to_dict()}
        failed |= checked.failed
    if args.update:
        for path in golden.write(args.update, results, matrix):
            _say(f"wrote {path}", machine)
    compile_broken = [r for r in results if r.compile_error is not None or compile_failures(r)]
    failed |= bool(compile_broken)

    if args.json:
        print(golden.dumps(envelope(rt, Envelope("fleet", matrix, tuple(results), tuple(problems), extra))), end="")
        if drift_text is not None:
            _say(drift_text, True)
    elif args.markdown:
        print(markdown(results, matrix, drift_text, problems))
    else:
        print(table(results, matrix))
        if drift_text is not None:
            print()
            print(drift_text)
    for note in sets.notes():
        _say(f"xbackend fleet: {note}", True)
    for problem in problems:
        _say(f"xbackend fleet: {'error' if strict else 'warning'}: {problem}", True)
    for r in compile_broken:
        why = r.compile_error or f"{len(compile_failures(r))} kernel(s) failing"
        _say(f"xbackend fleet: compile {r.target}: {why}", True)
    if strict and problems:
        return STRICT_EXIT
    return 1 if failed else 0


def plan_json(rt: Any, target: str, device: Any, matrix: Matrix, *, deployed: bool, where: str = "",
              problems: list[str] | None = None) -> str:
    """``xbackend plan --json``: the fleet document for one device."""
    from .skew import host_lane

    lanes = () if device.simulated else (host_lane(),)
    result = plan_device(rt, target, device, matrix, deployed=deployed, lanes=lanes, where=where)
    return golden.dumps(envelope(rt, Envelope("plan", matrix, (result,), tuple(problems or ()))))
