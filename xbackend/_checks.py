"""Argument checks shared by the ops. Every error names the op, the argument, what was expected and
what came, so the caller can fix the call without reading a kernel."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from ._registry import FLOAT_DTYPES

_DTYPE_NAMES = "float16, bfloat16 or float32"


def fail(op: str, arg: str, expected: str, got: object, exc: type[Exception] = ValueError) -> Exception:
    return exc(f"{op}: argument '{arg}' expected {expected}, got {got}")


def shape_str(t: torch.Tensor) -> str:
    return f"shape [{', '.join(map(str, t.shape))}]"


def tensor(op: str, arg: str, t: object, *, min_dim: int = 1) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise fail(op, arg, "a torch.Tensor", type(t).__name__, TypeError)
    # The reference, the kernels and the guard's copies address strided memory; a nested tensor
    # reports torch.strided but has no single shape.
    if t.layout != torch.strided or t.is_nested:
        got = "a nested tensor" if t.is_nested else f"layout {t.layout}"
        raise fail(op, arg, "a dense (strided) tensor; call .to_dense() first", got, TypeError)
    if t.dtype not in FLOAT_DTYPES:
        raise fail(op, arg, f"dtype {_DTYPE_NAMES}", t.dtype, TypeError)
    if t.dim() < min_dim:
        raise fail(op, arg, f"at least {min_dim} dimension(s)", f"{t.dim()}-D {shape_str(t)}")
    return t


def same_dtype_device(op: str, arg: str, t: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    if t.dtype != like.dtype:
        raise fail(op, arg, f"dtype {like.dtype} (same as '{like_name}'); cast it first", t.dtype, TypeError)
    if t.device != like.device:
        raise fail(op, arg, f"device {like.device} (same as '{like_name}')", t.device)


def broadcasts_to(op: str, arg: str, t: torch.Tensor, target: torch.Size, target_name: str) -> None:
    """``t`` must broadcast to ``target`` without growing it (the output keeps ``target``'s shape)."""
    ok = t.dim() <= len(target) and all(
        s == 1 or s == g for s, g in zip(reversed(t.shape), reversed(target), strict=False)
    )
    if not ok:
        raise fail(op, arg, f"a shape that broadcasts to {target_name} [{', '.join(map(str, target))}]", shape_str(t))


def real_number(op: str, arg: str, value: object, *, minimum: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(op, arg, "a float", type(value).__name__, TypeError)
    expected = f"a number >= {minimum:g}" if minimum is not None else "a number"
    if value != value or (minimum is not None and value < minimum):
        raise fail(op, arg, expected, value)
    try:
        return float(value)
    except OverflowError:  # an int past float's range
        raise fail(op, arg, f"{expected} within float range", f"an int of {value.bit_length()} bits") from None


def choice(op: str, arg: str, value: object, options: tuple[str, ...]) -> str:
    if value not in options:
        raise fail(op, arg, " or ".join(repr(o) for o in options), repr(value))
    return value  # type: ignore[return-value]


def bad_call(op: str, signature: str, bind: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError | None:
    """The TypeError for a call that does not fit ``bind``'s parameters, naming the op and its
    signature (Python's own says ``bind() got ...``); None when the call fits, so a TypeError that
    bind raised for another reason stays as it is. Only the error path runs this."""
    params = inspect.signature(bind).parameters
    names = list(params)
    unknown = [name for name in kwargs if name not in params]
    twice = [name for name in names[: len(args)] if name in kwargs]
    missing = [name for name in names[len(args):]
               if name not in kwargs and params[name].default is inspect.Parameter.empty]  # fmt: skip
    if unknown:
        problem = f"unexpected keyword argument {unknown[0]!r}"
    elif len(args) > len(names):
        problem = f"takes at most {len(names)} positional arguments ({len(args)} given)"
    elif twice:
        problem = f"argument {twice[0]!r} given twice (by position and by keyword)"
    elif missing:
        problem = f"missing required argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}"
    else:
        return None
    return TypeError(f"{op}: {problem}; signature: {signature}")
