"""na_triton's shift launch as a CUDA C++ kernel for sm90a at head_dim 64 (``na_sm90.cu``).

A 4 x 4 x 4 query tile at window 11 sees a 14 x 14 x 14 key box. na_triton walks it in 2 x 2 x 16
key blocks (Triton block shapes are powers of two): 49 blocks of 64 keys, 44% of the computed pairs
useful at the DiffVAE stage-5 tile. This kernel walks it in 2 x 2 x 14 blocks (a TMA box 14 keys
wide, q.k as wgmma m64n56k16): 49 blocks of 56 keys, the box exactly, so q.k and the exponents do
1/8 less work; p.v pads each block to 64 keys (a zero p column times a zero V row). Same walk
otherwise: each row shifted by its Cauchy-Schwarz bound, a tile with a looser bound left to
na_triton's online launch through the same flags.

``na_triton.neighborhood_attention`` takes it for the shift launch where ``supports`` says so, it
computes no more query-key pairs than na_triton's own blocks (``pays``), the extension builds
(``available``) and ``switched_on()`` (unless ``XBACKEND_NA_SM90`` is 0/false/no/off). The extension is built on first
use for ``sm_90a`` only (wgmma and TMA are that target's).

On the H200 (torch 2.11 + cu130, Triton 3.6, nvcc 13, 2026-12-05): the DiffVAE stage-5 tile's call
through ``get_op`` (key-norm pass, flags, this kernel, the online launch for flagged tiles) took 2.418,
2.435, 2.524 and 2.488 ms in four runs of ``python3 benchmarks/na_sol.py --cases plain`` (208, 206, 199
and 202 useful TFLOP/s); interleaved with na_triton's own shift launch (``python3
lab/gpu/na_sm90_rounds.py``, three runs of nine rounds) medians 2.500, 2.547 and 2.476 ms against 2.681,
2.659 and 2.609 ms, outputs 1.5e-4 relative apart (lab/results/h200/na_sol_sm90*.txt, na_sm90_rounds*.txt). Its GPU tests, ragged tiles
and windows 1-11 against the fp32 reference and na_triton's output, pass (gpu_tests_na_sm90.txt), and
compute-sanitizer's memcheck finds no error (``lab/gpu/na_sm90_check.py``, na_sm90_memcheck.txt).
"""

from __future__ import annotations

import math

import torch

from xbackend._switches import switch
from xbackend.kernels._cuda_build import CudaKernelUnavailable, JitExtension
from xbackend.kernels.na_triton_config import NAConfig, visited_pairs

__all__ = ["EXTENSION", "KV_TILE", "MAX_WINDOW", "Q_TILE", "SWITCH", "CudaKernelUnavailable", "available", "build_log",
           "layout_reason", "pays", "shift_launch", "supports", "switched_on", "takes"]

# On unless XBACKEND_NA_SM90=0 (or false/no/off): the way back to na_triton's own shift launch. Read once
# per Runtime (xbackend/_switches.py), so a key verified on one shift launch never runs the other; a
# kernel called outside any runtime (the fleet's capture workers) reads the environment at each call.
SWITCH = "XBACKEND_NA_SM90"

EXTENSION = JitExtension("xbackend_na_sm90", ("na_sm90_binding.cpp", "na_sm90.cu"), "cuda na_sm90",
                         gencode=("-gencode=arch=compute_90a,code=sm_90a",), capability=(9, 0), switch=SWITCH)
# A tile's key box along axis 2 is window + 3 keys, and one 14-key block must cover it.
MAX_WINDOW = 11
Q_TILE = (4, 4, 4)
KV_TILE = (2, 2, 14)  # the key blocks of q.k (p.v pads each to 64 keys)


def switched_on() -> bool:
    """Whether the environment leaves the kernel on, as the process runtime first read it: unset, or a
    true value; ``XBACKEND_NA_SM90=0`` (or false/no/off) turns it off. A value that is not a boolean
    warns once and leaves it on. A change takes effect in a new Runtime."""
    return switch(SWITCH, default=True)


def build_log() -> str | None:
    """The full compiler output of a failed build, or None."""
    return EXTENSION.failure_detail


def available() -> str | None:
    """None when the kernel can run here (building it if needed), else the reason. Never raises."""
    return EXTENSION.available()


def layout_reason(q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, o3: torch.Tensor,
                  kernel_size: tuple[int, int, int], dilation: tuple[int, int, int], is_causal: tuple[bool, bool, bool],
                  stride: tuple[int, int, int], scale: float, q_tile: tuple[int, int, int]) -> str | None:
    """Why the kernel cannot take this call's tensors and window (device aside), or None. Tensors are
    na_triton's ``[B, S0, S1, S2, heads, head_dim]`` views."""
    if q_tile != Q_TILE:
        return f"q_tile {q_tile}: the kernel's tile is {Q_TILE} (its flags index na_triton's grid of that tile)"
    if any(t.dtype != torch.bfloat16 for t in (q3, k3, v3, o3)):
        return f"dtype {q3.dtype}: bf16 only"
    if q3.dim() != 6 or q3.shape[-1] != 64:
        return f"head_dim {q3.shape[-1]}: 64 only"
    if any(t.shape != q3.shape for t in (k3, v3, o3)):
        return "q, k, v and out must share one shape"
    if not all(t.is_contiguous() for t in (q3, k3, v3, o3)):
        return "q, k, v and out must be contiguous"
    if any(t.data_ptr() % 16 for t in (q3, k3, v3, o3)):
        return "base addresses must be 16-byte aligned (TMA)"
    if dilation != (1, 1, 1) or stride != (1, 1, 1) or any(is_causal):
        return "dilation, stride and causal axes: none only"
    if not scale > 0:
        return f"scale {scale}: positive only"
    b, s0, s1, s2, heads, _ = q3.shape
    for axis, (n, ks) in enumerate(zip((s0, s1, s2), kernel_size, strict=True)):
        if not 1 <= ks <= MAX_WINDOW or n < ks:
            return f"axis {axis}: window {ks} over {n} (windows 1-{MAX_WINDOW}, no longer than the axis)"
    if not 1 <= b * heads <= 65535:
        return f"batch * heads {b * heads}: 1 to 65535 (the grid's second axis)"
    return None


def supports(q3: torch.Tensor, *args) -> str | None:
    """``layout_reason`` plus the device: an sm90 GPU (wgmma and TMA are sm_90a's)."""
    if not q3.is_cuda or torch.cuda.get_device_capability(q3.device) != (9, 0):
        return "needs an sm90 GPU (the kernel is built for sm_90a)"
    return layout_reason(q3, *args)


def pays(spatial: tuple[int, int, int], kernel_size: tuple[int, int, int], kv_tile: tuple[int, int, int]) -> str | None:
    """None when this kernel's tensor-core work (q.k over 56-key blocks, p.v padded to 64 keys) is at
    most na_triton's over its ``kv_tile`` blocks with the same 4 x 4 x 4 tiles, else why not. Its speed
    was measured at window 11 (0.94 of na_triton's pairs at the stage-5 tile); smaller windows fit
    na_triton's smaller blocks better (window 5 over the same tile: 1.84)."""
    plain = ((1, 1, 1), (False, False, False), (1, 1, 1))
    qk = visited_pairs(spatial, kernel_size, *plain, NAConfig(Q_TILE, KV_TILE, 4, 1))
    ours = qk * (1 + 64 / math.prod(KV_TILE))  # p.v pads each block to 64 keys
    theirs = 2 * visited_pairs(spatial, kernel_size, *plain, NAConfig(Q_TILE, kv_tile, 4, 1))
    if ours > theirs:
        return f"{ours / theirs:.2f}x na_triton's query-key pairs (its {kv_tile} blocks fit this window better)"
    return None


def takes(q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, o3: torch.Tensor, kernel_size: tuple[int, int, int],
          dilation: tuple[int, int, int], is_causal: tuple[bool, bool, bool], stride: tuple[int, int, int],
          scale: float, q_tile: tuple[int, int, int], kv_tile: tuple[int, int, int]) -> bool:
    """Whether na_triton's shift launch for these arguments (``supports``'s, and na_triton's KV blocks)
    is this kernel's: switched on, supported, no more work than na_triton's, and the extension built."""
    return (switched_on() and supports(q3, k3, v3, o3, kernel_size, dilation, is_causal, stride, scale, q_tile) is None
            and pays(tuple(q3.shape[1:4]), kernel_size, kv_tile) is None and available() is None)


def shift_launch(q3: torch.Tensor, k3: torch.Tensor, v3: torch.Tensor, o3: torch.Tensor, knorm: torch.Tensor,
                 flags: torch.Tensor, kernel_size: tuple[int, int, int], qk_scale: float, shift_max: float) -> None:
    """The shift launch on the current stream of q's device (which must be the current device).
    ``qk_scale`` includes log2(e); ``knorm`` is ``key_norm.max_key_norm(k3)``; ``flags`` int32, zeroed,
    one per tile of na_triton's grid. Raises CudaKernelUnavailable if the extension cannot be built."""
    mod = EXTENSION.module or EXTENSION.load()
    b, s0, s1, s2, heads, _ = q3.shape
    stream = torch.cuda.current_stream(q3.device).cuda_stream
    mod.shift(q3.data_ptr(), k3.data_ptr(), v3.data_ptr(), o3.data_ptr(), knorm.data_ptr(), flags.data_ptr(),
              b, s0, s1, s2, heads, *kernel_size, float(qk_scale), float(shift_max), stream)

