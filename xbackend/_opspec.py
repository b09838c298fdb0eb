"""The record each op file builds: how to bind, check, key, verify and plan one op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._precision import Output, Precision, compare

__all__ = ["OpSpec", "contiguous", "describe_args", "register_inference_op", "register_reference_autograd", "tensor_sig"]


def tensor_sig(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What a runtime key needs of a tensor: two tensors with equal sigs pass the same checks and
    take the same kernel path."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device)


@dataclass(frozen=True)
class OpSpec:
    """One abstract op. ``bind`` turns a caller's ``(*args, **kwargs)`` into the normalized positional
    tuple every other field (and every impl) takes."""

    name: str
    bind: Callable[..., tuple[Any, ...]]
    check: Callable[..., None]
    reference: Callable[..., Output]
    key: Callable[..., tuple[Any, ...]]
    example: Callable[[torch.dtype, torch.device], tuple[Any, ...]]
    custom_op: Callable[..., Output]
    tensor_args: tuple[int, ...]
    signature: str
    tolerant: bool = False
    # Calls with exactly this many positional arguments and no kwargs skip ``bind`` (it would return
    # them unchanged); None for ops whose bind normalizes (neighborhood_attention's int -> tuple).
    positional_arity: int | None = None
    verify: Callable[[Output, tuple[Any, ...], Precision], str | None] | None = None
    # The fake (meta) impl registered on ``custom_op``; also backs the inference-only op (below).
    fake: Callable[..., Output] | None = None
    # The conformance catalogue: ``cases(dtype, device, big)`` -> the op's ``Case`` list (``big``: also
    # the cases that need more than 4 GiB of device memory, such as offsets past 2**31 elements).
    cases: Callable[[torch.dtype, torch.device, bool], list[Any]] | None = None

    def device_of(self, args: tuple[Any, ...]) -> torch.device:
        return args[self.tensor_args[0]].device

    def dtype_of(self, args: tuple[Any, ...]) -> torch.dtype:
        return args[self.tensor_args[0]].dtype

    def needs_grad(self, args: tuple[Any, ...]) -> bool:
        # A loop, not any(<generator>): this runs on every eager call made with grad mode on.
        for i in self.tensor_args:
            if getattr(args[i], "requires_grad", False):
                return True
        return False

    def check_output(self, out: Output, args: tuple[Any, ...], precision: Precision) -> str | None:
        """The guard's comparison of an impl's output with the reference on the same inputs."""
        if self.verify is not None:
            return self.verify(out, args, precision)
        return compare(out, self.reference(*args), precision)


def describe_args(args: tuple[Any, ...]) -> str:
    """A short, stable description of one runtime key for reports and logs."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dtype = str(a.dtype).removeprefix("torch.")
            layout = "" if a.is_contiguous() else " strided"
            parts.append(f"{dtype}[{','.join(map(str, a.shape))}]{layout}")
        elif a is None:
            parts.append("-")
        else:
            parts.append(repr(a))
    return " ".join(parts)


_INFER_LIB: torch.library.Library | None = None
_INFER_OPS: dict[str, Any] = {}  # name -> the registered overload
_INFER_CALLS: dict[str, Callable[..., Output]] = {}  # name -> what its kernel runs (the latest Op's _eager)


def register_inference_op(spec: OpSpec, call: Callable[..., Output]) -> Callable[..., Output]:
    """``xbackend::<name>_infer``: the op again, for calls that need no gradient under ``torch.compile``.

    Same schema and fake impl as ``spec.custom_op``, one kernel at CompositeExplicitAutograd that runs
    ``call`` (the op's eager entry point: ``Op._eager``, its cached dispatch),
    and nothing else: ``torch.library.custom_op`` wraps every call in Python autograd, aliasing and
    device layers that cost ~14 µs of host time per call (measured on CPU), which a compiled DiT block
    with ~40 xbackend calls pays on every step. Outputs never alias inputs (every impl and reference
    allocates its result), which the schema's lack of alias annotations promises. Returns the op
    overload to call; ``spec.custom_op`` when the spec has no fake impl.
    """
    global _INFER_LIB
    if spec.fake is None:
        return spec.custom_op
    name = f"{spec.name}_infer"
    existing = _INFER_OPS.get(name)
    if existing is not None:  # a second Op for the spec (a reloaded module): one registration per process
        _INFER_CALLS[name] = call
        return existing
    if _INFER_LIB is None:
        _INFER_LIB = torch.library.Library("xbackend", "FRAGMENT")  # a module global: the registrations live with it
    schema = getattr(torch.ops.xbackend, spec.name).default._schema
    _INFER_LIB.define(str(schema).replace(f"xbackend::{spec.name}(", f"{name}(", 1))
    _INFER_CALLS[name] = call
    lists = any(isinstance(a.type, torch.ListType) for a in schema.arguments)

    def kernel(*args: Any) -> Output:
        if lists:  # the dispatcher hands int[]/bool[] over as lists; bound arguments (and keys) hold tuples
            args = tuple([tuple(a) if type(a) is list else a for a in args])
        return contiguous(_INFER_CALLS[name](*args))

    _INFER_LIB.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"xbackend::{name}", spec.fake, lib=_INFER_LIB)
    _INFER_OPS[name] = getattr(torch.ops.xbackend, name).default
    return _INFER_OPS[name]


def contiguous(out: Output) -> Output:
    """``out`` with every tensor contiguous (a no-op for contiguous ones): what the fake impls promise
    the compiler. A reference can return strided results (a transposed input through the diffusers
    RMSNorm), and a compiled graph checks the strides it was promised."""
    if isinstance(out, torch.Tensor):
        return out if out.is_contiguous() else out.contiguous()
    return type(out)(t if t.is_contiguous() else t.contiguous() for t in out)


def register_reference_autograd(custom_op: Any, reference: Callable[..., Output], tensor_args: tuple[int, ...]) -> None:
    """Gradients are the reference's gradients: these ops exist for inference speed, and a training
    caller must still get correct gradients rather than a silently detached result. A reference
    that returns several tensors gets the gradients of all of them at once.

    Higher-order gradients too: when the backward itself is recorded (``create_graph=True``, e.g. an
    R1 gradient penalty), the reference is re-run on the saved inputs themselves, so the returned
    gradients carry the reference's own graph to the inputs and to the incoming gradients."""

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: Output) -> None:
        ctx.inputs = inputs

    def backward(ctx: Any, *grad_outs: Any) -> tuple[Any, ...]:
        inputs = list(ctx.inputs)
        wanted = [i for i in tensor_args if inputs[i] is not None and inputs[i].requires_grad]
        # Grad mode is on inside backward exactly when autograd records it (create_graph=True).
        higher_order = torch.is_grad_enabled()
        if not higher_order:
            for i in wanted:
                inputs[i] = inputs[i].detach().requires_grad_(True)
        with torch.enable_grad():
            outs, grads_in = _differentiable(reference(*inputs), grad_outs)
            if not outs:  # no output got a gradient: nothing flows back
                return (None,) * len(inputs)
            grads = torch.autograd.grad(outs, [inputs[i] for i in wanted], grads_in, allow_unused=True,
                                        create_graph=higher_order)
        result: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, grads, strict=True):
            result[i] = g
        return tuple(result)

    custom_op.register_autograd(backward, setup_context=setup_context)


def _differentiable(out: Output, grad_outs: tuple[Any, ...]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The reference's outputs paired with their incoming gradients, leaving out those autograd has no
    gradient for (an output the caller never used, or one that does not depend on any input).

    A tuple-returning custom op hands ``backward`` one gradient per output; a list-returning one hands
    it the list as a single argument."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    grads = list(grad_outs[0]) if len(grad_outs) == 1 and isinstance(grad_outs[0], (tuple, list)) else list(grad_outs)
    if len(grads) != len(outs):
        raise RuntimeError(f"backward got {len(grads)} output gradient(s) for a reference with {len(outs)} output(s)")
    kept = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
    return [o for o, _ in kept], [g for _, g in kept]
