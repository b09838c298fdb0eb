"""The record each op file builds (how to bind, check, key, verify and plan one op) and ``define_op``,
which builds it with everything torch needs of the op."""

from __future__ import annotations

import functools
import inspect
import keyword
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ._active import dispatch
from ._guard import ALIGN, alignment
from ._precision import Output, Precision, compare

__all__ = ["OpSpec", "contiguous", "define_op", "describe_args", "make_key", "register_inference_op",
           "register_reference_autograd", "tensor_sig"]


def tensor_sig(t: torch.Tensor | None) -> tuple[Any, ...] | None:
    """What a runtime key needs of a tensor: two tensors with equal sigs pass the same checks and
    take the same kernel path (``alignment``: the data pointer's alignment class, or None for a
    tensor the guard cannot copy)."""
    if t is None:
        return None
    return (t.shape, t.stride(), t.dtype, t.device, alignment(t))


@dataclass(frozen=True)
class OpSpec:
    """One abstract op (an op file builds it with ``define_op``). ``bind`` turns a caller's
    ``(*args, **kwargs)`` into the normalized positional tuple every other field (and every impl) takes."""

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

    @functools.cached_property
    def arg_names(self) -> tuple[str, ...]:
        """The op's argument names, in ``bind``'s order (what guard and test messages call them)."""
        return tuple(inspect.signature(self.bind).parameters)

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
            return self.verify(out, args, precision) or _layout(out)
        return compare(out, self.reference(*args), precision) or _layout(out)


def _layout(out: Output) -> str | None:
    """Why ``out``'s layout breaks the op's, or None: every output tensor is contiguous, as the fake
    impls promise the compiler and the reference returns (``define_op`` makes it so). A value check
    alone would let a view into padded rows through to eager callers."""
    for j, o in enumerate(out if isinstance(out, (tuple, list)) else (out,)):
        if isinstance(o, torch.Tensor) and not o.is_contiguous():
            return f"output {j} has strides {tuple(o.stride())}; expected contiguous"
    return None


def describe_args(args: tuple[Any, ...]) -> str:
    """A short, stable description of one runtime key for reports and logs."""
    parts = []
    for a in args:
        if isinstance(a, torch.Tensor):
            dtype = str(a.dtype).removeprefix("torch.")
            layout = "" if a.is_contiguous() else " strided"
            parts.append(f"{dtype}[{','.join(map(str, a.shape))}]{layout}{_described_alignment(a)}")
        elif a is None:
            parts.append("-")
        else:
            parts.append(repr(a))
    return " ".join(parts)


def _described_alignment(t: torch.Tensor) -> str:
    """What a description says of ``t``'s alignment class: nothing at 16 bytes or more (the alignment
    vector loads, TMA and Triton's pointer specialisation test), else the class; "uncopyable" for a
    tensor the guard cannot copy."""
    try:
        found = alignment(t)
    except RuntimeError:  # no data pointer (sparse, MKL-DNN): the op's check refuses it
        return ""
    if found is None:
        return " uncopyable"
    return f" align {found}" if found < 16 else ""


_INFER_LIBS: dict[str, torch.library.Library] = {}  # namespace -> its library (the registrations live with it)
_INFER_OPS: dict[str, Any] = {}  # op name -> the registered overload
_INFER_CALLS: dict[str, Callable[..., Output]] = {}  # op name -> what its kernel runs (the latest registration's)


def register_inference_op(spec: OpSpec, call: Callable[..., Output], namespace: str = "xbackend") -> Callable[..., Output]:
    """``<namespace>::<name>_infer``: the op again, for calls that need no gradient under ``torch.compile``.

    Same schema and fake impl as ``spec.custom_op``, one kernel at CompositeExplicitAutograd that runs
    ``call`` (the op's eager entry point: the runtime's dispatch, or ``Op._eager``, its cached dispatch),
    and nothing else: ``torch.library.custom_op`` wraps every call in Python autograd, aliasing and
    device layers that cost ~14 µs of host time per call (measured on CPU), which a compiled DiT block
    with ~40 xbackend calls pays on every step. Outputs never alias inputs (every impl and reference
    allocates its result), which the schema's lack of alias annotations promises. Returns the op
    overload to call; ``spec.custom_op`` when the spec has no fake impl. Registered once per op and
    process; a later call (a second ``Op`` of the spec) only replaces ``call``.
    """
    if spec.fake is None:
        return spec.custom_op
    existing = _INFER_OPS.get(spec.name)
    if existing is not None:
        _INFER_CALLS[spec.name] = call
        return existing
    lib = _INFER_LIBS.get(namespace)
    if lib is None:
        lib = _INFER_LIBS[namespace] = torch.library.Library(namespace, "FRAGMENT")
    name, op_name = f"{spec.name}_infer", spec.name
    schema = getattr(getattr(torch.ops, namespace), spec.name).default._schema
    lib.define(str(schema).replace(f"{namespace}::{spec.name}(", f"{name}(", 1))
    _INFER_CALLS[op_name] = call
    lists = any(isinstance(a.type, torch.ListType) for a in schema.arguments)

    def kernel(*args: Any) -> Output:
        return contiguous(_INFER_CALLS[op_name](*(_tuples(args) if lists else args)))

    lib.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"{namespace}::{name}", spec.fake, lib=lib)
    _INFER_OPS[op_name] = getattr(getattr(torch.ops, namespace), name).default
    return _INFER_OPS[op_name]


def _contiguous_reference(reference: Callable[..., Output]) -> Callable[..., Output]:
    """``reference`` with contiguous outputs: eager calls then return the layout a compiled graph does
    (an elementwise reference would keep a transposed input's strides)."""

    @functools.wraps(reference)
    def contiguous_reference(*args: Any) -> Output:
        return contiguous(reference(*args))

    return contiguous_reference


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
        bound = list(_tuples(inputs))  # the reference takes bound arguments: tuples, not the dispatcher's lists
        # Tensors through save_for_backward, so autograd's version check refuses a backward after an
        # input was modified in place (as eager PyTorch does) instead of differentiating new values.
        ctx.save_for_backward(*[bound[i] for i in tensor_args])
        for i in tensor_args:
            bound[i] = None
        ctx.inputs = bound

    def backward(ctx: Any, *grad_outs: Any) -> tuple[Any, ...]:
        inputs = list(ctx.inputs)
        for i, t in zip(tensor_args, ctx.saved_tensors, strict=True):
            inputs[i] = t
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


# -- one call defines an op --------------------------------------------------------------------------
def define_op(
    name: str,
    *,
    bind: Callable[..., tuple[Any, ...]],
    check: Callable[..., None],
    reference: Callable[..., Output],
    fake: Callable[..., Output],
    example: Callable[[torch.dtype, torch.device], tuple[Any, ...]],
    cases: Callable[[torch.dtype, torch.device, bool], list[Any]] | None = None,
    verify: Callable[[Output, tuple[Any, ...], Precision], str | None] | None = None,
    tolerant: bool = False,
    normalizes: bool = False,
    tensor_args: tuple[int, ...] | None = None,
    key: Callable[..., tuple[Any, ...]] | None = None,
    signature: str | None = None,
    namespace: str = "xbackend",
) -> OpSpec:
    """The op ``name``'s :class:`OpSpec`, with everything torch needs of it registered.

    ``bind``'s signature is the op's: callers pass its parameters, every other function takes them
    bound, positionally. Its annotations give the custom op's schema: ``torch.Tensor`` and
    ``torch.Tensor | None`` are the tensor arguments (``tensor_args``, unless given); ``float``, ``int``,
    ``bool``, ``str``, each maybe ``| None``, are scalars; a union holding ``tuple[T, ...]`` or
    ``list[T]`` is a ``T[]`` that ``bind`` turns into a tuple (``normalizes=True`` then: bind is never
    skipped). ``fake``'s return annotation (``torch.Tensor`` or a tuple of them) is the schema's output.

    Registers the custom op ``<namespace>::<name>`` (``mutates_args=()``: every impl and the reference
    allocate their outputs), whose kernel is the runtime's dispatch and whose outputs are contiguous;
    ``fake`` as its fake impl (called with tuples where the dispatcher passes lists, as every other
    function is); the reference's gradients (``register_reference_autograd``); and the inference twin
    (``register_inference_op``). The runtime key is ``make_key``'s unless ``key`` is given; the signature
    shown in errors is bind's unless ``signature`` is given.
    """
    params = list(inspect.signature(bind).parameters.values())
    names = [p.name for p in params]
    if any(p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params):
        raise TypeError(f"define_op({name!r}): bind's parameters must be positional (no *args, keyword-only or **kwargs)")
    fake_names = list(inspect.signature(fake).parameters)
    if fake_names != names:
        raise TypeError(f"define_op({name!r}): fake takes ({', '.join(fake_names)}), bind ({', '.join(names)})")
    hints = typing.get_type_hints(bind)
    schema = [_schema_type(name, p.name, hints.get(p.name, inspect.Parameter.empty)) for p in params]
    output = typing.get_type_hints(fake).get("return", inspect.Signature.empty)
    if output is not torch.Tensor and not (typing.get_origin(output) is tuple and typing.get_args(output)
                                           and all(t is torch.Tensor for t in typing.get_args(output))):
        raise TypeError(f"define_op({name!r}): fake's return annotation expected torch.Tensor or a tuple of them "
                        f"(tuple[torch.Tensor, torch.Tensor]), got {output}")
    if tensor_args is None:
        tensor_args = tuple(i for i, t in enumerate(schema) if t in (torch.Tensor, torch.Tensor | None))
    lists = any(typing.get_origin(t) is list for t in schema)
    holder: list[OpSpec] = []  # the spec the kernel dispatches, made once the custom op exists

    def kernel(*args: Any) -> Output:
        out = dispatch(holder[0], _tuples(args) if lists else args)
        return contiguous(out) if isinstance(out, torch.Tensor) else tuple(contiguous(out))  # what the fake promises

    kernel.__name__ = kernel.__qualname__ = f"{name}_op"
    kernel.__module__ = bind.__module__
    kernel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t) for n, t in zip(names, schema, strict=True)],
        return_annotation=output)
    custom_op = torch.library.custom_op(f"{namespace}::{name}", kernel, mutates_args=())
    fake_kernel = (lambda *args: fake(*_tuples(args))) if lists else fake
    custom_op.register_fake(fake_kernel)
    spec = OpSpec(
        name=name, bind=bind, check=check, reference=_contiguous_reference(reference), example=example,
        custom_op=custom_op,
        key=key if key is not None else make_key(name, names, tensor_args,
                                                 {i for i in tensor_args if schema[i] != torch.Tensor}),
        tensor_args=tensor_args, signature=signature or _signature(name, params), tolerant=tolerant,
        positional_arity=None if normalizes else len(params), verify=verify, fake=fake_kernel, cases=cases,
    )
    holder.append(spec)
    register_reference_autograd(custom_op, reference, tensor_args)
    register_inference_op(spec, _dispatcher(spec), namespace)
    return spec


def make_key(name: str, params: list[str], tensor_args: tuple[int, ...], optional: set[int] | frozenset[int] = frozenset()
             ) -> Callable[..., tuple[Any, ...]]:
    """The runtime key of one op's bound arguments (positional or by name), as one flat function.

    ``(name, ...)`` then, per position: a tensor's ``shape, stride(), dtype, device`` and the alignment
    class of its data pointer (``_guard.alignment``: None for a tensor the guard cannot copy; five
    items); at an ``optional`` position, None or those five as a tuple; any other argument followed by
    its type tag, its type or for a tuple its elements' types (``_fastkey.cpp``'s ``type_tag``):
    ``1.0 == True`` and ``(3, 3) == (3.0, 3.0)``, while ``check()`` accepts one of each only. Every
    position reads back unambiguously, so two keys are equal iff every position's metadata, value and
    tag are, which is what makes the C++ key (same positions, same tags) equal exactly when this one is.

    The function is generated (its source is its ``__doc__``): it runs on every eager call, and a loop
    over the positions costs about twice as much host time as the flat tuple. A plain tensor's class
    is read inline (its data pointer, then a table of the classes by address modulo ``ALIGN``: 80 ns
    a tensor against 145 ns through ``alignment``, 2-core CPU, torch 2.13.0 CPU); anything else
    (a Parameter, a subclass, a null pointer, a BatchedTensor whose ``data_ptr()`` raises) goes
    through ``alignment``.
    """
    reserved = ("_type", "_tuple", "_map", "_align", "_classes", "_tensor", "_a")
    bad = [p for p in params if not p.isidentifier() or keyword.iskeyword(p) or p in reserved]
    if bad:
        raise ValueError(f"make_key({name!r}): {bad} cannot be parameter names (not identifiers, or the key's builtins)")

    def items(inline: bool) -> str:
        out = [repr(name)]
        for i, p in enumerate(params):
            if i not in tensor_args:
                out.append(f"{p}, (_tuple(_map(_type, {p})) if _type({p}) is _tuple else _type({p}))")
                continue
            align = (f"(_classes[_a & {ALIGN - 1}] if _type({p}) is _tensor and (_a := {p}.data_ptr()) else _align({p}))"
                     if inline else f"_align({p})")
            meta = f"{p}.shape, {p}.stride(), {p}.dtype, {p}.device, {align}"
            out.append(f"(None if {p} is None else ({meta}))" if i in optional else meta)
        return ", ".join(out)

    source = (f"def key({', '.join(params)}):\n    try:\n        return ({items(True)})\n"
              f"    except RuntimeError:\n        return ({items(False)})\n")
    namespace: dict[str, Any] = {"_type": type, "_tuple": tuple, "_map": map, "_align": alignment,
                                 "_tensor": torch.Tensor, "_classes": _CLASSES}
    exec(compile(source, f"<xbackend key of {name}>", "exec"), namespace)  # the source holds only identifiers checked above
    fn = namespace["key"]
    fn.__qualname__ = f"key[{name}]"
    fn.__doc__ = source
    return fn


# The alignment class of every address modulo ALIGN (a multiple of ALIGN, or null, is ALIGN itself).
_CLASSES = tuple(a & -a if a else ALIGN for a in range(ALIGN))


def _schema_type(op: str, param: str, annotation: Any) -> Any:
    """The schema type (as ``torch.library.infer_schema`` reads it) of one of bind's annotations."""
    members = typing.get_args(annotation) if typing.get_origin(annotation) in (typing.Union, types.UnionType) else (annotation,)
    optional = type(None) in members
    rest = [m for m in members if m is not type(None)]
    sequences = {typing.get_args(m)[0] for m in rest if typing.get_origin(m) in (tuple, list) and typing.get_args(m)}
    if len(sequences) == 1:
        (element,) = sequences
        if all(m == element or typing.get_origin(m) in (tuple, list) for m in rest) and element in (int, float, bool):
            base: Any = list[element]  # type: ignore[valid-type]
        else:
            base = None
    elif len(rest) == 1 and rest[0] in (torch.Tensor, float, int, bool, str):
        base = rest[0]
    else:
        base = None
    if base is None:
        raise TypeError(f"define_op({op!r}): bind's annotation of {param!r} ({annotation}) has no schema type; expected "
                        "torch.Tensor, float, int, bool or str, maybe | None, or T | tuple[T, ...] | list[T] for T int, "
                        "float or bool")
    return base | None if optional else base


def _signature(name: str, params: list[inspect.Parameter]) -> str:
    def literal(v: Any) -> str:
        if isinstance(v, str):
            return f'"{v}"' if '"' not in v else repr(v)
        if isinstance(v, float):
            return repr(v).replace("e-0", "e-").replace("e+0", "e+")
        return repr(v)

    parts = [p.name if p.default is inspect.Parameter.empty else f"{p.name}={literal(p.default)}" for p in params]
    return f"{name}({', '.join(parts)})"


def _tuples(args: tuple[Any, ...]) -> tuple[Any, ...]:
    # The dispatcher hands int[]/bool[] over as lists; bound arguments (and keys) hold tuples.
    return tuple([tuple(a) if type(a) is list else a for a in args])


def _dispatcher(spec: OpSpec) -> Callable[..., Output]:
    def call(*args: Any) -> Output:
        return dispatch(spec, args)

    return call
