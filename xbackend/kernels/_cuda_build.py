"""CUDA C++ kernels built on first use with ``torch.utils.cpp_extension.load``.

Each extension is compiled for the architectures of the visible GPUs and cached under
``$XBACKEND_CACHE_DIR`` (default ``~/.cache/xbackend``), keyed by the content of its sources and of the
package headers they include, its flags, and the torch, CUDA, Python and nvcc versions
(``_cachekey.extension_dir``), only in a directory tree no other user can write, under a build lock
whose wait is bounded (``xbackend._cache`` has both rules). A build that fails is not retried in the
process: its first compiler error becomes the reason the impl is unavailable (the resolver then takes
the next candidate), the whole log stays in ``build_log()``. Waiting out another process's build that
holds the lock too long is such a failure too, with one warning that names the lock file.

``prebuild()`` builds the package's extensions (``PACKAGE_EXTENSIONS``) that this host would use, ahead
of the first call that needs one: ``xbackend build`` runs it.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch

from xbackend._cache import BuildLockTimeout, load_extension, safe_dir
from xbackend._cachekey import extension_dir
from xbackend._plugins import env_flag

log = logging.getLogger("xbackend")
_CSRC = Path(__file__).parent

# The modules that define the package's CUDA extensions, each as its ``EXTENSION``.
PACKAGE_EXTENSIONS = ("xbackend.kernels.cuda_gated_residual", "xbackend.kernels.na_sm90")


class CudaKernelUnavailable(RuntimeError):
    """The CUDA extension cannot be built or loaded here; the message says why."""


def _device_capabilities() -> set[tuple[int, int]]:
    return {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}


def _device_archs() -> list[str]:
    """Compute capabilities of the visible GPUs as nvcc spells them ("90", "100", ...)."""
    return [f"{major}{minor}" for major, minor in sorted(_device_capabilities())]


def _arch_flags(archs: list[str]) -> list[str]:
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    # PTX of the newest arch too, so a later GPU can JIT it instead of failing outright.
    flags.append(f"-gencode=arch=compute_{archs[-1]},code=compute_{archs[-1]}")
    return flags


def _nvcc() -> str | None:
    """The nvcc torch's cpp_extension runs: ``$CUDA_HOME/bin/nvcc``, else the one on PATH."""
    from torch.utils.cpp_extension import CUDA_HOME

    nvcc = Path(CUDA_HOME, "bin", "nvcc") if CUDA_HOME else None
    return str(nvcc) if nvcc is not None and nvcc.exists() else shutil.which("nvcc")


@functools.cache
def _nvcc_version() -> str:
    """nvcc's ``--version`` build line ("Build cuda_13.0.r13.0/compiler.36424714_0"), part of the cache key."""
    nvcc = _nvcc()
    if nvcc is None:
        return "nvcc: none"
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        return f"nvcc {nvcc}: {type(e).__name__}"
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return f"nvcc {lines[-1] if lines else f'exit {out.returncode}'}"


def environment_reason() -> str | None:
    """Why no CUDA extension can be built in this process, or None."""
    if torch.version.hip is not None:
        return "ROCm build of torch: the CUDA C++ kernels target NVIDIA GPUs only"
    if torch.version.cuda is None or not torch.cuda.is_available():
        return "no CUDA device"
    if _nvcc() is None:
        return "nvcc not found (set CUDA_HOME)"
    if shutil.which("ninja") is None:
        from torch.utils.cpp_extension import is_ninja_available

        if not is_ninja_available():
            return "ninja not found (torch.utils.cpp_extension needs it)"
    return None


def first_error_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines[1:]:
        if re.search(r"\berror\b", line, re.IGNORECASE):
            return f"build failed: {line[:300]}"
    return f"build failed: {lines[0][:300]}" if lines else "build failed"


class JitExtension:
    """One extension: ``sources`` (in ``source_dir``, default beside this file) built once per process
    on first ``load()``."""

    def __init__(self, name: str, sources: tuple[str, ...], label: str, source_dir: Path = _CSRC,
                 gencode: tuple[str, ...] | None = None, capability: tuple[int, int] | None = None,
                 switch: str | None = None) -> None:
        self.name = name
        self.sources = sources
        self.source_dir = source_dir
        # Fixed nvcc -gencode flags (an arch-specific target such as sm_90a) instead of the visible GPUs'.
        self.gencode = gencode
        # The one compute capability whose GPUs run it (that of an arch-specific gencode), or None.
        self.capability = capability
        # The environment switch (on unless false) that turns its kernel off, or None.
        self.switch = switch
        self.label = label  # the error prefix: "<label> unavailable: <reason>"
        self.module: ModuleType | None = None
        self.failure: str | None = None
        self.failure_detail: str | None = None  # the whole build error, for build_log()
        self._lock = threading.Lock()

    def _build(self) -> ModuleType:
        archs = _device_archs()
        name = self.name if self.gencode else f"{self.name}_sm" + "_".join(archs)
        sources = [self.source_dir / src for src in self.sources]
        cflags = ["-O3"]
        # --fmad=false backs up the explicit __f*_rn: no mul+add may become an FMA.
        cuda_cflags = ["-O3", "--fmad=false", *(self.gencode or _arch_flags(archs))]
        tag = f"torch{torch.__version__}_cu{torch.version.cuda}_{sys.implementation.cache_tag}"
        build_dir = safe_dir(extension_dir(
            name, tag, sources, include_dirs=[self.source_dir], flags=[*cflags, "--cuda", *cuda_cflags],
            # nvcc's own device headers (cuda_bf16.h's conversions) and code generation are part of the kernel.
            toolchain=[_nvcc_version()],
        ))
        return load_extension(
            build_dir,
            name=name,
            sources=[str(src) for src in sources],
            extra_include_paths=[str(self.source_dir)],
            extra_cflags=cflags,
            extra_cuda_cflags=cuda_cflags,
            verbose=False,
        )

    def load(self) -> ModuleType:
        """The built extension, building it on first use; raises CudaKernelUnavailable otherwise."""
        with self._lock:
            if self.module is not None:
                return self.module
            if self.failure is None:
                try:
                    self.failure = environment_reason()
                    if self.failure is None:
                        self.module = self._build()
                        return self.module
                except BuildLockTimeout as exc:  # another process's build: its message names the lock and the fix
                    self.failure = str(exc)
                    log.warning("xbackend: %s unavailable: %s", self.label, self.failure)
                except Exception as exc:  # any build failure becomes the reason
                    self.failure = first_error_line(exc)
                    self.failure_detail = str(exc)
            raise CudaKernelUnavailable(f"{self.label} unavailable: {self.failure}")

    def available(self) -> str | None:
        """None when the extension can run here (building it if needed), else the reason. Never raises."""
        try:
            self.load()
        except CudaKernelUnavailable as exc:
            return str(exc).removeprefix(f"{self.label} unavailable: ")
        except Exception as exc:  # a probe must not raise
            return f"{type(exc).__name__}: {exc}"
        return None

    def unused_reason(self) -> str | None:
        """Why no GPU of this host would run the extension, or None (does not build anything)."""
        if self.switch is not None and not env_flag(self.switch, default=True):
            return f"switched off ({self.switch}={os.environ.get(self.switch)})"
        reason = environment_reason()
        if reason is None and self.capability is not None and self.capability not in _device_capabilities():
            major, minor = self.capability
            reason = f"no sm{major}{minor} GPU visible (built for {', '.join(self.gencode or ())} only)"
        return reason


@dataclass(frozen=True)
class Prebuilt:
    """One extension's outcome in ``prebuild``: ``ready`` (built, or loaded from the cache), ``skipped``
    (this host would not use it) or ``failed``; ``detail`` is the reason for the last two, ``log`` a
    failed build's whole compiler output."""

    label: str
    outcome: str
    seconds: float
    detail: str = ""
    log: str | None = None


def package_extensions() -> list[JitExtension]:
    return [importlib.import_module(module).EXTENSION for module in PACKAGE_EXTENSIONS]


def prebuild(extensions: list[JitExtension] | None = None) -> list[Prebuilt]:
    """Build (or load from the cache) each extension this host's GPUs would run; default the package's."""
    results = []
    for ext in package_extensions() if extensions is None else extensions:
        reason = ext.unused_reason()
        if reason is not None:
            results.append(Prebuilt(ext.label, "skipped", 0.0, reason))
            continue
        start = time.perf_counter()
        reason = ext.available()
        seconds = time.perf_counter() - start
        results.append(Prebuilt(ext.label, "ready", seconds) if reason is None
                       else Prebuilt(ext.label, "failed", seconds, reason, ext.failure_detail))
    return results
