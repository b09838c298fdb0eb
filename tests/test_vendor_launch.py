"""The vendor launch modules (backends/cuda/launch.py, backends/rocm/launch.py) share one definition of the
entry points the shared Triton kernels register under: each vendor passes its data (numerics, launch
traits), nothing of the code is written twice."""

from __future__ import annotations

import ast
import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import xbackend_cuda.impls
import xbackend_cuda.launch as nvidia
import xbackend_rocm.impls
import xbackend_rocm.launch as amd


def _launch_names(impls: list[Any], module: str) -> set[str]:
    """The launch-module attributes a vendor's impl records name (``"<module>:<attr>"``)."""
    refs = [ref for impl in impls for ref in (impl.fn, impl.supports) if isinstance(ref, str)]
    return {ref.partition(":")[2] for ref in refs if ref.partition(":")[0] == module}


CUDA_NAMES = _launch_names(xbackend_cuda.impls.IMPLS, nvidia.__name__)
ROCM_NAMES = _launch_names(xbackend_rocm.impls.IMPLS, amd.__name__)
SHARED = sorted(CUDA_NAMES & ROCM_NAMES)


def _definition(fn: Callable[..., Any]) -> object:
    """The code an entry point runs: a partial's function, a closure's (or function's) code object."""
    if isinstance(fn, functools.partial):
        return _definition(fn.func)
    return getattr(fn, "__func__", fn).__code__


def _bound_at_top_level(module: Any) -> set[str]:
    """The names a module's own source assigns or defines at its top level."""
    names: set[str] = set()
    for node in ast.parse(inspect.getsource(module)).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_both_vendors_register_the_shared_kernels() -> None:
    # What the test below compares: the RMSNorm family and the q/k preludes both vendors register.
    assert {"rmsnorm", "rmsnorm_fast", "add_rmsnorm", "qk_norm_rope", "qk_norm_rope_3d"} <= set(SHARED)


@pytest.mark.parametrize("module", [nvidia, amd], ids=["cuda", "rocm"])
def test_the_launch_module_serves_its_vendor_kernels(module: Any) -> None:
    from xbackend.kernels.vendor_kernels import VendorKernels

    kernels = module.KERNELS
    assert isinstance(kernels, VendorKernels)
    assert (kernels.numerics, kernels.launch) == (module.NUMERICS, module.LAUNCH)
    for name in VendorKernels.NAMES:
        assert getattr(module, name) is getattr(kernels, name), name


@pytest.mark.parametrize("name", SHARED)
def test_a_shared_entry_point_has_one_definition(name: str) -> None:
    written = [m.__name__ for m in (nvidia, amd) if name in _bound_at_top_level(m)]
    assert not written, f"{name}: defined in {written}; vendor differences belong in the data they pass (NUMERICS, LAUNCH)"
    mine, theirs = getattr(nvidia, name), getattr(amd, name)
    assert mine is not theirs, f"{name}: one object for both vendors (their numerics differ)"
    assert _definition(mine) is _definition(theirs), f"{name}: the vendors run different code"


@pytest.mark.parametrize("module", [nvidia, amd], ids=["cuda", "rocm"])
def test_every_named_launch_attribute_resolves(module: Any) -> None:
    names = CUDA_NAMES if module is nvidia else ROCM_NAMES
    missing = [n for n in sorted(names) if n != "gated_residual_cuda" and not callable(getattr(module, n, None))]
    assert not missing, f"{module.__name__}: impl records name {missing}, which it does not provide"
    with pytest.raises(AttributeError, match=f"{module.__name__}.*no_such_entry_point"):
        module.no_such_entry_point  # noqa: B018
