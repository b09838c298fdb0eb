"""A test kit for xbackend plugins.

- ``conformance.suite("myplugin")``: the whole conformance suite as one parametrized test (also
  ``pytest --xbackend-conformance=myplugin``); see :mod:`xbackend.testing.conformance`.
- ``fresh_runtime(plugins=[("mine", my_plugin)])``: a new runtime (plugin manager, registry, caches)
  as the process runtime for a ``with`` block; no entry point loads unless named.
- ``check_impl(rt, op, impl_name, cases)``: an impl against its op's reference on your own cases.
- ``assert_no_graph_break(fn, *args)``: ``torch.compile(fullgraph=True)`` over ``fn`` and one call.
- pytest fixtures (registered by ``pip install xbackend``): ``xbackend_runtime`` (references only),
  ``xbackend_runtime_with(plugins)`` (a factory for a fresh runtime with the named plugins), and the
  ``gpu`` marker, which skips where torch sees no GPU.

    from xbackend.testing import check_impl, fresh_runtime

    def test_my_kernel():
        with fresh_runtime(plugins=[("mine", my_plugin)]) as rt:
            check_impl(rt, "rmsnorm", "my_rmsnorm", cases=[...])
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .._precision import Output
from .._registry import Impl
from .._runtime import Runtime, set_runtime

__all__ = ["assert_no_graph_break", "check_impl", "conformance", "fresh_runtime"]


@contextlib.contextmanager
def fresh_runtime(
    plugins: Iterable[object | tuple[str, object]] = (),
    *,
    autoload: bool = False,
    block: Iterable[str] | None = (),
) -> Iterator[Runtime]:
    """A new runtime (plugin manager, registry, caches) installed as the process runtime for the
    duration of the block. By default no entry point loads: name the plugins the test needs."""
    rt = Runtime(plugins, autoload=autoload, block=block)
    previous = set_runtime(rt)
    try:
        yield rt
    finally:
        set_runtime(previous)


def check_impl(rt: Runtime, op: str, impl_name: str, cases: Iterable[tuple[Any, ...]]) -> None:
    """Assert that ``impl_name`` meets its own precision contract against the reference on every case
    (each case is the op's positional arguments), calling the impl directly (no guard)."""
    from ..ops import OPS

    spec = OPS[op]
    impl = _find(rt, op, impl_name)
    for case in cases:
        args = spec.bind(*case)
        spec.check(*args)
        reason = impl.resolved("supports")(*args) if impl.supports is not None else None
        if reason is not None:
            continue
        out = impl.resolved("fn")(*args)
        problem = spec.check_output(out, args, impl.precision)
        assert problem is None, f"{op}:{impl_name} on {_describe(args)}: {problem}"


def _find(rt: Runtime, op: str, name: str) -> Impl:
    for impl in rt.candidates(op):
        if name in (impl.name, impl.qualname):
            return impl
    raise LookupError(f"{op}: no impl named {name!r}; registered: {[i.qualname for i in rt.candidates(op)]}")


def _describe(args: tuple[Any, ...]) -> str:
    from .._opspec import describe_args

    return describe_args(args)


def assert_no_graph_break(fn: Any, *args: Any) -> Output:
    """Compile ``fn`` with ``fullgraph=True`` (raises on any graph break) and run it once."""
    return torch.compile(fn, fullgraph=True, backend="eager")(*args)


def __getattr__(name: str) -> Any:
    if name == "conformance":  # imported on first use
        import importlib

        return importlib.import_module(f"{__name__}.conformance")
    raise AttributeError(name)
