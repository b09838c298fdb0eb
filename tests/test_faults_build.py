"""Building and loading the C++ extensions when things go wrong: a build killed mid-compile, a build
that never finishes, and a cache directory other users can write to.

Nothing here compiles: ``torch.utils.cpp_extension.load`` is replaced by a stand-in that takes torch's
own lock file the way the real one does (``FileBaton`` on ``<build dir>/lock``). Anything that could
hang runs in a subprocess with a timeout, so a regression fails instead of stalling the suite.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import stat
import subprocess
import sys
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from xbackend import _cache, _fastkey
from xbackend.kernels import _cuda_build
from xbackend.ops import OPS

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="POSIX owners, modes and signals")
pytestmark = posix_only

# The stand-in for cpp_extension.load, in a subprocess: torch's lock sequence, and with STALL=1 a
# compile that never ends (the process prints "building" once it holds the locks); with STALL=orphan
# the compile runs in a child process that outlives it (it prints "building <child pid>").
PRELUDE = r'''
import os, subprocess, sys, time, types
import torch.utils.cpp_extension as cpp
from torch.utils.file_baton import FileBaton
from xbackend import _fastkey
from xbackend.kernels import _cuda_build

def fake_load(name, sources, build_directory, **kwargs):
    baton = FileBaton(os.path.join(build_directory, "lock"))
    if baton.try_acquire():
        try:
            if os.environ.get("STALL") == "orphan":  # a compiler that outlives this process, as ninja's does
                child = subprocess.Popen(["sleep", "600"], cwd=build_directory,
                                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                print("building", child.pid, flush=True)
                time.sleep(600)
            elif os.environ.get("STALL"):
                print("building", flush=True)
                time.sleep(600)
        finally:
            baton.release()
    else:
        baton.wait()
    return types.SimpleNamespace(make=lambda op, mask, key: key, __file__=os.path.join(build_directory, name + ".so"))

cpp.load = fake_load
_fastkey.build_problem = lambda: None
_cuda_build.environment_reason = lambda: None
_cuda_build._device_archs = lambda: ["90"]
'''
# The last line of each subprocess: use the extension once and print the outcome.
USE = {
    "fastkey": "print(_fastkey.decide(), flush=True)",
    "cuda": "e = _cuda_build.JitExtension('xbackend_test_ext', ('gated_residual.cu',), 'test ext'); print('reason:', e.available(), flush=True)",
}
BUILT = {"fastkey": "C++ keys (built in", "cuda": "reason: None"}


def _env(cache: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "XBACKEND_CACHE_DIR": str(cache), _fastkey.ENV: "1", **extra}


def _start_holder(kind: str, cache: Path, stall: str = "1") -> tuple[subprocess.Popen, list[str]]:
    """A process that has started the build (it holds the locks) and compiles forever; and what it printed."""
    proc = subprocess.Popen([sys.executable, "-c", PRELUDE + USE[kind]], env=_env(cache, STALL=stall),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], deadline - time.monotonic())
        if ready:
            line = proc.stdout.readline()
            if line.startswith("building"):
                return proc, line.split()
            if not line:
                break
    proc.kill()
    _, err = proc.communicate()
    pytest.fail(f"the holder never started building: {err[-2000:]}")


def _run(kind: str, cache: Path, timeout: float = 60, **extra: str) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([sys.executable, "-c", PRELUDE + USE[kind]], env=_env(cache, **extra),
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the next process's first use did not return within {timeout} s (it waits on a lock forever)")


# -- a build killed mid-compile, a build that never finishes ------------------------------------------
@pytest.mark.parametrize("kind", ["fastkey", "cuda"])
def test_a_build_killed_mid_compile_does_not_block_the_next_process(tmp_path, kind) -> None:
    holder, _ = _start_holder(kind, tmp_path)
    holder.send_signal(signal.SIGKILL)  # kill -9 while it holds torch's lock (and xbackend's)
    holder.communicate()
    assert list(tmp_path.rglob("lock")), "the killed build should have left torch's lock file"
    out = _run(kind, tmp_path)
    assert out.returncode == 0, out.stderr
    assert BUILT[kind] in out.stdout, (out.stdout, out.stderr)
    assert "stale" in out.stderr  # says it took over a dead build's lock
    assert not list(tmp_path.rglob("lock")) and not list(tmp_path.rglob("xbackend.lock"))


@pytest.mark.parametrize("kind", ["fastkey", "cuda"])
def test_a_build_that_never_finishes_bounds_the_wait_and_falls_back(tmp_path, kind) -> None:
    holder, _ = _start_holder(kind, tmp_path)
    try:
        t0 = time.monotonic()
        out = _run(kind, tmp_path, XBACKEND_BUILD_LOCK_TIMEOUT="1")
        elapsed = time.monotonic() - t0
    finally:
        holder.kill()
        holder.communicate()
    assert out.returncode == 0, out.stderr
    (lock,) = tmp_path.rglob("xbackend.lock")
    if kind == "fastkey":
        assert out.stdout.startswith("Python keys (") and str(lock) in out.stdout  # the reason `xbackend info` shows
    else:
        assert out.stdout.startswith("reason: ") and str(lock) in out.stdout  # the impl is unavailable: Triton runs
    warnings = [ln for ln in out.stderr.splitlines() if str(lock) in ln]
    assert len(warnings) == 1 and "XBACKEND_BUILD_LOCK_TIMEOUT" in warnings[0] and "delete" in warnings[0], out.stderr
    assert elapsed < 45


def test_the_compiler_of_a_killed_build_is_waited_for(tmp_path) -> None:
    """kill -9 of the Python process leaves its ninja and compiler running in the build directory: the
    next build waits for them (bounded) instead of starting a second compile under them."""
    holder, printed = _start_holder("fastkey", tmp_path, stall="orphan")
    compiler = int(printed[1])
    try:
        holder.send_signal(signal.SIGKILL)
        holder.communicate()
        out = _run("fastkey", tmp_path, XBACKEND_BUILD_LOCK_TIMEOUT="1")
        assert out.stdout.startswith("Python keys (waited 1 s for the build lock"), (out.stdout, out.stderr)
        assert f"is not running, but pid {compiler} still works in that directory" in out.stdout
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(compiler, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while Path(f"/proc/{compiler}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)  # reaped by init once it is gone
    out = _run("fastkey", tmp_path, XBACKEND_BUILD_LOCK_TIMEOUT="5")
    assert BUILT["fastkey"] in out.stdout and "stale" in out.stderr, (out.stdout, out.stderr)


# -- the lock itself --------------------------------------------------------------------------------
HOLD = r'''
import sys, time
from pathlib import Path
from xbackend._cache import build_lock
with build_lock(Path(sys.argv[1])):
    print("held", flush=True)
    time.sleep(600)
'''


def _hold(directory: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(directory)], stdout=subprocess.PIPE, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    if not ready or proc.stdout.readline().strip() != "held":
        proc.kill()
        pytest.fail("the lock holder did not start")
    return proc


def test_a_lock_of_a_live_owner_times_out_naming_the_file_and_the_fix(tmp_path) -> None:
    holder = _hold(tmp_path)
    try:
        t0 = time.monotonic()
        with pytest.raises(_cache.BuildLockTimeout) as err, _cache.build_lock(tmp_path, timeout=0.5):
            pass
        assert time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait()
    msg = str(err.value)
    assert str(tmp_path / "xbackend.lock") in msg and f"pid {holder.pid}" in msg
    assert "delete" in msg and "XBACKEND_BUILD_LOCK_TIMEOUT" in msg


def test_a_lock_held_in_this_process_is_waited_for_too(tmp_path) -> None:
    with _cache.build_lock(tmp_path), pytest.raises(_cache.BuildLockTimeout), _cache.build_lock(tmp_path, timeout=0.2):
        pass
    with _cache.build_lock(tmp_path, timeout=0):  # released: free again
        pass


def test_a_silent_owner_is_stale_after_the_age_bound(tmp_path, monkeypatch, caplog) -> None:
    """An owner that stopped beating (stopped, on another host, or its pid taken by another process)."""
    holder = _hold(tmp_path)
    try:
        holder.send_signal(signal.SIGSTOP)  # alive, but its heartbeat stops
        lock = tmp_path / "xbackend.lock"
        old = time.time() - _cache.STALE_AFTER_S - 5
        os.utime(lock, (old, old))
        with caplog.at_level(logging.WARNING, "xbackend"), _cache.build_lock(tmp_path, timeout=5):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        holder.kill()
        holder.wait()
    assert "stale" in caplog.text and "no heartbeat" in caplog.text
    assert not lock.exists()


def test_a_reused_pid_is_not_mistaken_for_the_owner(tmp_path, caplog) -> None:
    """The lock names this very process's pid (a container restart hands out the same pids) but a
    different process start: its owner is gone."""
    lock = tmp_path / "xbackend.lock"
    with _cache.build_lock(tmp_path):
        record = json.loads(lock.read_text())
    lock.write_text(json.dumps({**record, "start": "1", "token": "someone else"}))
    with caplog.at_level(logging.WARNING, "xbackend"), _cache.build_lock(tmp_path, timeout=5):
        pass
    assert "stale" in caplog.text and "not running" in caplog.text


def test_the_owner_keeps_its_lock_fresh(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(_cache, "HEARTBEAT_S", 0.05)
    lock = tmp_path / "xbackend.lock"
    with _cache.build_lock(tmp_path):
        os.utime(lock, (1, 1))
        deadline = time.monotonic() + 5
        while lock.stat().st_mtime < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert lock.stat().st_mtime > time.time() - 5


def test_a_bad_timeout_value_warns_and_uses_the_default(monkeypatch, caplog) -> None:
    monkeypatch.setenv(_cache.LOCK_TIMEOUT_ENV, "soon")
    with caplog.at_level(logging.WARNING, "xbackend"):
        assert _cache.lock_timeout() == _cache.DEFAULT_LOCK_TIMEOUT_S
    assert "soon" in caplog.text
    monkeypatch.setenv(_cache.LOCK_TIMEOUT_ENV, "2.5")
    assert _cache.lock_timeout() == 2.5


# -- who owns the cache ------------------------------------------------------------------------------
@pytest.fixture(autouse=True)
def _keep_key_form() -> Iterator[None]:
    saved = (_fastkey.KEYS, _fastkey._state)
    try:
        yield
    finally:
        _fastkey._set(*saved)


@pytest.fixture
def undecided(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Before the first dispatch, XBACKEND_FAST_KEY=1, nothing imported and builds recorded, not run."""
    _fastkey._set({name: spec.key for name, spec in OPS.items()}, None)
    monkeypatch.setenv("XBACKEND_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv(_fastkey.ENV, "1")
    monkeypatch.setattr(_fastkey, "build_problem", lambda: None)
    monkeypatch.setattr(_fastkey, "_import", lambda path: pytest.fail(f"imported {path}"))
    return tmp_path / "cache"


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The build directories cpp_extension.load was called with (it writes a group-writable binary, as
    a umask of 002 would)."""
    dirs: list[Path] = []

    def fake_load(name: str, sources: list[str], build_directory: str, **kwargs: object) -> types.SimpleNamespace:
        dirs.append(Path(build_directory))
        binary = Path(build_directory, f"{name}.so")
        binary.write_bytes(b"")
        binary.chmod(0o775)
        return types.SimpleNamespace(make=lambda op, mask, key: key, __file__=str(binary))

    monkeypatch.setattr(torch.utils.cpp_extension, "load", fake_load)
    return dirs


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _plant(root: Path, mode: int = 0o700) -> Path:
    """An extension binary at library_path(), every directory from root down given ``mode``."""
    planted = _fastkey.library_path()
    rel = planted.parent.relative_to(root)
    for d in [root, *(root / Path(*rel.parts[:i + 1]) for i in range(len(rel.parts)))]:
        d.mkdir(exist_ok=True)
        d.chmod(mode)
    planted.write_bytes(b"")
    return planted


def test_a_world_writable_cache_is_neither_loaded_from_nor_built_in(undecided, builds, caplog) -> None:
    _plant(undecided, 0o777)
    with caplog.at_level(logging.WARNING, "xbackend"):
        form = _fastkey.decide()
    assert form.form == "c++" and "built in" in form.reason  # built again, privately
    (where,) = builds
    assert undecided not in where.parents and _mode(where) == 0o700
    assert form.path == str(where / _fastkey.library_path().name)
    (warning,) = [r.getMessage() for r in caplog.records]
    assert str(undecided) in warning and "writable by group or others" in warning and str(where.parents[2]) in warning


@pytest.mark.parametrize("foreign", ["binary", "directory"])
def test_a_binary_or_directory_of_another_user_is_refused(undecided, builds, caplog, foreign) -> None:
    planted = _plant(undecided)
    os.chown(planted if foreign == "binary" else planted.parents[1], 12345, 12345)
    with caplog.at_level(logging.WARNING, "xbackend"):
        form = _fastkey.decide()
    rel = planted.parent.relative_to(undecided)
    assert builds == [undecided / f"xbackend-{os.getuid()}" / rel]  # the root is ours: a private tree in it
    assert form.form == "c++" and "built in" in form.reason
    assert "owned by uid 12345" in caplog.text


def test_a_shared_sticky_root_gets_a_private_tree_unless_someone_took_its_name(undecided, builds, caplog) -> None:
    undecided.mkdir()
    undecided.chmod(0o1777)  # like /tmp: others may create entries, not replace ours
    mine = undecided / f"xbackend-{os.getuid()}"
    assert _cache.safe_dir(_fastkey._build_dir()).is_relative_to(mine) and _mode(mine) == 0o700
    os.chown(mine, 12345, 12345)  # someone else got there first
    other = _cache.safe_dir(_fastkey._build_dir() / "x")
    assert undecided not in other.parents and _mode(other) == 0o700
    assert "owned by uid 12345" in caplog.text


def test_new_cache_directories_are_private_and_the_binary_not_group_writable(undecided, builds, monkeypatch) -> None:
    root = undecided / "a" / "b"
    monkeypatch.setenv("XBACKEND_CACHE_DIR", str(root))
    module, _ = _fastkey.build()
    (where,) = builds
    assert where == _fastkey._build_dir()
    for d in [undecided, *reversed(where.relative_to(undecided).parents[:-1]), where]:
        assert _mode(undecided / d) == 0o700, d
    assert _mode(Path(module.__file__)) & 0o022 == 0


def test_a_private_prebuilt_is_loaded(undecided, builds, monkeypatch) -> None:
    planted = _plant(undecided)
    imported: list[Path] = []
    monkeypatch.setattr(_fastkey, "_import", lambda p: imported.append(p) or types.SimpleNamespace(make=lambda o, m, k: k))
    form = _fastkey.decide()
    assert imported == [planted] and builds == [] and form.path == str(planted)


def test_the_cuda_extension_builds_privately_too(undecided, builds, monkeypatch, caplog, tmp_path) -> None:
    monkeypatch.setattr(_cuda_build, "_device_archs", lambda: ["90"])
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    undecided.mkdir()
    undecided.chmod(0o777)
    with caplog.at_level(logging.WARNING, "xbackend"):
        _cuda_build.JitExtension("xbackend_test_ext", ("k.cu",), "test ext", source_dir=tmp_path)._build()
    (where,) = builds
    assert undecided not in where.parents and _mode(where) == 0o700
    assert str(undecided) in caplog.text
