"""add_layernorm: the (gated) residual then layernorm_modulate of its rounded sum bit for bit (Flux.2's
and Qwen-Image's half blocks, Wan's float32 gate), argument checks, the custom op, and the conformance kit
over the op's cases (the reference and a norm of the unrounded sum)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPES, run_kit

import xbackend
from xbackend.ops import OPS
from xbackend.ops import add_layernorm as mod

add_ln = xbackend.get_op("add_layernorm")
ln_mod = xbackend.get_op("layernorm_modulate")


def _r(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("modulated", [False, True])
def test_is_the_residual_then_the_norm_op(dtype, gated, modulated) -> None:
    x, u = _r(2, 7, 64, dtype=dtype), _r(2, 7, 64, dtype=dtype, seed=1)
    gate = _r(2, 1, 64, dtype=dtype, seed=2) if gated else None
    sc, sh = (_r(2, 1, 64, dtype=dtype, seed=3, scale=0.3), _r(2, 1, 64, dtype=dtype, seed=4)) if modulated else (None, None)
    h, y = add_ln(x, u, gate, None, None, 1e-6, "torch", sc, sh)
    assert h.dtype == y.dtype == dtype and h.is_contiguous() and y.is_contiguous()
    want_h = x + gate * u if gated else x + u  # Flux.2 writes gate * attn_output
    assert torch.equal(h, want_h)
    normed = F.layer_norm(want_h, (64,), None, None, 1e-6)
    assert torch.equal(y, normed if sc is None else normed * (1 + sc) + sh)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_wan_float32_gate_and_fp32_norm(dtype) -> None:
    """Wan: ``(x.float() + attn * gate).type_as(x)`` with a float32 gate, then the fp32 LayerNorm of it."""
    x, u = _r(2, 5, 48, dtype=dtype), _r(2, 5, 48, dtype=dtype, seed=1)
    table = _r(2, 6, 48, seed=2)
    shift, scale, gate = table.chunk(6, dim=1)[:3]
    w, b = _r(48, seed=3), _r(48, seed=4)
    h, y = add_ln(x, u, gate, w, b, 1e-6, "fp32")
    want_h = (x.float() + u * gate).type_as(x)
    assert torch.equal(h, want_h) and not torch.equal(h, x + u * gate.to(dtype))
    assert torch.equal(y, F.layer_norm(want_h.float(), (48,), w, b, 1e-6).type_as(x))
    h, y = add_ln(x, u, None, None, None, 1e-6, "fp32", scale, shift)
    assert torch.equal(y, (F.layer_norm((x + u).float(), (48,), None, None, 1e-6) * (1 + scale) + shift).type_as(x))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_norm_reads_the_rounded_sum(dtype) -> None:
    x, u = _r(64, 256, dtype=dtype), _r(64, 256, dtype=dtype, seed=1)
    _, y = add_ln(x, u)
    unrounded = F.layer_norm(x.float() + u.float(), (256,), None, None, 1e-6).to(dtype)
    assert torch.equal(y, ln_mod(x + u)) and not torch.equal(y, unrounded)


def test_index_selects_gate_scale_and_shift_per_token() -> None:
    x, u = _r(2, 6, 32), _r(2, 6, 32, seed=1)
    gate, scale, shift = _r(2, 2, 32, seed=2), _r(2, 2, 32, seed=3), _r(2, 2, 32, seed=4)
    index = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 0, 0, 0, 1, 1]])

    def sel(t):
        return torch.where(index.unsqueeze(-1) == 0, t[0].unsqueeze(1), t[1].unsqueeze(1))

    h, y = add_ln(x, u, gate, None, None, 1e-6, "torch", scale, shift, index)
    assert torch.equal(h, x + sel(gate) * u)
    assert torch.equal(y, F.layer_norm(h, (32,), None, None, 1e-6) * (1 + sel(scale)) + sel(shift))
    h2, y2 = add_ln(x, u, gate, None, None, 1e-6, "torch", None, None, index)  # gate selected, norm plain
    assert torch.equal(h2, h) and torch.equal(y2, F.layer_norm(h, (32,), None, None, 1e-6))


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((torch.randn(2, 4, 8), torch.randn(2, 4, 1)), {}, ValueError,
         r"add_layernorm: argument 'update' expected the shape of 'x' \[2, 4, 8\] \(no broadcasting\), got shape \[2, 4, 1\]"),
        ((torch.randn(2, 8).bfloat16(), torch.randn(2, 8).bfloat16(), torch.randn(8, dtype=torch.float16)), {}, TypeError,
         r"add_layernorm: argument 'gate' expected dtype torch.bfloat16 \(same as 'x'\); cast it first, got torch.float16"),
        ((torch.randn(2, 8), torch.randn(2, 8), torch.randn(3, 8)), {}, ValueError,
         r"add_layernorm: argument 'gate' expected a shape that broadcasts to x \[2, 8\], got shape \[3, 8\]"),
        ((torch.randn(2, 8), torch.randn(2, 8)), {"scale": torch.randn(8)}, ValueError,
         r"add_layernorm: argument 'shift' expected a tensor, as 'scale' is given"),
        ((torch.randn(2, 3, 8), torch.randn(2, 3, 8)), {"index": torch.zeros(2, 3, dtype=torch.long)}, ValueError,
         r"add_layernorm: argument 'index' expected None when there is no gate, scale or shift to select"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_op_and_argument(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        add_ln(*args, **kwargs)


def test_spec() -> None:
    spec = OPS["add_layernorm"]
    assert spec is mod.SPEC
    assert spec.arg_names == ("x", "update", "gate", "weight", "bias", "eps", "flavour", "scale", "shift", "index")
    assert spec.signature.startswith("add_layernorm(x, update, gate=None, weight=None, bias=None, eps=1e-6")


def test_custom_op_and_inference_op_pass_opcheck() -> None:
    x, u, g = _r(2, 5, 16), _r(2, 5, 16, seed=1), _r(2, 1, 16, seed=2)
    torch.library.opcheck(mod.add_layernorm_op, (x, u, g, None, None, 1e-6, "torch", g, g, None))
    torch.library.opcheck(torch.ops.xbackend.add_layernorm_infer.default, (x, u, None, None, None, 1e-6, "fp32", None, None, None),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_compiled_call_is_one_inference_node_without_grad() -> None:
    x, u, g = _r(2, 5, 16), _r(2, 5, 16, seed=1), _r(2, 1, 16, seed=2)
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs) -> object:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    fn = torch.compile(lambda a, b, c: add_ln(a, b, c, scale=c, shift=c), backend=backend, fullgraph=True)
    with torch.no_grad():
        h, y = fn(x, u, g)
    want = mod.reference(x, u, g, None, None, 1e-6, "torch", g, g, None)
    assert "xbackend.add_layernorm_infer.default" in seen and torch.equal(h, want[0]) and torch.equal(y, want[1])
    torch._dynamo.reset()


# -- the conformance kit ------------------------------------------------------------------------------
def _plugin(name: str, fn):
    class _Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="add_layernorm", name=name, fn=fn, devices="cpu")

    return ("suspect", _Plugin())


def test_every_case_passes_the_kit_with_the_reference() -> None:
    failures, ran, _ = run_kit(_plugin("copy", mod.reference))
    assert failures == [] and ran == sum(len(mod.cases(dt, torch.device("cpu"), False)) for dt in DTYPES)


def test_the_kit_catches_a_norm_of_the_unrounded_sum() -> None:
    def unrounded(x, update, gate, weight, bias, eps, flavour, scale, shift, index):
        s = x.float() + (update.float() if gate is None else update.float() * mod._ln.select(gate, index).float())
        h = s.to(x.dtype)
        y = mod._ln.reference(s, scale, shift, weight, bias, eps, "fp32", index if scale is not None else None) \
            if flavour == "fp32" else F.layer_norm(s, (s.shape[-1],), None if weight is None else weight.float(),
                                                   None if bias is None else bias.float(), eps)
        if flavour == "torch" and scale is not None:
            y = y * (1 + mod._ln.select(scale, index).float()) + mod._ln.select(shift, index).float()
        return h, y.to(x.dtype)

    failures, _, _ = run_kit(_plugin("unrounded", unrounded))
    assert any("add_layernorm:suspect:unrounded:cpu:bfloat16 case 'torch/plain add, no modulation': output 1: not bit-identical"
               in f for f in failures), failures[:3]
