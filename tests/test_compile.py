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
