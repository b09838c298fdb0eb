"""The FallbackWarning a test's injected fault must raise, asserted where it happens: the run's output
then shows a fallback only when one is missing or unexpected."""

from __future__ import annotations

import re

import pytest

import xbackend


def falls_back(impl: str, what: str = "failed verification") -> pytest.WarningsRecorder:
    """Expect ``impl`` ("backend:name") to ``what`` ("failed verification", "raised", "ran out of
    memory") and the call to fall back. Nest one per expected impl: each re-emits what it did not match."""
    return pytest.warns(xbackend.FallbackWarning, match=f"impl {re.escape(impl)} {what} on ")
