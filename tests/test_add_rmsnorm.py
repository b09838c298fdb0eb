"""add_rmsnorm: eager ``h = x + update`` then the norm of ``h`` (plain or modulated) bit for bit, a
float64 formula, argument checks, the custom op, and the conformance kit over the op's cases (the
reference, a wrong impl, and the Triton kernel under the interpreter)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers import DTYPES, TOL, rmsnorm64, run_kit

import xbackend
from xbackend.ops import OPS
from xbackend.ops import add_rmsnorm as mod

add_rmsnorm = xbackend.get_op("add_rmsnorm")
rmsnorm = xbackend.get_op("rmsnorm")
modulate = xbackend.get_op("rmsnorm_modulate")
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _inputs(shape, dtype=torch.float32, seed=0, modulated=False):
    g = torch.Generator().manual_seed(seed)
    x, u = (torch.randn(shape, generator=g).to(dtype) for _ in range(2))
    w = torch.randn(shape[-1], generator=g).to(dtype)
    if not modulated:
        return x, u, w, None, None
    mod_shape = (shape[0], *([1] * (len(shape) - 2)), shape[-1])
    return x, u, w, *((0.3 * torch.randn(mod_shape, generator=g)).to(dtype) for _ in range(2))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("flavour", ["torch", "diffusers"])
@pytest.mark.parametrize("modulated", [False, True])
@pytest.mark.parametrize("shape", [(2, 7, 64), (1, 2, 3, 4, 40)])
def test_is_the_add_then_the_norm_op(shape, modulated, flavour, dtype) -> None:
    x, u, w, sc, sh = _inputs(shape, dtype, modulated=modulated)
    h, y = add_rmsnorm(x, u, w, 1e-6, flavour, sc, sh)
    assert h.dtype == y.dtype == dtype and h.shape == y.shape == x.shape and h.is_contiguous() and y.is_contiguous()
    assert torch.equal(h, x + u)
    s = x + u
    if flavour == "torch":
        normed = torch.nn.functional.rms_norm(s, (shape[-1],), w, 1e-6)
    else:  # diffusers' RMSNorm.forward, written out
        normed = (s * torch.rsqrt(s.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    assert torch.equal(y, normed if sc is None else normed * (1 + sc) + sh)
    assert {h.data_ptr(), y.data_ptr()}.isdisjoint({x.data_ptr(), u.data_ptr()})


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_norm_reads_the_rounded_sum(dtype) -> None:
    """The sum is rounded to the dtype before the norm reads it, as eager's two ops do: the norm of the
    fp32 sum differs on some rows."""
    x, u, w, _, _ = _inputs((64, 256), dtype, seed=1)
    _, y = add_rmsnorm(x, u, w)
    unrounded = torch.nn.functional.rms_norm(x.float() + u.float(), (256,), w.float(), 1e-6).to(dtype)
    assert torch.equal(y, rmsnorm(x + u, w)) and not torch.equal(y, unrounded)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_formula(dtype) -> None:
    x, u, w, sc, sh = _inputs((3, 5, 48), dtype, seed=2, modulated=True)
    h, y = add_rmsnorm(x, u, w, scale=sc, shift=sh)
    h64 = x.double() + u.double()
    torch.testing.assert_close(h.double(), h64, **TOL[dtype])
    want = rmsnorm64(h, w, 1e-6) * (1 + sc.double()) + sh.double()
    torch.testing.assert_close(y.double(), want, **{k: 3 * v for k, v in TOL[dtype].items()})


def test_strided_inputs_give_contiguous_outputs() -> None:
    x = torch.randn(16, 8).t()  # [8, 16] transposed: eager's x + u comes out transposed too
    u = torch.randn(16, 8).t()
    h, y = add_rmsnorm(x, u, None, 1e-6, "diffusers")
    assert h.is_contiguous() and torch.equal(h, x + u)
    assert torch.equal(y, rmsnorm((x + u).contiguous(), None, 1e-6, "diffusers"))


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((torch.randn(2, 4, 8), torch.randn(2, 4, 1)), {}, ValueError,
         r"add_rmsnorm: argument 'update' expected the shape of 'x' \[2, 4, 8\] \(no broadcasting\), got shape \[2, 4, 1\]"),
        ((torch.randn(2, 8), torch.randn(2, 8, dtype=torch.bfloat16)), {}, TypeError,
         r"add_rmsnorm: argument 'update' expected dtype torch.float32 \(same as 'x'\); cast it first, got torch.bfloat16"),
        ((torch.randn(2, 8), torch.randn(2, 8)), {"scale": torch.randn(8)}, ValueError,
         r"add_rmsnorm: argument 'shift' expected a tensor, as 'scale' is given \(modulate with both or neither\), got None"),
        ((torch.randn(2, 8), torch.randn(2, 8)), {"scale": torch.randn(3, 8), "shift": torch.randn(8)}, ValueError,
         r"add_rmsnorm: argument 'scale' expected a shape that broadcasts to x \[2, 8\], got shape \[3, 8\]"),
        ((torch.randn(2, 8), torch.randn(2, 8), torch.randn(4)), {}, ValueError,
         r"add_rmsnorm: argument 'weight' expected shape \[8\] \(the last dim of 'x'\), got shape \[4\]"),
        ((torch.randn(2, 8), torch.randn(2, 8)), {"flavour": "apex"}, ValueError, r"add_rmsnorm: argument 'flavour'"),
        ((torch.randn(2, 8), [1.0] * 8), {}, TypeError, r"add_rmsnorm: argument 'update' expected a torch.Tensor, got list"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_op_and_argument(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        add_rmsnorm(*args, **kwargs)


def test_spec() -> None:
    spec = OPS["add_rmsnorm"]
    assert spec is mod.SPEC and spec.arg_names == ("x", "update", "weight", "eps", "flavour", "scale", "shift")
    assert spec.tensor_args == (0, 1, 2, 5, 6)
    assert spec.signature == 'add_rmsnorm(x, update, weight=None, eps=1e-6, flavour="torch", scale=None, shift=None)'
    x, u, w, _, flavour, sc, sh = spec.example(torch.bfloat16, torch.device("meta"))
    assert x.shape == u.shape == (1, 40, 96, 96, 256) and w.shape == (256,) and flavour == "torch"
    assert sc.shape == sh.shape == (1, 1, 1, 1, 256)
    assert "add_rmsnorm" in xbackend.list_ops()


def test_custom_op_and_inference_op_pass_opcheck() -> None:
    x, u, w, sc, sh = _inputs((2, 5, 16), modulated=True)
    torch.library.opcheck(mod.add_rmsnorm_op, (x, u, w, 1e-6, "torch", sc, sh))
    torch.library.opcheck(mod.add_rmsnorm_op, (x, u, None, 1e-6, "diffusers", None, None))
    torch.library.opcheck(torch.ops.xbackend.add_rmsnorm_infer.default, (x, u, w, 1e-6, "torch", None, None),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_gradients_are_the_references() -> None:
    x, u, w, sc, sh = _inputs((2, 5, 16), modulated=True)
    leaves = [t.clone().requires_grad_(True) for t in (x, u, w, sc, sh)]
    h, y = add_rmsnorm(leaves[0], leaves[1], leaves[2], 1e-6, "torch", leaves[3], leaves[4])
    (h.sin().sum() + (y * torch.arange(16.0)).sum()).backward()
    ref = [t.clone().requires_grad_(True) for t in (x, u, w, sc, sh)]
    rh, ry = mod.reference(ref[0], ref[1], ref[2], 1e-6, "torch", ref[3], ref[4])
    (rh.sin().sum() + (ry * torch.arange(16.0)).sum()).backward()
    for a, b in zip(leaves, ref, strict=True):
        assert torch.equal(a.grad, b.grad)


def test_compiled_call_is_one_inference_node_without_grad() -> None:
    x, u, w, _, _ = _inputs((2, 5, 16))
    seen: list[str] = []

    def backend(gm: torch.fx.GraphModule, _inputs) -> object:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    fn = torch.compile(lambda a, b, c: add_rmsnorm(a, b, c), backend=backend, fullgraph=True)
    with torch.no_grad():
        h, y = fn(x, u, w)
    want = mod.reference(x, u, w, 1e-6, "torch", None, None)
    assert "xbackend.add_rmsnorm_infer.default" in seen and torch.equal(h, want[0]) and torch.equal(y, want[1])
    torch._dynamo.reset()


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
def test_is_the_ltx2_vae_block_residual_and_norm() -> None:
    from diffusers.models.autoencoders.ltx2_diffusion_decoder import LTX2VideoVaeNABlock

    torch.manual_seed(0)
    block = LTX2VideoVaeNABlock(16, (3, 3, 3), head_dim=8).to(torch.bfloat16)
    x, a = torch.randn(2, 1, 2, 3, 4, 16).to(torch.bfloat16).unbind(0)
    with torch.no_grad():
        h, y = add_rmsnorm(x, a, block.norm2.weight, block.norm2.eps, "torch")
        assert torch.equal(h, x + a) and torch.equal(y, block.norm2(x + a))


# -- the conformance kit ------------------------------------------------------------------------------
def _plugin(name: str, fn, precision: xbackend.Precision = xbackend.EXACT, supports=None, dtypes=None):
    class _Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            extra = {} if dtypes is None else {"dtypes": dtypes}
            registrar.register(op="add_rmsnorm", name=name, fn=fn, devices="cpu", precision=precision,
                               supports=supports, **extra)  # fmt: skip

    return ("suspect", _Plugin())


def _check(plugin) -> tuple[list[str], int]:
    return run_kit(plugin)[:2]


def test_every_case_passes_the_kit_with_the_reference() -> None:
    failures, ran = _check(_plugin("copy", mod.reference))
    assert failures == [] and ran == 3 * len(mod.cases(torch.float32, torch.device("cpu"), False))


def test_the_kit_catches_a_norm_of_the_unrounded_sum() -> None:
    def unrounded(x, update, weight, eps, flavour, scale, shift):
        s = x.float() + update.float()
        w = None if weight is None else weight.float()
        sc, sh = (None, None) if scale is None else (scale.float(), shift.float())
        h, y = mod.reference(s, torch.zeros_like(s), w, eps, flavour, sc, sh)
        return h.to(x.dtype), y.to(x.dtype)

    failures, _ = _check(_plugin("unrounded", unrounded))
    assert any("add_rmsnorm:suspect:unrounded:cpu:bfloat16 case 'torch/[2,8,64]': output 1: not bit-identical" in f
               for f in failures)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's overflow warnings from the NaN/Inf cases
def test_triton_kernel_passes_the_kit_under_the_interpreter() -> None:
    """The exact kernel (interpreted on CPU, CUDA's reduction order, a truncating bf16 cast) through every
    case in fp32 and fp16: supports() answers, accepted cases run without writing an input, repeat bit
    for bit, pass opcheck and compile; values within 1e-3 of CPU eager, which reduces in another order
    (the GPU tests prove bit-identity with CUDA eager)."""
    pytest.importorskip("triton")
    import xbackend_cuda.launch as nvidia
    import xbackend_cuda.supports as nvidia_supports

    if torch.cuda.is_available():
        pytest.skip("Triton kernels are compiled here (a GPU is visible): the GPU tests run this kernel")
    failures, ran = _check(_plugin("triton", nvidia.add_rmsnorm, xbackend.tolerance(1e-3), nvidia_supports.supports_add_rmsnorm,
                                   dtypes={torch.float32, torch.float16}))  # fmt: skip
    assert failures == []
    cases = mod.cases(torch.float32, torch.device("cpu"), False)
    rejected = {c.name for c in cases if nvidia_supports.supports_add_rmsnorm(*c.args) is not None}
    assert rejected == {"torch/D=1"}  # aten runs its Welford kernel for D % 4 != 0
    assert ran == 2 * (len(cases) - len(rejected))
