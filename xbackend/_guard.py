"""The guard: one verified call of a candidate impl against the op's reference, and the signals the guard
raises itself (never an impl's failure to fall back from).

A verification call never lets the candidate touch the caller's tensors. Each input storage the call
reads is copied (the span its views cover) and the candidate runs on views of the copies with the
caller's shapes and strides, at data addresses equal to the caller's modulo 512 bytes, so it takes the
same vectorised path as on the originals (the storage offset itself may differ). The reference runs on
the caller's own tensors. After the candidate returns, its copies are compared byte for byte with the
originals (a write anywhere in the span is a mutation) and its outputs' storages with the copies' (an
output sharing an input's memory is an alias). Either rejects the impl; so does an output that misses
the op's precision contract.

Copies cost one extra read and write of every input, on verification calls only (the first call per
runtime key in the default mode; see ``VerifyMode``).
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch

from ._precision import Output

__all__ = ["ALWAYS", "FIRST", "GUARD_SIGNALS", "FallbackWarning", "ImplUnusableError", "ReferenceFailed", "VerifyMode",
           "cannot_verify_now", "env_verify_mode", "isolated_call", "parse_verify_mode"]

# CUDA's caching allocator hands out blocks aligned to 512 bytes; keeping the copy's offset modulo 512
# keeps every alignment a kernel can test for (16-byte vector loads, 128-byte lines).
_ALIGN = 512
ENV = "XBACKEND_VERIFY"


class FallbackWarning(UserWarning):
    """An impl failed its check (wrong output, mutated input, raised) and the call fell back.
    ``python -W error::xbackend.FallbackWarning`` turns every fallback into an error."""


class ImplUnusableError(RuntimeError):
    """A forced impl (``xbackend.use``) cannot take this call."""


# Raised by the guard itself, never an impl's failure to fall back from: a forced impl that cannot run,
# and a fallback turned into an error by ``-W error::xbackend.FallbackWarning``.
GUARD_SIGNALS = (ImplUnusableError, FallbackWarning)


class ReferenceFailed(Exception):
    """The reference raised (its ``__cause__``) while a later-call check compared a verified impl with
    it: the caller's error, which the runtime raises instead of blaming the impl."""


def cannot_verify_now(args: tuple[Any, ...], spec: Any) -> str | None:
    """Why no comparison can run on this call, or None: a compile trace or a CUDA graph capture (a
    comparison would sync), or meta tensors (no values to compare)."""
    if torch.compiler.is_compiling():
        return "first use during a compile trace"
    device = spec.device_of(args)
    if device.type == "meta":
        return "meta tensors carry no values to compare"
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return "first use during a CUDA graph capture"
    return None


@dataclass(frozen=True)
class VerifyMode:
    """When the guard compares an impl with the reference.

    ``first`` (default): the first call per runtime key. ``sample:N``: also one call in N afterwards,
    per key (a production canary). ``always``: every call (CI, debugging).
    """

    kind: str  # "first", "sample", "always"
    every: int = 0  # N of sample:N

    def __str__(self) -> str:
        return f"sample:{self.every}" if self.kind == "sample" else self.kind


FIRST = VerifyMode("first")
ALWAYS = VerifyMode("always")


def parse_verify_mode(text: str, *, where: str = "verify") -> VerifyMode:
    """``"first"``, ``"always"`` or ``"sample:N"`` (N >= 1) as a :class:`VerifyMode`."""
    value = text.strip().lower()
    if value in ("first", ""):
        return FIRST
    if value == "always":
        return ALWAYS
    kind, _, n = value.partition(":")
    if kind == "sample" and n.isdigit() and int(n) >= 1:
        return ALWAYS if int(n) == 1 else VerifyMode("sample", int(n))
    raise ValueError(f"{where}: expected 'first', 'always' or 'sample:N' with N >= 1, got {text!r}")


def env_verify_mode() -> VerifyMode:
    """The process default from ``XBACKEND_VERIFY`` (a bad value warns and means ``first``)."""
    raw = os.environ.get(ENV, "")
    try:
        return parse_verify_mode(raw, where=ENV)
    except ValueError as e:
        warnings.warn(f"xbackend: {e}; using 'first'", RuntimeWarning, stacklevel=2)
        return FIRST


# -- isolated candidate calls ---------------------------------------------------------------------
@dataclass
class _Copy:
    original: torch.Tensor  # bytes [lo, hi) of the caller's storage
    data: torch.Tensor  # the same bytes, in the guard's own storage
    shift: int  # byte offset in the copy's storage minus byte offset in the caller's
    names: tuple[str, ...]  # the arguments viewing this storage


def _span(t: torch.Tensor) -> tuple[int, int]:
    """Bytes [lo, hi) of ``t``'s storage that its elements occupy."""
    size = t.element_size()
    start = t.storage_offset() * size
    if t.numel() == 0:
        return start, start
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True))
    return start, start + extent * size


def _storage_bytes(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage, 0, (storage.nbytes(),), (1,))


def isolated_inputs(args: tuple[Any, ...], tensor_args: tuple[int, ...],
                    names: tuple[str, ...]) -> tuple[tuple[Any, ...], list[_Copy]]:
    """``args`` with each tensor replaced by a view of a private copy of its storage span (views of
    one storage share one copy, as they share memory in the caller's call). ``names[i]`` names
    argument ``i``."""
    spans: dict[int, list[Any]] = {}  # storage ptr -> [storage, device, lo, hi, names]
    for i in tensor_args:
        t = args[i]
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            continue
        storage = t.untyped_storage()
        lo, hi = _span(t)
        seen = spans.get(storage.data_ptr())
        if seen is None:
            spans[storage.data_ptr()] = [storage, t.device, lo, hi, (names[i],)]
        else:
            seen[2], seen[3], seen[4] = min(lo, seen[2]), max(hi, seen[3]), (*seen[4], names[i])
    copies: dict[int, _Copy] = {}
    for ptr, (storage, device, lo, hi, arg_names) in spans.items():
        original = _storage_bytes(storage, device)[lo:hi]
        buf = torch.empty(_ALIGN + hi - lo, dtype=torch.uint8, device=device)
        # Start the copy at the original's address modulo _ALIGN (allocators align less on the CPU).
        base = (ptr + lo - buf.data_ptr()) % _ALIGN
        data = buf[base : base + hi - lo]
        data.copy_(original)
        copies[ptr] = _Copy(original, data, base - lo, arg_names)
    out = list(args)
    for i in tensor_args:
        t = args[i]
        if not isinstance(t, torch.Tensor):
            continue
        if t.numel() == 0:
            out[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            continue
        c = copies[t.untyped_storage().data_ptr()]
        offset = (t.storage_offset() * t.element_size() + c.shift) // t.element_size()
        out[i] = torch.empty(0, dtype=t.dtype, device=t.device).set_(
            c.data.untyped_storage(), offset, t.shape, t.stride())
    return tuple(out), list(copies.values())


def _outputs(out: Output) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [o for o in out if isinstance(o, torch.Tensor)]
    return []


def side_effects(out: Output, copies: list[_Copy], inputs: dict[str, torch.Tensor]) -> str | None:
    """Why an isolated call is unacceptable (it wrote into an input, or returned an input's memory, or
    two outputs over one storage), or None. ``inputs``: the isolated call's tensor arguments by name
    (the empty ones have no copy)."""
    for c in copies:
        if not torch.equal(c.data, c.original):
            return f"modified its input {' / '.join(repr(n) for n in c.names)} in place"
    # Storage identity, as torch's custom-op aliasing check judges it (an op's outputs are new tensors,
    # so the custom op would reject them on its autograd path), empty tensors included.
    owners = {t.untyped_storage()._cdata: f"input {name!r}" for name, t in inputs.items()}
    # Overlap by address too: DLPack, numpy or set_() views of a copy are other storage objects over
    # the same memory.
    taken = [(c.data.device, c.data.data_ptr(), c.data.data_ptr() + c.data.numel(),
              f"input {' / '.join(repr(n) for n in c.names)}") for c in copies]
    for j, o in enumerate(_outputs(out)):
        owner = owners.setdefault(o.untyped_storage()._cdata, f"output {j}")
        if owner != f"output {j}":
            return _shared(j, owner)
        if not o.numel():
            continue
        lo, hi = _span(o)
        lo, hi = o.data_ptr(), o.data_ptr() + (hi - lo)  # the output's bytes, as addresses
        for device, base, end, what in taken:
            if device == o.device and lo < end and base < hi:
                return _shared(j, what)
        taken.append((o.device, lo, hi, f"output {j}"))
    return None


def _shared(j: int, owner: str) -> str:
    if owner.startswith("output"):
        return f"returned output {j} sharing memory with {owner} (outputs must be new tensors)"
    return f"returned an output sharing memory with {owner}"


def isolated_call(fn: Any, args: tuple[Any, ...], tensor_args: tuple[int, ...],
                  names: tuple[str, ...]) -> tuple[Output, str | None]:
    """Run ``fn`` on private copies of ``args``' tensors: (its output, why it is unacceptable or None)."""
    inputs, copies = isolated_inputs(args, tensor_args, names)
    out = fn(*inputs)
    tensors = {names[i]: inputs[i] for i in tensor_args if isinstance(inputs[i], torch.Tensor)}
    return out, side_effects(out, copies, tensors)

