"""Goldens record the plugin set their plans were made with, and ``--check`` / ``--update`` plan with
exactly that set: a third-party plugin installed next to it is named on stderr and left out, not
drift; ``--all-plugins`` plans with every installed plugin."""

from __future__ import annotations

import importlib
import json
import shutil
import sys
from pathlib import Path

import pytest

import xbackend
from xbackend._device import BUILTIN_FLEET
from xbackend.cli import main
from xbackend.testing import fresh_runtime

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "goldens"

# A vendor plugin as a third party ships it: its own distribution, an entry point in the xbackend group,
# an impl that outranks the builtin gated residual on Hopper.
FAKE_PLUGIN = '''
import xbackend

@xbackend.hookimpl
def xbackend_register_impls(registrar):
    registrar.register(op="gated_residual", name="fast", fn="xbackend.ops.gated_residual:reference",
                       priority=500, devices="sm90")
'''


@pytest.fixture
def fake_vendor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The distribution 'fake-vendor' installed on sys.path with the entry point 'fakevendor'."""
    root = tmp_path / "site"
    info = root / "fake_vendor-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-vendor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[xbackend]\nfakevendor = fake_vendor.plugin\n")
    (root / "fake_vendor").mkdir()
    (root / "fake_vendor" / "__init__.py").write_text("")
    (root / "fake_vendor" / "plugin.py").write_text(FAKE_PLUGIN)
    monkeypatch.setattr(sys, "path", [str(root), *sys.path])
    importlib.invalidate_caches()
    monkeypatch.delenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    monkeypatch.delenv("XBACKEND_PLUGINS", raising=False)
    monkeypatch.delenv("XBACKEND_BLOCK", raising=False)
    return "fakevendor"


def _fleet(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["fleet", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _builtin_plugins() -> list[tuple[str, object]]:
    import xbackend_cuda.plugin
    import xbackend_natten.plugin
    import xbackend_rocm.plugin

    return [("cuda", xbackend_cuda.plugin), ("rocm", xbackend_rocm.plugin), ("natten", xbackend_natten.plugin)]


def test_the_goldens_record_their_plugin_set() -> None:
    for target in BUILTIN_FLEET:
        doc = json.loads((GOLDENS / f"{target}.json").read_text())
        assert doc["plugins"] == ["cuda", "natten", "rocm"], target


def test_an_installed_third_party_plugin_does_not_fail_the_check(fake_vendor: str, capsys) -> None:
    with fresh_runtime(autoload=True) as rt:
        assert rt.plugins[fake_vendor].error is None  # installed and loaded: in every plan it can reach
        assert xbackend.plan("gated_residual", "h200", assume_available=True).chosen.qualname == "fakevendor:fast"
        code, out, err = _fleet(capsys, "--check", str(GOLDENS))
    assert code == 0, out[-3000:]
    assert f"fleet check: {len(BUILTIN_FLEET)} target(s) match the goldens in {GOLDENS}" in out
    assert ("xbackend fleet: not in the goldens' plugin set (cuda, natten, rocm), left out: fakevendor; "
            "--all-plugins plans with every installed plugin") in err
    assert "fakevendor" not in out  # the table and the check plan without it


def test_all_plugins_checks_with_every_installed_plugin(fake_vendor: str, capsys) -> None:
    with fresh_runtime(autoload=True):
        code, out, err = _fleet(capsys, "--check", str(GOLDENS), "--all-plugins", "--op", "gated_residual")
    assert code == 1
    assert "h200 gated_residual bf16 lossless: cuda:cuda_vec -> fakevendor:fast" in out
    assert "+ fakevendor:fast (new candidate, priority 500): chosen: highest priority eligible" in out
    assert ("xbackend fleet: planned with every installed plugin (--all-plugins); not in the goldens' plugin set "
            "(cuda, natten, rocm): fakevendor") in err


def test_check_json_names_the_plugins_left_out(fake_vendor: str, capsys) -> None:
    with fresh_runtime(autoload=True):
        code, out, _ = _fleet(capsys, "--check", str(GOLDENS), "--op", "gated_residual", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["check"]["plugins"] == {"left_out": ["fakevendor"], "not_loaded": []}
    assert {tuple(t["plugins"]) for t in doc["targets"]} == {("cuda", "natten", "rocm")}
    assert "fakevendor" in {p["name"] for p in doc["plugins"]}  # installed here: the envelope lists it


def test_update_keeps_the_goldens_plugin_set_and_a_new_golden_records_what_is_loaded(
        fake_vendor: str, capsys, tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    shutil.copytree(GOLDENS, kept)
    fresh = tmp_path / "fresh"
    with fresh_runtime(autoload=True):
        assert _fleet(capsys, "--update", str(kept))[0] == 0
        for target in BUILTIN_FLEET:
            assert (kept / f"{target}.json").read_bytes() == (GOLDENS / f"{target}.json").read_bytes()
        assert _fleet(capsys, "--update", str(fresh), "--targets", "h200", "--op", "gated_residual")[0] == 0
        assert json.loads((fresh / "h200.json").read_text())["plugins"] == ["cuda", "fakevendor", "natten", "rocm"]
        assert _fleet(capsys, "--check", str(fresh), "--op", "gated_residual")[0] == 0
    # Without the plugin the golden names, the check says so and its plans drift.
    with fresh_runtime(_builtin_plugins()):
        code, out, err = _fleet(capsys, "--check", str(fresh), "--op", "gated_residual")
    assert code == 1 and "h200 gated_residual bf16 lossless: fakevendor:fast -> cuda:cuda_vec" in out
    assert ("xbackend fleet: in the goldens' plugin set, not loaded here: fakevendor (installed, not loaded: autoload is off and XBACKEND_PLUGINS does not name it)") in err


def test_update_refuses_to_drop_a_recorded_plugin_that_is_not_loaded(capsys, tmp_path: Path) -> None:
    kept = tmp_path / "kept"
    shutil.copytree(GOLDENS, kept)
    cuda, rocm, _ = _builtin_plugins()
    with fresh_runtime([cuda, rocm]):
        code, _, err = _fleet(capsys, "--update", str(kept))
        assert code == 1
        assert ("xbackend fleet: --update: the goldens' plugin set names natten, not loaded here (installed, not loaded: autoload is off and XBACKEND_PLUGINS does not name it); "
                f"load it, or record the plugins loaded here with --update {kept} --all-plugins") in err
        for target in BUILTIN_FLEET:
            assert (kept / f"{target}.json").read_bytes() == (GOLDENS / f"{target}.json").read_bytes()
        assert _fleet(capsys, "--update", str(kept), "--all-plugins")[0] == 0
    assert json.loads((kept / "h200.json").read_text())["plugins"] == ["cuda", "rocm"]


def test_a_recorded_plugin_that_is_not_installed_is_named(builtin_runtime, capsys, tmp_path: Path) -> None:
    doc = json.loads((GOLDENS / "h200.json").read_text())
    doc["plugins"] = [*doc["plugins"], "ghostvendor"]
    (tmp_path / "h200.json").write_text(json.dumps(doc, indent=2) + "\n")
    code, out, err = _fleet(capsys, "--check", str(tmp_path), "--op", "rmsnorm")
    assert code == 0, out  # the plans do not depend on it: no drift
    assert "xbackend fleet: in the goldens' plugin set, not loaded here: ghostvendor (not installed)" in err
    code, _, err = _fleet(capsys, "--update", str(tmp_path), "--op", "rmsnorm")
    assert code == 1 and "names ghostvendor, not loaded here (not installed)" in err


@pytest.fixture
def builtin_runtime():
    with fresh_runtime(autoload=True) as rt:
        yield rt


def test_a_block_naming_a_left_out_plugins_impl_is_no_typo(fake_vendor: str, capsys, caplog, monkeypatch) -> None:
    monkeypatch.setenv("XBACKEND_BLOCK", "fakevendor:fast,cuda:cuda_vec")
    with fresh_runtime(autoload=True, block=None):
        code, out, err = _fleet(capsys, "--check", str(GOLDENS), "--op", "gated_residual", "--dtype", "bf16",
                                "--strict")
    assert code == 1  # the block of cuda:cuda_vec still applies to the goldens' plugin set: drift, no problem
    assert "h200 gated_residual bf16 lossless: cuda:cuda_vec -> cuda:triton" in out
    assert "error" not in err
    assert not [r.message for r in caplog.records if "names no plugin or impl" in r.getMessage()]
