"""Fixtures, the ``gpu`` marker and ``--xbackend-conformance`` for xbackend and its plugins, registered as
a pytest plugin (entry point ``pytest11``) by ``pip install xbackend``.

``pytest --xbackend-conformance=NAME`` (repeatable) runs one test per impl × device × dtype of the
installed plugin NAME through the conformance suite (``xbackend.testing.conformance``), and only those:
the project's own tests are collected beside them only when paths are named on the command line."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest
import torch

from .._runtime import Runtime
from . import fresh_runtime


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("xbackend").addoption(
        "--xbackend-conformance", action="append", default=[], metavar="PLUGIN",
        help="run the xbackend conformance suite on the installed plugin PLUGIN (its entry-point name); "
             "other tests run beside it only from paths named on the command line")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA/ROCm GPU; skipped where torch sees none")


def _conformance_only(config: pytest.Config) -> bool:
    """``--xbackend-conformance`` with no path named: the suite is the run, not an addition to the
    ``testpaths`` (or the current directory's) tests."""
    named = getattr(pytest.Config, "ArgsSource", None)
    return bool(config.getoption("--xbackend-conformance", default=None)) and (
        named is None or config.args_source != named.ARGS)


def pytest_ignore_collect(collection_path: object, config: pytest.Config) -> bool | None:
    return True if _conformance_only(config) else None


class ConformanceItem(pytest.Item):
    """One impl × device × dtype of a plugin, through its op's conformance cases."""

    def __init__(self, *, target: object, rt: object, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.target, self.rt = target, rt

    def runtest(self) -> None:
        from .conformance import check

        failures, ran = check(self.rt, self.target)  # type: ignore[arg-type]
        if ran == 0 and failures and all(": SKIP " in f for f in failures):
            pytest.skip(failures[0].split(": SKIP ", 1)[1])
        assert not failures, "\n".join(failures)

    def reportinfo(self) -> tuple[str, int, str]:
        return "xbackend-conformance", 0, self.name


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Adds the conformance items, then skips GPU tests where no GPU is visible (the one place that
    skips by device)."""
    for plugin in config.getoption("--xbackend-conformance", default=[]) or []:
        from .conformance import targets

        rt, found = targets(plugin)
        items += [ConformanceItem.from_parent(session, name=f"conformance[{t.id}]", target=t, rt=rt) for t in found]
        if not found:
            item = ConformanceItem.from_parent(session, name=f"conformance[{plugin}]", target=None, rt=rt)
            item.add_marker(pytest.mark.skip(reason=f"plugin {plugin!r} registers no impl for a device present here"))
            items.append(item)
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def xbackend_runtime() -> Iterator[Runtime]:
    """A fresh runtime with no plugins: only the references run."""
    with fresh_runtime() as rt:
        yield rt


@pytest.fixture
def xbackend_runtime_with() -> Iterator[Callable[..., Runtime]]:
    """A factory: ``xbackend_runtime_with("cuda", ("mine", plugin))`` installs a fresh runtime with
    those plugins (installed entry-point names or ``(name, object)`` pairs) for the rest of the test."""
    stack = contextlib.ExitStack()

    def make(*plugins: str | tuple[str, object]) -> Runtime:
        from .conformance import plugin_object

        stack.close()
        return stack.enter_context(fresh_runtime([plugin_object(p) for p in plugins]))

    with stack:
        yield make
