"""The AMD impl records (filled as kernels land)."""

from __future__ import annotations

import xbackend

IMPLS: list[xbackend.Impl] = []
