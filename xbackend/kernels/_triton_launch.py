"""Launch a JIT'd Triton kernel through its compiled launcher, without ``JITFunction.run``'s per-call work.

``kernel[grid](...)`` re-binds every argument, re-derives the specialisation of each one, stringifies
the options, hashes the lot, builds launch metadata for the hook chain, and its C launcher asks the
driver about every pointer (``cuPointerGetAttribute``). For our pointwise kernels (a dozen runtime
arguments, up to twenty constexprs) that came to 20-32 µs of host time per launch on the H200 host,
against 12-15 µs through this module (the lab's ``host_overhead.py``, measured at commit 003a86e, which
the script needs; torch 2.11.0+cu130, Triton 3.6, 2026-11-30; lab/results/h200/host_overhead.txt):
more than the GPU time of the small shapes a DiT block runs (the audio stream's 126-token norms), so a
patched block is host-bound through Triton's own launch path.

The first launch of each specialisation goes through Triton, which compiles and caches it; we keep the
compiled kernel it returns. Later launches call the kernel's launcher directly, with pointers passed
as integers (the launcher then skips its per-pointer driver query; our callers have checked the
tensors are on the current CUDA device). Two ways to key the compiled kernels:

* ``DirectLaunch(fn)(grid, args, **options)`` derives the key from the arguments, exactly what Triton
  specialises on: every constexpr and option, each pointer's dtype and 16-byte alignment, and for each
  integer whether it is 1, divisible by 16, and 32- or 64-bit (``native_specialize_impl`` in Triton 3.x).
* a caller that already holds a launch plan fixed by the inputs' metadata keys by that plan plus the
  pointers' alignments and calls :func:`launch_compiled` itself (``rmsnorm.launch.Launcher`` does).

The interpreter, launch hooks (profilers such as proton install them) and argument types not listed
above go through Triton's own path. Not honoured after a kernel's first launch: Triton debug or
instrumentation modes switched on at run time (``TRITON_DEBUG``, knobs) — reading those knobs on
every launch costs more than the launch; set them before the process launches kernels.
"""

from __future__ import annotations

from typing import Any

import torch

try:  # Triton 3.x
    from triton import knobs as _knobs
    from triton.runtime.driver import driver as _driver
except ImportError:  # pragma: no cover - older Triton: always the JIT path
    _knobs = None
    _driver = None

_current_device = torch.cuda.current_device  # module attribute: tests swap it on CPU
_I32_MIN, _I32_MAX, _I64_MAX = -(2**31), 2**31 - 1, 2**63 - 1
_MAX_ENTRIES = 4096


def direct_capable(fn: Any) -> bool:
    """True for a compiled ``@triton.jit`` function (the interpreter hands out InterpretedFunction)."""
    return _knobs is not None and hasattr(fn, "device_caches") and hasattr(fn, "params")


def _hooks_installed() -> bool:
    runtime = _knobs.runtime
    enter, exit_ = runtime.launch_enter_hook, runtime.launch_exit_hook
    return bool((enter is not None and getattr(enter, "calls", True)) or (exit_ is not None and getattr(exit_, "calls", True)))


# Triton 3.6 holds the launch hooks in two HookChain objects that profilers add to; reading their call
# lists directly costs a tenth of going through the knobs descriptors on every launch.
_CHAINS = None
if _knobs is not None:
    _chains = (_knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook)
    if all(isinstance(getattr(c, "calls", None), list) for c in _chains):
        _CHAINS = _chains


def hooked() -> bool:
    """True when a launch hook is installed (so Triton's own launch path must run)."""
    if _CHAINS is not None:
        enter, exit_ = _CHAINS
        if enter.calls or exit_.calls:
            return True
        # A hook set by assignment replaces the chain object instead of adding to it.
        runtime = _knobs.runtime
        return runtime.launch_enter_hook is not enter or runtime.launch_exit_hook is not exit_
    return _knobs is None or _hooks_installed()


def launch_compiled(kernel: Any, grid: tuple[int, ...], device: int, args: tuple[Any, ...]) -> None:
    """Launch a kernel Triton compiled earlier (a handle ``fn[grid](...)`` returned), on the current stream
    of ``device``. ``args`` are every kernel parameter in signature order; pointers may be ints."""
    g1 = grid[1] if len(grid) > 1 else 1
    g2 = grid[2] if len(grid) > 2 else 1
    stream = _driver.active.get_current_stream(device)
    run = kernel.run
    if _cuda_launcher_without_scratch(run):
        # CudaLauncher.__call__ without its scratch-allocation closures (none needed here).
        run.launch(grid[0], g1, g2, stream, kernel.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                   kernel.packed_metadata, None, None, None, *args)  # fmt: skip
    else:  # HIPLauncher (its raw launch takes other arguments) or a kernel that needs scratch memory
        run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata, None, None, None, *args)


def _cuda_launcher_without_scratch(run: Any) -> bool:
    """Triton 3.6's CudaLauncher with no global or profile scratch: its raw ``launch`` can be called."""
    return (
        type(run).__name__ == "CudaLauncher"
        and hasattr(run, "launch")
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
        and hasattr(run, "launch_pdl")
        and hasattr(run, "launch_cooperative_grid")
    )


def _int_spec(v: int) -> int:
    """Triton 3.6's integer specialisation: 1 (a constexpr), else i32 / i64 / u64 and divisibility by 16."""
    if v == 1:
        return 1
    return 2 | (v % 16 == 0) << 2 | (not _I32_MIN <= v <= _I32_MAX) << 3 | (v > _I64_MAX) << 4


class DirectLaunch:
    """``DirectLaunch(kernel)(grid, args, **options)``: ``args`` are every kernel parameter in
    signature order (constexprs included, as Triton's launcher takes them); ``options`` are launch
    options (``num_warps``, ``enable_fp_fusion``, ...). Returns the compiled kernel handle."""

    __slots__ = ("_cache", "_constexpr_idx", "_direct", "_fn", "_runtime_idx")

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        self._direct = direct_capable(fn)
        params = getattr(fn, "params", ())
        self._runtime_idx = tuple(p.num for p in params if not p.is_constexpr)
        self._constexpr_idx = tuple(p.num for p in params if p.is_constexpr)
        self._cache: dict[tuple[Any, ...], Any] = {}

    @property
    def fn(self) -> Any:
        return self._fn

    @property
    def direct(self) -> bool:
        return self._direct

    def __call__(self, grid: tuple[int, ...], args: tuple[Any, ...], _switched: bool = False, **options: Any) -> Any:
        if not self._direct or hooked():
            return self._fn[grid](*args, **options)
        device = _current_device()
        spec: list[Any] = [device]
        launch_args = list(args)
        for i in self._runtime_idx:
            a = args[i]
            t = type(a)
            if t is torch.Tensor or t is torch.nn.Parameter:
                where = a.get_device()
                if where != device:
                    if where < 0 or _switched:  # a CPU tensor, or tensors on two GPUs: Triton's own error
                        return self._fn[grid](*args, **options)
                    # Triton launches on the current device; run where the data is instead.
                    with torch.cuda.device(where):
                        return self(grid, args, _switched=True, **options)
                ptr = a.data_ptr()
                spec.append(a.dtype)
                spec.append(ptr % 16 == 0)
                launch_args[i] = ptr
            elif t is int:
                spec.append(_int_spec(a))
            elif t is float or a is None:
                spec.append(t)
            else:
                return self._fn[grid](*args, **options)
        key = (tuple(spec), tuple([args[i] for i in self._constexpr_idx]), tuple(options.items()))
        kernel = self._cache.get(key)
        if kernel is None:
            kernel = self._fn[grid](*args, **options)
            if kernel is not None and len(self._cache) < _MAX_ENTRIES:
                self._cache[key] = kernel
            return kernel
        launch_compiled(kernel, grid, device, tuple(launch_args))
        return kernel


__all__ = ["DirectLaunch", "direct_capable", "hooked", "launch_compiled"]
