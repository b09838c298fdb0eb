"""xbackend-liger: registration, availability, supports(), plans, and liger's real kernels checked
against the op references (on CPU through the Triton interpreter, on a GPU natively).

On CPU the interpreter truncates fp32 -> bf16 and computes bf16 arithmetic on the raw bits, so the
precision contracts are checked in fp16 and fp32 there (the interpreter rounds those as IEEE does);
bf16 is only checked to run and stay within a few ulp where the kernel converts rather than computes
in bf16. The bf16 classification is the GPU's (``bench_liger.py --classify``).
"""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
from xbackend_liger import impl, interpreter, plugin

import xbackend
from xbackend.ops import OPS
from xbackend.testing import check_impl, conformance, fresh_runtime

GPU = torch.cuda.is_available()
DEVICE = torch.device("cuda" if GPU else "cpu")
LIGER = {(i.op, i.name): i for i in plugin.IMPLS}


@pytest.fixture
def liger() -> None:
    """Skips (with the reason) where liger-kernel cannot run here."""
    reason = impl.available()
    if reason is not None:
        pytest.skip(f"liger-kernel unavailable: {reason}")
    if not GPU and not interpreter.interpreting():
        pytest.skip("no GPU and TRITON_INTERPRET is not 1: liger's Triton kernels cannot run here")


class _PretendH200:
    """Probe hook: CPU tensors are reported as an H200 (sm90), so the resolver picks liger's impls and
    the guard verifies them on CPU (the kernels run under the interpreter)."""

    @xbackend.hookimpl
    def xbackend_probe_device(self, device):
        return xbackend.Device("cuda", "sm90", "NVIDIA H200 (simulated on CPU)", simulated=True)


def _runtime(*extra):
    plugins = [("liger", plugin), *extra]
    if not GPU:
        plugins.append(("pretend_h200", _PretendH200()))
    return fresh_runtime(plugins)


# -- registration and availability ----------------------------------------------------------------
def test_registers_every_impl_below_the_builtins() -> None:
    import xbackend_cuda.plugin
    import xbackend_rocm.plugin

    with fresh_runtime([("liger", plugin)]) as rt:
        assert rt.plugins["liger"].impls == ["rmsnorm:liger", "rmsnorm:liger_diffusers", "rmsnorm_modulate:liger",
                                             "rotary_embedding:liger", "qk_norm_rope:liger"]  # fmt: skip
        for i in rt.registry.impls("rmsnorm"):
            assert i.devices == "cuda,rocm" and i.dtypes == {torch.bfloat16, torch.float16}
        assert {str(i.precision) for i in rt.registry.impls("rmsnorm")} == {"ulp(1)", "ulp(2)"}
        for op in ("rmsnorm_modulate", "rotary_embedding", "qk_norm_rope"):
            (i,) = rt.registry.impls(op)
            assert i.precision == xbackend.tolerance(5e-3) and torch.float32 in i.dtypes
    with fresh_runtime([("cuda", xbackend_cuda.plugin), ("rocm", xbackend_rocm.plugin)]) as rt:
        for i in plugin.IMPLS:
            builtins = rt.registry.impls(i.op)
            assert builtins and all(b.priority > i.priority for b in builtins), i.op


def test_available_reports_missing_liger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # `import liger_kernel` raises ModuleNotFoundError
    assert impl.available() == "liger-kernel not installed"
    with fresh_runtime([("liger", plugin)]):
        rows = {r.impl: r for r in xbackend.plan("rmsnorm", "sm90", quality="fast").rows}
        assert rows["liger"].verdict == "unavailable"
        assert rows["liger"].reason == "unavailable: liger-kernel not installed"
        assert xbackend.plan("rotary_embedding", "sm90", quality="fast").chosen.impl == "reference"
        # As deployed on a target that has it installed, liger is planned (and the host's gap listed).
        p = xbackend.plan("rmsnorm", "sm90", quality="high", assume_available=True)
        assert p.chosen.qualname == "liger:liger" and p.chosen.assumed == "liger-kernel not installed"


def test_available_reports_old_or_changed_liger(liger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(impl, "version", lambda: "0.7.1")
    assert impl.available() == "liger-kernel 0.7.1 < 0.8 (needs modulated_rms_norm and rope's rotary_dim)"
    monkeypatch.setattr(impl, "version", lambda: "0.8.5")
    real = impl._lk()
    changed = type(real)(**{**vars(real), "rms_norm_forward": lambda X, W, eps, offset, casting_mode: None})
    monkeypatch.setattr(impl, "_lk", lambda: changed)
    assert "rms_norm_forward" in impl.available()


# -- supports() on meta tensors (what the resolver sees when planning) ----------------------------
def _meta(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    return torch.empty(*shape, dtype=dtype, device="meta")


def test_rmsnorm_supports_reasons() -> None:
    x, w = _meta(1, 4096, 3072), _meta(3072)
    assert impl.supports_rmsnorm_torch(x, w, 1e-6, "torch") is None
    assert impl.supports_rmsnorm_torch(x, None, 1e-6, "torch") is None
    assert impl.supports_rmsnorm_diffusers(x, w, 1e-6, "diffusers") is None
    assert "flavour 'torch' only" in impl.supports_rmsnorm_torch(x, w, 1e-6, "diffusers")
    assert "flavour 'diffusers' only" in impl.supports_rmsnorm_diffusers(x, w, 1e-6, "torch")
    assert "dtype" in impl.supports_rmsnorm_torch(_meta(4, 64, dtype=torch.float32), None, 1e-6, "torch")
    assert impl.supports_rmsnorm_torch(_meta(8, 64)[:, :32], None, 1e-6, "torch") is None  # padded rows
    assert "last dim" in impl.supports_rmsnorm_torch(_meta(64, 16).t(), None, 1e-6, "torch")
    assert impl.supports_rmsnorm_torch(_meta(2, 8, 64)[:, ::2], None, 1e-6, "torch") is None  # rows 128 apart
    assert "one stride" in impl.supports_rmsnorm_torch(_meta(2, 8, 64)[:, :4], None, 1e-6, "torch")
    assert "not contiguous" in impl.supports_rmsnorm_torch(_meta(4, 64), _meta(128)[::2], 1e-6, "torch")
    assert "65536" in impl.supports_rmsnorm_torch(_meta(2, 65537), None, 1e-6, "torch")


def test_modulate_supports_reasons() -> None:
    x = _meta(2, 8, 64)
    s = impl.supports_rmsnorm_modulate
    for mod in ((2, 1, 64), (1, 1, 64), (64,), (2, 8, 64)):
        assert s(x, _meta(*mod), _meta(*mod), None, 1e-6, "torch") is None, mod
    assert s(x, _meta(2, 1, 64), _meta(64), None, 1e-6, "diffusers") is None  # brought to one shape
    assert "broadcasts over D" in s(x, _meta(2, 8, 1), _meta(2, 8, 1), None, 1e-6, "torch")
    assert "r // rows_per_modulation" in s(x, _meta(1, 8, 64), _meta(1, 8, 64), None, 1e-6, "torch")
    assert "dtype" in s(x, _meta(64, dtype=torch.float16), _meta(64), None, 1e-6, "torch")
    assert s(_meta(1, 16, 48, 80, 512), _meta(1, 1, 1, 1, 512), _meta(1, 1, 1, 1, 512), None, 1e-6, "torch") is None


def test_rope_supports_reasons() -> None:
    x = _meta(1, 32640, 4096)
    cos = _meta(1, 32, 32640, 64, dtype=torch.float32)
    assert impl.supports_rotary_embedding(x, cos, cos, "split") is None  # LTX-2.3
    assert "interleaved" in impl.supports_rotary_embedding(x, _meta(1, 32640, 4096), _meta(1, 32640, 4096), "interleaved")
    f64 = _meta(1, 32, 32640, 64, dtype=torch.float64)
    assert "cos dtype" in impl.supports_rotary_embedding(x, f64, f64, "split")
    wide = _meta(1, 8, 32768, dtype=torch.float32)
    assert "rotary width" in impl.supports_rotary_embedding(_meta(1, 8, 65536), wide, wide, "split")
    w = _meta(4096)
    assert impl.supports_qk_norm_rope(x, x, w, w, cos, cos, 1e-6, "torch", "split") is None
    assert "interleaved" in impl.supports_qk_norm_rope(x, x, w, w, cos, cos, 1e-6, "torch", "interleaved")
    assert "k_weight" in impl.supports_qk_norm_rope(x, x, w, _meta(8192)[::2], cos, cos, 1e-6, "torch", "split")


def test_cpu_tensors_need_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    x = torch.zeros(2, 64, dtype=torch.float16)
    assert "CUDA/ROCm" in impl.supports_rmsnorm_torch(x, None, 1e-6, "torch")


# -- plans ---------------------------------------------------------------------------------------
def test_plan_verdicts_on_sm90() -> None:
    import xbackend_cuda.plugin

    with fresh_runtime([("liger", plugin)]):
        rows = {r.impl: r for r in xbackend.plan("rmsnorm", "sm90").rows}  # lossless: nothing of liger's
        assert rows["liger"].verdict == rows["liger_diffusers"].verdict == "quality"
        assert rows["liger"].reason == "ulp(1) needs quality 'high'; current is 'lossless'"
        assert rows["liger_diffusers"].reason == "ulp(2) needs quality 'fast'; current is 'lossless'"
        high = {r.impl: r for r in xbackend.plan("rmsnorm", "sm90", quality="high", assume_available=True).rows}
        assert high["liger"].verdict == "chosen"
        assert high["liger_diffusers"].verdict == "quality"
        fast = {r.impl: r for r in xbackend.plan("rmsnorm", "sm90", quality="fast", assume_available=True).rows}
        assert fast["liger_diffusers"].verdict == "unsupported"  # the example is flavour "torch"
        assert xbackend.plan("rmsnorm", "gfx950", quality="high", assume_available=True).chosen.qualname == "liger:liger"
        assert {r.impl: r.verdict for r in xbackend.plan("rmsnorm", "cpu", quality="high").rows}["liger"] == "arch"
        # The op's example rope is interleaved: liger's split-only kernel is unsupported there.
        rope = {r.impl: r for r in xbackend.plan("rotary_embedding", "sm90", quality="fast", assume_available=True).rows}
        assert rope["liger"].verdict == "unsupported" and "split" in rope["liger"].reason
    with fresh_runtime([("cuda", xbackend_cuda.plugin), ("liger", plugin)]):
        high = xbackend.plan("rmsnorm", "sm90", quality="high", assume_available=True)
        assert high.chosen.qualname == "cuda:triton"
        assert {r.qualname: r.verdict for r in high.rows}["liger:liger"] == "lower_priority"
        fast = xbackend.plan("rmsnorm_modulate", "sm90", quality="fast", assume_available=True)
        assert fast.chosen.qualname == "cuda:triton"
        assert {r.qualname: r.verdict for r in fast.rows}["liger:liger"] == "lower_priority"


# -- liger's kernels against the references --------------------------------------------------------
def _cases(op: str, dtype: torch.dtype, *, specials: bool = True) -> list[tuple]:
    return [c.args for c in OPS[op].cases(dtype, DEVICE, False) if specials or "NaN" not in c.name]


@pytest.mark.parametrize("dtype", [torch.float16] + ([torch.bfloat16] if GPU else []))
def test_rmsnorm_meets_its_contracts(liger, dtype) -> None:
    with _runtime() as rt:
        check_impl(rt, "rmsnorm", "liger", _cases("rmsnorm", dtype))
        check_impl(rt, "rmsnorm", "liger_diffusers", _cases("rmsnorm", dtype))


@pytest.mark.parametrize("op", ["rmsnorm_modulate", "rotary_embedding", "qk_norm_rope"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32] + ([torch.bfloat16] if GPU else []))
def test_tolerance_impls_meet_their_contract(liger, op, dtype) -> None:
    # Not the NaN/Inf cases: a relative Frobenius norm over a tensor holding Inf is NaN, so
    # xbackend's tolerance comparison cannot pass them even for an identical output.
    with _runtime() as rt:
        check_impl(rt, op, "liger", _cases(op, dtype, specials=False))


@pytest.mark.skipif(GPU, reason="the interpreter's bf16 behaviour; a GPU checks the contracts in bf16 above")
def test_bf16_runs_under_the_interpreter(liger) -> None:
    """bf16 on CPU: the kernels run on every layout they accept, within the few ulp the interpreter's
    truncating fp32 -> bf16 casts add (up to two truncations each side of the diffusers flavour)."""
    from xbackend._precision import ulp_distance

    spec = OPS["rmsnorm"]
    for name, bound in (("liger", 1), ("liger_diffusers", 4)):
        i = LIGER[("rmsnorm", name)]
        for args in _cases("rmsnorm", torch.bfloat16):
            if i.resolved("supports")(*args) is None and args[0].numel():
                out, ref = impl.rmsnorm(*args), spec.reference(*args)
                assert int(ulp_distance(out.nan_to_num(0), ref.nan_to_num(0)).max()) <= bound
    spec = OPS["rotary_embedding"]
    for args in _cases("rotary_embedding", torch.bfloat16):
        if impl.supports_rotary_embedding(*args) is None:
            out, ref = impl.rotary_embedding(*args), spec.reference(*args)
            assert int(ulp_distance(out, ref).max()) <= 1


def test_casting_modes_are_the_flavours(liger) -> None:
    """In fp16, where the interpreter rounds as a GPU does: gemma meets the torch flavour's contract
    and llama the diffusers one, and each is much nearer its own flavour than the other's (the
    elements that differ from its own flavour come only from liger's reduction order)."""
    from xbackend._precision import ulp_distance

    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=g).to(torch.float16).to(DEVICE)
    w = (torch.randn(256, generator=g) * 0.3 + 1).to(torch.float16).to(DEVICE)
    fwd = impl._lk().rms_norm_forward
    ref = OPS["rmsnorm"].reference
    torch_ref, diffusers_ref = ref(x, w, 1e-6, "torch"), ref(x, w, 1e-6, "diffusers")
    gemma, llama = fwd(x, w, 1e-6, 0.0, "gemma", None)[0], fwd(x, w, 1e-6, 0.0, "llama", None)[0]
    assert int(ulp_distance(gemma, torch_ref).max()) <= 1
    assert int(ulp_distance(llama, diffusers_ref).max()) <= 2

    def differ(a: torch.Tensor, b: torch.Tensor) -> int:
        return int((a != b).sum())

    assert differ(gemma, torch_ref) * 4 < differ(gemma, diffusers_ref)
    assert differ(llama, diffusers_ref) * 4 < differ(llama, torch_ref)


def test_rope_rotates_a_copy(liger) -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 6, 2 * 32, generator=g).to(torch.float16).to(DEVICE)
    angle = torch.rand(1, 2, 6, 16, generator=g).to(DEVICE) * 6.3
    before = x.clone()
    out = impl.rotary_embedding(x, angle.cos(), angle.sin(), "split")
    assert torch.equal(x, before) and out.data_ptr() != x.data_ptr()
    assert out.is_contiguous() and out.shape == x.shape


# -- through the guard -------------------------------------------------------------------------------
def test_guard_verifies_liger_per_contract(liger) -> None:
    g = torch.Generator().manual_seed(2)

    def r(*shape, scale=1.0, dtype=torch.float16):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)

    x, w = r(2, 16, 128), r(128, scale=0.3) + 1
    angle = torch.rand(1, 2, 16, 32, generator=g).to(DEVICE) * 6.3
    cos, sin = angle.cos(), angle.sin()
    with _runtime() as rt:
        with xbackend.quality("high"):
            xbackend.get_op("rmsnorm")(x, w, 1e-6, "torch")
        with xbackend.quality("fast"):
            xbackend.get_op("rmsnorm")(x, w, 1e-6, "diffusers")
            xbackend.get_op("rmsnorm_modulate")(x, r(2, 1, 128, scale=0.1), r(2, 1, 128, scale=0.1), w, 1e-6, "torch")
            xbackend.get_op("rotary_embedding")(x[:1], cos, sin, "split")  # x [1, T, H*D], cos [1, H, T, D/2]
            xbackend.get_op("qk_norm_rope")(x[:1], x[1:], w, w, cos, sin, 1e-6, "diffusers", "split")
            xbackend.get_op("rotary_embedding")(x, r(2, 16, 128, dtype=torch.float32), r(2, 16, 128, dtype=torch.float32),
                                                "interleaved")  # fmt: skip
        events = [(e.op, e.impl, e.status) for e in rt.events]
    assert events == [
        ("rmsnorm", "liger:liger", "verified"),
        ("rmsnorm", "liger:liger_diffusers", "verified"),
        ("rmsnorm_modulate", "liger:liger", "verified"),
        ("rotary_embedding", "liger:liger", "verified"),
        ("qk_norm_rope", "liger:liger", "verified"),
        ("rotary_embedding", "xbackend:reference", "reference"),  # interleaved: liger does not take it
    ]


class _WrongCastingMode:
    """Liger's gemma casting mode offered for the diffusers flavour and claimed exact: the guard must
    catch it (the two flavours differ by a rounding)."""

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        def gemma_for_diffusers(x, weight, eps, flavour):
            return impl._lk().rms_norm_forward(x, weight, eps, 0.0, "gemma", None)[0]

        registrar.register(op="rmsnorm", name="gemma_as_diffusers", fn=gemma_for_diffusers, priority=200,
                           devices="cuda,rocm", dtypes={torch.float16}, precision=xbackend.EXACT)


def test_guard_rejects_a_wrong_casting_mode(liger) -> None:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 256, generator=g).to(torch.float16).to(DEVICE)
    w = (torch.randn(256, generator=g) * 0.3 + 1).to(torch.float16).to(DEVICE)
    with _runtime(("wrong", _WrongCastingMode())) as rt:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", xbackend.FallbackWarning)
            out = xbackend.get_op("rmsnorm")(x, w, 1e-6, "diffusers")
        assert torch.equal(out, OPS["rmsnorm"].reference(x, w, 1e-6, "diffusers"))
        statuses = [(e.impl, e.status) for e in rt.events]
        assert statuses[0] == ("wrong:gemma_as_diffusers", "mismatch")
        assert "not bit-identical" in rt.events[0].detail
        assert statuses[-1] == ("xbackend:reference", "reference")


# -- xbackend's conformance suite, on CPU through the simulated H200 --------------------------------
@pytest.mark.skipif(GPU, reason="test_liger_conformance.py runs the suite on the GPU itself")
@pytest.mark.parametrize("key", sorted(LIGER), ids=[f"{op}:{name}" for op, name in sorted(LIGER)])
def test_conformance_cases_on_cpu(liger, key) -> None:
    """Every case of the op's catalogue in fp16 (and fp32 where registered), with the suite's own
    isolation, repeatability, opcheck and compile checks; the dispatch it forces runs on the
    simulated H200. The NaN/Inf case of the tolerance contracts is left out (see above)."""
    from xbackend._runtime import Runtime

    rt = Runtime([("liger", plugin), ("pretend_h200", _PretendH200())], autoload=False, block=())
    found = next(i for i in rt.registry.impls(key[0]) if i.name == key[1])
    for dtype in (torch.float16, torch.float32):
        if dtype not in found.dtypes:
            continue
        specials = found.precision.kind != "tolerance"
        cases = [c for c in OPS[key[0]].cases(dtype, DEVICE, False) if specials or "NaN" not in c.name]
        with xbackend.quality("fast"):  # the suite forces the impl for opcheck and compile (see conftest)
            failures, ran = conformance.check(rt, conformance.Target(found, DEVICE, dtype), cases)
        assert ran > 0
        assert failures == []


@pytest.mark.parametrize(("x_shape", "cos_shape"), [
    ((2, 3, 4, 16), (2, 1, 4, 8)),   # cos broadcast over heads between varying dims: copied per row
    ((2, 3, 4, 16), (1, 1, 4, 8)),   # HF heads-first: batch and heads share the rows of cos
    ((2, 4, 3, 16), (2, 4, 1, 8)),   # heads last: three heads per kernel row
    ((1, 100, 8), (4,)),             # one frequency row for 100 "heads": more than a row takes, so rows
    ((3, 8), (3, 4)),                # 2-D
    ((2, 5, 3 * 12), (2, 3, 5, 6)),  # LTX-2.3 [B, T, H*D] against [B, H, T, D/2]
])  # fmt: skip
def test_rope_layouts(liger, x_shape, cos_shape) -> None:
    from xbackend._precision import ulp_distance

    g = torch.Generator().manual_seed(4)
    x = torch.randn(*x_shape, generator=g).to(torch.float16).to(DEVICE)
    angle = torch.rand(*cos_shape, generator=g).to(DEVICE) * 6.3
    args = OPS["rotary_embedding"].bind(x, angle.cos(), angle.sin(), "split")
    OPS["rotary_embedding"].check(*args)
    assert impl.supports_rotary_embedding(*args) is None
    out, ref = impl.rotary_embedding(*args), OPS["rotary_embedding"].reference(*args)
    assert out.shape == ref.shape and out.is_contiguous()
    assert int(ulp_distance(out, ref).max()) <= 1
    q, k = OPS["qk_norm_rope"].reference(x, x.flip(-1), None, None, angle.cos(), angle.sin(), 1e-6, "torch", "split")
    qo, ko = impl.qk_norm_rope(x, x.flip(-1), None, None, angle.cos(), angle.sin(), 1e-6, "torch", "split")
    assert int(ulp_distance(qo, q).max()) <= 2 and int(ulp_distance(ko, k).max()) <= 2


@pytest.mark.slow
def test_bench_script_dry_run(liger, tmp_path) -> None:
    """bench_liger.py's classification and benchmark on tiny shapes (CPU: interpreter, host µs)."""
    import json

    import bench_liger

    if GPU:
        pytest.skip("run_gpu.sh runs the script at DiT shapes on a GPU")
    assert bench_liger.main(["--dry-run", "--classify", "--ops", "rmsnorm,rotary_embedding",
                             "--json", str(tmp_path / "c.json")]) == 0  # fmt: skip
    report = json.loads((tmp_path / "c.json").read_text())
    summary = {(s["impl"], s["dtype"]): s for s in report["summary"]}
    assert summary[("rmsnorm:liger", "float16")]["holds"] and summary[("rmsnorm:liger", "float16")]["max_ulp"] <= 1
    assert summary[("rmsnorm:liger", "float32")]["registered_dtype"] is False
    assert summary[("rotary_embedding:liger", "float16")]["tier"] in ("lossless", "high")
    assert bench_liger.main(["--dry-run", "--ops", "rmsnorm,rotary_embedding", "--no-compile",
                             "--json", str(tmp_path / "b.json")]) == 0  # fmt: skip
    rows = json.loads((tmp_path / "b.json").read_text())["rows"]
    variants = {(r["case"], r["variant"]) for r in rows}
    assert ("rmsnorm torch [1,64,256]", "liger:liger") in variants
    assert ("rope split [1,32,128] h2 float32 freqs", "liger kernel only (in place)") in variants
    assert all("pct_of_copy" in r and "x_vs_eager" in r for r in rows)
