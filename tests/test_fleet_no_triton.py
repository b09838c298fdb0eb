"""Planning a GPU target needs no GPU compiler on the planning host: in a process where ``import
triton`` fails, the fleet's plans match the goldens, ``--strict`` finds nothing, a simulated target
plans the Triton impls, and ``xbackend info`` writes nothing to stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Run before anything else in the child: `import triton` then raises ModuleNotFoundError and
# importlib.util.find_spec("triton") is None, as on a host where Triton is not installed.
NO_TRITON = 'import sys\nsys.modules["triton"] = None\n'


@pytest.fixture(scope="module")
def no_triton_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    shim = tmp_path_factory.mktemp("no_triton")
    (shim / "sitecustomize.py").write_text(NO_TRITON)
    env = {k: v for k, v in os.environ.items() if not k.startswith("XBACKEND_") and k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim), env.get("PYTHONPATH", "")) if p)
    return env


def _run(env: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def test_the_shim_really_hides_triton(no_triton_env: dict[str, str]) -> None:
    run = _run(no_triton_env, "-c", "import importlib.util, xbackend.kernels as k; "
                                    "print(importlib.util.find_spec('triton'), k.triton_available())")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["None", "triton", "is", "not", "installed"]


def test_fleet_check_and_strict_pass_without_triton(no_triton_env: dict[str, str]) -> None:
    run = _run(no_triton_env, "-m", "xbackend.cli", "fleet", "--check", "goldens/", "--strict", "--json")
    assert run.returncode == 0, run.stderr[-3000:]
    assert "fleet check: 6 target(s) match the goldens in goldens/" in run.stderr
    assert "error" not in run.stderr
    doc = json.loads(run.stdout)
    assert doc["check"]["drift"] == [] and doc["check"]["missing"] == [] and doc["problems"] == []
    # The Triton impls are planned as deployed: this host's missing Triton is an assumption, not a verdict.
    assumed = {a["impl"]: a["reason"] for t in doc["targets"] for a in t["assumed"]}
    assert assumed["cuda:triton"] == assumed["rocm:triton"] == "triton is not installed"


def test_every_builtin_supports_imports_without_triton(no_triton_env: dict[str, str]) -> None:
    code = ("import xbackend\n"
            "from xbackend._api import kernel_ops\n"
            "rt = xbackend.runtime()\n"
            "for op in kernel_ops():\n"
            "    for impl in rt.candidates(op):\n"
            "        if impl.backend in ('cuda', 'rocm') and impl.supports is not None:\n"
            "            impl.resolved('supports')\n"
            "            print(impl.qualname, impl.supports)\n")
    run = _run(no_triton_env, "-c", code)
    assert run.returncode == 0, run.stderr[-3000:]
    assert len(run.stdout.splitlines()) == 34  # every builtin impl has a supports predicate


def test_plan_for_a_simulated_target_without_triton(no_triton_env: dict[str, str]) -> None:
    run = _run(no_triton_env, "-m", "xbackend.cli", "plan", "--device", "sm100", "--op", "rmsnorm_modulate")
    assert run.returncode == 0, run.stderr
    chosen = [line for line in run.stdout.splitlines() if line.lstrip().startswith("->")]
    assert len(chosen) == 1 and "cuda:triton " in chosen[0], run.stdout
    assert "supports() raised" not in run.stdout


def test_info_is_quiet_without_triton(no_triton_env: dict[str, str]) -> None:
    run = _run(no_triton_env, "-m", "xbackend.cli", "info")
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "cuda backend: triton missing (triton is not installed)" in run.stdout
