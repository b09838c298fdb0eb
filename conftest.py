"""Repository-wide test setup."""

from __future__ import annotations

import collections
import os

import pytest
import torch

# Triton kernels are tested on CPU through its interpreter, which must be chosen before triton loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """Skips as one line of counts by reason. A CPU run skips every GPU test; one line per skip (``-rs``,
    ``-ra``) is there for who asks, and the default report (``-rfE``) keeps to failures and errors."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped or set(config.option.reportchars) & {"s", "a", "A"}:
        return
    reasons = collections.Counter(_skip_reason(r) for r in skipped)
    terminalreporter.write_line(
        "skipped by reason: " + "; ".join(f"{n} {reason}" for reason, n in reasons.most_common()))
