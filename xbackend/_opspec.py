"""The record each op file builds: how to bind, check, key, verify and plan one op."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._precision import Precision, compare

__all__ = ["OpSpec", "describe_args", "register_reference_autograd", "tensor_sig"]


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
    reference: Callable[..., torch.Tensor]
    key: Callable[..., tuple[Any, ...]]
    example: Callable[[torch.dtype, torch.device], tuple[Any, ...]]
    custom_op: Callable[..., torch.Tensor]
    tensor_args: tuple[int, ...]
    signature: str
    tolerant: bool = False
    # Calls with exactly this many positional arguments and no kwargs skip ``bind`` (it would return
    # them unchanged); None for ops whose bind normalizes (neighborhood_attention's int -> tuple).
    positional_arity: int | None = None
    verify: Callable[[torch.Tensor, tuple[Any, ...], Precision], str | None] | None = None

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

    def check_output(self, out: torch.Tensor, args: tuple[Any, ...], precision: Precision) -> str | None:
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


def register_reference_autograd(custom_op: Any, reference: Callable[..., torch.Tensor], tensor_args: tuple[int, ...]) -> None:
    """Gradients are the reference's gradients: these ops exist for inference speed, and a training
    caller must still get correct gradients rather than a silently detached result."""

    def setup_context(ctx: Any, inputs: tuple[Any, ...], output: torch.Tensor) -> None:
        ctx.inputs = inputs

    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        inputs = list(ctx.inputs)
        wanted = [i for i in tensor_args if inputs[i] is not None and inputs[i].requires_grad]
        for i in wanted:
            inputs[i] = inputs[i].detach().requires_grad_(True)
        with torch.enable_grad():
            out = reference(*inputs)
            grads = torch.autograd.grad(out, [inputs[i] for i in wanted], grad_out, allow_unused=True)
        result: list[Any] = [None] * len(inputs)
        for i, g in zip(wanted, grads, strict=True):
            result[i] = g
        return tuple(result)

    custom_op.register_autograd(backward, setup_context=setup_context)
