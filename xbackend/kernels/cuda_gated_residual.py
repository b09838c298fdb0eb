"""CUDA C++ gated residual: ``out = x + update * gate`` rounded exactly like eager PyTorch.

The kernels (``gated_residual.cu`` beside this file, bound by ``gated_residual_binding.cpp``) are built on first use
(``_cuda_build``). The extension exposes one CPython function that plans and launches in C++, so the per-call host cost is
about one eager kernel launch. ``entry()`` hands that function to callers that want no Python frame in between (the
CUDA plugin's registered impl); ``gated_residual`` here adds the keyword launch knobs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from xbackend.kernels._cuda_build import CudaKernelUnavailable, JitExtension
from xbackend.kernels._gated_residual_layout import analyze, promotes

__all__ = ["EXTENSION", "CudaKernelUnavailable", "available", "build_log", "entry", "gated_residual", "supports"]

EXTENSION = JitExtension("xbackend_gated_residual", ("gated_residual_binding.cpp", "gated_residual.cu"),
                         "cuda gated_residual")


def build_log() -> str | None:
    """The full compiler output of a failed build, or None."""
    return EXTENSION.failure_detail


def available() -> str | None:
    """None when the CUDA kernel can run here (building it if needed), else the reason. Never raises."""
    return EXTENSION.available()


def supports(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why this kernel cannot take these inputs, or None when it can (does not build anything)."""
    layout = analyze(x, update, gate)
    if isinstance(layout, str):
        return layout
    if promotes(x, gate):
        # The kernels read x, update and gate as one dtype; the Triton kernel takes this promoted sum.
        return "x, update and gate must share one dtype"
    # Device and vendor are the resolver's filters (and available()); this sees shapes only, so it
    # also answers for meta tensors when planning for a device this host does not have.
    return None


def gated_residual(
    x: torch.Tensor,
    update: torch.Tensor,
    gate: torch.Tensor,
    *,
    rows_per_thread: int = 0,
    packs_per_thread: int = 0,
    block_cols: int = 0,
    load_hint: int = 0,
) -> torch.Tensor:
    """``x + update * gate`` as a new tensor, bit-identical to eager on the same GPU.

    Launch knobs (0 = chosen from the shape; they never change the result):
    ``rows_per_thread`` (1, 2, 4 or 8): rows one thread handles (sharing one gate load) on the
    row-tiled path; auto is 1 for vector gates, 1..4 by size for per-token gates.
    ``packs_per_thread`` (1, 2 or 4): 16-byte packs per thread on the flat (full gate) path.
    ``block_cols`` (32..256, by 32): threads per row-tiled block (narrow rows stack several rows).
    ``load_hint`` (1 plain, 2 ``L1::evict_first``): how x and update are loaded when a thread takes one row
    or one pack (the defaults; more load plainly); auto is evict_first when one input fits in half the L2
    (measured on an H200, see ``pick_evict_first`` in gated_residual.cu).
    Raises CudaKernelUnavailable if the extension cannot be built, RuntimeError naming the argument
    for inputs or knobs the kernels do not take.
    """
    mod = EXTENSION.module or EXTENSION.load()
    if rows_per_thread or packs_per_thread or block_cols or load_hint:
        return mod.gated_residual(x, update, gate, rows_per_thread, packs_per_thread, block_cols, load_hint)
    return mod.gated_residual(x, update, gate)


def entry() -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """The extension's own ``gated_residual(x, update, gate)`` (C, no Python frame), building it if it can
    be built here; else this module's ``gated_residual``, which raises why. Same results, same errors."""
    if EXTENSION.module is None:
        EXTENSION.available()
    return EXTENSION.module.gated_residual if EXTENSION.module is not None else gated_residual
