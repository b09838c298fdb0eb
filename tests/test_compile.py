"""torch.compile sees one opaque node per op: no graph break, the custom op in the graph."""

from __future__ import annotations

import torch

import xbackend


def block(x, scale, shift, gate, w):
    h = xbackend.get_op("rmsnorm_modulate")(x, scale, shift, w, flavour="diffusers")
    h = xbackend.get_op("rmsnorm")(h, w)
    return xbackend.get_op("gated_residual")(x, h, gate)


def test_fullgraph_compile_has_no_graph_break_and_matches_eager() -> None:
    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 16, 64, generator=g)
    scale, shift, gate = (torch.randn(2, 1, 64, generator=g) for _ in range(3))
    w = torch.randn(64, generator=g)
    compiled = torch.compile(block, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(x, scale, shift, gate, w), block(x, scale, shift, gate, w))


def test_graph_holds_the_custom_ops() -> None:
    torch._dynamo.reset()
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    q = torch.randn(1, 6, 6, 2, 8)
    fn = torch.compile(lambda q: xbackend.get_op("neighborhood_attention")(q, q, q, 3), fullgraph=True, backend=backend)
    fn(q)
    assert any("xbackend.neighborhood_attention" in s for s in seen)


def test_inductor_compiles_the_block() -> None:
    torch._dynamo.reset()
    x = torch.randn(2, 8, 32)
    s = torch.randn(2, 1, 32)
    w = torch.randn(32)
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(x, s, s, s, w), block(x, s, s, s, w))


def test_real_tensors_inside_a_compile_session_do_not_recurse() -> None:
    """A backend that runs the graph on real tensors while compiling (benchmarking, validation) calls the
    inference op's kernel while torch.compiler.is_compiling() is still true: it must run the op, not
    route back to the inference op."""
    rms = xbackend.get_op("rmsnorm")
    x, w = torch.randn(4, 64), torch.randn(64)

    def backend(gm: torch.fx.GraphModule, example_inputs):
        gm(*[torch.randn(t.shape) if isinstance(t, torch.Tensor) else t for t in example_inputs])
        return gm

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(lambda x, w: rms(x, w, 1e-6, "torch"), backend=backend)(x, w)
    assert torch.equal(out, rms(x, w, 1e-6, "torch"))


def test_strided_reference_outputs_meet_the_fake_layout() -> None:
    """The diffusers RMSNorm of a transposed input is strided in eager; the fake impls promise contiguous
    outputs and inductor checks that promise."""
    qk = xbackend.get_op("qk_norm_rope")

    def f(t, k, w, cos, sin):
        a, b = qk(t.transpose(0, 1), k.transpose(0, 1), w, w, cos, sin, 1e-6, "diffusers")
        return a + 1, b

    args = (torch.randn(5, 2, 64), torch.randn(5, 2, 64), torch.randn(64), torch.randn(5, 64), torch.randn(5, 64))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(f)(*args)
        assert all(torch.equal(a, b) for a, b in zip(out, f(*args), strict=True))


def test_a_second_op_object_reuses_the_inference_registration() -> None:
    from xbackend._api import Op
    from xbackend.ops import OPS

    first, second = Op(OPS["rmsnorm"]), Op(OPS["rmsnorm"])
    assert first._infer_op is second._infer_op
