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
    """A short status (devices, plugins, problems, what runs here); with --impls every op's candidates
    and the hardware each impl was verified on."""
    rt = runtime()
    backend = f"ROCm {torch.version.hip}" if torch.version.hip else (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build")
    print(f"xbackend {__import__('xbackend').__version__} | torch {torch.__version__} ({backend}) | Python {platform.python_version()}")
    print("\nDevices:")
    for d in _devices():
        print(f"  {d}: {rt.device(d)}")
    if not torch.cuda.is_available():
        print("  (no GPU visible: only CPU impls run here; `xbackend plan --device sm90|sm100|gfx950` plans for one)")
    print("\nPlugins:")
    for status in sorted(rt.plugins.values(), key=lambda s: s.name):
        state = f"FAILED: {status.error}" if status.error else f"{len(status.impls)} impls"
        print(f"  {status.name:<10} {state}  [{status.source}]")
    for lines in rt.pm.hook.xbackend_report_header(runtime=rt):
        for line in lines or ():
            print(f"  {line}")
    problems = rt.load_problems()
    print(f"\nProblems: {len(problems) or 'none'}")
    for problem in problems:
        print(f"  {problem}")
    for note in rt.notes:
        print(f"\nNote: {note}")
    from . import _fastkey

    print(f"\nDispatch: {_fastkey.decide()}")
    from .fleet.skew import host_lane, unverified

    lane = host_lane()
    dtype = _DTYPES[args.dtype]
    for d in _devices():
        plans = [plan(op, d, dtype=dtype) for op in kernel_ops()]
        if args.impls:
            print(f"\nPlan on {d} (representative {args.dtype} inputs):")
            for p in plans:
                print(_indent(str(p)))
        else:
            print(f"\nRuns on {d} ({args.dtype}, quality {plans[0].quality}):")
            chosen = {p.chosen.qualname for p in plans}
            if len(chosen) == 1:
                print(f"  every op: {chosen.pop()}")
            else:
                for p in plans:
                    print(f"  {p.op:<24} {p.chosen.qualname}")
        impls = {i.qualname: i for op in kernel_ops() for i in rt.candidates(op)}
        for flag in unverified(plans, (lane,), impls, rt.device(d).arch):
            print(f"  {flag.message}: {', '.join(flag.impls)}")
    if args.impls:
        print("\nVerified on hardware (torch / Triton, and arch, the precision contract was checked on):")
        for line in _verified_lines(rt):
            print(f"  {line}")
        print("\nvae_tile_decode: host-level op (tiles over torch.distributed ranks when a process group is up)")
    else:
        print("\n`xbackend info --impls`: every op's candidates and why, and the hardware each impl was verified on")
    return 0


def _verified_lines(rt) -> list[str]:
    """One line per backend whose impls share their verified_on, else one per impl."""
    by_backend: dict[str, dict[str, tuple]] = {}
    for op in kernel_ops():
        for impl in rt.candidates(op):
            if impl.backend != "xbackend":
                by_backend.setdefault(impl.backend, {})[f"{op}:{impl.name}"] = impl.verified_on

    def said(pairs: tuple) -> str:
        return ", ".join(f"torch {run[0]} / Triton {run[1]}" + (f" on {run[2]}" if len(run) > 2 else "")
                         for run in pairs) or "never run on hardware"

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
    if args.json and args.shape:
        raise ValueError("plan: --shape plans one input; it prints the text plan (drop --json)")
    if args.json:
        dtype = str(_DTYPES[args.dtype]).removeprefix("torch.")
        matrix = Matrix(ops, (dtype,), (args.quality or current_policy()[0],))
        target = args.device.strip().lower() if dev.simulated else probed_target(dev)
        where = "" if dev.simulated else str(torch.device(args.device))
        print(plan_json(rt, target, dev, matrix, deployed=deployed, where=where, problems=problems), end="")
    else:
        dtype = _DTYPES[args.dtype]
        plans = [plan(op, dev, dtype=dtype, quality=args.quality, assume_available=deployed,
                      args=_shaped_args(op, dtype, args.shape) if args.shape else None)
                 for op in ops]
        print("\n".join(str(p) for p in plans))
    for problem in problems:
        print(f"xbackend plan: {'error' if strict else 'warning'}: {problem}", file=sys.stderr)
    return STRICT_EXIT if strict and problems else 0


def _shaped_args(op: str, dtype: torch.dtype, shapes: list[str]) -> tuple:
    """The op's representative input (meta tensors) with the named tensor arguments replaced:
    ``x=1,32640,4096`` (contiguous, in that argument's dtype) or ``weight=none``."""
    import inspect

    from ._api import get_op

    spec = get_op(op).spec
    names = list(spec.arg_names)
    args = list(spec.example(dtype, torch.device("meta")))
    for item in shapes:
        name, sep, dims = item.partition("=")
        name = name.strip()
        if not sep or name not in names or names.index(name) not in spec.tensor_args:
            tensors = ", ".join(names[i] for i in spec.tensor_args)
            raise ValueError(f"plan: --shape expected NAME=D0,D1,... with NAME a tensor argument of {op} "
                             f"({tensors}), got {item!r}")
        i = names.index(name)
        if dims.strip().lower() == "none":
            if inspect.signature(spec.bind).parameters[name].default is inspect.Parameter.empty:
                raise ValueError(f"plan: --shape {name}=none: {op} requires argument {name!r}")
            args[i] = None
            continue
        try:
            size = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise ValueError(f"plan: --shape {name} expected comma-separated ints, got {dims!r}") from None
        if any(d < 0 for d in size):
            raise ValueError(f"plan: --shape {name} expected sizes >= 0, got {dims!r}")
        like = args[i] if isinstance(args[i], torch.Tensor) else args[spec.tensor_args[0]]
        args[i] = torch.empty(size, dtype=like.dtype, device="meta")
    return tuple(args)


def cmd_ops(args: argparse.Namespace) -> int:
    """Every op with its signature; with --signatures, the impl signature a plugin implements."""

    from ._api import get_op, list_ops

    for name in list_ops():
        op = get_op(name)
        spec = getattr(op, "spec", None)
        print(op.signature if spec is None else spec.signature)
        if args.signatures and spec is not None:
            params = ", ".join(spec.arg_names)
            tensors = ", ".join(spec.arg_names[i] for i in spec.tensor_args)
            # What the op's fake returns for its example input (meta tensors): the outputs an impl returns.
            out = spec.fake(*spec.example(torch.float32, torch.device("meta")))
            returns = f"a tuple of {len(out)} new tensors" if isinstance(out, (tuple, list)) else "a new tensor"
            print(f"    impl:     fn({params}) -> {returns}  (positional, normalized by bind; never writes an input)")
            print(f"    supports: supports({params}) -> None | str  (shapes/strides/dtypes only: also runs on meta)")
            print(f"    tensors:  {tensors}")
        elif spec is None:
            print("    host-level op: runs decode_tile callables, no impls to register")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from . import _fastkey
    from .kernels import _cuda_build

    rc = 0
    try:
        _, seconds = _fastkey.build()
    except Exception as e:
        print(f"xbackend build: the C++ dispatch key extension failed to build: {e}", file=sys.stderr)
        rc = 1
    else:
        print(f"C++ dispatch keys: {_fastkey.library_path()} ({seconds:.1f} s); later processes load it "
              f"(unless {_fastkey.ENV}=0)")
    print("CUDA kernels (built for this host's GPUs, cached for later processes):")
    for r in _cuda_build.prebuild():
        text = f"ready ({r.seconds:.1f} s)" if r.outcome == "ready" else f"{r.outcome}: {r.detail}"
        print(f"  {r.label:<22} {text}")
        if r.outcome == "failed":
            print(f"xbackend build: {r.label} failed: {r.log or r.detail}", file=sys.stderr)
            rc = 1
    return rc


def cmd_bench(args: argparse.Namespace) -> int:
    from .bench import main as bench_main

    return bench_main(args)


def cmd_attribute(args: argparse.Namespace) -> int:
    from ._attribute_models import cmd_attribute as run

    return run(args)


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xbackend", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="device probe, plugins, and what each op runs here")
    info.add_argument("--dtype", choices=sorted(_DTYPES), default="bf16")
    info.add_argument("--impls", "-v", action="store_true",
                      help="also every op's candidates with the reason for each, and where each impl was verified")
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
    p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                   help="plan this input: a tensor argument's shape (repeat; NAME=none for an absent one), "
                        "e.g. --shape x=1,32640,4096 --shape weight=4096")
    p.add_argument("--strict", action="store_true",
                   help="exit 3 on a broken plugin, an unknown XBACKEND_PLUGINS/XBACKEND_BLOCK name or an impl "
                        "whose fn does not import (also XBACKEND_STRICT=1)")
    p.set_defaults(func=cmd_plan)
    from .fleet.cli import add_parser as add_fleet

    add_fleet(sub)
    o = sub.add_parser("ops", help="every op and its signature")
    o.add_argument("--signatures", action="store_true", help="also the impl and supports() signatures plugins implement")
    o.set_defaults(func=cmd_ops)
    build = sub.add_parser("build", help="build the C++ dispatch-key extension and, on a GPU host, the CUDA kernels "
                                         "now rather than on first use")
    build.set_defaults(func=cmd_build)
    b = sub.add_parser("bench", help="benchmark ops against eager, torch.compile and copy_ (GPU)")
    b.add_argument("ops", nargs="*", help="ops to bench; default all pointwise ops")
    b.add_argument("--quick", action="store_true", help="only the shapes the bars are stated on, fewer repeats")
    b.add_argument("--png", help="also write a bar chart to this PNG path (needs matplotlib)")
    b.add_argument("--json", help="also write the rows to this JSON path")
    b.set_defaults(func=cmd_bench)
    from ._attribute_models import add_arguments as add_attribute

    a = sub.add_parser("attribute", help="which patched site makes a bundled tiny LTX-2 model's output drift from "
                                          "its all-reference forward, and by how much")
    add_attribute(a)
    a.set_defaults(func=cmd_attribute)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, KeyError, TypeError) as e:  # the ops' argument errors are Value/TypeErrors
        print(f"xbackend: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `xbackend fleet | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
