"""The conformance suite for xbackend plugins, in one line.

    # tests/test_conformance.py of a plugin package
    from xbackend.testing import conformance
    test_conformance = conformance.suite("myplugin")        # the plugin's entry-point name

or, with no test file at all, ``pytest --xbackend-conformance=myplugin``.

Every impl the plugin registers runs on every device present that it is registered for (the CPU; each
GPU when there is one), for every dtype it declares, through its op's own case catalogue (``cases`` in
``xbackend/ops/<op>.py``: empty and one-row inputs, odd and large last dims, padded, transposed and
stride-0 views, every broadcast form, NaN and Inf, offsets past 2**31 elements on a GPU with the memory).
Per case:

- ``supports()`` returns None or a reason, never raises; a case it accepts, the impl must run;
- the output meets the impl's declared precision against the reference, on private copies of the
  inputs: an input written in place or an output sharing an input's memory fails;
- a second call gives the same bits.

Per impl and dtype, on the first case the impl accepts: ``torch.library.opcheck`` of the op with the impl
forced, and ``torch.compile(fullgraph=True)`` over a call (no graph break, the same answer). Each failure
names op, impl, device, dtype, case and what differed.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._guard import isolated_call
from .._precision import EXACT, QUALITY_TIERS, admits, compare
from .._registry import Impl
from .._runtime import Runtime
from ..ops import OPS
from ..ops._cases import Case, big_offset_bytes

__all__ = ["Case", "Target", "check", "plugin_object", "suite", "targets"]

# Offsets past 2**31 elements need a > 4 GiB buffer; leave this much of the device free besides.
_BIG_MARGIN = 2 << 30
# The most such buffers one op's fp32 cases hold at once (rmsnorm: two offset views and a spanning
# view; rotary_embedding: an offset view and two spanning views), plus the private copy the guard
# makes of a spanning view's whole span during its call.
_BIG_BUFFERS = 4


@dataclass(frozen=True)
class Target:
    """One unit of the suite: an impl on a device in a dtype."""

    impl: Impl
    device: torch.device
    dtype: torch.dtype

    @property
    def id(self) -> str:
        return f"{self.impl.op}:{self.impl.qualname}:{self.device}:{str(self.dtype).removeprefix('torch.')}"


def plugin_object(plugin: str | tuple[str, object]) -> tuple[str, object]:
    """``(name, plugin)`` for an entry-point name, or the pair itself."""
    if not isinstance(plugin, str):
        return plugin
    for ep in importlib.metadata.entry_points(group="xbackend"):
        if ep.name == plugin:
            return plugin, ep.load()
    names = sorted(ep.name for ep in importlib.metadata.entry_points(group="xbackend"))
    raise LookupError(f"conformance: no installed xbackend plugin named {plugin!r}; installed: {', '.join(names)}")


def _devices() -> list[torch.device]:
    found = [torch.device("cpu")]
    if torch.cuda.is_available():
        found += [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    return found


def targets(plugin: str | tuple[str, object]) -> tuple[Runtime, list[Target]]:
    """A runtime with only ``plugin`` loaded, and every (impl, device, dtype) the suite runs."""
    name, obj = plugin_object(plugin)
    rt = Runtime([(name, obj)], autoload=False, block=())
    status = rt.plugins.get(name)
    if status is not None and status.error:
        raise RuntimeError(f"conformance: plugin {name!r} failed to load: {status.error}")
    found = []
    for op in rt.registry.ops():
        for impl in rt.registry.impls(op):
            if impl.backend != name:
                continue
            for device in _devices():
                if impl.runs_on(rt.device(device)):
                    found += [Target(impl, device, dtype) for dtype in sorted(impl.dtypes, key=str)]
    return rt, found


def _big_ok(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    return free > _BIG_BUFFERS * big_offset_bytes(torch.empty(2 * 4096, dtype=torch.float32)) + _BIG_MARGIN


def check(rt: Runtime, target: Target, cases: list[Case] | None = None) -> tuple[list[str], int]:
    """Run one target through its op's cases: (failures, cases run). A failure is one line naming op,
    impl, device, dtype, case and what differed."""
    impl, spec = target.impl, OPS[target.impl.op]
    where = f"{target.id}"
    unavailable = rt.availability(impl)
    if unavailable is not None:
        return [f"{where}: SKIP unavailable: {unavailable}"], 0
    if cases is None:
        cases = spec.cases(target.dtype, target.device, _big_ok(target.device)) if spec.cases else []
    try:
        fn = impl.resolved("fn")
    except Exception as e:
        return [f"{where}: fn {impl.fn!r} does not import: {type(e).__name__}: {e}"], 0
    names = spec.arg_names
    failures: list[str] = []
    ran = 0
    first: tuple[Any, ...] | None = None
    for case in cases:
        label = f"{where} case {case.name!r}"
        args = spec.bind(*case.args)
        try:
            reason = impl.resolved("supports")(*args) if impl.supports is not None else None
        except Exception as e:
            failures.append(f"{label}: supports() raised {type(e).__name__}: {e} (it must return None or a reason)")
            continue
        if reason is not None:
            if not isinstance(reason, str):
                failures.append(f"{label}: supports() returned {reason!r}; expected None or a str")
            continue
        ran += 1
        try:
            out, side = isolated_call(fn, args, spec.tensor_args, names)
        except Exception as e:
            failures.append(f"{label}: raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''} "
                            f"(supports() accepted the case)")
            continue
        try:
            problem = side or spec.check_output(out, args, impl.precision)
        except Exception as e:
            problem = f"its output could not be compared: {type(e).__name__}: {e}"
        if problem is not None:
            failures.append(f"{label}: {problem} (contract {impl.precision})")
            continue
        try:
            again, _ = isolated_call(fn, args, spec.tensor_args, names)
            differ = compare(again, out, EXACT)
        except Exception as e:
            differ = f"raised {type(e).__name__}: {e}"
        if differ is not None:
            failures.append(f"{label}: a second call differs from the first: {differ}")
            continue
        if first is None:
            first = args
    if first is not None:
        failures += [f"{where} {line}" for line in _op_checks(rt, impl, spec, first)]
    return failures, ran


def _op_checks(rt: Runtime, impl: Impl, spec: Any, args: tuple[Any, ...]) -> Iterator[str]:
    """opcheck and a fullgraph compile of the op with ``impl`` forced, in ``rt``."""
    from .. import _runtime
    from .._api import get_op
    from .._policy import quality, use

    tier = next((t for t in QUALITY_TIERS if admits(t, impl.precision, spec.tolerant)), "fast")
    previous = _runtime.set_runtime(rt)
    try:
        with quality(tier), use(**{spec.name: impl.qualname}):
            try:
                torch.library.opcheck(spec.custom_op, args, test_utils=("test_schema", "test_faketensor",
                                                                        "test_autograd_registration"))
            except Exception as e:
                yield f"opcheck with the impl forced: {type(e).__name__}: {str(e).splitlines()[0]}"
            op = get_op(spec.name)
            try:
                compiled = torch.compile(lambda *a: op(*a), fullgraph=True, backend="eager")
                got = compiled(*args)
                problem = spec.check_output(got, args, impl.precision)
                if problem is not None:
                    yield f"under torch.compile(fullgraph=True): {problem}"
            except Exception as e:
                yield f"torch.compile(fullgraph=True) over a call failed: {type(e).__name__}: {str(e).splitlines()[0]}"
    finally:
        _runtime.set_runtime(previous)
        torch._dynamo.reset()


def suite(plugin: str | tuple[str, object]) -> Callable[..., None]:
    """A pytest test function, parametrized over every (impl, device, dtype) of ``plugin`` (an
    entry-point name, or ``(name, plugin object)``). Assign it to a ``test_*`` name in a test module."""
    import pytest

    rt, found = targets(plugin)

    @pytest.mark.parametrize("target", found, ids=[t.id for t in found])
    def test_conformance(target: Target) -> None:
        failures, ran = check(rt, target)
        skipped = [f for f in failures if ": SKIP " in f]
        if skipped and len(skipped) == len(failures) and ran == 0:
            pytest.skip(skipped[0].split(": SKIP ", 1)[1])
        assert not failures, "\n".join(failures)

    if not found:
        name = plugin if isinstance(plugin, str) else plugin[0]

        def test_conformance() -> None:  # type: ignore[no-redef]
            pytest.skip(f"plugin {name!r} registers no impl for a device present here")

    return test_conformance
