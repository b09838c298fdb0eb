"""Launch a JIT'd Triton kernel through its compiled launcher, without ``JITFunction.run``'s per-call work.

``kernel[grid](...)`` re-binds every argument, re-derives the specialisation of each one, stringifies
the options and hashes the lot on every launch. For our pointwise kernels (a dozen runtime arguments,
up to twenty constexprs) that host cost exceeds the GPU time of the small shapes a DiT block runs
(the audio stream's 126-token norms), so a patched block went host-bound (issue 6). ``DirectLaunch``
does the first launch of each specialisation through Triton (which compiles and caches it) and keeps
the returned compiled kernel; later launches call its launcher directly.

The cache key holds exactly what Triton specialises on: every constexpr and option, the dtype and
16-byte alignment of each pointer, and for each integer whether it is 1, divisible by 16, and 32- or
64-bit (``native_specialize_impl`` in Triton 3.x). Anything unusual — the interpreter, launch hooks
(profilers such as proton set them), a non-current device, an argument type not listed — goes
through Triton's own path, so behaviour never differs, only the host cost.
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
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_MAX_ENTRIES = 4096


def _int_spec(v: int) -> int:
    if v == 1:
        return 1
    return 2 | (v % 16 == 0) << 2 | (not _I32_MIN <= v <= _I32_MAX) << 3


def _hooked(runtime: Any) -> bool:
    """True when a launch hook is installed (Triton 3.6 keeps them in a HookChain, empty by default)."""
    return any(
        hook is not None and getattr(hook, "calls", True)
        for hook in (runtime.launch_enter_hook, runtime.launch_exit_hook)
    )


class DirectLaunch:
    """``DirectLaunch(kernel)(grid, args, **options)``: ``args`` are every kernel parameter in
    signature order (constexprs included, as Triton's launcher takes them); ``options`` are launch
    options (``num_warps``, ``enable_fp_fusion``, ...). Returns the compiled kernel handle."""

    __slots__ = ("_cache", "_constexpr_idx", "_direct", "_fn", "_runtime_idx")

    def __init__(self, fn: Any) -> None:
        self._fn = fn
        # The interpreter (TRITON_INTERPRET=1) hands out InterpretedFunction: no compiled launcher.
        self._direct = _knobs is not None and hasattr(fn, "device_caches") and hasattr(fn, "params")
        params = getattr(fn, "params", ())
        self._runtime_idx = tuple(p.num for p in params if not p.is_constexpr)
        self._constexpr_idx = tuple(p.num for p in params if p.is_constexpr)
        self._cache: dict[tuple[Any, ...], Any] = {}

    def __call__(self, grid: tuple[int, ...], args: tuple[Any, ...], **options: Any) -> Any:
        if not self._direct or _hooked(_knobs.runtime):
            return self._fn[grid](*args, **options)
        device = _current_device()
        spec: list[Any] = [device]
        for i in self._runtime_idx:
            a = args[i]
            t = type(a)
            if t is torch.Tensor or t is torch.nn.Parameter:
                if a.get_device() != device:
                    # Triton launches on the current device; run where the data is instead.
                    with torch.cuda.device(a.get_device()):
                        return self(grid, args, **options)
                spec.append(a.dtype)
                spec.append(a.data_ptr() % 16 == 0)
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
        g1 = grid[1] if len(grid) > 1 else 1
        g2 = grid[2] if len(grid) > 2 else 1
        kernel.run(grid[0], g1, g2, _driver.active.get_current_stream(device), kernel.function,
                   kernel.packed_metadata, None, None, None, *args)
        return kernel


def launcher(fn: Any) -> DirectLaunch:
    """A :class:`DirectLaunch` for ``fn`` (a ``@triton.jit`` kernel)."""
    return DirectLaunch(fn)


__all__ = ["DirectLaunch", "launcher"]
