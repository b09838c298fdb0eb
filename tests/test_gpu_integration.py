"""On a GPU: the builtin backends resolve, verify and run; compiled graphs and CUDA graphs work."""

from __future__ import annotations

import pytest
import torch

import xbackend
from xbackend.testing import fresh_runtime

pytestmark = pytest.mark.gpu


@pytest.fixture
def builtin():
    with fresh_runtime(autoload=True) as rt:
        yield rt


def _block_inputs(rows: int = 4096, d: int = 3072):
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(2, rows, d, device="cuda", generator=g).bfloat16()
    scale, shift, gate = (torch.randn(2, 1, d, device="cuda", generator=g).bfloat16() * 0.1 for _ in range(3))
    return x, scale, shift, gate, torch.randn(d, device="cuda", generator=g).bfloat16()


def block(x, scale, shift, gate, w):
    h = xbackend.get_op("rmsnorm_modulate")(x, scale, shift, None, 1e-6, "diffusers")
    h = xbackend.get_op("rmsnorm")(h, w, 1e-6, "torch")
    return xbackend.get_op("gated_residual")(x, h, gate)


def reference_block(x, scale, shift, gate, w):
    n = x.float()
    n = (x * torch.rsqrt(n.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * (1 + scale) + shift
    n = torch.nn.functional.rms_norm(n, (x.shape[-1],), w, 1e-6)
    return x + n * gate


def test_fast_kernels_are_chosen_verified_and_exact(builtin) -> None:
    args = _block_inputs()
    assert torch.equal(block(*args), reference_block(*args))
    ran = {(e.op, e.impl): e.status for e in builtin.events}
    assert ran[("rmsnorm_modulate", "cuda:triton")] == "verified"
    assert ran[("rmsnorm", "cuda:triton")] == "verified"
    assert ran.get(("gated_residual", "cuda:cuda_vec")) == "verified" or ran.get(("gated_residual", "cuda:triton")) == "verified"


def test_fullgraph_compile_runs_the_fast_kernels(builtin) -> None:
    torch._dynamo.reset()
    args = _block_inputs(1024)
    compiled = torch.compile(block, fullgraph=True)
    assert torch.equal(compiled(*args), reference_block(*args))
    assert {e.status for e in builtin.events} == {"verified"}


def test_cuda_graph_capture_after_warmup(builtin) -> None:
    args = _block_inputs(512)
    static_out = block(*args)  # warm-up: verification happens here, before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = block(*args)
    fresh = _block_inputs(512)
    for dst, src in zip(args, fresh, strict=True):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(static_out, reference_block(*fresh))


def test_dispatch_on_each_visible_gpu(builtin) -> None:
    for i in range(torch.cuda.device_count()):
        x = torch.randn(64, 256, device=f"cuda:{i}", dtype=torch.bfloat16)
        assert torch.equal(xbackend.get_op("rmsnorm")(x), torch.nn.functional.rms_norm(x, (256,), None, 1e-6))
        assert builtin.device(torch.device("cuda", i)).arch.startswith("sm")


def _vendor_targets() -> tuple[object, list]:
    from xbackend.testing import conformance

    rt, found = conformance.targets("rocm" if torch.version.hip else "cuda")
    return rt, [t for t in found if t.device.type == "cuda"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("op", ["rmsnorm", "rmsnorm_modulate", "add_rmsnorm", "gated_residual", "silu_mul",
                                "rotary_embedding", "qk_norm_rope", "qk_norm_rope_3d"])
def test_the_vendor_backends_pointwise_impls_pass_the_kit_on_the_gpu(op: str) -> None:
    """Every case of the op's catalogue (padded, transposed and stride-0 views, aliased inputs, NaN/Inf,
    an offset past 2**31 elements where memory allows) through the vendor backend's impls against the
    device's own eager reference, each at its declared precision."""
    from xbackend.testing import conformance

    rt, found = _vendor_targets()
    mine = [t for t in found if t.impl.op == op]
    assert mine, f"no {op} impl registered for this GPU"
    failures: list[str] = []
    for target in mine:
        failures += [f for f in conformance.check(rt, target)[0] if ": SKIP " not in f]
    assert not failures, "\n".join(failures)
