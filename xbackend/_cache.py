"""Where xbackend keeps what it builds (the C++ dispatch keys, the CUDA gated-residual extension)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """``$XBACKEND_CACHE_DIR``, default ``~/.cache/xbackend``."""
    root = os.environ.get("XBACKEND_CACHE_DIR")
    return Path(root) if root else Path.home() / ".cache" / "xbackend"
