"""The lab scripts still load: every Python script under lab/ imports as a module (its ``main`` guarded by
``if __name__ == "__main__":``, nothing run), and every shell script passes ``bash -n``.

A script is imported the way ``python3 lab/gpu/<script>.py`` loads it (its own folder first on
``sys.path``, so sibling imports such as ``from na_launch_parts import SHORT`` resolve), under a private
module name. GPU-only modules (triton, the CUDA build helpers) import on a CPU machine; a script must not
call into the GPU (``torch.cuda``, the driver library) before its ``main`` runs.
"""

from __future__ import annotations

import ast
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAB = ROOT / "lab"
PY_SCRIPTS = sorted(p for p in LAB.rglob("*.py") if "__pycache__" not in p.parts)
SH_SCRIPTS = sorted(LAB.rglob("*.sh"))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def _has_main_guard(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare):
            test = node.test
            if (isinstance(test.left, ast.Name) and test.left.id == "__name__" and len(test.comparators) == 1
                    and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"):
                return True
    return False


def _imported_by_siblings(script: Path) -> bool:
    """Whether another lab script imports this one as a module (a library such as na_triton_divides.py:
    it has no main to guard)."""
    pattern = re.compile(rf"^\s*(?:import|from)\s+{re.escape(script.stem)}\b", re.MULTILINE)
    return any(pattern.search(other.read_text(encoding="utf-8")) for other in PY_SCRIPTS if other != script)


def test_lab_has_scripts() -> None:
    # The parametrized tests below run over what the glob finds: an empty glob must not pass silently.
    assert PY_SCRIPTS and SH_SCRIPTS, f"no lab scripts found under {_rel(LAB)}"


@pytest.mark.parametrize("script", PY_SCRIPTS, ids=_rel)
def test_lab_script_guards_its_main(script: Path) -> None:
    tree = ast.parse(script.read_text(encoding="utf-8"), filename=str(script))
    defines_main = any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body)
    if not defines_main and _imported_by_siblings(script):
        return
    assert _has_main_guard(tree), f"{_rel(script)}: no top-level `if __name__ == \"__main__\":` (importing it runs it)"


@pytest.mark.parametrize("script", PY_SCRIPTS, ids=_rel)
def test_lab_script_imports(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The scripts put the repository, benchmarks/ or tests/kernels on sys.path: restored afterwards, and the
    # lab modules a script imported by name are dropped, so no later test sees them.
    monkeypatch.setattr(sys, "path", [str(script.parent), *sys.path])
    monkeypatch.setattr(sys, "argv", [str(script)])
    name = "xbackend_lab_" + "_".join(script.relative_to(LAB).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    before = set(sys.modules)
    sys.modules[name] = module  # dataclasses resolve annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        pytest.fail(f"{_rel(script)} does not import: {type(e).__name__}: {e}")
    finally:
        for added in set(sys.modules) - before:
            if str(getattr(sys.modules[added], "__file__", None) or "").startswith(str(LAB)):
                del sys.modules[added]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash on this machine")
@pytest.mark.parametrize("script", SH_SCRIPTS, ids=_rel)
def test_lab_shell_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, f"{_rel(script)}: bash -n: {done.stderr.strip()}"
