"""The runtime key of an op call, built in C++ (``_fastkey.cpp``) where that extension is available.

Every eager call builds a key of its inputs and looks it up in the dispatch cache (``xbackend bench
dispatch``, the whole ``get_op(...)(...)`` call over calling the impl directly, best of four runs: 0.65 µs
with the C++ key, 2.05 µs with the Python key, ``XBACKEND_FAST_KEY=0``; without the alignment classes
0.64 and 1.72 µs; 2-core CPU, torch 2.13.0 CPU, 2026-12-06). The Python keys (``make_key``) read shape,
stride(), dtype and device of every tensor, 47-95 ns per attribute on a CPU tensor (``timeit`` of
``t.shape``, ``t.stride()``, ``t.dtype``, ``t.device``; 2026-12-05), and the alignment class of its
data pointer (``_guard.alignment``; 80 ns inline, 2026-12-06); the C++ key reads the same five things
of each tensor in one call and returns ``(op name, bytes, arg, tag(arg), ...)`` for the non-tensor args.
Both forms hold each non-tensor arg with its type tag (its type; for a tuple, its elements' types):
values compare with ``==``, and ``1.0 == True`` or ``(3, 3) == (3.0, 3.0)`` while ``check()`` accepts
only one of each. Two calls get equal C++ keys iff their Python keys are equal,
so a cached key still implies that the op's ``check()`` passed for arguments of these very types
(tests/test_fastkey.py holds the two forms to that). Inputs the C++ code cannot read exactly as
Python would (tensor subclasses, an active torch function mode, symbolic sizes, sparse/nested
tensors, a tensor the guard cannot copy such as a vmap BatchedTensor) get the Python key, per call;
such keys never equal a C++ one.

Loading policy. The key form is decided once per process, at the first dispatch (before any cache
entry exists, so a cache never mixes the two forms for the same inputs); ``import xbackend`` never
compiles. ``XBACKEND_FAST_KEY`` picks a row of ``RULES``:

=====================  ==================================  ================  ========================
XBACKEND_FAST_KEY      when                                prebuilt is used  builds if none is cached
=====================  ==================================  ================  ========================
``0``                  always                              no                no (Python keys)
``1``                  always                              yes               yes
unset / ``auto``       a CUDA/ROCm GPU is visible          yes               yes (a serving host)
unset / ``auto``       no GPU visible                      yes               no (``xbackend build``)
=====================  ==================================  ================  ========================

The extension is cached under ``$XBACKEND_CACHE_DIR`` (default ``~/.cache/xbackend``), keyed by the
torch version, the Python ABI and a digest of the source and flags (``_cachekey.extension_dir``).
Building took 13-14 s on a 2-core CPU (``xbackend build`` with an empty ``XBACKEND_CACHE_DIR``, twice,
torch 2.13.0 CPU, 2026-12-05; one translation unit; ``python_variable.h`` is most of it). Any build or
load failure is logged once as a warning and the process keeps the Python keys: the caller never sees
it. ``xbackend info`` shows the form in use and why; ``xbackend build`` builds it ahead of time.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch

from ._cache import BuildLockTimeout, find_safe_dir, load_extension, safe_dir
from ._cachekey import extension_dir
from .ops import OPS

__all__ = ["KEYS", "RULES", "KeyForm", "active", "build", "decide", "subscribe"]

log = logging.getLogger("xbackend")

_SOURCE = Path(__file__).with_name("_fastkey.cpp")
_CFLAGS = ("-O2",)
ENV = "XBACKEND_FAST_KEY"


class Rule(NamedTuple):
    load_prebuilt: bool
    build: bool
    why: str


# The loading policy as data: the env value (or, for auto, whether a GPU is visible) picks one row.
RULES: dict[str, Rule] = {
    "off": Rule(False, False, f"{ENV}=0"),
    "force": Rule(True, True, f"{ENV}=1"),
    "auto-gpu": Rule(True, True, "auto: a GPU is visible, so it is built on first use"),
    "auto-cpu": Rule(True, False, "auto: no GPU visible, so only a prebuilt one is used; `xbackend build` builds it"),
}
_ENV_VALUES = {"0": "off", "1": "force", "": "auto", "auto": "auto"}


@dataclass(frozen=True)
class KeyForm:
    form: str  # "c++" or "python"
    reason: str
    path: str | None = None  # the extension's file, when loaded

    def __str__(self) -> str:
        return f"{'C++' if self.form == 'c++' else 'Python'} keys ({self.reason})"


# op name -> the key function dispatch uses. Python keys until decide() runs; replaced as a whole.
KEYS: dict[str, Callable[..., Any]] = {name: spec.key for name, spec in OPS.items()}
_state: KeyForm | None = None
_lock = threading.Lock()
_listeners: list[Callable[[dict[str, Callable[..., Any]]], None]] = []


def subscribe(listener: Callable[[dict[str, Callable[..., Any]]], None]) -> None:
    """Call ``listener(KEYS)`` now and whenever the key form changes (``Op`` keeps its own
    reference to its key function, so the hot path does no lookup)."""
    _listeners.append(listener)
    listener(KEYS)


def active() -> KeyForm | None:
    """The key form in use, or None before the first dispatch decided it."""
    return _state


def decide() -> KeyForm:
    """Fix this process's key form (once; later calls return it). Never raises."""
    if _state is not None:
        return _state
    with _lock:
        if _state is None:
            try:
                _install(*_choose())
            except Exception as e:  # e.g. the source file missing from an install: dispatch must not break
                form = KeyForm("python", f"C++ keys unavailable: {type(e).__name__}: {e}")
                log.warning("xbackend: %s; using Python keys", form.reason)
                _install(form, None)
    return _state  # type: ignore[return-value]


def _choose() -> tuple[KeyForm, ModuleType | None]:
    value = os.environ.get(ENV, "").strip().lower()
    mode = _ENV_VALUES.get(value)
    if mode is None:
        log.warning("xbackend: %s=%r is not one of 0, 1, auto; using auto", ENV, value)
        mode = "auto"
    if mode == "auto":
        mode = "auto-gpu" if _gpu_visible() else "auto-cpu"
    rule = RULES[mode]
    if not rule.load_prebuilt and not rule.build:
        return KeyForm("python", rule.why), None
    path = _prebuilt(create=rule.build)
    if path is not None:
        try:
            return KeyForm("c++", f"prebuilt {path.name}; {rule.why}", str(path)), _import(path)
        except Exception as e:
            if not rule.build:
                return _failed(f"prebuilt {path} failed to load: {type(e).__name__}: {e}", rule)
    if not rule.build:
        return KeyForm("python", f"no prebuilt extension; {rule.why}"), None
    try:
        module, seconds = build()
    except BuildLockTimeout as e:  # another process's build outlasted the wait: its message names the fix
        return _failed(str(e), rule)
    except Exception as e:
        return _failed(_first_line(e), rule)
    where = getattr(module, "__file__", None) or str(library_path())
    return KeyForm("c++", f"built in {seconds:.1f} s; {rule.why}", where), module


def _failed(problem: str, rule: Rule) -> tuple[KeyForm, None]:
    log.warning("xbackend: C++ dispatch keys unavailable (%s); using Python keys", problem)
    return KeyForm("python", f"{problem}; {rule.why}"), None


def _install(form: KeyForm, module: ModuleType | None) -> None:
    """Switch the process to ``form``: dispatch and every Op use the new key functions. Only safe
    before any cache entry exists (decide()) or with fresh runtimes (tests)."""
    keys = {name: spec.key for name, spec in OPS.items()}
    if module is not None:
        keys = {name: module.make(name, _mask(spec.tensor_args), spec.key) for name, spec in OPS.items()}
    _set(keys, form)


def _set(keys: dict[str, Callable[..., Any]], state: KeyForm | None) -> None:
    global KEYS, _state
    KEYS, _state = keys, state
    for listener in _listeners:
        listener(keys)


def _mask(positions: tuple[int, ...]) -> int:
    return sum(1 << i for i in positions)


def _gpu_visible() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


# -- the extension: where it lives, loading and building ---------------------------------------------
def _name() -> str:
    """The extension's module name: its build directory's, so the binary's name carries its key too."""
    return _build_dir().name


def _build_dir() -> Path:
    # Keyed by the source and flags, torch and the Python ABI; not by the C++ compiler, which need not
    # be installed where a prebuilt extension is loaded (any compiler builds the same key function).
    return extension_dir("xbackend_fastkey", f"torch{torch.__version__}_{sys.implementation.cache_tag}", [_SOURCE],
                         flags=_CFLAGS)


def library_path() -> Path:
    """Where the built extension is (or would be) for this torch, Python and source, in the cache as
    configured; when that tree is not safe to load from, xbackend uses a private one instead (``_cache``)."""
    return _build_dir() / f"{_name()}{'.pyd' if sys.platform == 'win32' else '.so'}"


def _prebuilt(create: bool) -> Path | None:
    """The built extension where it may be loaded from (library_path() or its private fallback), if it
    is there. ``create`` makes the fallback when one is needed (this process is about to build anyway)."""
    where = safe_dir(_build_dir()) if create else find_safe_dir(_build_dir())
    path = None if where is None else where / library_path().name
    return path if path is not None and path.exists() else None


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_problem() -> str | None:
    """Why building cannot work here (no compiler, no ninja), or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not found; set CXX)"
    if shutil.which("ninja") is None:
        from torch.utils.cpp_extension import is_ninja_available

        if not is_ninja_available():
            return "ninja not found (torch.utils.cpp_extension needs it)"
    return None


def build() -> tuple[ModuleType, float]:
    """Build (or reuse) the extension and import it: (module, seconds). Raises on failure, and
    BuildLockTimeout when another process's build of it outlasts ``$XBACKEND_BUILD_LOCK_TIMEOUT``."""
    problem = build_problem()
    if problem is not None:
        raise RuntimeError(problem)
    build_dir = safe_dir(_build_dir())
    t0 = time.perf_counter()
    log.info("xbackend: building the C++ dispatch key extension in %s", build_dir)
    module = load_extension(build_dir, name=_name(), sources=[str(_SOURCE)], extra_cflags=list(_CFLAGS), verbose=False)
    return module, time.perf_counter() - t0


def _first_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in (str(exc) or type(exc).__name__).splitlines() if ln.strip()]
    for line in lines[1:]:
        if " error" in line.lower() or line.lower().startswith("error"):
            return f"build failed: {line[:300]}"
    return f"build failed: {lines[0][:300]}" if lines else "build failed"
