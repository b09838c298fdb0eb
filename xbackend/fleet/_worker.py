"""What the compile pool's worker processes (``_pool``) run. Each worker starts without
``TRITON_INTERPRET``, so ``@triton.jit`` gives compilable kernels whatever the parent process runs
under; every task returns plain picklable data, and runs under the pool's time bound."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CaptureResult", "CompileResult", "capture_shapes", "compile_native", "compile_triton", "ping"]


@dataclass(frozen=True)
class CaptureResult:
    """One catalogue shape run through one impl's launch path."""

    shape: str
    reason: str | None = None  # the impl's ``supports`` rejected the shape
    error: str | None = None  # the launch path raised
    launches: tuple[Any, ...] = ()  # _capture.Launch


@dataclass(frozen=True)
class CompileResult:
    """One kernel compiled for one arch: resources, or the first line of the error."""

    kernel: str
    error: str | None = None
    registers: int = 0
    sgprs: int = 0
    agprs: int = 0
    spill_bytes: int = 0
    spill_stores: int = 0
    shared_bytes: int = 0
    num_warps: int = 0
    num_stages: int = 0
    compiler_occupancy: int | None = None
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


def first_line(exc: BaseException) -> str:
    """The most telling line of an exception: a compiler's first ``error`` line, else the first line.
    Triton's CompilationError puts "at <line>:<col>:" and a source excerpt first, then its message
    (or none, with the cause chained): that message, with the kernel line it points at."""
    where = ""
    while hasattr(exc, "error_message") and hasattr(exc, "node"):
        where = where or (f" (kernel line {exc.node.lineno})" if hasattr(exc.node, "lineno") else "")
        if exc.error_message:
            return _pick(exc.error_message) + where
        if exc.__cause__ is None:
            break
        exc = exc.__cause__
    return _pick(str(exc) or type(exc).__name__) + where


def _pick(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in lines:
        if re.search(r"error\b", line, re.IGNORECASE):
            return line[:300]
    return (lines[0] if lines else "error")[:300]


@contextlib.contextmanager
def _environ(env: dict[str, str] | None) -> Iterator[None]:
    """``env`` set for the duration (Triton reads its knobs from the environment when asked)."""
    saved = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def capture_shapes(
    arch: str,
    vendor: str,
    fn_ref: Any,
    supports_ref: Any,
    op: str,
    dtype: str,
    shapes: tuple[int, ...] | None,
    env: dict[str, str] | None = None,
) -> list[CaptureResult]:
    """Run one impl over its op's catalogue (the listed indices, or all) on a simulated ``arch``,
    with ``env`` set meanwhile."""
    with _environ(env):
        return _capture_shapes(arch, vendor, fn_ref, supports_ref, op, dtype, shapes)


def _capture_shapes(
    arch: str, vendor: str, fn_ref: Any, supports_ref: Any, op: str, dtype: str, shapes: tuple[int, ...] | None
) -> list[CaptureResult]:
    import torch

    from xbackend.fleet import _capture
    from xbackend.fleet.catalogue import catalogue

    fn = _capture.resolve(fn_ref)
    supports = _capture.resolve(supports_ref) if supports_ref is not None else None
    entries = catalogue(op)
    out: list[CaptureResult] = []
    for i, shape in enumerate(entries):
        if shapes is not None and i not in shapes:
            continue
        try:
            reason, launches = _capture.capture(arch, vendor, fn, shape.make, getattr(torch, dtype), supports)
        except Exception as exc:  # the launch path raised for this input: report it per shape
            out.append(CaptureResult(shape.label, error=f"{type(exc).__name__}: {first_line(exc)}"))
            continue
        out.append(CaptureResult(shape.label, reason=reason, launches=tuple(launches)))
    return out


def compile_triton(
    spec: Any, arch: str, env: dict[str, str] | None = None, stages: tuple[str, ...] = ()
) -> CompileResult:
    """Compile one captured specialisation for ``arch`` and read its resources. ``env`` is set for
    this compile only (Triton reads its knobs from the environment); ``stages`` names IR texts to
    return in ``extra`` ("ttgir", "ptx", "amdgcn", ...)."""
    start = time.perf_counter()
    try:
        with _environ(env):
            return _compile_triton(spec, arch, stages, start)
    except Exception as exc:  # a compile error is a result: the fleet table reports it per kernel
        return CompileResult(spec.name, error=first_line(exc), seconds=time.perf_counter() - start)


def _compile_triton(spec: Any, arch: str, stages: tuple[str, ...], start: float) -> CompileResult:
    import triton

    from xbackend.fleet import _capture, _resources

    kernel = triton.compile(_capture.ast_source(spec), target=_capture.gpu_target(arch), options=dict(spec.options))
    md = kernel.metadata
    if "cubin" in kernel.asm:
        reserved = 1024 if int(arch.removeprefix("sm").rstrip("abf")) >= 90 else 0  # see cubin_resources
        found = _resources.cubin_resources(kernel.asm["cubin"], md.shared, reserved)
        res = found.get(md.name) or next(iter(found.values()))
    else:
        res = _resources.amdgcn_resources(kernel.asm["amdgcn"], md.shared)
    return CompileResult(
        spec.name,
        registers=res.registers,
        sgprs=res.sgprs,
        agprs=res.agprs,
        spill_bytes=res.spill_bytes,
        spill_stores=res.spill_stores,
        shared_bytes=res.shared_bytes,
        num_warps=md.num_warps,
        num_stages=md.num_stages,
        compiler_occupancy=res.compiler_occupancy,
        seconds=time.perf_counter() - start,
        extra={stage: kernel.asm[stage] for stage in stages if stage in kernel.asm},
    )


def compile_native(source: str, include_dir: str, arch: str, flags: tuple[str, ...]) -> list[CompileResult]:
    """Compile a CUDA C++ file's kernels to a cubin for ``arch`` with nvcc; one result per
    ``__global__`` instantiation, from ptxas's resource report. No nvcc: one ``skipped`` result. nvcc
    runs through ``_pool.run_compiler``: the task's time bound ends it, with the cicc and ptxas it runs."""
    from xbackend.fleet import _resources
    from xbackend.fleet._pool import run_compiler

    nvcc = shutil.which("nvcc")
    name = os.path.basename(source)
    if nvcc is None:
        return [CompileResult(name, error="skipped: no nvcc")]
    sm = arch.removeprefix("sm")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            nvcc,
            "-cubin",
            *flags,
            f"-gencode=arch=compute_{sm},code=sm_{sm}",
            "--resource-usage",
            f"-I{include_dir}",
            source,
            "-o",
            os.path.join(tmp, "k.cubin"),
        ]
        proc = run_compiler(cmd)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return [CompileResult(name, error=first_line(RuntimeError(proc.stderr or proc.stdout)), seconds=seconds)]
    found = _resources.ptxas_resources(proc.stdout + proc.stderr)
    names = _demangle(list(found))
    return [
        CompileResult(
            names.get(k, k),
            registers=r.registers,
            spill_bytes=r.spill_bytes,
            spill_stores=r.spill_stores,
            shared_bytes=r.shared_bytes,
            seconds=seconds / max(len(found), 1),
        )
        for k, r in found.items()
    ]


def _demangle(names: list[str]) -> dict[str, str]:
    """Readable kernel names without namespaces or parameter lists: ``row_tile_kernel<float, 8, false,
    2, (Hint)0>``. Any Itanium demangler on PATH will do (nvcc's cu++filt, binutils, LLVM)."""
    tool = next((t for t in ("cu++filt", "c++filt", "llvm-cxxfilt") if shutil.which(t)), None)
    if tool is None or not names:
        return {}
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    if len(out) != len(names):
        return {}
    short = {}
    for mangled, readable in zip(names, out, strict=True):
        readable = re.sub(r"\(anonymous namespace\)::|\b\w+::", "", readable).removeprefix("void ")
        cut = readable.rfind(">(")
        short[mangled] = readable[: cut + 1] if cut >= 0 else readable.split("(")[0]
    return short


def ping(_: int = 0) -> int:
    """A no-op task: submitting one per worker starts them all."""
    return os.getpid()
