"""``xbackend fleet``: a mixed NVIDIA/AMD fleet planned in one process as deployed on each GPU,
byte-identical output, goldens that catch drift, per-target compile wiring, version skew, --strict,
and the CI workflows that run it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

import xbackend
from xbackend import Device
from xbackend._device import BUILTIN_FLEET
from xbackend.cli import main
from xbackend.fleet import matrix as fleet_matrix
from xbackend.fleet.render import WIDTH
from xbackend.fleet.spec import FleetSpecError, load_fleet
from xbackend.testing import fresh_runtime

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "goldens"
FLEET = ",".join(BUILTIN_FLEET)
VERDICTS = {"chosen", "lower_priority", "tie", "arch", "dtype", "quality", "unavailable", "unsupported", "blocked",
            "disabled", "forced"}


def _cuda_vec_mark() -> str:
    """How the table shows cuda:cuda_vec on a simulated target: starred where this host cannot build it."""
    rt = xbackend.runtime()
    impl = next(i for i in rt.candidates("gated_residual") if i.qualname == "cuda:cuda_vec")
    return "cuda:cuda_vec*" if rt.availability(impl) is not None else "cuda:cuda_vec"


def _builtin_plugins() -> list[tuple[str, object]]:
    import xbackend_cuda.plugin
    import xbackend_natten.plugin
    import xbackend_rocm.plugin

    return [("cuda", xbackend_cuda.plugin), ("rocm", xbackend_rocm.plugin), ("natten", xbackend_natten.plugin)]


@pytest.fixture
def builtin():
    with fresh_runtime(autoload=True) as rt:
        yield rt


def _fleet(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["fleet", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def _plans(doc: dict, target: str) -> dict[tuple[str, str, str], dict]:
    t = next(t for t in doc["targets"] if t["target"] == target)
    return {(p["op"], p["dtype"], p["quality"]): p for p in t["plans"]}


def test_the_builtin_fleet_in_one_process_plans_as_deployed(builtin, capsys) -> None:
    t0 = time.perf_counter()
    code, out, _ = _fleet(capsys, "--targets", FLEET, "--json")
    seconds = time.perf_counter() - t0
    assert code == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 3 and doc["command"] == "fleet" and doc["xbackend"] == xbackend.__version__
    assert [t["target"] for t in doc["targets"]] == list(BUILTIN_FLEET)
    assert sum(len(t["plans"]) for t in doc["targets"]) == 396  # 6 targets x 11 ops x 3 dtypes x 2 tiers
    assert seconds < 30  # ~0.5 s on a 2-core CPU box; one process, no subprocess per plan
    h200 = _plans(doc, "h200")
    assert h200[("gated_residual", "bfloat16", "lossless")]["chosen"] == "cuda:cuda_vec"
    assert _plans(doc, "mi355x")[("gated_residual", "bfloat16", "lossless")]["chosen"] == "rocm:triton"
    assert _plans(doc, "b300")[("neighborhood_attention", "bfloat16", "lossless")]["chosen"] == "natten:natten_blackwell"
    for t in doc["targets"]:
        assert t["planned_as"] == "deployed" and t["device"]["simulated"] is True
        for p in t["plans"]:
            assert ":" in p["chosen"]
            for c in p["candidates"]:
                assert ":" in c["impl"] and c["verdict"] in VERDICTS and c["reason"]
                assert c["verdict"] != "unavailable"  # no CPU-runner fact leaks into a target's plan
    # Every assumption is listed, with this host's reason.
    assumed = {a["impl"]: a for a in next(t for t in doc["targets"] if t["target"] == "h200")["assumed"]}
    if xbackend.runtime().availability(next(i for i in xbackend.runtime().candidates("gated_residual")
                                            if i.qualname == "cuda:cuda_vec")) is not None:
        assert assumed["cuda:cuda_vec"]["note"] == "assumed available on h200" and assumed["cuda:cuda_vec"]["reason"]
    # Versions and load status live in the envelope.
    plugins = {p["name"]: p for p in doc["plugins"]}
    assert plugins["cuda"]["status"] == "loaded" and plugins["cuda"]["distribution"] == "xbackend"
    assert plugins["cuda"]["version"] == xbackend.__version__
    assert doc["host"]["torch"] and "triton" in doc["host"]
    verified = {(i["op"], i["impl"]): i["verified_on"] for i in doc["impls"]}
    assert verified[("gated_residual", "cuda:cuda_vec")] == [["2.11", "3.6", "sm90"]]
    assert verified[("gated_residual", "rocm:triton")] == []


def test_output_is_byte_identical_across_processes_and_hash_seeds() -> None:
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run([sys.executable, "-m", "xbackend.cli", "fleet", "--targets", FLEET, "--json"],
                             capture_output=True, env=env, check=True, cwd=ROOT)
        outs.append(run.stdout)
    assert outs[0] == outs[1]
    assert _plans(json.loads(outs[0]), "h200")[("gated_residual", "bfloat16", "lossless")]["chosen"] == "cuda:cuda_vec"


def test_plans_do_not_depend_on_plugin_install_order(capsys) -> None:
    docs = []
    for plugins in (_builtin_plugins(), _builtin_plugins()[::-1]):
        with fresh_runtime(plugins):
            assert main(["fleet", "--targets", FLEET, "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        docs.append([t["plans"] for t in doc["targets"]])
    assert docs[0] == docs[1]


def test_checked_in_goldens_match(builtin, capsys) -> None:
    """What CI runs after the tests (.ci/run): `xbackend fleet --check goldens/`."""
    code, out, _ = _fleet(capsys, "--check", str(GOLDENS))
    assert code == 0, out
    assert f"fleet check: {len(BUILTIN_FLEET)} target(s) match the goldens" in out
    assert "xbackend fleet --check goldens/" in (ROOT / ".ci" / "run").read_text()


def test_goldens_hold_no_host_or_version_facts() -> None:
    import torch

    for target in BUILTIN_FLEET:
        text = (GOLDENS / f"{target}.json").read_text()
        doc = json.loads(text)
        assert set(doc) == {"schema_version", "target", "device", "plugins", "matrix", "plans"}
        for fact in (torch.__version__, "assumed", "host", "python", "simulated", "no CUDA device", "natten not"):
            assert fact not in text, (target, fact)


def test_update_rewrites_byte_identical_goldens(capsys, tmp_path: Path) -> None:
    # A new golden records the plugins loaded: the goldens' set, whatever else this host has installed.
    with fresh_runtime(_builtin_plugins()):
        assert _fleet(capsys, "--update", str(tmp_path), "--targets", FLEET)[0] == 0
    for target in BUILTIN_FLEET:
        assert (tmp_path / f"{target}.json").read_bytes() == (GOLDENS / f"{target}.json").read_bytes()


class _Prio:
    """A test plugin with one gated_residual impl on Hopper at a given priority."""

    def __init__(self, priority: int) -> None:
        self.priority = priority

    @xbackend.hookimpl
    def xbackend_register_impls(self, registrar):
        registrar.register(op="gated_residual", name="fast", fn="xbackend.ops.gated_residual:reference",
                           priority=self.priority, devices="sm90")


def test_a_priority_change_in_a_plugin_fails_the_check_with_a_diff(capsys, tmp_path: Path) -> None:
    cuda = _builtin_plugins()[0]
    argv = ["--targets", "h200,b200", "--op", "gated_residual"]
    with fresh_runtime([cuda, ("prio", _Prio(10))]):
        assert _fleet(capsys, *argv, "--update", str(tmp_path))[0] == 0
        assert _fleet(capsys, *argv, "--check", str(tmp_path))[0] == 0
    with fresh_runtime([cuda, ("prio", _Prio(200))]):
        code, out, _ = _fleet(capsys, *argv, "--check", str(tmp_path))
    assert code == 1
    assert "fleet check: 12 plan(s) drifted from the goldens" in out
    assert "h200 gated_residual bf16 lossless: cuda:cuda_vec -> prio:fast" in out
    assert "~ prio:fast: priority 10 -> 200; lower_priority -> chosen: highest priority eligible" in out
    assert "~ cuda:cuda_vec: chosen -> lower_priority: lower priority than prio:fast (200 > 110)" in out
    # On the B200 the impl does not run (sm90 only): the choice holds, the candidate's record moved.
    assert "b200 gated_residual fp32 high: cuda:cuda_vec (unchanged), candidates differ" in out
    assert "~ prio:fast: priority 10 -> 200; arch: needs sm90; device is sm100" in out
    with fresh_runtime([cuda, ("prio", _Prio(200))]):
        code, out, err = _fleet(capsys, *argv, "--check", str(tmp_path), "--json")
    assert code == 1 and "cuda:cuda_vec -> prio:fast" in err
    drift = json.loads(out)["check"]["drift"][0]
    assert drift == {**drift, "target": "h200", "op": "gated_residual", "from": "cuda:cuda_vec", "to": "prio:fast"}


def test_a_missing_golden_fails_and_names_the_fix(builtin, capsys, tmp_path: Path) -> None:
    code, out, _ = _fleet(capsys, "--targets", "h200", "--op", "rmsnorm", "--check", str(tmp_path))
    assert code == 1 and f"xbackend fleet --targets h200 --update {tmp_path}" in out


def test_equal_priorities_show_as_a_tie(capsys) -> None:
    class Twin:
        def __init__(self, name: str) -> None:
            self.name = name

        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="rmsnorm", name="k", fn="xbackend.ops.rmsnorm:reference", priority=5, devices="sm90")

    with fresh_runtime([("zz", Twin("zz")), ("aa", Twin("aa"))]):
        assert main(["fleet", "--targets", "h100", "--op", "rmsnorm", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["targets"][0]["plans"][0]
    assert plan["chosen"] == "aa:k"
    zz = next(c for c in plan["candidates"] if c["impl"] == "zz:k")
    assert zz["verdict"] == "tie" and zz["reason"].startswith("tie with aa:k at priority 5")


def test_table_fits_100_columns_and_marks_assumptions(builtin, capsys) -> None:
    code, out, _ = _fleet(capsys, "--targets", FLEET)
    assert code == 0
    assert max(map(len, out.splitlines())) <= WIDTH
    assert "h100 h200" in out and _cuda_vec_mark() in out and "* assumed available on the target" in out
    # Six distinct columns do not fit side by side: they are cut into panels of whole columns.
    code, out, _ = _fleet(capsys, "--targets", "sm80,h200,b200,sm120,mi300x,cpu")
    assert code == 0 and max(map(len, out.splitlines())) <= WIDTH
    assert out.count("\nrmsnorm\n") == 2


def test_markdown_for_a_pr_comment(builtin, capsys) -> None:
    code, out, _ = _fleet(capsys, "--targets", FLEET, "--markdown", "--check", str(GOLDENS))
    assert code == 0
    assert "| op | dtype | quality | h100 h200 | b200 b300 | mi300x mi355x |" in out
    assert f"| gated_residual | bf16 | lossless | `{_cuda_vec_mark()}` |" in out
    assert "match the goldens" in out


FLEET_TOML = """
lanes = [{ name = "prod", torch = "2.11.0", triton = "3.6.0" }]

[[gpu]]
type = "h200"
count = 64
lanes = [{ name = "prod", torch = "2.11.0+cu130", triton = "3.6.0" }, { name = "canary", torch = "2.13", triton = "3.9" }]

[[gpu]]
type = "mi355x"
count = 16
"""


def test_fleet_toml_lanes_flag_version_skew(builtin, capsys, tmp_path: Path) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET_TOML)
    code, out, _ = _fleet(capsys, "--fleet", str(path), "--json")
    assert code == 0
    h200, mi355x = json.loads(out)["targets"]
    assert (h200["count"], mi355x["count"]) == (64, 16)
    assert [lane["name"] for lane in h200["lanes"]] == ["prod", "canary"]
    [canary] = h200["unverified"]  # prod runs the verified versions: nothing flagged there
    assert canary["lane"] == "canary" and "cuda:cuda_vec" in canary["impls"] and "cuda:triton" in canary["impls"]
    assert canary["message"] == ("exactness unverified on torch 2.13 / Triton 3.9 on sm90: the guard falls back "
                                 "if it differs")
    [rocm] = mi355x["unverified"]  # the ROCm impls never ran on hardware
    assert rocm["lane"] == "prod" and "rocm:triton" in rocm["impls"] and rocm["arch"] == "gfx950"
    code, out, _ = _fleet(capsys, "--fleet", str(path))
    assert "h200 lane canary: exactness unverified on torch 2.13 / Triton 3.9 on sm90" in out


def test_verification_is_per_arch(builtin, capsys, tmp_path: Path) -> None:
    """The CUDA impls ran on sm90 hardware only: a Blackwell target on the very versions they were
    verified with flags them, an H100 (sm90, like the H200) does not."""
    path = tmp_path / "fleet.toml"
    path.write_text('[[gpu]]\ntype = "b200"\nlanes = [{ name = "prod", torch = "2.11.0+cu130", triton = "3.6.0" }]\n'
                    '[[gpu]]\ntype = "h100"\nlanes = [{ name = "prod", torch = "2.11.0+cu130", triton = "3.6.0" }]\n')
    code, out, _ = _fleet(capsys, "--fleet", str(path), "--op", "gated_residual", "--json")
    assert code == 0
    b200, h100 = json.loads(out)["targets"]
    [flag] = b200["unverified"]
    assert flag["arch"] == "sm100" and "cuda:cuda_vec" in flag["impls"], flag
    assert h100["unverified"] == []


def test_verified_on_runs_with_and_without_an_arch() -> None:
    from xbackend import Impl
    from xbackend.fleet.skew import verified
    from xbackend.fleet.spec import Lane

    lane = Lane("prod", "2.11.0+cu130", "3.6.0")
    anywhere = Impl("rmsnorm", "a", fn=lambda *a: None, verified_on=(("2.11", "3.6"),))
    sm90 = Impl("rmsnorm", "b", fn=lambda *a: None, verified_on=(("2.11", "3.6", "sm90"),))
    assert verified(anywhere, lane, "sm100") and verified(sm90, lane, "sm90") and not verified(sm90, lane, "sm100")
    assert verified(sm90, lane)  # no arch asked: versions only
    assert verified(Impl("rmsnorm", "d", fn=lambda *a: None, verified_on=(("2.11", "3.6", "sm_90"),)), lane, "sm90")
    for bad in (("2.11",), ("2.11", "3.6", "h200"), (2.11, 3.6)):
        with pytest.raises(xbackend.RegistrationError, match="verified_on expected"):
            Impl("rmsnorm", "c", fn=lambda *a: None, verified_on=(bad,))


@pytest.mark.parametrize(("text", "message"), [
    ("[[gpu]]\ncount = 2\n", "needs type = "),
    ("[[gpu]]\ntype = 'h200'\ncount = 0\n", "count must be a positive integer"),
    ("[[gpu]]\ntype = 'h200'\nlanes = [{ torch = '2.11' }]\n", "needs torch and triton"),
    ("gpus = 1\n", "unknown key(s) gpus"),
    ("[[gpu]\n", "not valid TOML"),
])
def test_fleet_toml_errors_name_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    with pytest.raises(FleetSpecError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_fleet(path)


def test_fleet_toml_without_a_toml_parser(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Python 3.10 has no tomllib: the error says to install tomli."""
    monkeypatch.setitem(sys.modules, "tomllib", None)
    monkeypatch.setitem(sys.modules, "tomli", None)
    path = tmp_path / "fleet.toml"
    path.write_text(FLEET_TOML)
    with pytest.raises(FleetSpecError, match="pip install tomli"):
        load_fleet(path)


def test_unknown_target_is_a_usage_error(builtin, capsys) -> None:
    code, _, err = _fleet(capsys, "--targets", "h200,tpu7")
    assert code == 2 and "unknown device target 'tpu7'" in err


# -- --strict ---------------------------------------------------------------------------------------


def test_strict_fails_on_a_repeated_target(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    code, out, err = _fleet(capsys, "--targets", "h100,h200,h100", "--op", "rmsnorm")
    assert code == 0 and "warning: target 'h100' is listed more than once" in err
    assert "2 target(s)" in out
    assert _fleet(capsys, "--targets", "h100,h100", "--op", "rmsnorm", "--strict")[0] == 3
    monkeypatch.setenv("XBACKEND_STRICT", "1")
    assert _fleet(capsys, "--targets", "h100,h100", "--op", "rmsnorm")[0] == 3


def test_strict_fails_on_a_plugin_that_did_not_load(capsys) -> None:
    class Broken:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            raise RuntimeError("vendor library too old")

    with fresh_runtime([("broken", Broken())]):
        assert main(["fleet", "--targets", "h200", "--op", "rmsnorm"]) == 0
        assert main(["fleet", "--targets", "h200", "--op", "rmsnorm", "--strict"]) == 3
    err = capsys.readouterr().err
    assert "plugin 'broken' failed to load: registration failed: RuntimeError: vendor library too old" in err


def test_strict_fails_on_an_impl_whose_fn_does_not_import(capsys) -> None:
    class Typo:
        @xbackend.hookimpl
        def xbackend_register_impls(self, registrar):
            registrar.register(op="rmsnorm", name="typo", fn="xbackend.kernels.no_such_module:rmsnorm", devices="sm90")

    with fresh_runtime([("typo", Typo())]):
        assert main(["fleet", "--targets", "h200", "--op", "rmsnorm"]) == 0  # planning never imports fn
        capsys.readouterr()
        assert main(["plan", "--device", "h200", "--op", "rmsnorm", "--strict"]) == 3
        assert "impl typo:typo has fn 'xbackend.kernels.no_such_module:rmsnorm', which does not import" in capsys.readouterr().err
        assert main(["fleet", "--targets", "h200", "--op", "rmsnorm", "--strict", "--json"]) == 3
    assert any("typo:typo" in p for p in json.loads(capsys.readouterr().out)["problems"])


def test_strict_fails_on_an_unknown_block_name(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XBACKEND_BLOCK", "cuda:tritonn")
    with fresh_runtime(autoload=True, block=None):
        code = main(["fleet", "--targets", "h200", "--op", "rmsnorm", "--strict"])
    assert code == 3 and "cuda:tritonn" in capsys.readouterr().err


def test_strict_problems_are_the_runtimes_load_problems(monkeypatch: pytest.MonkeyPatch) -> None:
    """--strict reads the same list as ``xbackend.problems()``: unknown names in both env vars."""
    from xbackend.fleet.strict import load_problems

    monkeypatch.setenv("XBACKEND_DISABLE_PLUGIN_AUTOLOAD", "1")
    monkeypatch.setenv("XBACKEND_PLUGINS", "cuda,cudaa")
    with fresh_runtime(block={"nosuch", "triton", "cuda:cuda_vec"}) as rt:  # cuda loads through XBACKEND_PLUGINS
        assert set(rt.plugins) == {"cuda"}
        problems = load_problems(rt)
        assert problems == xbackend.problems()
    assert len(problems) == 2
    assert problems[0].startswith("XBACKEND_PLUGINS names no installed plugin: cudaa")
    assert problems[1].startswith("XBACKEND_BLOCK names no plugin or impl: nosuch")


# -- --compile ----------------------------------------------------------------------------------------


def _fake_compile(monkeypatch: pytest.MonkeyPatch, records) -> list:
    calls = []

    def compile_target(target, device, plans):
        calls.append((target, device.arch, len(plans)))
        return records(target, plans)

    module = types.ModuleType("xbackend.fleet.compile")
    module.compile_target = compile_target
    monkeypatch.setitem(sys.modules, "xbackend.fleet.compile", module)
    monkeypatch.setattr(xbackend.fleet, "compile", module, raising=False)
    return calls


def _kernel(target: str, problem: str = "", **fields) -> dict:
    """A row as compile.py writes it (KernelRow.to_dict(): the impl is ``chosen``)."""
    return {"target": target, "kernel": "_gated_residual_kernel", "chosen": "cuda:triton", "op": "gated_residual",
            "shape": "[1,32640,4096]", "dtype": "bfloat16", "status": "ok", "registers": 32, "spill_bytes": 0,
            "shared_bytes": 0, "problem": problem, **fields}


def test_compile_without_compile_py_reports_it_missing(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "xbackend.fleet.compile", None)
    monkeypatch.delattr(xbackend.fleet, "compile", raising=False)
    code, out, err = _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")
    assert code == 1 and "compile.py missing" in out and "compile.py missing" in err
    code, out, _ = _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--json")
    assert code == 0 and "kernels" not in json.loads(out)["targets"][0]  # planning never needs it


def test_compile_runs_per_target_and_lands_in_json_and_table(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_compile(monkeypatch, lambda target, plans: [_kernel(target)])
    code, out, _ = _fleet(capsys, "--targets", "h200,mi355x", "--op", "gated_residual", "--compile", "--json")
    assert code == 0
    assert calls == [("h200", "sm90", 6), ("mi355x", "gfx950", 6)]
    assert json.loads(out)["targets"][0]["kernels"] == [_kernel("h200")]
    code, out, _ = _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")
    assert "compile h200 (sm90): 1 rows: 1 ok, 0 failed, 0 skipped; 0 failing" in out and "0 waived" in out
    assert "  cuda:triton              _gated_residual_kernel            1    1    0   32     0       0" in out
    assert max(map(len, out.splitlines())) <= WIDTH


def test_compile_fails_on_a_failed_kernel_or_an_unwaived_spill(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_compile(monkeypatch, lambda target, plans: [
        _kernel(target), _kernel(target, spill_bytes=8, problem="spills 8 B without a waiver"),
        _kernel(target, spill_bytes=4, problem="")])  # waived by compile.py's rule: problem empty
    code, out, err = _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")
    assert code == 1 and "compile h200: 1 kernel(s) failing" in err
    assert "! _gated_residual_kernel (gated_residual bfloat16 [1,32640,4096]): spills 8 B without a waiver" in out
    _fake_compile(monkeypatch, lambda target, plans: [_kernel(target, status="failed: ptxas error")])
    assert _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")[0] == 0  # problem "" = waived
    _fake_compile(monkeypatch, lambda target, plans: [{k: v for k, v in _kernel(target, status="failed: x").items()
                                                       if k != "problem"}])
    assert _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")[0] == 1  # no field: status decides
    _fake_compile(monkeypatch, lambda target, plans: [_kernel(target, spill_bytes=4, problem="")])
    assert _fleet(capsys, "--targets", "h200", "--op", "gated_residual", "--compile")[0] == 0


# -- --local ------------------------------------------------------------------------------------------


def test_local_on_a_cpu_host_checks_against_the_cpu_golden(builtin, capsys, tmp_path: Path) -> None:
    if __import__("torch").cuda.is_available():
        pytest.skip("this host has a GPU: the gpu workflow job runs --local against its target's golden")
    assert _fleet(capsys, "--targets", "cpu", "--update", str(tmp_path))[0] == 0
    code, out, _ = _fleet(capsys, "--local", "--check", str(tmp_path), "--json")
    assert code == 0
    [t] = json.loads(out)["targets"]
    assert (t["target"], t["planned_as"], t["where"], t["lanes"][0]["name"]) == ("cpu", "host", "cpu", "host")


def test_local_gpu_is_checked_against_the_golden_it_probes_as(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """An H200 runner's real probe and availability against goldens/h200.json: where the CUDA
    extension cannot build (here: no GPU at all), the real plan drifts from the golden, as it must."""
    h200 = Device("cuda", "sm90", "NVIDIA H200", 0)
    monkeypatch.setattr(fleet_matrix, "local_devices", lambda rt: [(h200, "cuda:0-7")])
    code, out, _ = _fleet(capsys, "--local", "--op", "gated_residual", "--check", str(GOLDENS))
    cuda_vec = next(i for i in xbackend.runtime().candidates("gated_residual") if i.qualname == "cuda:cuda_vec")
    if xbackend.runtime().availability(cuda_vec) is None:
        assert code == 0
        return
    assert code == 1
    assert "h200 gated_residual bf16 lossless: cuda:cuda_vec -> cuda:triton" in out
    assert "~ cuda:cuda_vec: chosen -> unavailable: unavailable: " in out
    assert "h200 (cuda:0-7)" in out


def test_local_notes_a_fallback_missing_here_without_failing(builtin, capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    """The golden plans NATTEN as installed; a runner without it still runs what the golden says
    (cuda:na_triton on Hopper), so the missing fallback is a note, not drift."""
    h200 = Device("cuda", "sm90", "NVIDIA H200", 0)
    monkeypatch.setattr(fleet_matrix, "local_devices", lambda rt: [(h200, "cuda:0")])
    code, out, _ = _fleet(capsys, "--local", "--op", "neighborhood_attention", "--dtype", "bf16", "--check", str(GOLDENS))
    assert code == 0, out
    assert "fleet check: 1 target(s) match the goldens" in out
    natten = next(i for i in xbackend.runtime().candidates("neighborhood_attention") if i.qualname == "natten:natten")
    if xbackend.runtime().availability(natten) is not None:
        assert "not installed on this machine" in out and "  h200: natten:natten: natten not importable" in out


def test_plan_json_is_the_fleet_form(builtin, capsys) -> None:
    assert main(["plan", "--device", "h200", "--op", "gated_residual", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == 3 and doc["command"] == "plan"
    [t] = doc["targets"]
    assert t["target"] == "h200" and t["planned_as"] == "deployed"
    assert t["plans"][0]["chosen"] == "cuda:cuda_vec"
    assert main(["plan", "--device", "cpu", "--op", "gated_residual", "--json"]) == 0
    [t] = json.loads(capsys.readouterr().out)["targets"]
    assert t["planned_as"] == "host" and t["plans"][0]["chosen"] == "xbackend:reference"


# -- the workflows a fleet adopts ---------------------------------------------------------------------


def _workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / ".github" / "workflows" / "fleet.yml").read_text())


def _runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def test_fleet_workflow_structure() -> None:
    wf = _workflow()
    assert wf["name"] and (wf.get("on") or wf.get(True))  # PyYAML reads the key `on` as True
    jobs = wf["jobs"]
    assert set(jobs) == {"cpu", "gpu"}
    for name, job in jobs.items():
        assert job["runs-on"], name
        assert job["steps"], name
        for step in job["steps"]:
            assert ("run" in step) != ("uses" in step), (name, step)
            if "uses" in step:
                assert "@" in step["uses"], step  # pinned actions
    cpu = jobs["cpu"]
    assert cpu["runs-on"] == "ubuntu-latest"
    assert "python -m pytest" in _runs(cpu) and "xbackend fleet --check goldens/" in _runs(cpu)
    assert f"xbackend fleet --targets {FLEET} --compile" in _runs(cpu)
    gpu = jobs["gpu"]
    assert gpu["runs-on"] == ["self-hosted", "gpu-${{ matrix.gpu }}"]
    assert gpu["strategy"]["matrix"]["gpu"] == list(BUILTIN_FLEET) and gpu["strategy"]["fail-fast"] is False
    assert gpu["needs"] == "cpu"
    runs = _runs(gpu)
    assert "pytest -m gpu" in runs and "xbackend fleet --check goldens/ --local" in runs and "xbackend bench --quick" in runs


def test_fleet_workflow_passes_actionlint_where_installed() -> None:
    import shutil

    if shutil.which("actionlint") is None:
        pytest.skip("actionlint not on PATH (optional: the structure test above always runs)")
    run = subprocess.run(["actionlint", str(ROOT / ".github" / "workflows" / "fleet.yml")], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize(("value", "strict"), [("1", True), ("true", True), ("0", False), ("false", False), ("", False)])
def test_strict_env_is_a_boolean(value: str, strict: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from xbackend.fleet.strict import strict_requested

    monkeypatch.setenv("XBACKEND_STRICT", value)
    assert strict_requested(False) is strict and strict_requested(True)
