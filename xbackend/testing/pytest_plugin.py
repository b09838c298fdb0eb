"""Fixtures and the ``gpu`` marker for xbackend and its plugins, registered as a pytest plugin
(entry point ``pytest11``) by ``pip install xbackend``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from .._runtime import Runtime
from . import fresh_runtime


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA/ROCm GPU; skipped where torch sees none")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The one place that skips by device."""
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
