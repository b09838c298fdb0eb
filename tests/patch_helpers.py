"""Shared by the per-family patch tests (test_patch_wan.py, test_patch_flux2.py, test_patch_qwenimage.py).

On CPU every op resolves to its reference, so torch.equal between the patched and the stock model
proves the rewrite itself; the op-call spy proves the sites are live (the fused op ran, not the
written expression)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

from xbackend.patching import _common, _layernorm

# op name -> (module holding the op object the patches call, attribute)
SPIED = {
    "rmsnorm": (_common, "_RMSNORM"),
    "gated_residual": (_common, "_GATED_RESIDUAL"),
    "rotary_embedding": (_common, "_ROTARY"),
    "silu_mul": (_common, "_SILU_MUL"),
    "layernorm_modulate": (_layernorm, "_LAYERNORM_MODULATE"),
    "add_layernorm": (_layernorm, "_ADD_LAYERNORM"),
}


def spy_ops(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of each fused op from the patched code."""
    calls = dict.fromkeys(SPIED, 0)
    for name, (module, attr) in SPIED.items():
        op = getattr(module, attr)

        def spy(*args: Any, _op: Any = op, _name: str = name) -> Any:
            calls[_name] += 1
            return _op(*args)

        monkeypatch.setattr(module, attr, spy)
    return calls


def run(model: nn.Module, inputs: dict[str, Any]) -> tuple[torch.Tensor, ...]:
    with torch.no_grad():
        out = model(**inputs)
    return tuple(t for t in out if isinstance(t, torch.Tensor))


def assert_equal(a: Any, b: Any) -> None:
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y), f"max |diff| {(x.float() - y.float()).abs().max().item()}"


def randomize_norms(model: nn.Module, seed: int = 0) -> None:
    """Affine norms start at ones and zeros; random values make their rounding visible."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        if any("norm" in part for part in name.split(".")[:-1]):
            weight = name.endswith("weight")
            value = torch.rand(p.shape, generator=g) + 0.5 if weight else torch.randn(p.shape, generator=g) * 0.1
            p.data.copy_(value)


def overrides(model: nn.Module) -> dict[str, Any]:
    return {name: m.__dict__["forward"] for name, m in model.named_modules() if "forward" in m.__dict__}


def block_inputs(model: nn.Module, block: nn.Module, call: Callable[[], Any]) -> dict[str, Any]:
    """The keyword arguments ``block`` receives while ``call()`` runs the model."""
    captured: dict[str, Any] = {}

    def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        names = list(type(block).forward.__code__.co_varnames[1 : 1 + len(args)])
        captured.update(dict(zip(names, args, strict=True)), **kwargs)

    handle = block.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        call()
    handle.remove()
    return captured


def compiled_ops(module: nn.Module, kwargs: dict[str, Any]) -> tuple[Any, set[str]]:
    """``module(**kwargs)`` through ``torch.compile(fullgraph=True)`` with a backend that records the
    graph's call targets (no inductor: the graph itself is the test)."""
    seen: set[str] = set()

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Any:
        seen.update(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(module, fullgraph=True, backend=backend)(**kwargs)
    return out, seen
