"""The op layer reaches the process-wide runtime without importing the runtime module.

``_runtime`` builds its registry from the op table (``ops.OPS``, whose files call ``_opspec.define_op``),
so ``_opspec`` sits below it: every op's torch custom op dispatches through ``xbackend._active``, the one
home of the process-wide runtime, which imports neither.
"""

from __future__ import annotations

import ast
from pathlib import Path

import torch

import xbackend
from xbackend import _runtime
from xbackend.testing import fresh_runtime

PACKAGE = Path(xbackend.__file__).resolve().parent


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import in ``path``, at any depth, outside ``if TYPE_CHECKING:`` blocks;
    relative imports resolved against the xbackend package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = {id(n) for node in ast.walk(tree)
               if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
               for n in ast.walk(node)}  # fmt: skip
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = "xbackend" if node.level == 1 else ""
            module = ".".join(p for p in (base, node.module or "") if p)
            found.append((node.lineno, module))
            found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
    return found


def test_the_op_layer_does_not_import_the_runtime() -> None:
    for name in ("_opspec", "_active"):
        assert (PACKAGE / f"{name}.py").is_file(), f"no xbackend/{name}.py"
        hits = [f"xbackend/{name}.py:{line}" for line, module in _imported_modules(PACKAGE / f"{name}.py")
                if module == "xbackend._runtime" or module.startswith("xbackend._runtime.")]
        assert not hits, f"xbackend.{name} imports xbackend._runtime (the runtime imports the op layer): {hits}"


def test_the_runtime_module_serves_the_one_process_wide_runtime() -> None:
    from xbackend import _active

    assert (_runtime.runtime, _runtime.set_runtime, _runtime.current, _runtime.dispatch) == (
        _active.runtime, _active.set_runtime, _active.current, _active.dispatch)


def test_a_custom_op_call_dispatches_through_the_runtime_set_for_the_process() -> None:
    from xbackend import _active

    x, w = torch.randn(2, 8), torch.randn(8)
    with fresh_runtime() as rt:
        assert _active.current() is rt
        out = torch.ops.xbackend.rmsnorm(x, w, 1e-6, "torch")
        infer = torch.ops.xbackend.rmsnorm_infer(x, w, 1e-6, "torch")
        assert rt.events_total > 0, "the custom op did not reach the runtime set for the process"
    torch.testing.assert_close(out, infer, rtol=0, atol=0)
