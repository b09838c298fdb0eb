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

Every runtime key holds each tensor's alignment class (``alignment``), so a call whose data starts at
another class than the verified one's is verified again. A tensor whose bytes are not its values
(``uncopyable``: a vmap BatchedTensor, a functorch wrapper, a ``__torch_dispatch__`` subclass such as
FakeTensor) cannot be copied: such a call gets the reference's answer and an "unverified" event, and
no impl is blamed; its key (alignment class None) is never a plain tensor's.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

from ._precision import Output

__all__ = ["ALIGN", "ALWAYS", "FIRST", "GUARD_SIGNALS", "FallbackWarning", "ImplUnusableError", "ReferenceFailed",
           "VerifyMode", "alignment", "cannot_verify_now", "env_verify_mode", "isolated_call", "parse_verify_mode",
           "uncopyable"]

# CUDA's caching allocator hands out blocks aligned to 512 bytes; keeping the copy's offset modulo 512
# keeps every alignment a kernel can test for (16-byte vector loads and TMA, 128-byte lines).
ALIGN = 512
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


# Tensors whose bytes are not the values the caller sees, so a copy of them is not the caller's input:
# vmap's BatchedTensor and torch.func's grad wrapper (no storage of their own), functionalize's wrapper
# (its storage is a record of pending writes), and every __torch_dispatch__ subclass (FakeTensor, a
# quantized or sharded wrapper: what an op computes on it is what its dispatch says).
_UNCOPYABLE = (
    (torch._C.DispatchKey.FuncTorchBatched, "a torch.vmap BatchedTensor"),
    (torch._C.DispatchKey.FuncTorchGradWrapper, "a torch.func grad-tracking wrapper"),
    (torch._C.DispatchKey.Functionalize, "a functionalized tensor"),
    (torch._C.DispatchKey.Python, "a __torch_dispatch__ subclass"),
)


def uncopyable(t: torch.Tensor) -> str | None:
    """What ``t`` is when the guard cannot copy it (see ``_UNCOPYABLE``), or None."""
    keys = torch._C._dispatch_keys(t)
    for key, what in _UNCOPYABLE:
        if keys.has(key):
            return what if key is not torch._C.DispatchKey.Python else f"{what} ({type(t).__name__})"
    return None


def alignment(t: torch.Tensor) -> int | None:
    """The alignment class of ``t``'s data pointer, part of every runtime key: the largest power of two
    dividing its address, at most ``ALIGN`` (a null pointer, of an empty or meta tensor, is ``ALIGN``).
    None for a tensor the guard cannot copy (``uncopyable``), which no verified impl may then run on.
    Raises as ``data_ptr()`` does for a tensor without one (sparse, MKL-DNN): the op's check refuses it.

    A kernel may take another path for another class (vector loads, TMA and Triton's pointer
    specialisation test 16 bytes); the guard's copies keep the caller's address modulo ``ALIGN``, so a
    verification call takes the caller's path, and the key keeps one class from running on another's
    verification."""
    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter and uncopyable(t) is not None:
        return None
    try:
        address = t.data_ptr()
    except RuntimeError:
        if uncopyable(t) is not None:  # a BatchedTensor or grad wrapper has no storage to point into
            return None
        raise
    if not address and uncopyable(t) is not None:  # functionalize's wrapper answers 0
        return None
    address |= ALIGN
    return address & -address


def cannot_verify_now(args: tuple[Any, ...], spec: Any) -> str | None:
    """Why no comparison can run on this call, or None: a compile trace or a CUDA graph capture (a
    comparison would sync), an input the guard cannot copy (``uncopyable``), or meta tensors (no
    values to compare)."""
    if torch.compiler.is_compiling():
        return "first use during a compile trace"
    for i in spec.tensor_args:
        t = args[i]
        what = uncopyable(t) if isinstance(t, torch.Tensor) else None
        if what is not None:
            return f"the guard cannot copy argument {spec.arg_names[i]!r} ({what})"
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
    """The process default from ``XBACKEND_VERIFY`` (a bad value logs a warning and means ``first``)."""
    raw = os.environ.get(ENV, "")
    try:
        return parse_verify_mode(raw, where=ENV)
    except ValueError as e:
        # Logged like the other bad environment values: the cause is the variable, not a source line.
        logging.getLogger("xbackend").warning("xbackend: %s; using 'first'", e)
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
        buf = torch.empty(ALIGN + hi - lo, dtype=torch.uint8, device=device)
        # Start the copy at the original's address modulo ALIGN (allocators align less on the CPU).
        base = (ptr + lo - buf.data_ptr()) % ALIGN
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

