"""``xbackend info | plan | fleet | build | bench`` — what this machine (or a simulated one, or a whole
fleet) will run, and how fast."""

from __future__ import annotations

import argparse
import platform
import sys

import torch

from ._api import kernel_ops, plan
from ._device import SIMULATED_TARGETS, TARGET_ALIASES, probed_target
from ._runtime import runtime

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
           "fp32": torch.float32, "float32": torch.float32}


def _devices() -> list[torch.device]:
    if torch.cuda.is_available():
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return [torch.device("cpu")]


def cmd_info(args: argparse.Namespace) -> int:
    rt = runtime()
    backend = f"ROCm {torch.version.hip}" if torch.version.hip else (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build")
    print(f"xbackend {__import__('xbackend').__version__} | torch {torch.__version__} ({backend}) | Python {platform.python_version()}")
    print("\nDevices:")
    for d in _devices():
        print(f"  {d}: {rt.device(d)}")
    if not torch.cuda.is_available():
        print("  (no GPU visible: only CPU impls run here; `xbackend plan --device sm90|sm100|gfx950` plans for one)")
    print("\nPlugins:")
    for status in rt.plugins.values():
        state = f"FAILED: {status.error}" if status.error else f"{len(status.impls)} impls"
        print(f"  {status.name:<10} {state}  [{status.source}]")
    for lines in rt.pm.hook.xbackend_report_header(runtime=rt):
        for line in lines or ():
            print(f"  {line}")
    from . import _fastkey

    print(f"\nDispatch: {_fastkey.decide()}")
    print("\nVerified on hardware (torch / Triton the precision contract was checked on):")
    for line in _verified_lines(rt):
        print(f"  {line}")
    from .fleet.skew import host_lane, unverified

    lane = host_lane()
    for d in _devices():
        print(f"\nPlan on {d} (representative bf16 inputs):")
        plans = [plan(op, d, dtype=_DTYPES[args.dtype]) for op in kernel_ops()]
        for p in plans:
            print(_indent(str(p)))
        impls = {i.qualname: i for op in kernel_ops() for i in rt.candidates(op)}
        for flag in unverified(plans, (lane,), impls):
            print(f"  {flag.message}: {', '.join(flag.impls)}")
    print("\nvae_tile_decode: host-level op (tiles over torch.distributed ranks when a process group is up)")
    return 0


def _verified_lines(rt) -> list[str]:
    """One line per backend whose impls share their verified_on, else one per impl."""
    by_backend: dict[str, dict[str, tuple]] = {}
    for op in kernel_ops():
        for impl in rt.candidates(op):
            if impl.backend != "xbackend":
                by_backend.setdefault(impl.backend, {})[f"{op}:{impl.name}"] = impl.verified_on

    def said(pairs: tuple) -> str:
        return ", ".join(f"torch {t} / Triton {tr}" for t, tr in pairs) or "never run on hardware"

    lines = []
    for backend in sorted(by_backend):
        impls = by_backend[backend]
        if len(set(impls.values())) == 1:
            lines.append(f"{backend:<10} all {len(impls)} impls: {said(next(iter(impls.values())))}")
        else:
            lines += [f"{backend:<10} {name}: {said(pairs)}" for name, pairs in impls.items()]
    return lines


def cmd_plan(args: argparse.Namespace) -> int:
    """A simulated target is planned as deployed (its packages assumed installed there, each
    assumption shown); a real device with its real availability unless --assume-available."""
    from ._policy import current_policy
    from .fleet.cli import plan_json
    from .fleet.spec import Matrix
    from .fleet.strict import STRICT_EXIT, fn_problems, load_problems, strict_requested

    rt = runtime()
    ops = tuple(args.op or kernel_ops())
    dev = rt.device(args.device)
    deployed = dev.simulated or args.assume_available
    strict = strict_requested(args.strict)
    problems = load_problems(rt) + (fn_problems(rt, ops) if strict else [])
    if args.json:
        dtype = str(_DTYPES[args.dtype]).removeprefix("torch.")
        matrix = Matrix(ops, (dtype,), (args.quality or current_policy()[0],))
        target = args.device.strip().lower() if dev.simulated else probed_target(dev)
        where = "" if dev.simulated else str(torch.device(args.device))
        print(plan_json(rt, target, dev, matrix, deployed=deployed, where=where, problems=problems), end="")
    else:
        plans = [plan(op, dev, dtype=_DTYPES[args.dtype], quality=args.quality, assume_available=deployed)
                 for op in ops]
        print("\n".join(str(p) for p in plans))
    for problem in problems:
        print(f"xbackend plan: {'error' if strict else 'warning'}: {problem}", file=sys.stderr)
    return STRICT_EXIT if strict and problems else 0


def cmd_build(args: argparse.Namespace) -> int:
    from . import _fastkey

    try:
        _, seconds = _fastkey.build()
    except Exception as e:
        print(f"xbackend build: the C++ dispatch key extension failed to build: {e}", file=sys.stderr)
        return 1
    print(f"C++ dispatch keys: {_fastkey.library_path()} ({seconds:.1f} s); later processes load it "
          f"(unless {_fastkey.ENV}=0)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xbackend", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="device probe, plugins, and what each op runs here")
    info.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    info.set_defaults(func=cmd_info)
    targets = sorted(SIMULATED_TARGETS) + sorted(TARGET_ALIASES)
    p = sub.add_parser("plan", help="what each op would run on a device (real or simulated)")
    p.add_argument("--device", default="cpu", help=f"a torch device (cuda:1) or a target: {' '.join(targets)}")
    p.add_argument("--op", action="append", choices=kernel_ops(), help="repeat for several; default all")
    p.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    p.add_argument("--quality", choices=["lossless", "high", "fast"], default=None)
    p.add_argument("--assume-available", action="store_true",
                   help="plan as if every impl's packages were installed (a simulated target always is)")
    p.add_argument("--json", action="store_true", help="the fleet JSON document for this one device")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 on a broken plugin, an unknown XBACKEND_PLUGINS/XBACKEND_BLOCK name or an impl "
                        "whose fn does not import (also XBACKEND_STRICT=1)")
    p.set_defaults(func=cmd_plan)
    from .fleet.cli import add_parser as add_fleet

    add_fleet(sub)
    build = sub.add_parser("build", help="build the C++ dispatch key extension now (a GPU host builds it on first use)")
    build.set_defaults(func=cmd_build)
    b = sub.add_parser("bench", help="benchmark ops against eager, torch.compile and copy_ (GPU)")
    b.add_argument("ops", nargs="*", help="ops to bench; default all pointwise ops")
    b.add_argument("--quick", action="store_true", help="only the shapes the bars are stated on, fewer repeats")
    b.add_argument("--png", help="also write a bar chart to this PNG path (needs matplotlib)")
    b.add_argument("--json", help="also write the rows to this JSON path")
    b.set_defaults(func=cmd_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError) as e:
        print(f"xbackend: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
