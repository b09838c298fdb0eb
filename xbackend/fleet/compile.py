"""Compile, on a CPU-only host, every kernel a fleet's plans would launch, to each target's binary, and
report what each uses of the GPU.

``compile_target(target, device, plans)`` takes one target's plans (``op``, ``dtype``, ``quality``,
``chosen`` = "backend:impl"). For each chosen impl that launches Triton kernels, the impl's own launch
path runs over its op's catalogue of representative inputs (``catalogue.py``) for the simulated device
(``_capture.py``: the vendor's launch configs, Triton's own specialisation rules), and every
specialisation it would launch is compiled for the target (cubin for ``sm*``, hsaco for ``gfx*``).
CUDA C++ impls (``native.NATIVE``) and the CUDA C++ kernels a Triton impl's launch path launches
(``native.NATIVE_LAUNCHES``) are compiled with nvcc when it is on PATH. One row per plan x input x
kernel: registers, spills, shared memory / LDS, an occupancy estimate (``_resources.ARCH_LIMITS``), a
status ("ok", "failed: <first error line>", "timeout: <what ran too long>", "skipped: <why>") and a
``problem`` that is non-empty when the kernel failed to compile, timed out, or spills without a waiver
(``WAIVERS``).

Compiles run in worker processes (``_pool``) started without ``TRITON_INTERPRET`` (the interpreter
replaces ``@triton.jit`` kernels with Python ones at import), and their results are cached per (kernel,
specialisation, arch) in this process: lossless and high plans that choose one impl compile it once.
Every task in a worker is bounded (``timeout``, default ``$XBACKEND_COMPILE_TIMEOUT`` seconds, 300):
one that runs longer is a row with status "timeout: ..." and a problem, and is not cached. The workers
exit when this process dies.

``python -m xbackend.fleet.compile --targets mi355x,b200`` plans every op for those targets and prints
the table.
"""

from __future__ import annotations

import atexit
import concurrent.futures as cf
import dataclasses
import fnmatch
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from xbackend._device import Device
from xbackend.fleet import _resources, _worker
from xbackend.fleet._pool import TIMEOUT_ENV, TaskTimeout, WorkerDied, WorkerPool, task_bound
from xbackend.fleet._worker import CaptureResult, CompileResult
from xbackend.fleet.native import NATIVE, NativeLaunch, NativeSource, native_key

__all__ = [
    "NATIVE",
    "NOT_COMPILED",
    "WAIVERS",
    "KernelRow",
    "NativeSource",
    "compile_spec",
    "compile_target",
    "format_rows",
    "judge",
    "run_in_worker",
    "shutdown",
    "waiver_for",
]

# (kernel pattern, arch pattern) -> why that kernel's spill is accepted. fnmatch patterns; a kernel
# pattern is matched against the kernel's name and against "<name> <specialisation>" (a Triton row's
# ``specialisation``: "*fp32 ... D=1024 FLAVOUR=0 ... num_warps=4"), so a waiver can name one input.
WAIVERS: dict[tuple[str, str], str] = {
    # Triton 3.9, fp32 torch-flavour exact RMSNorm at D = 1024 (DiffVAE rows), sm90/sm100/sm103: 80
    # registers, an 8 B stack frame, 4 B spill stores and loads per thread. The spill comes from the
    # --regAllocOptLevel=2 that Triton 3.9 passes ptxas (13.4 here) to avoid a ptxas 13.x bug: the same
    # PTX without it assembles to 80 registers and no spill.
    ("_rmsnorm_exact_kernel *fp32 * D=1024 FLAVOUR=0 *", "sm*"): "4 B per thread, from Triton 3.9's "
    "--regAllocOptLevel=2 ptxas workaround (none without it, same 80 registers)",
    # The same flag, Triton 3.9, the fp32 add + RMSNorm variant (RESIDUAL, torch flavour): 8 B stack,
    # 8 B spill stores and loads per thread at D = 256 modulated (64 registers) and D = 2048 (80) on
    # sm90; the same PTX without the flag assembles to 63 and 80 registers and no spill (ptxas 13.4). At
    # D = 1024 the entry above covers it (80 registers, 4 B spill stores, none without the flag).
    ("_rmsnorm_exact_kernel *fp32 * D=256 FLAVOUR=0 * MODULATE=True * RESIDUAL=True *", "sm*"): "8 B per thread, "
    "from Triton 3.9's --regAllocOptLevel=2 ptxas workaround (none without it)",
    ("_rmsnorm_exact_kernel *fp32 * D=2048 FLAVOUR=0 * RESIDUAL=True *", "sm*"): "8 B per thread, from Triton 3.9's "
    "--regAllocOptLevel=2 ptxas workaround (none without it)",
    # nvcc 13.0, sm100 and sm103, bf16 only: row_tile_kernel with 8 rows per thread and a vector gate
    # takes 255 registers and spills (a per-row gate: 88 B stack, 88 B spill stores; a divided gate:
    # 16 B stack, 12 B stores); none on sm90 or for fp16/fp32. gated_residual.cu launches 8 rows per
    # thread only when a caller passes rows_per_thread=8: the registered impl takes 1 row per thread for
    # vector gates and 1, 2 or 4 for per-token gates (pick_rows_per_thread).
    ("row_tile_kernel<*, 8, *>", "sm10*"): "8 rows per thread only through the rows_per_thread=8 tuning knob; "
    "the registered impl never launches it",
}


# Impls (fnmatch over "backend:impl") whose kernels are not built from this repository's sources.
NOT_COMPILED: dict[str, str] = {
    "xbackend:reference": "eager PyTorch: aten's prebuilt kernels",
    "rocm:aiter*": "AITER's prebuilt CK kernels",
    "*:na_flex": "flex_attention: torch inductor generates and compiles its Triton kernels at run time",
    "*:na_tiled_sdpa": "torch SDPA: aten's prebuilt kernels",
    "natten:*": "NATTEN's prebuilt CUTLASS kernels",
}


@dataclass(frozen=True)
class KernelRow:
    """One kernel of one plan on one representative input."""

    target: str
    arch: str
    op: str
    dtype: str
    quality: str
    chosen: str
    kernel: str
    shape: str
    status: str  # "ok", "failed: <first error line>", "timeout: <what ran too long>", "skipped: <why>"
    specialisation: str = ""  # Triton: first pointer type, constexprs, warps
    problem: str = ""  # non-empty: the kernel failed, timed out, or spills without a waiver
    grid: tuple[int, ...] = ()
    num_warps: int = 0
    num_stages: int = 0
    registers: int = 0  # per thread (NVIDIA) / VGPRs per lane incl. AGPRs (AMD)
    sgprs: int = 0
    spill_bytes: int = 0  # local memory per thread (NVIDIA) / scratch per lane (AMD)
    spill_stores: int = 0
    shared_bytes: int = 0  # shared memory (NVIDIA) / LDS (AMD) per block
    occupancy: int | None = None  # resident warps per SM / waves per CU
    occupancy_limiter: str = ""
    waiver: str = ""
    compile_s: float = 0.0
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def waiver_for(
    kernel: str, arch: str, waivers: dict[tuple[str, str], str] | None = None, specialisation: str = ""
) -> str | None:
    """Why ``kernel``'s spill on ``arch`` is accepted, or None."""
    names = (kernel, f"{kernel} {specialisation}") if specialisation else (kernel,)
    for (k, a), why in (WAIVERS if waivers is None else waivers).items():
        if any(fnmatch.fnmatchcase(n, k) for n in names) and fnmatch.fnmatchcase(arch, a):
            return why
    return None


def judge(
    kernel: str,
    arch: str,
    result: CompileResult,
    waivers: dict[tuple[str, str], str] | None = None,
    specialisation: str = "",
) -> tuple[str, str, str]:
    """(status, problem, waiver) of one compiled kernel: a compile error is a problem, and so is any
    spill (NVIDIA: local memory per thread; AMD: scratch per lane or spilled registers) that
    ``waivers`` (default ``WAIVERS``) does not cover."""
    if result.error is not None:
        if result.error.startswith("skipped:"):
            return result.error, "", ""
        if result.error.startswith("timeout:"):
            return result.error, result.error, ""
        return f"failed: {result.error}", f"does not compile: {result.error}", ""
    if result.spill_bytes > 0 or result.spill_stores > 0:
        why = waiver_for(kernel, arch, waivers, specialisation)
        if why is None:
            if arch.startswith("gfx"):
                spilled = f"{result.spill_bytes} B scratch per lane, {result.spill_stores} registers spilled"
            else:
                spilled = f"{result.spill_bytes} B local memory per thread"
                spilled += f", {result.spill_stores} B spill stores" if result.spill_stores else ""
            return "ok", f"spills ({spilled}) without a waiver", ""
        return "ok", "", why
    return "ok", "", ""


# -- the worker pool ---------------------------------------------------------------------------------
_POOL: WorkerPool | None = None


def _pool(workers: int | None) -> WorkerPool:
    global _POOL
    n = workers or max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 2, 8))
    if _POOL is not None and _POOL.size == n:
        return _POOL
    shutdown()
    _POOL = WorkerPool(n)
    return _POOL


def shutdown() -> None:
    """Stop the worker processes (a later compile starts new ones, with the environment as it is then)."""
    global _POOL
    if _POOL is not None:
        pool, _POOL = _POOL, None
        pool.shutdown()


atexit.register(shutdown)


def _result(future: cf.Future, kernel: str, what: str) -> Any:
    """A task's result; a timeout or a dead worker as the CompileResult of ``kernel`` (``what`` ran)."""
    try:
        return future.result()
    except TaskTimeout as exc:
        killed = "; its worker was killed" if exc.killed else ""
        return CompileResult(kernel, error=f"timeout: {what} took longer than {exc.seconds:g} s{killed} "
                                           f"({TIMEOUT_ENV} sets the bound)")
    except WorkerDied as exc:  # a compiler crash took its worker down
        return CompileResult(kernel, error=f"worker process died: {exc}")
    except Exception as exc:  # the task itself raised (its own errors are results): report, don't abort
        return CompileResult(kernel, error=f"{type(exc).__name__}: {_worker.first_line(exc)}")


def _transient(error: str | None) -> bool:
    """An outcome of this run, not of the kernel: not cached, so a later compile runs it again."""
    return error is not None and error.startswith(("timeout:", "worker process died"))


# -- caches (per process) ------------------------------------------------------------------------------
_COMPILED: dict[tuple[str, str], CompileResult] = {}  # (specialisation key, arch)
_CAPTURED: dict[tuple[Any, ...], list[CaptureResult]] = {}  # (arch, op, impl, dtype, shapes)
_NATIVE_RESULTS: dict[tuple[str, str, tuple[str, ...], str], list[CompileResult]] = {}  # (path, arch, flags, sha)


def run_in_worker(fn: Any, *args: Any, workers: int | None = None, task_timeout: float | None = None,
                  **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a compile worker (a module-level function: the worker runs without
    ``TRITON_INTERPRET``, so Triton kernels there are compilable). Raises ``_pool.TaskTimeout`` after
    ``task_timeout`` seconds (default ``$XBACKEND_COMPILE_TIMEOUT``)."""
    return _pool(workers).submit(fn, args, kwargs, timeout=task_bound(task_timeout, "run_in_worker: task_timeout")).result()


def compile_spec(spec: Any, arch: str, workers: int | None = None, timeout: float | None = None) -> CompileResult:
    """One captured specialisation compiled for ``arch`` (cached per process like ``compile_target``'s)."""
    key = (spec.key(), arch)
    if key in _COMPILED:
        return _COMPILED[key]
    future = _pool(workers).submit(_worker.compile_triton, (spec, arch), timeout=task_bound(timeout, "compile_spec: timeout"))
    res = _result(future, spec.name, f"Triton compile of {spec.name} for {arch}")
    if not _transient(res.error):
        _COMPILED[key] = res
    return res


# -- the plans -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Plan:
    op: str
    dtype: str
    quality: str
    chosen: str
    impl: Any  # the Impl record, or None
    kind: str  # "triton", "native", "skipped", "failed"
    detail: str = ""


def _classify(plan: dict[str, Any], device: Device, rt: Any) -> _Plan:
    op, dtype, quality, chosen = plan["op"], plan["dtype"], plan.get("quality", ""), plan["chosen"]
    try:
        candidates = rt.candidates(op)
    except KeyError:
        return _Plan(op, dtype, quality, chosen, None, "skipped", "a host-level op: no kernels of its own")
    if ":" in chosen:
        impl = next((i for i in candidates if i.qualname == chosen), None)
    else:
        impl = next((i for i in candidates if i.name == chosen and i.runs_on(device)), None)
        impl = impl or next((i for i in candidates if i.name == chosen), None)
    if impl is None:
        return _Plan(op, dtype, quality, chosen, None, "failed", f"no impl {chosen!r} registered for {op}")
    qualname = impl.qualname
    if qualname in NATIVE:
        return _Plan(op, dtype, quality, qualname, impl, "native")
    for pattern, why in NOT_COMPILED.items():
        if fnmatch.fnmatchcase(qualname, pattern):
            return _Plan(op, dtype, quality, qualname, impl, "skipped", why)
    return _Plan(op, dtype, quality, qualname, impl, "triton")


def _shape_indices(shapes: int | Sequence[int] | None) -> tuple[int, ...] | None:
    if shapes is None:
        return None
    if isinstance(shapes, int):
        return tuple(range(shapes))
    return tuple(shapes)


def compile_target(
    target: str,
    device: Device,
    plans: list[dict[str, Any]],
    *,
    shapes: int | Sequence[int] | None = None,
    workers: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> list[dict[str, Any]]:
    """Compile every kernel ``plans`` would launch on ``device`` (``target`` labels the rows: "b200").

    ``shapes``: only the first N catalogue inputs of each op (or these indices); ``workers``: compile
    processes (default: this host's cores, at most 8); ``env``: variables set in the workers while the
    launch paths run (a deployment's switches, e.g. ``XBACKEND_NA_SM90=0``; the workers otherwise see
    this process's environment as it was when they started); ``timeout``: seconds each compile (and
    each launch-path run) may take, default ``$XBACKEND_COMPILE_TIMEOUT`` or 300. Returns one
    ``KernelRow.to_dict()`` per plan x input x kernel, in plan order.
    """
    import xbackend

    rt = xbackend.runtime()
    arch, vendor = device.arch, device.vendor
    bound = task_bound(timeout, "compile_target: timeout")
    classified = [_classify(p, device, rt) for p in plans]
    needs_pool = any(p.kind in ("triton", "native") for p in classified)
    pool = _pool(workers) if needs_pool else None
    env_key = tuple(sorted((env or {}).items()))

    natives: dict[tuple[str, str, tuple[str, ...], str], cf.Future | list[CompileResult]] = {}

    def native(src: NativeSource) -> tuple[str, str, tuple[str, ...], str]:
        key = native_key(src, arch)
        if key not in natives:
            natives[key] = _NATIVE_RESULTS.get(key) or pool.submit(
                _worker.compile_native, (key[0], str(Path(key[0]).parent), key[1], src.flags), timeout=bound
            )
        return key

    # 1. Run each distinct (impl, dtype)'s launch path over its catalogue.
    captures: dict[tuple[Any, ...], cf.Future | list[CaptureResult]] = {}
    for p in classified:
        if p.kind == "triton":
            key = (arch, p.op, p.chosen, p.dtype, _shape_indices(shapes), env_key)
            if key not in captures:
                captures[key] = _CAPTURED.get(key) or pool.submit(
                    _worker.capture_shapes,
                    (arch, vendor, p.impl.fn, p.impl.supports, p.op, p.dtype, key[4], env),
                    timeout=bound,
                )
        elif p.kind == "native":
            native(NATIVE[p.chosen])
    for key, found in list(captures.items()):
        if isinstance(found, cf.Future):
            got = _result(found, "-", f"the launch path of {key[2]} ({key[3]}) over its inputs")
            captures[key] = got if isinstance(got, list) else [CaptureResult("-", error=got.error)]
            if isinstance(got, list):
                _CAPTURED[key] = got

    # 2. Compile each distinct specialisation (and CUDA C++ source) not compiled before in this process.
    fresh: set[tuple[str, ...]] = set()
    compiles: dict[tuple[str, str], tuple[str, cf.Future]] = {}
    for found in captures.values():
        for shape in found:
            for launch in shape.launches:
                if isinstance(launch.spec, NativeLaunch):
                    native(launch.spec.source)
                    continue
                key = (launch.spec.key(), arch)
                if key not in _COMPILED and key not in compiles:
                    future = pool.submit(_worker.compile_triton, (launch.spec, arch), timeout=bound)
                    compiles[key] = (launch.spec.name, future)
    compiled: dict[tuple[str, str], CompileResult] = {}
    for key, (name, fut) in compiles.items():
        compiled[key] = _result(fut, name, f"Triton compile of {name} for {arch}")
        if not _transient(compiled[key].error):
            _COMPILED[key] = compiled[key]
        fresh.add(key)
    for key, found in list(natives.items()):
        if isinstance(found, cf.Future):
            got = _result(found, Path(key[0]).name, f"nvcc of {Path(key[0]).name} for {key[1]}")
            natives[key] = got if isinstance(got, list) else [got]
            if not any(_transient(r.error) for r in natives[key]):
                _NATIVE_RESULTS[key] = natives[key]
            fresh.add(("native",) + key[:2])

    # 3. Rows, in plan order; a compile counts its seconds on the first row that uses it.
    rows: list[KernelRow] = []
    reported: set[tuple[str, ...]] = set()

    def native_rows(base: dict[str, Any], src: NativeSource, dtype: str, shape: str) -> None:
        nkey = native_key(src, arch)
        first = ("native",) + nkey[:2] in fresh and ("native",) + nkey[:2] not in reported
        reported.add(("native",) + nkey[:2])
        for res in (r for r in natives[nkey] if src.instantiates(r.kernel, dtype)):
            if res.error is None and src.dynamic_shared_bytes:
                res = dataclasses.replace(res, shared_bytes=res.shared_bytes + src.dynamic_shared_bytes)
            rows.append(_row(base, res.kernel, shape, (), src.block_warps, res, arch, cached=not first))

    for p in classified:
        base = dict(target=target, arch=arch, op=p.op, dtype=p.dtype, quality=p.quality, chosen=p.chosen)
        if p.kind in ("skipped", "failed"):
            status = f"{p.kind}: {p.detail}"
            rows.append(
                KernelRow(**base, kernel="-", shape="-", status=status, problem=p.detail if p.kind == "failed" else "")
            )
        elif p.kind == "native":
            native_rows(base, NATIVE[p.chosen], p.dtype, "all inputs (host code picks the instantiation)")
        else:
            for shape in captures[(arch, p.op, p.chosen, p.dtype, _shape_indices(shapes), env_key)]:
                if shape.error is not None and shape.error.startswith("timeout:"):
                    rows.append(KernelRow(**base, kernel="-", shape=shape.shape, status=shape.error, problem=shape.error))
                elif shape.error is not None:
                    rows.append(
                        KernelRow(
                            **base,
                            kernel="-",
                            shape=shape.shape,
                            status=f"failed: {shape.error}",
                            problem=f"launch path raised: {shape.error}",
                        )
                    )
                elif shape.reason is not None:
                    rows.append(
                        KernelRow(
                            **base,
                            kernel="-",
                            shape=shape.shape,
                            status=f"skipped: the impl does not take this input ({shape.reason})",
                        )
                    )
                elif not shape.launches:
                    rows.append(KernelRow(**base, kernel="-", shape=shape.shape, status="skipped: launched no kernel"))
                for launch in shape.launches:
                    if isinstance(launch.spec, NativeLaunch):
                        native_rows(base, launch.spec.source, p.dtype, shape.shape)
                        continue
                    key = (launch.spec.key(), arch)
                    res = compiled[key] if key in compiled else _COMPILED[key]
                    first = key in fresh and key not in reported
                    reported.add(key)
                    rows.append(
                        _row(
                            base,
                            launch.spec.name,
                            shape.shape,
                            launch.grid,
                            res.num_warps or launch.spec.option.get("num_warps", 0),
                            res,
                            arch,
                            cached=not first,
                            specialisation=launch.spec.describe(),
                        )
                    )
    return [r.to_dict() for r in rows]


def _row(
    base: dict[str, Any],
    kernel: str,
    shape: str,
    grid: tuple[int, ...],
    num_warps: int,
    res: CompileResult,
    arch: str,
    cached: bool,
    specialisation: str = "",
) -> KernelRow:
    status, problem, waiver = judge(kernel, arch, res, specialisation=specialisation)
    occ = None
    if res.error is None:
        occ = _resources.occupancy(
            arch,
            _resources.Resources(registers=res.registers, sgprs=res.sgprs, shared_bytes=res.shared_bytes),
            num_warps,
        )
    return KernelRow(
        **base,
        kernel=kernel,
        shape=shape,
        status=status,
        specialisation=specialisation,
        problem=problem,
        grid=tuple(grid),
        num_warps=num_warps,
        num_stages=res.num_stages,
        registers=res.registers,
        sgprs=res.sgprs,
        spill_bytes=res.spill_bytes,
        spill_stores=res.spill_stores,
        shared_bytes=res.shared_bytes,
        occupancy=occ.warps if occ else None,
        occupancy_limiter=occ.limiter if occ else "",
        waiver=waiver,
        compile_s=0.0 if cached else res.seconds,
        cached=cached,
    )


def format_rows(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table of ``compile_target`` rows (``python -m xbackend.fleet.compile``)."""
    from ._compile_main import format_rows as render

    return render(rows)


if __name__ == "__main__":
    from ._compile_main import main

    sys.exit(main())
