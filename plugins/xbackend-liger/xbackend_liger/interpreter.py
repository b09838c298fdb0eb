"""Running liger's kernels under ``TRITON_INTERPRET=1`` (CPU tests and ``bench_liger.py --dry-run``).

Two gaps of Triton's interpreter stop liger's kernels there, both bridged for the duration of
:func:`bridge` only (the impls never call it):

* a Python float argument (``eps``, ``offset``) reaches the kernel as a Python float, where compiled
  Triton passes an fp32 scalar; liger calls ``eps.to(tl.float32)`` on it. Inside the bridge the
  interpreter converts floats to fp32 scalars, as the compiler types them.
* ``triton.language.extra.libdevice.rsqrt``, which liger's norms import, has no interpreter
  implementation (it returns None); inside the bridge it is ``tl.math.rsqrt`` (numpy's ``1/sqrt``).

Everything else is liger's own kernel code. The interpreter also truncates fp32 -> bf16 where a GPU
rounds to nearest even, so bf16 results on CPU are not evidence of rounding (fp16 and fp32 are).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

__all__ = ["bridge", "interpreting"]

_LIGER_NORMS = ("liger_kernel.ops.rms_norm", "liger_kernel.ops.modulated_rms_norm")


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@contextlib.contextmanager
def bridge() -> Iterator[None]:
    """Within the block, liger's kernels run under the interpreter (a no-op when not interpreting or
    when liger-kernel does not import)."""
    if not interpreting():
        yield
        return
    import importlib

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original_cvt = interpreter._implicit_cvt

    def implicit_cvt(arg: object) -> object:
        if type(arg) is float:
            handle = interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32)
            return tl.tensor(handle, tl.float32)
        return original_cvt(arg)

    def rsqrt(x: object) -> object:
        return tl.math.rsqrt(x)  # resolved at call time: the interpreter patches tl.math per launch

    patched: list[tuple[object, object]] = []
    for name in _LIGER_NORMS:
        try:
            module = importlib.import_module(name)
        except Exception:
            continue
        patched.append((module, module.rsqrt))
        module.rsqrt = rsqrt
    interpreter._implicit_cvt = implicit_cvt
    try:
        yield
    finally:
        interpreter._implicit_cvt = original_cvt
        for module, fn in patched:
            module.rsqrt = fn
