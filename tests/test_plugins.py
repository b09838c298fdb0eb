"""Plugin loading: entry points, builtin backends, failures isolated, blocks, autoload switch."""

from __future__ import annotations

import importlib.metadata
import sys
import types

import pytest

import xbackend
from xbackend.ops import rmsnorm
from xbackend.testing import fresh_runtime


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, modules: dict[str, types.ModuleType | None]) -> None:
    eps = []
    for name, module in modules.items():
        mod_name = f"xb_test_plugin_{name}"
        if module is not None:
            monkeypatch.setitem(sys.modules, mod_name, module)
        eps.append(importlib.metadata.EntryPoint(name=name, value=mod_name, group="xbackend"))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: [e for e in eps if e.group == group])


def _module(register) -> types.ModuleType:
    m = types.ModuleType("plugin")
    m.xbackend_register_impls = xbackend.hookimpl(register)
    return m


def _ok(registrar):
    registrar.register(op="rmsnorm", name="good", fn=lambda *a: None, devices="sm90")


def test_builtin_backends_load_through_the_entry_point_group() -> None:
    names = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="xbackend")}
    assert names["cuda"] == "xbackend_cuda.plugin" and names["rocm"] == "xbackend_rocm.plugin"
    with fresh_runtime(autoload=True) as rt:
        assert rt.plugins["cuda"].error is None and rt.plugins["rocm"].error is None


def test_failing_plugins_are_reported_and_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    def unknown_op(registrar):
        registrar.register(op="rmsnorm", name="kept_only_if_all_succeed", fn=lambda *a: None)
        registrar.register(op="softmax", name="x", fn=lambda *a: None)

    def duplicate(registrar):
        registrar.register(op="rmsnorm", name="good", fn=lambda *a: None)  # same name as plugin 'good': fine
        registrar.register(op="rmsnorm", name="good", fn=lambda *a: None)  # twice in one plugin: an error

    _fake_entry_points(monkeypatch, {"good": _module(_ok), "broken_import": None, "unknown_op": _module(unknown_op), "dup": _module(duplicate)})
    with fresh_runtime(autoload=True) as rt:
        assert rt.plugins["good"].error is None and rt.plugins["good"].impls == ["rmsnorm:good"]
        assert rt.plugins["broken_import"].error.startswith("import failed: ModuleNotFoundError")
        assert "plugin 'unknown_op' registered impl 'x' for unknown op 'softmax'" in rt.plugins["unknown_op"].error
        assert rt.plugins["dup"].error.endswith(
            "plugin 'dup' registered impl 'good' for op 'rmsnorm' twice; impl names are unique per plugin and op")
        # Nothing of a failed plugin is kept, and the rest keep working.
        assert [i.qualname for i in rt.candidates("rmsnorm")] == ["good:good", "xbackend:reference"]
        assert xbackend.plan("rmsnorm", "sm90").chosen.impl == "good"


def test_autoload_off_loads_only_named_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, {"good": _module(_ok)})
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "1")
    with fresh_runtime(autoload=None) as rt:
        assert rt.plugins == {}
    monkeypatch.setenv("XBACKEND_PLUGINS", "good")
    with fresh_runtime(autoload=None) as rt:
        assert list(rt.plugins) == ["good"]


NO_BACKEND = "autoload off and XBACKEND_PLUGINS empty: no backend loaded"


def test_autoload_off_with_no_plugin_named_says_so_in_plans_and_info(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from xbackend.cli import main

    _fake_entry_points(monkeypatch, {"good": _module(_ok)})
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.delenv("XBACKEND_PLUGINS", raising=False)
    with fresh_runtime(autoload=None):
        p = xbackend.plan("rmsnorm", "sm90")
        assert p.chosen.qualname == "xbackend:reference" and NO_BACKEND in str(p)
        assert main(["info"]) == 0
        assert NO_BACKEND in capsys.readouterr().out
    monkeypatch.setenv("XBACKEND_PLUGINS", "good")
    with fresh_runtime(autoload=None):
        assert NO_BACKEND not in str(xbackend.plan("rmsnorm", "sm90"))


def test_xbackend_plugins_with_autoload_on_is_a_load_time_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, {"good": _module(_ok)})
    monkeypatch.delenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.setenv("XBACKEND_PLUGINS", "foo")
    with fresh_runtime(autoload=None) as rt:
        assert list(rt.plugins) == ["good"]
        assert rt.load_problems() == [
            "XBACKEND_PLUGINS=foo is ignored: it selects plugins only with XBACKEND_DISABLE_PLUGIN_AUTOLOAD=1, "
            "and autoload is on (every installed plugin loads)"]


def test_block_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, {"good": _module(_ok)})
    monkeypatch.setenv("XBACKEND_BLOCK", "good")
    with fresh_runtime(autoload=True, block=None) as rt:
        assert rt.plugins["good"].error == "blocked by XBACKEND_BLOCK"


def test_registrar_rejects_impersonation() -> None:
    def impersonate(registrar):
        registrar.register(xbackend.Impl(op="rmsnorm", name="x", fn=lambda *a: None, backend="cuda"))

    with fresh_runtime([("evil", _module(impersonate))]) as rt:
        assert "claiming backend 'cuda'" in rt.plugins["evil"].error


# -- registrations are validated when registered ----------------------------------------------------
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"devices": "sm90-sm103"}, "a range is written sm90..sm103"),
        ({"devices": "hopper"}, "unknown arch 'hopper'"),
        ({"priority": "high"}, "priority expected an int"),
        ({"priority": True}, "priority expected an int"),
        ({"dtypes": {"bf16"}}, "dtypes expected a non-empty set of torch dtypes"),
        ({"precision": "exact"}, "precision expected xbackend.EXACT"),
        ({"fn": "no_colon_here"}, "fn expected a callable or a 'package.module:function' string"),
        ({"supports": 3}, "supports expected None"),
    ],
)
def test_bad_registrations_raise_naming_plugin_and_impl(fields, message) -> None:
    class Bad:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(**{"op": "rmsnorm", "name": "mine", "fn": rmsnorm.reference, **fields})

    with pytest.raises(xbackend.RegistrationError, match=message):
        xbackend.Impl(**{"op": "rmsnorm", "name": "mine", "fn": rmsnorm.reference, **fields})
    with fresh_runtime([("badplugin", Bad())]) as rt:
        error = rt.plugins["badplugin"].error or ""
        assert "impl rmsnorm:mine" in error and message.split("(")[0] in error


def test_an_impl_whose_fn_does_not_import_is_unavailable_not_chosen() -> None:
    class Broken:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="rmsnorm", name="ghost", fn="no_such_package.kernels:rmsnorm", priority=99, devices="*")

    with fresh_runtime([("broken", Broken())]):
        plan = xbackend.plan("rmsnorm", "cpu")
        ghost = next(r for r in plan.rows if r.impl == "ghost")
        assert not ghost.chosen and "cannot import fn 'no_such_package.kernels:rmsnorm'" in (ghost.reason or "")


# -- a third-party entry point named like a builtin backend ------------------------------------------
IMPOSTOR_PLUGIN = '''
import xbackend

@xbackend.hookimpl
def xbackend_register_impls(registrar):
    registrar.register(op="gated_residual", name="impostor", fn=lambda x, u, g: x, priority=10**6, devices="*")
'''


def _impostor_distribution(root, name: str = "cuda") -> None:
    """An installed distribution 'evil-dist' whose entry point takes a builtin backend's name."""
    info = root / "evil_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-dist\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[xbackend]\n{name} = evil_cuda.plugin\n")
    (root / "evil_cuda").mkdir()
    (root / "evil_cuda" / "__init__.py").write_text("")
    (root / "evil_cuda" / "plugin.py").write_text(IMPOSTOR_PLUGIN)


@pytest.mark.parametrize("order", ["impostor_first", "impostor_last"])
def test_an_entry_point_named_like_a_builtin_backend_is_refused_and_the_builtin_still_loads(
        monkeypatch: pytest.MonkeyPatch, tmp_path, capsys, order: str) -> None:
    from xbackend.cli import main
    from xbackend.fleet.matrix import plugin_records

    _impostor_distribution(tmp_path)
    path = [str(tmp_path), *sys.path] if order == "impostor_first" else [*sys.path, str(tmp_path)]
    monkeypatch.setattr(sys, "path", path)
    importlib.invalidate_caches()
    found = [(ep.name, ep.dist.name) for ep in importlib.metadata.entry_points(group="xbackend") if ep.name == "cuda"]
    assert found == ([("cuda", "evil-dist"), ("cuda", "xbackend")] if order == "impostor_first"
                     else [("cuda", "xbackend"), ("cuda", "evil-dist")])

    def check(rt) -> None:
        builtin, impostor = rt.plugins["cuda"], rt.plugins["cuda@evil-dist"]
        assert builtin.error is None and builtin.impls and "xbackend_cuda.plugin (xbackend)" in builtin.source
        assert impostor.name == "cuda@evil-dist" and "evil_cuda.plugin (evil-dist)" in impostor.source
        assert "the plugin name 'cuda' is reserved for the builtin backend" in (impostor.error or "")
        assert "evil_cuda" not in sys.modules  # refused before its module is imported
        assert xbackend.plan("gated_residual", "sm90").chosen.backend == "cuda"
        assert "impostor" not in [i.name for i in rt.candidates("gated_residual")]
        (problem,) = [p for p in xbackend.problems() if "evil-dist" in p]
        assert problem.startswith("plugin 'cuda@evil-dist' from evil-dist: refused")
        assert [s.name for s in xbackend.plugins()].count("cuda") == 1
        records = {r["name"]: r for r in plugin_records(rt)}  # the fleet JSON's plugin list
        assert (records["cuda"]["distribution"], records["cuda@evil-dist"]["distribution"]) == ("xbackend", "evil-dist")

    with fresh_runtime(autoload=True) as rt:
        check(rt)
        assert main(["info"]) == 0
        out = capsys.readouterr().out
        assert "  cuda@evil-dist FAILED: refused: the plugin name 'cuda' is reserved" in out
        assert any(line.split()[:1] == ["cuda"] and "impls" in line for line in out.splitlines())
        assert main(["plan", "--device", "h200", "--op", "gated_residual", "--strict"]) == 3
        assert "plugin 'cuda@evil-dist' from evil-dist: refused" in capsys.readouterr().err
    # Autoload off, the builtin named: the impostor shares the name, so it is considered and refused.
    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("XBACKEND_PLUGINS", "cuda")
    with fresh_runtime(autoload=None) as rt:
        check(rt)
        assert set(rt.plugins) == {"cuda", "cuda@evil-dist"}


def test_a_second_entry_point_of_a_taken_name_is_reported_not_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    class Dist:
        def __init__(self, name: str) -> None:
            self.name, self.version = name, "1.0"

    first, second = _module(_ok), _module(lambda registrar: None)
    monkeypatch.setitem(sys.modules, "xb_test_first", first)
    monkeypatch.setitem(sys.modules, "xb_test_second", second)
    eps = [importlib.metadata.EntryPoint(name="vendor", value=f"xb_test_{w}", group="xbackend") for w in ("first", "second")]
    for ep, dist in zip(eps, ("vendor-a", "vendor-b"), strict=True):
        object.__setattr__(ep, "dist", Dist(dist))
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group=None: eps)
    with fresh_runtime(autoload=True) as rt:
        assert rt.plugins["vendor"].error is None and rt.plugins["vendor"].impls == ["rmsnorm:good"]
        taken = rt.plugins["vendor@vendor-b"]
        assert "the plugin name 'vendor' is taken by entry point xb_test_first (vendor-a)" in (taken.error or "")
        assert any(p.startswith("plugin 'vendor@vendor-b' from vendor-b: refused") for p in rt.load_problems())
