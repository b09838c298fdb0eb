"""A one-line progress bar on stderr for tile decoding (no tqdm: one bar does not justify a dependency)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class TileProgress:
    """`with TileProgress(total, label) as bar: bar.advance()`; a disabled bar writes nothing."""

    def __init__(self, total: int, label: str, *, enabled: bool = True, stream: TextIO | None = None, width: int = 30):
        self.total = total
        self.label = label
        self.enabled = enabled and total > 0
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.done = 0
        self._start = time.perf_counter()

    def __enter__(self) -> TileProgress:
        self._draw()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._draw()

    def _draw(self) -> None:
        if not self.enabled:
            return
        filled = self.width * self.done // self.total
        elapsed = time.perf_counter() - self._start
        bar = "#" * filled + "." * (self.width - filled)
        # A carriage return redraws in place, so a long decode leaves one line, not one per tile.
        self.stream.write(f"\r{self.label} [{bar}] {self.done}/{self.total} tiles {elapsed:6.1f}s")
        self.stream.flush()
