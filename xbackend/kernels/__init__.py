"""Kernels shared by the vendor backends. Importing this package imports no kernel module (and no
triton): backends name kernels as "xbackend.kernels.<module>:<fn>" strings, imported on first use."""

from __future__ import annotations

import importlib.util


def triton_available() -> str | None:
    """None when triton can be imported here, else why not (an impl's ``available`` predicate)."""
    return None if importlib.util.find_spec("triton") is not None else "triton is not installed"
