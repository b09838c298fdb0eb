"""Fault injection against the guard's promise: a caller never gets a wrong answer, a crash or a hang
from a fast path. One test per way through that promise (build locks, cache ownership, distributed
decode and runtime keys have their own modules: test_faults_build, test_faults_distributed,
test_faults_keys)."""

from __future__ import annotations

import importlib.metadata
import logging
import subprocess
import sys
import threading
import warnings

import pytest
import torch
from fallbacks import falls_back

import xbackend
from xbackend.ops import gated_residual as gr
from xbackend.ops import neighborhood_attention as na
from xbackend.ops import rmsnorm as rn
from xbackend.testing import fresh_runtime

gated_residual = xbackend.get_op("gated_residual")
rmsnorm = xbackend.get_op("rmsnorm")


def inputs(d: int = 64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(d)
    x, u = (torch.randn(2, 8, d, generator=g).to(torch.bfloat16) for _ in range(2))
    return x, u, torch.randn(2, 1, d, generator=g).to(torch.bfloat16)


def plugin(op: str, name: str, fn, **fields):
    class _Plugin:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op=op, name=name, fn=fn, priority=fields.pop("priority", 50), devices="cpu", **fields)

    return (name, _Plugin())


def statuses(rt) -> list[tuple[str, str]]:
    return [(e.impl, e.status) for e in rt.events]


# -- wrong answers -------------------------------------------------------------------------------
def test_an_impl_writing_its_output_into_x_is_rejected_and_x_is_untouched() -> None:
    def into_x(x, u, g):
        return torch.add(x, u * g, out=x)

    x, u, g = inputs()
    before = x.clone()
    with fresh_runtime([plugin("gated_residual", "inplace", into_x)]) as rt, falls_back("inplace:inplace"):
        out = gated_residual(x, u, g)
    assert torch.equal(x, before)
    assert torch.equal(out, before + u * g)
    assert statuses(rt)[0] == ("inplace:inplace", "mismatch")
    assert "modified its input 'x' in place" in rt.events[0].detail


def test_an_impl_that_mutates_then_returns_the_reference_of_the_mutation_is_rejected() -> None:
    def sneaky(x, u, g):
        x.mul_(-1)
        return gr.reference(x, u, g)

    x, u, g = inputs()
    before = x.clone()
    with fresh_runtime([plugin("gated_residual", "sneaky", sneaky)]) as rt, falls_back("sneaky:sneaky"):
        out = gated_residual(x, u, g)
    assert torch.equal(x, before) and torch.equal(out, before + u * g)
    assert statuses(rt) == [("sneaky:sneaky", "mismatch"), ("xbackend:reference", "reference")]


def test_an_output_aliasing_an_input_is_rejected() -> None:
    def returns_view(x, weight, eps, flavour):
        return x.view(x.shape)  # correct values only when the norm is the identity; aliasing regardless

    x = torch.ones(4, 16, dtype=torch.float32)
    with fresh_runtime([plugin("rmsnorm", "alias", returns_view)]) as rt, falls_back("alias:alias"):
        out = rmsnorm(x, None, 0.0, "torch")
    assert out.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()
    assert "sharing memory with input 'x'" in rt.events[0].detail


def test_an_empty_input_returned_as_the_output_is_rejected() -> None:
    def shortcut(x, u, g):
        return x if x.numel() == 0 else gr.reference(x, u, g)

    x, u, g = torch.zeros(0, 8, 64), torch.zeros(0, 8, 64), torch.ones(1, 1, 64)
    with fresh_runtime([plugin("gated_residual", "early", shortcut)]) as rt, falls_back("early:early"):
        out = gated_residual(x, u, g)
        assert out is not x and out.shape == x.shape
        assert statuses(rt)[0] == ("early:early", "mismatch")
        assert "sharing memory with input 'x'" in rt.events[0].detail
        xg = x.clone().requires_grad_()
        gated_residual(xg, u, g).sum().backward()  # torch's custom-op aliasing check would refuse x


def test_outputs_sharing_one_storage_are_rejected() -> None:
    from xbackend.ops import add_rmsnorm as ar

    def one_buffer(x, update, weight, eps, flavour, scale, shift):
        h, y = ar.reference(x, update, weight, eps, flavour, scale, shift)
        buf = torch.stack((h, y))  # disjoint halves of one allocation, as a fused kernel might write them
        return buf[0], buf[1]

    x, u, w = torch.randn(4, 64), torch.randn(4, 64), torch.randn(64)
    with fresh_runtime([plugin("add_rmsnorm", "fused", one_buffer)]) as rt, falls_back("fused:fused"):
        xbackend.get_op("add_rmsnorm")(x, u, w)
        assert statuses(rt)[0] == ("fused:fused", "mismatch")
        assert "output 1 sharing memory with output 0" in rt.events[0].detail
        xg = x.clone().requires_grad_()
        h, y = xbackend.get_op("add_rmsnorm")(xg, u, w)  # autograd's path: its own key, checked again
        (h.sum() + y.sum()).backward()


def test_an_output_that_is_not_contiguous_is_rejected() -> None:
    def padded_rows(x, u, g):  # right values in rows padded to 72 elements: a view no caller can .view()
        out = torch.empty(*x.shape[:-1], 72, dtype=x.dtype)[..., :64]
        return out.copy_(gr.reference(x, u, g))

    def as_reference(x, u, g):  # torch's elementwise ops keep a transposed x's layout
        return gr.reference(x, u, g)

    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "padded", padded_rows)]) as rt:
        with falls_back("padded:padded"):
            out = gated_residual(x, u, g)
        assert out.is_contiguous() and statuses(rt)[0] == ("padded:padded", "mismatch")
        assert "output 0 has strides (576, 72, 1); expected contiguous" in rt.events[0].detail
    xt = x.transpose(0, 1).contiguous().transpose(0, 1)
    assert not as_reference(xt, u, g).is_contiguous()
    with fresh_runtime([plugin("gated_residual", "inputs_layout", as_reference)]) as rt:
        with falls_back("inputs_layout:inputs_layout"):
            out = gated_residual(xt, u, g)
        assert out.is_contiguous() and torch.equal(out, xt + u * g)  # the reference's answer, contiguous
        assert statuses(rt) == [("inputs_layout:inputs_layout", "mismatch"), ("xbackend:reference", "reference")]


def test_copies_keep_strides_offsets_and_shared_storage() -> None:
    seen = {}

    def spy(x, u, g):
        seen["x"] = (x.shape, x.stride(), x.data_ptr() % 512)
        seen["g"] = g.stride()
        seen["shared"] = x.untyped_storage().data_ptr() == u.untyped_storage().data_ptr()
        return gr.reference(x, u, g)

    base = torch.randn(3, 8, 64).to(torch.bfloat16)
    x, u = base[1:], base[1:]  # one storage, an offset view
    g = torch.randn(1, 1, 64).to(torch.bfloat16).expand(2, 1, 64)  # stride 0
    with fresh_runtime([plugin("gated_residual", "spy", spy)]) as rt:
        gated_residual(x, u, g)
    assert seen["x"] == (x.shape, x.stride(), x.data_ptr() % 512)
    assert seen["g"] == g.stride() and seen["shared"]
    assert statuses(rt) == [("spy:spy", "verified")]


def test_double_backward_is_the_references() -> None:
    for op, reference, make in (
        (rmsnorm, rn.reference, lambda: (torch.randn(3, 16), torch.randn(16), 1e-6, "torch")),
        (gated_residual, gr.reference, lambda: (torch.randn(2, 4, 8), torch.randn(2, 4, 8), torch.randn(2, 1, 8))),
    ):
        grads = []
        for fn in (op, reference):
            torch.manual_seed(0)
            args = [a.requires_grad_() if isinstance(a, torch.Tensor) else a for a in make()]
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            (g,) = torch.autograd.grad(fn(*args).pow(2).sum(), tensors[0], create_graph=True)
            assert g.requires_grad
            grads.append(torch.autograd.grad(g.pow(2).sum(), tensors))
        for ours, theirs in zip(*grads, strict=True):
            # The same math through a different graph (the op's backward re-runs the reference), so
            # fp32 rounding may differ; a detached first-order gradient would be off by O(1).
            torch.testing.assert_close(ours, theirs)


class _FakeDist:
    name = "evil-kernels"


class _FakeEntryPoint:
    def __init__(self, name: str, obj: object) -> None:
        self.name, self.value, self.dist, self._obj = name, "evil_kernels.plugin", _FakeDist(), obj

    def load(self) -> object:
        return self._obj


@pytest.mark.parametrize("name", ["xbackend", "cuda", "rocm", "reference"])
def test_entry_points_named_like_a_builtin_are_refused(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _, zeros = plugin("rmsnorm", "zeros", lambda x, w, eps, flavour: torch.zeros_like(x))
    eps = [_FakeEntryPoint(name, zeros)]
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: eps)
    rt = xbackend.Runtime()
    assert rt.plugins[name].error is not None and "reserved" in rt.plugins[name].error
    assert "evil-kernels" in rt.plugins[name].source
    assert any("evil-kernels" in p for p in rt.problems)
    assert [i.qualname for i in rt.candidates("rmsnorm")] == ["xbackend:reference"]


def test_explicit_plugin_named_xbackend_is_refused() -> None:
    _, zeros = plugin("rmsnorm", "zeros", lambda x, w, eps, flavour: torch.zeros_like(x))
    with pytest.raises(ValueError, match="'xbackend' is reserved"):
        xbackend.Runtime([("xbackend", zeros)], autoload=False)


def test_exact_compares_bits() -> None:
    def negative_zero(x, u, g):
        out = gr.reference(x, u, g)
        return torch.where(out == 0, -0.0, out).to(out.dtype)

    def wrong_nan(x, u, g):
        out = gr.reference(x, u, g)
        out.view(-1)[0] = float("nan")
        return out

    x, u, g = inputs()
    u.view(-1)[:8] = 0
    x.view(-1)[:8] = 0
    for name, fn in (("negzero", negative_zero), ("nan", wrong_nan)):
        with fresh_runtime([plugin("gated_residual", name, fn)]) as rt, falls_back(f"{name}:{name}"):
            gated_residual(x, u, g)
        assert statuses(rt)[0] == (f"{name}:{name}", "mismatch"), rt.events[0]
    assert xbackend.Precision() == xbackend.EXACT
    from xbackend._precision import compare

    nan = torch.tensor([float("nan"), 1.0])
    assert compare(nan, nan.clone(), xbackend.EXACT) is None  # NaN against NaN at the same place


def test_ulp_contract_refuses_inf_where_the_reference_is_finite() -> None:
    big = torch.finfo(torch.bfloat16).max

    def overflow(x, u, g):
        out = gr.reference(x, u, g)
        return torch.where(out == big, float("inf"), out).to(out.dtype)

    x = torch.full((1, 1, 8), big, dtype=torch.bfloat16)
    u, g = torch.zeros_like(x), torch.ones(1, 1, 8, dtype=torch.bfloat16)
    with fresh_runtime([plugin("gated_residual", "inf", overflow, precision=xbackend.ulp(1))]) as rt, \
            xbackend.quality("high"), falls_back("inf:inf"):
        assert torch.equal(gated_residual(x, u, g), x)
    assert statuses(rt)[0] == ("inf:inf", "mismatch")
    assert "infinite where the reference is finite" in rt.events[0].detail


def test_neighborhood_attention_guard_sees_unsampled_rows() -> None:
    tokens = 128 * 128
    # Rows a fixed, seeded sample of 2048 queries would never look at: a guard must not be predictable.
    fixed = set(torch.randperm(tokens, generator=torch.Generator().manual_seed(tokens))[:2048].tolist())
    holes = [i for i in range(tokens) if i not in fixed][:200]

    def zero_rows(q, k, v, kernel_size, dilation, is_causal, scale, stride):
        out = na.reference(q, k, v, kernel_size, dilation, is_causal, scale, stride)
        out.view(out.shape[0], tokens, *out.shape[-2:])[:, holes] = 0
        return out

    q, k, v = (torch.randn(1, 128, 128, 1, 16).to(torch.bfloat16) for _ in range(3))
    with fresh_runtime([plugin("neighborhood_attention", "holes", zero_rows, precision=xbackend.tolerance(na.REL_FRO_BOUND))]) as rt, \
            falls_back("holes:holes"):
        xbackend.get_op("neighborhood_attention")(q, k, v, kernel_size=(3, 3))
    assert statuses(rt)[0] == ("holes:holes", "mismatch")


def test_neighborhood_attention_sample_covers_every_border_and_is_random() -> None:
    spatial, ks, dil, causal = (40, 96, 96), (11, 11, 11), (1, 1, 1), (False, False, False)
    work = 40 * 96 * 96 * 1331 * 4 * 64
    picks = [na.guard_queries(spatial, ks, dil, causal, work, torch.Generator().manual_seed(s)) for s in (1, 2)]
    assert not torch.equal(picks[0], picks[1])
    for sample in picks:
        coords = torch.stack([sample // (96 * 96), (sample // 96) % 96, sample % 96], 1)
        for axis, length in enumerate(spatial):
            present = set(coords[:, axis].tolist())
            assert set(range(6)) <= present and set(range(length - 7, length)) <= present
    full = na.guard_queries((8, 8), (3, 3), (1, 1), (False, False), 10, torch.Generator())
    assert full is None


def test_sample_and_always_modes_catch_an_impl_wrong_from_its_second_call() -> None:
    calls = {"n": 0}

    def second_call_wrong(x, u, g):
        calls["n"] += 1
        out = gr.reference(x, u, g)
        return out if calls["n"] == 1 else out + 1

    x, u, g = inputs()
    # sample:3: the third call after the verified one is compared (calls 2 and 3 go unchecked).
    for mode, wrong_calls in (("always", 0), ("sample:3", 2)):
        calls["n"] = 0
        with fresh_runtime([plugin("gated_residual", "late", second_call_wrong)]) as rt, xbackend.verify(mode), \
                falls_back("late:late"):
            results = [gated_residual(x, u, g) for _ in range(4)]
        wrong = sum(not torch.equal(r, x + u * g) for r in results)
        assert wrong == wrong_calls, (mode, statuses(rt))
        assert ("late:late", "mismatch") in statuses(rt)
    calls["n"] = 0
    with fresh_runtime([plugin("gated_residual", "late", second_call_wrong)]):
        results = [gated_residual(x, u, g) for _ in range(2)]
    assert not torch.equal(results[1], x + u * g)  # first: the documented limit of the default mode


def test_verify_mode_from_the_environment() -> None:
    code = ("import xbackend, xbackend._policy as p; print(p.current_verify_mode()); "
            "import contextlib\nwith xbackend.verify('sample:10'): print(p.current_verify_mode())")
    env = {"XBACKEND_VERIFY": "always", "PATH": "", "XBACKEND_FAST_KEY": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["always", "sample:10"], out.stderr
    with pytest.raises(ValueError, match="'first', 'always' or 'sample:N'"):
        xbackend.verify("sometimes").__enter__()


# -- crashes -------------------------------------------------------------------------------------
def test_every_thread_falls_back_when_a_verified_impl_starts_raising() -> None:
    state = {"fail": False}

    def flaky(x, u, g):
        if state["fail"]:
            threading.Event().wait(0.01)  # keep the eight callers inside the failing call together
            raise RuntimeError("CUDA error: unspecified launch failure (simulated)")
        return gr.reference(x, u, g)

    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "flaky", flaky)]) as rt:
        gated_residual(x, u, g)
        state["fail"] = True
        barrier = threading.Barrier(8)
        results, errors = [], []

        def worker() -> None:
            barrier.wait()
            try:
                results.append(gated_residual(x, u, g))
            except Exception as e:  # the promise: no caller sees the impl's error
                errors.append(e)

        threads = [threading.Thread(target=worker) for _ in range(8)]
        with falls_back("flaky:flaky", "raised"):
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    assert errors == [] and len(results) == 8
    assert all(torch.equal(r, x + u * g) for r in results)
    assert [s for _, s in statuses(rt)].count("raised") == 1


def ooms_first(state: dict[str, int]):
    """gated_residual's reference as an impl that raises torch.OutOfMemoryError while state["oom"]
    counts down to 0."""

    def sometimes_oom(x, u, g):
        if state["oom"]:
            state["oom"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (simulated)")
        return gr.reference(x, u, g)

    return sometimes_oom


def test_transient_out_of_memory_does_not_disable_the_impl() -> None:
    state = {"oom": 0}
    sometimes_oom = ooms_first(state)
    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "oom", sometimes_oom)]) as rt:
        gated_residual(x, u, g)
        state["oom"] = 1  # one OOM: the retry after emptying the cache succeeds
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        state["oom"] = 2  # twice in a row: this call falls back, the impl keeps its place
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert rt.lookup(next(iter(rt._caches[xbackend._policy._POLICY.get()]))) is sometimes_oom
        assert "transient" in [s for _, s in statuses(rt)]
        assert "1 of 3;" in str(xbackend.report())
        state["oom"] = 10**6  # out of memory on every call: disabled after OOM_STRIKES
        with falls_back("oom:oom", "ran out of memory"):
            for _ in range(3):
                assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt)[-1] == ("xbackend:reference", "reference")


def test_out_of_memory_at_first_use_retries_then_falls_back_for_that_call_only() -> None:
    state = {"oom": 1}
    sometimes_oom = ooms_first(state)
    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "oom", sometimes_oom)]) as rt:
        # One OOM during verification: the retry after emptying the cache verifies the impl.
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt) == [("oom:oom", "verified")]
    with fresh_runtime([plugin("gated_residual", "oom", sometimes_oom)]) as rt:
        state["oom"] = 2  # twice: this call is the reference's, nothing cached, the next call verifies
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt) == [("oom:oom", "transient")]
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt)[-1] == ("oom:oom", "verified")


def test_a_forced_impl_out_of_memory_twice_raises_instead_of_answering_with_the_reference() -> None:
    state = {"oom": 0}
    sometimes_oom = ooms_first(state)
    x, u, g = inputs()
    for mode in ("first", "always"):
        with fresh_runtime([plugin("gated_residual", "oom", sometimes_oom)]) as rt, \
                xbackend.use(gated_residual="oom"), xbackend.verify(mode):
            gated_residual(x, u, g)
            state["oom"] = 2
            with pytest.raises(xbackend.ImplUnusableError, match="forced impl 'oom' ran out of memory"):
                gated_residual(x, u, g)
            assert torch.equal(gated_residual(x, u, g), x + u * g)  # a strike: it keeps its place
            assert ("xbackend:reference", "reference") not in statuses(rt)


def test_the_reference_cannot_be_blocked_or_shadowed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XBACKEND_BLOCK", "reference")
    with fresh_runtime(block=None) as rt:
        assert "cannot block reference" in " ".join(rt.problems)
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
    with pytest.raises(ValueError, match="cannot block xbackend"):
        xbackend.Runtime(block=["xbackend"], autoload=False)
    with fresh_runtime([("shadow", plugin("rotary_embedding", "reference", lambda *a: None)[1])]) as rt:
        assert "reserved" in (rt.plugins["shadow"].error or "")
        with xbackend.use(rotary_embedding="reference"):
            plan = xbackend.plan("rotary_embedding", "cpu")
        assert plan.chosen.backend == "xbackend"


def test_xbackend_info_survives_a_blocked_reference() -> None:
    env = {"XBACKEND_BLOCK": "reference", "PATH": "", "XBACKEND_FAST_KEY": "0"}
    out = subprocess.run([sys.executable, "-m", "xbackend.cli", "info"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "cannot block reference" in out.stdout + out.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CPU-only machine's answer")
def test_plan_for_an_invisible_cuda_device_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    from xbackend.cli import main

    assert main(["plan", "--device", "cuda:0"]) == 2
    err = capsys.readouterr().err
    assert "'cuda:0' is not visible here" in err and "h100" in err and "Traceback" not in err


# -- smaller -------------------------------------------------------------------------------------
@pytest.mark.parametrize(("value", "autoload"), [("false", True), ("0", True), ("", True), ("1", False), ("TRUE", False)])
def test_autoload_switch_parses_booleans(value: str, autoload: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", value)
    monkeypatch.delenv("XBACKEND_PLUGINS", raising=False)
    rt = xbackend.Runtime()
    assert ("cuda" in rt.plugins) is autoload


def test_a_bad_autoload_value_is_a_problem_of_every_runtime_and_warns_once(monkeypatch: pytest.MonkeyPatch,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    from xbackend import _cache

    monkeypatch.setattr(_cache, "_warned", set())
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "maybe")
    monkeypatch.delenv("XBACKEND_PLUGINS", raising=False)
    message = ("XBACKEND_DISABLE_PLUGIN_AUTOLOAD='maybe' is not a boolean (1/true/yes/on or 0/false/no/off); "
               "taken as false")
    with caplog.at_level(logging.WARNING, "xbackend"):
        runtimes = [xbackend.Runtime(), xbackend.Runtime()]
    assert all("cuda" in rt.plugins and message in rt.problems for rt in runtimes)
    assert [r.getMessage() for r in caplog.records if "maybe" in r.getMessage()] == [f"xbackend: {message}"]


def test_unknown_plugin_and_block_names_are_reported(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("XBACKEND_PLUGINS", "cuda,cdua")
    monkeypatch.setenv("XBACKEND_BLOCK", "tritn")
    rt = xbackend.Runtime()
    assert any("cdua" in p for p in rt.problems) and any("tritn" in p for p in rt.problems)
    assert "cdua" in caplog.text


def test_events_are_bounded() -> None:
    from xbackend import _runtime

    with fresh_runtime() as rt:
        for n in range(1, _runtime._MAX_EVENTS + 50):
            rt._event(rt.candidates("rmsnorm")[0].op and xbackend.get_op("rmsnorm").spec,
                      type("E", (), {"described": str(n)})(), rt.reference("rmsnorm"), "reference")
        assert len(rt.events) == _runtime._MAX_EVENTS
        assert rt.events_total == _runtime._MAX_EVENTS + 49
        assert "earlier events not kept" in str(xbackend.report())


def test_fallback_is_a_warning_of_its_own_category() -> None:
    def wrong(x, u, g):
        return gr.reference(x, u, g) + 1

    with fresh_runtime([plugin("gated_residual", "wrong", wrong)]), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gated_residual(*inputs())
    assert [w.category for w in caught] == [xbackend.FallbackWarning]
    with fresh_runtime([plugin("gated_residual", "wrong", wrong)]), warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        with pytest.raises(xbackend.FallbackWarning, match="wrong:wrong failed verification"):
            gated_residual(*inputs())


def test_an_unhashable_argument_gets_the_ops_error() -> None:
    with fresh_runtime():
        with pytest.raises(TypeError, match="rmsnorm: argument 'eps' expected a float, got list"):
            rmsnorm(torch.randn(2, 4), None, [1e-6])


def test_bad_arguments_get_the_same_error_on_the_autograd_and_compile_paths() -> None:
    x = torch.randn(2, 8)
    with fresh_runtime():
        for t in (x, x.clone().requires_grad_()):
            with pytest.raises(TypeError, match="rmsnorm: argument 'eps' expected a float, got bool"):
                rmsnorm(t, None, True)
        torch._dynamo.reset()
        with torch.no_grad(), pytest.raises(Exception, match="rmsnorm: argument 'eps' expected a float, got bool"):
            torch.compile(lambda t: rmsnorm(t, None, True), backend="eager", fullgraph=True)(x)


def test_a_sparse_mkldnn_or_nested_tensor_or_a_huge_int_gets_the_ops_error() -> None:
    x, u, g = (t.float() for t in inputs())
    with fresh_runtime():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch: nested tensors are a prototype
            nested = torch.nested.nested_tensor([x[0], x[1, :5]])
        for bad in (x.to_sparse(), x.to_mkldnn(), nested):
            with pytest.raises(TypeError, match="gated_residual: argument 'x' expected a dense .strided. tensor"):
                gated_residual(bad, u, g)
        with pytest.raises(ValueError, match="rmsnorm: argument 'eps' expected a number >= 0 within float range"):
            rmsnorm(x, None, 10**400)


def test_meta_tensors_run_the_reference_and_blame_no_impl() -> None:
    class Portable:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="gated_residual", name="portable", fn=gr.reference, devices="*")

    meta = torch.empty(2, 8, 64, device="meta")
    with fresh_runtime([("p", Portable())]) as rt, warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        out = gated_residual(meta, meta, meta[:, :1])
        assert out.device.type == "meta" and out.shape == meta.shape
        assert statuses(rt) == [("p:portable", "unverified")] and "meta tensors" in rt.events[0].detail
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt)[-1] == ("p:portable", "verified")


def test_help_shows_the_ops_own_doc_and_signature() -> None:
    import inspect

    op = xbackend.get_op("rotary_embedding")
    assert str(inspect.signature(op)) == "(x: 'torch.Tensor', cos: 'torch.Tensor', sin: 'torch.Tensor', layout: 'str' = 'interleaved')"
    assert type(op).__doc__.startswith("rotary_embedding(x, cos, sin")


def test_tolerance_contract_with_nan_and_inf_in_the_reference() -> None:
    from xbackend._precision import compare

    ref = torch.tensor([1.0, float("nan"), float("inf"), 2.0])
    assert compare(ref.clone(), ref, xbackend.tolerance(1e-3)) is None
    assert "NaN" in compare(torch.tensor([1.0, 1.0, float("inf"), 2.0]), ref, xbackend.tolerance(1e-3))
    assert "relative Frobenius" in compare(torch.tensor([1.0, float("nan"), float("inf"), 3.0]), ref, xbackend.tolerance(1e-3))


# -- found by review: each reproduced, then fixed -----------------------------------------------------
def test_neighborhood_attention_output_of_another_shape_or_dtype_is_rejected() -> None:
    q = torch.randn(1, 16, 2, 8).to(torch.bfloat16)
    for name, bad in (("flat", lambda r: r.flatten()), ("fp32", lambda r: r.float()),
                      ("reshaped", lambda r: r.reshape(1, 2, 16, 8))):
        def impl(*a, bad=bad):
            return bad(na.reference(*a))

        with fresh_runtime([plugin("neighborhood_attention", name, impl, precision=xbackend.tolerance(0.005))]) as rt, \
                falls_back(f"{name}:{name}"):
            out = xbackend.get_op("neighborhood_attention")(q, q, q, 3)
        assert statuses(rt)[0] == (f"{name}:{name}", "mismatch") and out.shape == q.shape and out.dtype == q.dtype


def test_an_output_over_an_inputs_memory_through_another_storage_is_rejected() -> None:
    def through_dlpack(x, u, g):
        return torch.from_dlpack(x.__dlpack__())  # another storage object over x's memory

    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "dl", through_dlpack)]) as rt, falls_back("dl:dl"):
        gated_residual(x, u, g)
    assert "sharing memory with input 'x'" in rt.events[0].detail


def test_backward_after_an_in_place_edit_of_an_input_raises_like_eager() -> None:
    x, u, g = (torch.randn(2, 4, 8, requires_grad=True) for _ in range(3))
    y = gated_residual(x, u, g)
    with torch.no_grad():
        g.mul_(10)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()


def test_a_forced_impl_that_keeps_failing_raises_impl_unusable_every_call() -> None:
    def crashes(x, u, g):
        raise RuntimeError("CUDA error (simulated)")

    with fresh_runtime([plugin("gated_residual", "bad", crashes)]), xbackend.use(gated_residual="bad"):
        for _ in range(3):
            with pytest.raises(xbackend.ImplUnusableError, match="forced impl 'bad"):
                gated_residual(*inputs())


def test_werror_fallback_warning_is_raised_on_a_later_call_mismatch_too() -> None:
    calls = {"n": 0}

    def late(x, u, g):
        calls["n"] += 1
        return gr.reference(x, u, g) + (calls["n"] > 1)

    args = inputs()  # one key: new tensors of the same shape can start at another alignment class
    with fresh_runtime([plugin("gated_residual", "late", late)]), xbackend.verify("always"), warnings.catch_warnings():
        warnings.simplefilter("error", xbackend.FallbackWarning)
        gated_residual(*args)
        with pytest.raises(xbackend.FallbackWarning, match="later call"):
            gated_residual(*args)


def test_an_error_after_an_out_of_memory_retry_falls_back_and_a_good_retry_resets_the_count() -> None:
    plan = []

    def scripted(x, u, g):
        step = plan.pop(0) if plan else "ok"
        if step == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        if step == "crash":
            raise RuntimeError("illegal memory access (simulated)")
        return gr.reference(x, u, g)

    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "s", scripted)]) as rt:
        gated_residual(x, u, g)
        for _ in range(4):  # OOM then a good retry, four times: never disabled
            plan[:] = ["oom", "ok"]
            assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert ("s:s", "raised") not in statuses(rt) and ("s:s", "transient") not in statuses(rt)
        plan[:] = ["oom", "crash"]
        with falls_back("s:s", "raised"):
            assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt)[-2:] == [("s:s", "raised"), ("xbackend:reference", "reference")]


def test_an_impl_that_calls_its_own_op_does_not_hang() -> None:
    def reenters(x, u, g):
        return gated_residual(x, u, g)

    x, u, g = inputs()
    done = []
    t = threading.Thread(target=lambda: done.append(gated_residual(x, u, g)))
    with fresh_runtime([plugin("gated_residual", "loop", reenters)]) as rt, falls_back("loop:loop", "raised"):
        t.start()
        t.join(timeout=30)
    assert not t.is_alive() and torch.equal(done[0], x + u * g)
    assert statuses(rt)[0] == ("loop:loop", "raised") and "re-enter" in rt.events[0].detail


def test_a_reference_failure_during_verification_reaches_the_caller_and_disables_nothing(monkeypatch) -> None:
    x, u, g = inputs()
    with fresh_runtime([plugin("gated_residual", "good", gr.reference)]) as rt:
        spec = gated_residual.spec
        monkeypatch.setattr(type(spec), "check_output", lambda self, out, args, p: (_ for _ in ()).throw(
            RuntimeError("CUDA error in the reference (simulated)")))
        with pytest.raises(RuntimeError, match="in the reference"):
            gated_residual(x, u, g)
        monkeypatch.undo()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert statuses(rt) == [("good:good", "verified")]


def test_a_reference_failure_during_a_later_check_reaches_the_caller_and_disables_nothing(monkeypatch) -> None:
    x, u, g = inputs()
    for forced in (False, True):
        with fresh_runtime([plugin("gated_residual", "good", gr.reference)]) as rt, xbackend.verify("always"), \
                xbackend.use(**({"gated_residual": "good"} if forced else {})):
            gated_residual(x, u, g)
            spec = gated_residual.spec
            monkeypatch.setattr(type(spec), "check_output", lambda self, out, args, p: (_ for _ in ()).throw(
                RuntimeError("CUDA error in the reference (simulated)")))
            with pytest.raises(RuntimeError, match="in the reference") as raised:
                gated_residual(x, u, g)
            assert type(raised.value) is RuntimeError
            monkeypatch.undo()
            assert torch.equal(gated_residual(x, u, g), x + u * g)
            assert statuses(rt) == [("good:good", "verified")]


def test_problems_lists_a_failed_plugin_even_when_another_line_contains_its_name() -> None:
    class Broken:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            raise RuntimeError("kernel table missing")

    with fresh_runtime([("liger", Broken())], block=["liger_old"]):
        assert any(p.startswith("plugin 'liger'") for p in xbackend.problems())


def test_a_bad_verify_mode_in_the_environment_warns_and_means_first(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    from xbackend._guard import FIRST, env_verify_mode

    monkeypatch.setenv("XBACKEND_VERIFY", "sometimes")
    with caplog.at_level(logging.WARNING, "xbackend"):
        assert env_verify_mode() == FIRST
        monkeypatch.setenv("XBACKEND_VERIFY", "sample:0")
        assert env_verify_mode() == FIRST
    messages = [r.getMessage() for r in caplog.records]
    assert "xbackend: XBACKEND_VERIFY: expected 'first', 'always' or 'sample:N' with N >= 1, got 'sometimes'; " \
           "using 'first'" in messages
    assert any("got 'sample:0'" in m for m in messages)
