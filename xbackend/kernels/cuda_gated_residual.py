"""CUDA C++ gated residual: ``out = x + update * gate`` rounded exactly like eager PyTorch.

The kernels (``gated_residual.cu`` beside this file, bound by ``gated_residual_binding.cpp``) are built on first use with
``torch.utils.cpp_extension.load`` for the architectures of the visible GPUs and cached under
``$XBACKEND_CACHE_DIR`` (default ``~/.cache/xbackend``), keyed by torch and CUDA versions. The
extension exposes one pybind function that plans and launches in C++, so the per-call host cost is
about one eager kernel launch; the wrapper here only holds the module handle.
"""

from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path
from types import ModuleType

import torch

from xbackend._cache import cache_root
from xbackend.kernels._gated_residual_layout import analyze

_CSRC = Path(__file__).parent
_SOURCES = ("gated_residual_binding.cpp", "gated_residual.cu")


class CudaKernelUnavailable(RuntimeError):
    """The CUDA extension cannot be built or loaded here; the message says why."""


_module: ModuleType | None = None
_failure: str | None = None
_failure_detail: str | None = None  # the whole build error, for diagnostics (build_log())
_lock = threading.Lock()


def _device_archs() -> list[str]:
    """Compute capabilities of the visible GPUs as nvcc spells them ("90", "100", ...)."""
    caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
    return [f"{major}{minor}" for major, minor in sorted(caps)]


def _arch_flags(archs: list[str]) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    # PTX of the newest arch too, so a later GPU can JIT it instead of failing outright.
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


def _environment_reason() -> str | None:
    if torch.version.hip is not None:
        return "ROCm build of torch: the CUDA C++ kernel targets NVIDIA GPUs only"
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "no CUDA device"
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    if nvcc is None or not nvcc.exists():
        if shutil.which("nvcc") is None:
            return "nvcc not found (set CUDA_HOME)"
    if shutil.which("ninja") is None:
        from torch.utils.cpp_extension import is_ninja_available

        if not is_ninja_available():
            return "ninja not found (torch.utils.cpp_extension needs it)"
    return None


def _first_error_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines[1:]:
        if re.search(r"\berror\b", line, re.IGNORECASE):
            return f"build failed: {line[:300]}"
    return f"build failed: {lines[0][:300]}" if lines else "build failed"


def _build() -> ModuleType:
    from torch.utils.cpp_extension import load

    archs = _device_archs()
    name = "xbackend_gated_residual_sm" + "_".join(archs)
    tag = f"torch{torch.__version__}_cu{torch.version.cuda}".replace("+", "_").replace(".", "_")
    build_dir = cache_root() / "torch_extensions" / tag / name
    build_dir.mkdir(parents=True, exist_ok=True)
    return load(
        name=name,
        sources=[str(_CSRC / src) for src in _SOURCES],
        extra_include_paths=[str(_CSRC)],
        extra_cflags=["-O3"],
        # --fmad=false backs up the explicit __fmul_rn/__fadd_rn: no mul+add may become an FMA.
        extra_cuda_cflags=["-O3", "--fmad=false", *_arch_flags(archs)],
        build_directory=str(build_dir),
        verbose=False,
    )


def _load() -> ModuleType:
    """The built extension, building it on first use; raises CudaKernelUnavailable otherwise."""
    global _module, _failure, _failure_detail
    with _lock:
        if _module is not None:
            return _module
        if _failure is None:
            try:
                _failure = _environment_reason()
                if _failure is None:
                    _module = _build()
                    return _module
            except Exception as exc:  # any build failure becomes the reason
                _failure = _first_error_line(exc)
                _failure_detail = str(exc)
        raise CudaKernelUnavailable(f"cuda gated_residual unavailable: {_failure}")


def build_log() -> str | None:
    """The full compiler output of a failed build, or None."""
    return _failure_detail


def available() -> str | None:
    """None when the CUDA kernel can run here (building it if needed), else the reason. Never raises."""
    try:
        _load()
    except CudaKernelUnavailable as exc:
        return str(exc).removeprefix("cuda gated_residual unavailable: ")
    except Exception as exc:  # a probe must not raise
        return f"{type(exc).__name__}: {exc}"
    return None


def supports(x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor) -> str | None:
    """Why this kernel cannot take these inputs, or None when it can (does not build anything)."""
    layout = analyze(x, update, gate)
    if isinstance(layout, str):
        return layout
    # Device and vendor are the resolver's filters (and available()); this sees shapes only, so it
    # also answers for meta tensors when planning for a device this host does not have.
    return None


def gated_residual(
    x: torch.Tensor, update: torch.Tensor, gate: torch.Tensor, *, rows_per_thread: int = 0
) -> torch.Tensor:
    """``x + update * gate`` as a new tensor, bit-identical to eager on the same GPU.

    ``rows_per_thread`` (1, 2, 4 or 8) sets how many rows one thread handles (sharing one gate
    load) on the row-tiled path; 0 picks: 1 for vector gates, 1..4 by size for per-token gates.
    Raises CudaKernelUnavailable if the extension cannot be built.
    """
    mod = _module
    if mod is None:
        mod = _load()
    return mod.gated_residual(x, update, gate, rows_per_thread)
