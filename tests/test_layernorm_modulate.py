"""layernorm_modulate: nn.LayerNorm + modulate (Flux.2, Qwen-Image), diffusers' FP32LayerNorm chain
(Wan) and Qwen-Image's per-token ``_modulate`` bit for bit, a float64 formula, argument checks, the
custom op, and the conformance kit over the op's cases (the reference and a wrong impl)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
import torch.nn.functional as F
from helpers import DTYPES, TOL, run_kit

import xbackend
from xbackend.ops import OPS
from xbackend.ops import layernorm_modulate as mod

ln_mod = xbackend.get_op("layernorm_modulate")
HAS_DIFFUSERS = importlib.util.find_spec("diffusers") is not None


def _r(*shape, dtype=torch.float32, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g)).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("affine", [False, True])
def test_torch_flavour_is_layer_norm_then_modulate(dtype, affine) -> None:
    x = _r(2, 7, 64, dtype=dtype)
    w, b = (_r(64, dtype=dtype, seed=1), _r(64, dtype=dtype, seed=2)) if affine else (None, None)
    sc, sh = _r(2, 1, 64, dtype=dtype, seed=3, scale=0.3), _r(2, 1, 64, dtype=dtype, seed=4, scale=0.3)
    y = ln_mod(x, sc, sh, w, b, 1e-6)
    assert y.dtype == dtype and y.shape == x.shape and y.is_contiguous()
    normed = F.layer_norm(x, (64,), w, b, 1e-6)
    assert torch.equal(y, normed * (1 + sc) + sh)
    assert torch.equal(y, (1 + sc) * normed + sh)  # Flux.2's order: the same product
    assert torch.equal(ln_mod(x, None, None, w, b, 1e-6), normed)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_fp32_flavour_modulates_in_float32_and_rounds_once(dtype) -> None:
    x = _r(3, 5, 48, dtype=dtype)
    sc, sh = _r(3, 1, 48, seed=3, scale=0.3), _r(3, 1, 48, seed=4, scale=0.3)  # float32, as Wan's table
    y = ln_mod(x, sc, sh, flavour="fp32")
    want = (F.layer_norm(x.float(), (48,), None, None, 1e-6) * (1 + sc) + sh).to(dtype)
    assert y.dtype == dtype and torch.equal(y, want)
    # Not the half chain: the norm and the modulate rounded separately differ on some elements.
    half = F.layer_norm(x, (48,), None, None, 1e-6) * (1 + sc.to(dtype)) + sh.to(dtype)
    assert not torch.equal(y, half)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_formula(dtype) -> None:
    x = _r(3, 5, 48, dtype=dtype, seed=2)
    w, b = _r(48, dtype=dtype, seed=5), _r(48, dtype=dtype, seed=6)
    sc, sh = _r(3, 1, 48, dtype=dtype, seed=3, scale=0.3), _r(3, 1, 48, dtype=dtype, seed=4, scale=0.3)
    y = ln_mod(x, sc, sh, w, b)
    x64 = x.double()
    n = (x64 - x64.mean(-1, keepdim=True)) / torch.sqrt(x64.var(-1, unbiased=False, keepdim=True) + 1e-6)
    want = (n * w.double() + b.double()) * (1 + sc.double()) + sh.double()
    torch.testing.assert_close(y.double(), want, **{k: 4 * v for k, v in TOL[dtype].items()})


def test_index_selects_a_table_per_token() -> None:
    x = _r(2, 6, 32)
    tables = _r(2, 2, 32, seed=1), _r(2, 2, 32, seed=2)  # [2, B, D]: entry 0 for index 0, entry 1 else
    index = torch.tensor([[0, 1, 2, 0, 1, 0], [1, 1, 0, 0, 0, 5]])
    y = ln_mod(x, *tables, index=index)
    normed = F.layer_norm(x, (32,), None, None, 1e-6)
    for bi in range(2):
        for li in range(6):
            t = 0 if index[bi, li] == 0 else 1
            want = normed[bi, li] * (1 + tables[0][t, bi]) + tables[1][t, bi]
            assert torch.equal(y[bi, li], want)


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
def test_is_qwen_image_modulate_with_and_without_index() -> None:
    from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock

    block = QwenImageTransformerBlock(32, 2, 16).to(torch.bfloat16)
    x = _r(2, 6, 32, dtype=torch.bfloat16)
    normed = block.img_norm1(x)
    params = _r(2, 96, dtype=torch.bfloat16, seed=1)
    want, _ = block._modulate(normed, params)
    shift, scale, _ = params.chunk(3, dim=-1)
    assert torch.equal(ln_mod(x, scale.unsqueeze(1), shift.unsqueeze(1), eps=block.img_norm1.eps), want)
    # zero_cond_t: the batch of tables is twice the batch of tokens, selected per token
    params2 = _r(4, 96, dtype=torch.bfloat16, seed=2)
    index = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 0, 1, 0, 1, 0]])
    want, _ = block._modulate(normed, params2, index)
    shift, scale, _ = (t.unflatten(0, (2, 2)) for t in params2.chunk(3, dim=-1))
    assert torch.equal(ln_mod(x, scale, shift, eps=block.img_norm1.eps, index=index), want)


@pytest.mark.skipif(not HAS_DIFFUSERS, reason="diffusers not installed")
def test_is_wans_fp32_layer_norm_chain() -> None:
    from diffusers.models.normalization import FP32LayerNorm

    x = _r(2, 5, 32, dtype=torch.bfloat16)
    table = _r(2, 6, 32, seed=1)  # Wan's scale_shift_table + temb.float(): float32
    shift, scale = table.chunk(6, dim=1)[:2]
    plain, affine = FP32LayerNorm(32, 1e-6, elementwise_affine=False), FP32LayerNorm(32, 1e-6, elementwise_affine=True)
    with torch.no_grad():
        affine.weight.copy_(_r(32, seed=2))
        affine.bias.copy_(_r(32, seed=3))
        want = (plain(x.float()) * (1 + scale) + shift).type_as(x)
        assert torch.equal(ln_mod(x, scale, shift, flavour="fp32"), want)
        want = affine(x.float()).type_as(x)
        assert torch.equal(ln_mod(x, None, None, affine.weight, affine.bias, 1e-6, "fp32"), want)


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "match"),
    [
        ((torch.randn(2, 8), torch.randn(3, 8), torch.randn(8)), {}, ValueError,
         r"layernorm_modulate: argument 'scale' expected a shape that broadcasts to x \[2, 8\], got shape \[3, 8\]"),
        ((torch.randn(2, 8), torch.randn(8)), {}, ValueError,
         r"layernorm_modulate: argument 'shift' expected a tensor, as 'scale' is given"),
        ((torch.randn(2, 8).bfloat16(), torch.randn(8).bfloat16(), torch.randn(8).bfloat16()), {"flavour": "fp32"},
         TypeError, r"layernorm_modulate: argument 'scale' expected dtype torch.float32 \(flavour 'fp32'"),
        ((torch.randn(2, 8).bfloat16(), torch.randn(8), torch.randn(8)), {}, TypeError,
         r"layernorm_modulate: argument 'scale' expected dtype torch.bfloat16 \(same as 'x'\); cast it first"),
        ((torch.randn(2, 8),), {"bias": torch.randn(4)}, ValueError,
         r"layernorm_modulate: argument 'bias' expected shape \[8\] \(the last dim of 'x'\), got shape \[4\]"),
        ((torch.randn(2, 3, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)), {"index": torch.zeros(2, 4, dtype=torch.long)},
         ValueError, r"layernorm_modulate: argument 'index' expected shape \[B, L\] with 'x' of shape \[B, L, D\]"),
        ((torch.randn(2, 3, 8), torch.randn(1, 2, 8), torch.randn(1, 2, 8)), {"index": torch.zeros(2, 3, dtype=torch.long)},
         ValueError, r"layernorm_modulate: argument 'scale' expected shape \[2, 2, 8\] \(two \[B, D\] tables"),
        ((torch.randn(2, 3, 8), torch.randn(2, 2, 8), torch.randn(2, 2, 8)), {"index": torch.zeros(2, 3)},
         TypeError, r"layernorm_modulate: argument 'index' expected an integer or bool tensor, got torch.float32"),
        ((torch.randn(2, 3, 8),), {"index": torch.zeros(2, 3, dtype=torch.long)}, ValueError,
         r"layernorm_modulate: argument 'index' expected None when there is no scale and shift to select"),
        ((torch.randn(2, 8),), {"flavour": "apex"}, ValueError, r"layernorm_modulate: argument 'flavour'"),
        ((torch.randn(2, 0),), {}, ValueError, r"layernorm_modulate: argument 'x' expected a last \(normalized\) dim"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_op_and_argument(args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        ln_mod(*args, **kwargs)


def test_spec() -> None:
    spec = OPS["layernorm_modulate"]
    assert spec is mod.SPEC
    assert spec.arg_names == ("x", "scale", "shift", "weight", "bias", "eps", "flavour", "index")
    assert spec.tensor_args == (0, 1, 2, 3, 4, 7)
    x, sc, sh, *_ = spec.example(torch.bfloat16, torch.device("meta"))
    assert x.shape == (1, 4096, 6144) and sc.shape == sh.shape == (1, 1, 6144)
    assert "layernorm_modulate" in xbackend.list_ops()


def test_custom_op_and_inference_op_pass_opcheck() -> None:
    x, sc, sh = _r(2, 5, 16), _r(2, 1, 16, seed=1), _r(2, 1, 16, seed=2)
    torch.library.opcheck(mod.layernorm_modulate_op, (x, sc, sh, _r(16, seed=3), _r(16, seed=4), 1e-6, "torch", None))
    index = torch.tensor([[0, 1, 0, 1, 1], [1, 0, 0, 0, 1]])
    torch.library.opcheck(mod.layernorm_modulate_op, (x, _r(2, 2, 16), _r(2, 2, 16), None, None, 1e-6, "fp32", index))
    torch.library.opcheck(torch.ops.xbackend.layernorm_modulate_infer.default, (x, None, None, None, None, 1e-6, "torch", None),
                          test_utils=("test_schema", "test_faketensor"))  # fmt: skip


def test_gradients_are_the_references() -> None:
    args = [_r(2, 5, 16), _r(2, 1, 16, seed=1), _r(2, 1, 16, seed=2), _r(16, seed=3), _r(16, seed=4)]
    leaves = [t.clone().requires_grad_(True) for t in args]
    (ln_mod(*leaves) * torch.arange(16.0)).sum().backward()
    ref = [t.clone().requires_grad_(True) for t in args]
    (mod.reference(*ref, 1e-6, "torch", None) * torch.arange(16.0)).sum().backward()
    for a, b in zip(leaves, ref, strict=True):
        assert torch.equal(a.grad, b.grad)


# -- the conformance kit ------------------------------------------------------------------------------
def _plugin(name: str, fn):
    class _Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="layernorm_modulate", name=name, fn=fn, devices="cpu")

    return ("suspect", _Plugin())


def test_every_case_passes_the_kit_with_the_reference() -> None:
    failures, ran, _ = run_kit(_plugin("copy", mod.reference))
    assert failures == [] and ran == sum(len(mod.cases(dt, torch.device("cpu"), False)) for dt in DTYPES)


def test_the_kit_catches_a_half_chain_for_the_fp32_flavour() -> None:
    def half_chain(x, scale, shift, weight, bias, eps, flavour, index):
        if scale is not None:
            scale, shift = scale.to(x.dtype), shift.to(x.dtype)
        w = None if weight is None else weight.to(x.dtype)
        b = None if bias is None else bias.to(x.dtype)
        return mod.reference(x, scale, shift, w, b, eps, "torch", index)

    failures, _, _ = run_kit(_plugin("half", half_chain))
    assert any("layernorm_modulate:suspect:half:cpu:bfloat16 case 'fp32/mod [B,1,D]': not bit-identical" in f
               for f in failures), failures[:3]
