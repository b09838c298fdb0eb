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


@pytest.fixture(autouse=True)
def _conformance_in_the_fast_tier(request: pytest.FixtureRequest) -> Iterator[None]:
    """The conformance suite forces each impl for its opcheck and compile checks under the current
    quality tier, the default "lossless", which admits no liger impl (none is exact): the suite runs
    under "fast", the tier that admits every contract here."""
    if request.node.path.name != "test_liger_conformance.py":
        yield
        return
    import xbackend

    with xbackend.quality("fast"):
        yield
