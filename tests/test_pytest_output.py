"""The test command's own output: skips as one line by reason, and ``--xbackend-conformance`` from the
repository root runs the conformance suite alone."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _pytest(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def test_skips_are_one_line_by_reason_under_the_projects_options(tmp_path: Path) -> None:
    # The project's addopts line as it stands (tomllib needs Python 3.11; the project supports 3.10).
    addopts = re.search(r"^addopts = (.+)$", (ROOT / "pyproject.toml").read_text(encoding="utf-8"), re.M)
    (tmp_path / "pyproject.toml").write_text(f"[tool.pytest.ini_options]\naddopts = {ast.literal_eval(addopts[1])!r}\n")
    (tmp_path / "conftest.py").write_text((ROOT / "conftest.py").read_text(encoding="utf-8"))
    (tmp_path / "test_some.py").write_text(
        "import pytest\n\n"
        "@pytest.mark.parametrize('n', range(3))\n"
        "def test_gpu(n):\n    pytest.skip('needs a GPU')\n\n"
        "def test_lib():\n    pytest.skip('needs natten')\n\n"
        "def test_ok():\n    pass\n")
    run = _pytest("-q", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert not any(line.startswith("SKIPPED") for line in lines), run.stdout
    assert "skipped by reason: 3 needs a GPU; 1 needs natten" in lines, run.stdout


@pytest.mark.skipif(torch.version.hip is not None, reason="a ROCm host runs the rocm plugin's impls")
def test_conformance_option_from_the_root_runs_only_the_suite() -> None:
    run = _pytest("--xbackend-conformance=rocm", "-q", cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "1 skipped" in run.stdout and "passed" not in run.stdout, run.stdout[-3000:]
    assert "plugin 'rocm' registers no impl for a device present here" in run.stdout
    named = _pytest("--xbackend-conformance=rocm", "tests/test_quality_tiers.py", "-q", cwd=ROOT)
    assert named.returncode == 0 and "passed, 1 skipped" in named.stdout, named.stdout[-3000:]
