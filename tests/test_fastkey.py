"""C++ dispatch keys (xbackend/_fastkey.py): equal iff the Python keys are equal, the hot path and the
guard unchanged under them, and a clean fall back to Python keys when the extension is unavailable.

The extension is built once per test session into the usual cache ($XBACKEND_CACHE_DIR or
~/.cache/xbackend), so a later session only loads it; a fresh build takes ~15-20 s on a 2-core CPU.
"""

from __future__ import annotations

import functools
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from fallbacks import falls_back
from hypothesis import given, settings
from hypothesis import strategies as st
from plugin_fixtures import FaultyPlugin

import xbackend
from xbackend import _cache, _fastkey
from xbackend._guard import ALIGN, alignment
from xbackend.ops import OPS
from xbackend.testing import fresh_runtime

gated_residual = xbackend.get_op("gated_residual")
rmsnorm = xbackend.get_op("rmsnorm")


@functools.cache
def _built() -> tuple[ModuleType, Path]:
    # Cached per process, not per fixture: other test modules bind this fixture under their own name.
    module, _ = _fastkey.build()
    return module, _cache.cache_root()


@pytest.fixture(scope="session")
def ext() -> tuple[ModuleType, Path]:
    problem = _fastkey.build_problem()
    if problem is not None:
        pytest.skip(f"the C++ dispatch key extension cannot be built here: {problem}")
    return _built()


@pytest.fixture(autouse=True)
def _keep_key_form() -> Iterator[None]:
    """Every test here may switch the process's key form; the rest of the suite gets it back."""
    saved = (_fastkey.KEYS, _fastkey._state)
    try:
        yield
    finally:
        _fastkey._set(*saved)


@pytest.fixture
def fast(ext: tuple[ModuleType, Path]) -> dict:
    _fastkey._install(_fastkey.KeyForm("c++", "test"), ext[0])
    return _fastkey.KEYS


def keyfn(module: ModuleType, mask: int = 0b111):
    def fallback(*args):
        raise LookupError("fallback")

    return module.make("t", mask, fallback)


def sig(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device, alignment(t))


def at(shape, strides, dtype, device, offset: int = 0) -> torch.Tensor:
    """A new tensor of this metadata whose data starts ``offset`` bytes past an ALIGN-aligned address
    (a meta tensor has none), so its alignment class is ``offset``'s (ALIGN for 0)."""
    size = torch.empty(0, dtype=dtype).element_size()
    extent = 1 + sum((n - 1) * st for n, st in zip(shape, strides, strict=True)) if all(shape) else 0
    buf = torch.empty(ALIGN + offset + extent * size, dtype=torch.uint8, device=device)
    start = 0 if buf.is_meta else (-buf.data_ptr()) % ALIGN + offset
    return torch.empty(0, dtype=dtype, device=device).set_(buf.untyped_storage(), start // size, shape, strides)


def twin(t: torch.Tensor) -> torch.Tensor:
    """A new tensor with ``t``'s shape, strides, dtype and device at an address congruent to t's modulo
    ALIGN: the same runtime key."""
    return at(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % ALIGN)


def tagged(v):
    """What both key forms hold of a non-tensor argument: the value and its type tag."""
    return v, tuple(map(type, v)) if type(v) is tuple else type(v)


class Tup(tuple):
    """A tuple subclass: equal to a plain tuple of the same items, so only its tag tells it apart."""


# Non-tensor arguments in classes of equal values of other types (1 == 1.0 == True, (1, 0) == (True,
# False)): a key comparing values alone would confuse the members of a class.
EQUAL = [[None], [0, 0.0, False, -0.0], [1, 1.0, True], [3, 3.0], ["torch"], [()],
         [(1, 0), (True, False), (1.0, 0.0)], [(3, 3), (3.0, 3.0), (3, 3.0), Tup((3, 3))], [[3, 3], [3.0, 3.0]],
         [((1,),), ((True,),)], [2**70, 2.0**70]]  # fmt: skip


@st.composite
def _scalar_pair(draw):
    """Two non-tensor arguments, most often members of one EQUAL class (equal values, maybe other types)."""
    first = draw(st.sampled_from(EQUAL))
    second = first if draw(st.integers(0, 3)) else draw(st.sampled_from(EQUAL))
    return draw(st.sampled_from(first)), draw(st.sampled_from(second))


# -- equal iff the Python keys are equal -----------------------------------------------------------
@st.composite
def _arg(draw):
    """None or (sizes, strides, dtype, device, byte offset) from a small space, so equal metadata is
    common; the offset past an ALIGN-aligned address sets the alignment class."""
    if draw(st.integers(0, 4)) == 0:
        return None
    sizes = draw(st.lists(st.integers(0, 3), min_size=0, max_size=3))
    strides = draw(st.lists(st.integers(0, 4), min_size=len(sizes), max_size=len(sizes)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    offset = draw(st.sampled_from([0, 2, 4, 8, 16, 64, 256]))
    return sizes, strides, dtype, draw(st.sampled_from(["cpu", "meta"])), offset - offset % (4 if dtype == torch.float32 else 2)


def make(spec):
    if spec is None:
        return None
    return at(*spec)


@settings(max_examples=300, deadline=None)
@given(st.lists(_arg(), min_size=3, max_size=3), st.lists(_arg(), min_size=3, max_size=3), st.booleans())
def test_keys_are_equal_iff_the_python_keys_are(ext, a, b, same) -> None:
    k = keyfn(ext[0])
    xs = [make(s) for s in a]
    # Half the time the second call has the same metadata (new tensors), so equality is exercised.
    ys = [None if t is None else twin(t) for t in xs] if same else [make(s) for s in b]
    fx, fy = k(*xs), k(*ys)
    assert isinstance(fx[1], bytes) and hash(fx) is not None
    assert (fx == fy) == ([sig(t) for t in xs] == [sig(t) for t in ys])


@settings(max_examples=300, deadline=None)
@given(st.lists(_scalar_pair(), min_size=2, max_size=2), st.booleans(), st.booleans())
def test_non_tensor_arguments_key_by_value_and_type(ext, pairs, same_tensor, tensor_first) -> None:
    """A tensor and two non-tensor arguments, in either order: keys are equal iff the tensors' metadata,
    the values and their type tags are."""
    (a0, b0), (a1, b1) = pairs
    a, b = (a0, a1), (b0, b1)
    k = keyfn(ext[0], mask=0b001 if tensor_first else 0b100)
    x = torch.randn(2, 3)
    y = torch.empty_like(x) if same_tensor else x.t()

    def call(t, values):
        return k(t, *values) if tensor_first else k(*values, t)

    fx, fy = call(x, a), call(y, b)
    assert isinstance(fx[1], bytes)
    assert (fx == fy) == (sig(x) == sig(y) and [tagged(v) for v in a] == [tagged(v) for v in b]), (a, b)


def test_op_keys_agree_with_the_python_keys(fast) -> None:
    x = torch.randn(2, 8, 64)
    w, w2 = torch.randn(64), torch.randn(64, dtype=torch.float64)[::1].float()
    calls = [
        ("rmsnorm", (x, w, 1e-6, "torch")), ("rmsnorm", (x, None, 1e-6, "torch")), ("rmsnorm", (x, w2, 1e-6, "torch")),
        ("rmsnorm", (x, w, 1e-5, "torch")), ("rmsnorm", (x, w, 1e-6, "diffusers")), ("rmsnorm", (x.bfloat16(), None, 1e-6, "torch")),
        ("gated_residual", (x, x, x[:, :1])), ("gated_residual", (x, x, x[:, :1].contiguous())), ("gated_residual", (x, x, x)),
        ("rmsnorm_modulate", (x, x[:, :1], x[:, :1], None, 1e-6, "torch")), ("rmsnorm_modulate", (x, x[:, :1], x[:, :1], w, 1e-6, "torch")),
    ]
    # Equal values of other types: each pair would share a key if keys compared values alone.
    calls += [("rmsnorm", (x, w, 1.0, "torch")), ("rmsnorm", (x, w, 1, "torch")), ("rmsnorm", (x, w, True, "torch")),
              ("rmsnorm", (x, None, 0.0, "torch")), ("rmsnorm", (x, None, False, "torch")),
              ("rmsnorm_modulate", (x, x[:, :1], x[:, :1], None, 1, "torch")),
              ("rmsnorm_modulate", (x, x[:, :1], x[:, :1], None, 1.0, "torch"))]  # fmt: skip
    q = torch.randn(1, 6, 6, 2, 8)
    calls += [("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (False, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 2), (False, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (False, False), 0.5, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (False, False), 1, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (False, False), 1.0, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3.0, 3.0), (1, 1), (False, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3.0), (1, 1), (False, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (True, True), (False, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (True, False), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, (3, 3), (1, 1), (1, 0), None, (1, 1))),
              ("neighborhood_attention", (q, q, q, Tup((3, 3)), (1, 1), (False, False), None, (1, 1)))]  # fmt: skip
    c = torch.randn(2, 8, 64)
    calls += [("rotary_embedding", (x, c, c, "interleaved")), ("rotary_embedding", (x, c, c, "split")),
              ("qk_norm_rope", (x, x, w, w, c, c, 1e-6, "torch", "interleaved")),
              ("qk_norm_rope", (x, x, w, w, c, c, 1, "torch", "interleaved")),
              ("qk_norm_rope", (x, x, w, w, c, c, 1.0, "torch", "interleaved"))]  # fmt: skip
    for name, args in calls:
        assert isinstance(fast[name](*args)[1], bytes), name
    for n1, a1 in calls:
        for n2, a2 in calls:
            same_python = OPS[n1].key(*a1) == OPS[n2].key(*a2)
            assert (fast[n1](*a1) == fast[n2](*a2)) == same_python, (n1, n2)


@pytest.mark.parametrize("other", [
    lambda x: x.view(4, 4, 8),  # shape (and ndim)
    lambda x: x.reshape(1, 8, 16),  # ndim only: same numel and last dims
    lambda x: x.t(),  # a non-contiguous view: shape and stride
    lambda x: x[:, ::2],  # non-contiguous, same shape as a contiguous one below
    lambda x: torch.empty_strided(x.shape, (1, 8), dtype=x.dtype),  # stride only
    lambda x: x.double(),  # dtype
    lambda x: x.to("meta"),  # device
    lambda x: None,  # None vs a tensor
])
def test_any_difference_gives_a_different_key(ext, other) -> None:
    k = keyfn(ext[0], mask=0b1)
    x = torch.randn(8, 16)
    y = other(x)
    assert k(x) != k(y)
    if y is not None:
        assert k(y) == k(twin(y))


def test_a_non_contiguous_view_differs_from_its_contiguous_copy(ext) -> None:
    k = keyfn(ext[0], mask=0b1)
    v = torch.randn(8, 16)[:, ::2]
    assert v.shape == v.contiguous().shape and k(v) != k(v.contiguous())


def test_non_tensor_arguments_stay_python_objects(ext) -> None:
    k = ext[0].make("rmsnorm", 0b11, OPS["rmsnorm"].key)
    x = torch.randn(2, 4)
    key = k(x, None, 1e-6, "torch")
    assert key[0] == "rmsnorm" and key[2:] == (1e-6, float, "torch", str)
    assert key != k(x, None, 1e-5, "torch") and key != k(x, None, 1e-6, "diffusers")
    assert k(x, None, 1.0, "torch") != k(x, None, True, "torch") != k(x, None, 1, "torch")
    # A tuple's tag is its elements' types: (3, 3) and (3.0, 3.0) are equal values of other types.
    nk = ext[0].make("neighborhood_attention", 0b111, OPS["neighborhood_attention"].key)
    q = torch.randn(1, 6, 6, 2, 8)
    assert nk(q, q, q, (3, 3), (1, 1), (True, False), None)[2:] == \
        ((3, 3), (int, int), (1, 1), (int, int), (True, False), (bool, bool), None, type(None))
    assert nk(q, q, q, (3.0, 3.0), (1, 1), (1, 0), None)[2:] == \
        ((3.0, 3.0), (float, float), (1, 1), (int, int), (1, 0), (int, int), None, type(None))


# -- what the C++ code does not read itself goes to the Python key ----------------------------------
class Sub(torch.Tensor):
    pass


class Liar(torch.Tensor):
    """A subclass whose __torch_function__ changes what ``.shape`` says: only Python sees that."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func == torch.Tensor.shape.__get__:
            return torch.Size([99])
        return super().__torch_function__(func, types, args, kwargs or {})


class Mode(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_subclasses_modes_and_odd_tensors_get_the_python_key(fast) -> None:
    spec = OPS["gated_residual"]
    fk = fast["gated_residual"]
    x = torch.randn(2, 4)
    for args in [(x.as_subclass(Sub), x, x), (x, x.as_subclass(Liar), x)]:
        assert fk(*args) == spec.key(*args)
    assert spec.key(x, x.as_subclass(Liar), x)[6] == torch.Size([99])
    with Mode():
        assert fk(x, x, x) == spec.key(x, x, x)
    with torch.device("meta"):  # a torch function mode too
        assert fk(x, x, x) == spec.key(x, x, x)
    assert fk(x, x, x) != spec.key(x, x, x)  # and back to C++ keys after it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "nested tensors are in prototype stage"
        nested = torch.nested.nested_tensor([torch.randn(2, 4), torch.randn(3, 4)])
    # Sparse and MKL-DNN tensors have no data pointer: both forms raise data_ptr()'s error.
    for bad in ([1, 2], 3.0, nested, x.to_sparse(), x.to_mkldnn()):
        with pytest.raises(Exception) as fast_error:
            fk(x, bad, x)
        with pytest.raises(Exception) as python_error:
            spec.key(x, bad, x)
        assert type(fast_error.value) is type(python_error.value)
        assert str(fast_error.value) == str(python_error.value)
    assert fk(x=x, update=x, gate=x) == spec.key(x=x, update=x, gate=x)


def test_the_python_keys_inline_class_is_alignments_at_every_offset() -> None:
    """make_key reads a plain tensor's class from a table by address modulo ALIGN; a Parameter goes
    through alignment() itself: both give the largest power of two dividing the address, capped."""
    spec = OPS["rmsnorm"]
    for dtype in (torch.uint8, torch.bfloat16, torch.float32):
        size = torch.empty(0, dtype=dtype).element_size()
        for offset in range(0, 2 * ALIGN, size):
            x = at((2, 3), (3, 1), dtype, "cpu", offset)
            w = torch.nn.Parameter(at((3,), (1,), dtype, "cpu", offset), requires_grad=False)
            expected = min(ALIGN, offset & -offset) if offset else ALIGN
            assert alignment(x) == alignment(w) == expected
            key = spec.key(x, w, 1e-6, "torch")
            assert key[5] == key[6][4] == expected  # x, then the optional weight as one tuple


def test_tensors_the_guard_cannot_copy_get_the_python_key_with_no_alignment(fast) -> None:
    spec, fk = OPS["gated_residual"], fast["gated_residual"]
    x = torch.randn(3, 2, 4)
    seen = []

    def record(a):
        seen.append((fk(a, a, a), spec.key(a, a, a)))
        return a

    torch.vmap(record)(x)  # a BatchedTensor of one example's shape
    torch.func.functionalize(record)(x)  # a functionalize wrapper, whose data_ptr() answers 0
    assert [python_key[1] for _, python_key in seen] == [x[0].shape, x.shape]
    for fast_key, python_key in seen:
        assert fast_key == python_key and python_key[5] is None  # no alignment class: the guard cannot copy it


def test_parameters_take_the_cpp_path_and_key_like_tensors(fast) -> None:
    x, w = torch.randn(2, 8), torch.randn(8)
    p = torch.nn.Parameter(twin(w).copy_(w))  # other memory, the same alignment class
    key = fast["rmsnorm"](x, p, 1e-6, "torch")
    assert isinstance(key[1], bytes) and key == fast["rmsnorm"](x, w, 1e-6, "torch")


# -- the hot path and the guard under C++ keys -----------------------------------------------------
def inputs(d: int = 64, dtype: torch.dtype = torch.bfloat16):
    g = torch.Generator().manual_seed(d)
    x, u = (torch.randn(2, 8, d, generator=g).to(dtype) for _ in range(2))
    return x, u, torch.randn(2, 1, d, generator=g).to(dtype)


def test_ops_use_the_installed_key_functions(fast) -> None:
    for name in OPS:
        assert xbackend.get_op(name)._key is fast[name]


def test_hot_path_and_guard_under_cpp_keys(fast) -> None:
    with fresh_runtime([("faulty", FaultyPlugin())]) as rt, torch.inference_mode(), falls_back("faulty:wrong"), \
            falls_back("faulty:wrong", "raised"), falls_back("faulty:crashing", "raised"):  # wrong: .view() of xt
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert [(e.impl, e.status) for e in rt.events] == [
            ("faulty:wrong", "mismatch"), ("faulty:crashing", "raised"), ("faulty:exact", "verified")]
        for _ in range(3):  # cache hits: no new events
            assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert len(rt.events) == 3
        (cache,) = rt._caches.values()
        assert all(isinstance(k[1], bytes) for k in cache)
        # A new layout of the same shape is a new key: checked and verified again.
        xt = x.transpose(0, 1).contiguous().transpose(0, 1)
        assert torch.equal(gated_residual(xt, u, g), xt + u * g)
        assert len(rt.events) == 6
        # A subclass goes through the Python key (a separate entry), with the same result.
        xs = x.as_subclass(Sub)
        assert torch.equal(gated_residual(xs, u, g), x + u * g)
        assert sum(not isinstance(k[1], bytes) for k in cache) == 1
        # Errors are the op's own, as with Python keys.
        with pytest.raises(TypeError, match="argument 'gate' expected a torch.Tensor, got NoneType"):
            gated_residual(x, u, None)
        with pytest.raises(TypeError, match="argument 'gate' expected a torch.Tensor, got list"):
            gated_residual(x, u, [1.0])
        out = rmsnorm(x.float(), None, 1e-6, "torch")
        assert torch.equal(out, torch.nn.functional.rms_norm(x.float(), (64,), None, 1e-6))


def test_bench_dispatch_says_which_keys_it_timed(fast) -> None:
    from xbackend.bench import bench_dispatch

    assert "C++ keys" in bench_dispatch(2000)


# -- the loading policy and failures ---------------------------------------------------------------
@pytest.fixture
def undecided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """A process state before its first dispatch, with an empty cache dir."""
    _fastkey._set({name: spec.key for name, spec in OPS.items()}, None)
    monkeypatch.setenv("XBACKEND_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv(_fastkey.ENV, raising=False)
    return tmp_path


def first_dispatch() -> None:
    with fresh_runtime(), torch.inference_mode():
        x, u, g = inputs()
        assert torch.equal(gated_residual(x, u, g), x + u * g)
        assert torch.equal(gated_residual(x, u, g), x + u * g)


def test_a_failed_build_falls_back_to_python_keys_with_one_warning(undecided, monkeypatch, caplog) -> None:
    def broken_build():
        raise RuntimeError("Error building extension 'xbackend_fastkey'\nfastkey.cpp:1: error: simulated")

    monkeypatch.setattr(_fastkey, "build", broken_build)
    monkeypatch.setenv(_fastkey.ENV, "1")
    with caplog.at_level(logging.WARNING, "xbackend"):
        first_dispatch()
        first_dispatch()
    assert [r.getMessage() for r in caplog.records] == [
        "xbackend: C++ dispatch keys unavailable (build failed: fastkey.cpp:1: error: simulated); using Python keys"]
    assert _fastkey.active().form == "python" and "build failed" in _fastkey.active().reason
    assert gated_residual._key is OPS["gated_residual"].key


def test_a_broken_prebuilt_falls_back_without_building(undecided, monkeypatch, caplog) -> None:
    monkeypatch.setattr(_fastkey, "_gpu_visible", lambda: False)
    monkeypatch.setattr(_fastkey, "build", lambda: pytest.fail("no build without a GPU or XBACKEND_FAST_KEY=1"))
    path = _fastkey.library_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(b"not a shared object")
    with caplog.at_level(logging.WARNING, "xbackend"):
        first_dispatch()
    assert len(caplog.records) == 1 and "failed to load" in caplog.records[0].getMessage()
    assert _fastkey.active().form == "python"


@pytest.mark.parametrize(("env", "gpu", "prebuilt", "form", "built"), [
    ("0", True, True, "python", False),
    ("1", False, False, "c++", True),
    (None, True, False, "c++", True),  # a serving host builds on first use
    (None, False, False, "python", False),  # a CPU host without a prebuilt one does not build
    (None, False, True, "c++", False),  # ... but loads one that is there
    ("auto", False, True, "c++", False),
])
def test_loading_policy(undecided, monkeypatch, ext, env, gpu, prebuilt, form, built) -> None:
    calls = []

    def fake_build():
        calls.append(1)
        return ext[0], 0.0

    if prebuilt:
        monkeypatch.setenv("XBACKEND_CACHE_DIR", str(ext[1]))
    if env is not None:
        monkeypatch.setenv(_fastkey.ENV, env)
    monkeypatch.setattr(_fastkey, "_gpu_visible", lambda: gpu)
    monkeypatch.setattr(_fastkey, "build", fake_build)
    first_dispatch()
    state = _fastkey.active()
    assert (state.form, bool(calls)) == (form, built), state
    assert isinstance(gated_residual._key(*inputs()), tuple)
    assert (gated_residual._key is OPS["gated_residual"].key) == (form == "python")


def test_decided_once_per_process(undecided, monkeypatch, ext) -> None:
    monkeypatch.setenv("XBACKEND_CACHE_DIR", str(ext[1]))
    first_dispatch()
    state = _fastkey.active()
    monkeypatch.setenv(_fastkey.ENV, "0")
    first_dispatch()
    assert _fastkey.active() is state and state.form == "c++"


def test_import_never_compiles() -> None:
    code = ("import sys, xbackend; from xbackend import _fastkey; "
            "assert _fastkey.active() is None; assert 'torch.utils.cpp_extension' not in sys.modules; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, _fastkey.ENV: "1"})
    assert out.stdout.strip() == "ok"
