"""xbackend-liger tests: the plugin importable from the source tree (installed or not), and liger's
kernels runnable under the Triton interpreter for the duration of each test (see
``xbackend_liger.interpreter``; the repository conftest sets TRITON_INTERPRET=1 where torch sees no GPU)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from xbackend_liger import interpreter


@pytest.fixture(autouse=True)
def _liger_under_the_interpreter() -> Iterator[None]:
    with interpreter.bridge():
        yield
