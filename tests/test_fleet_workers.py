"""The fleet's compile workers: they exit when the process that started them dies, and every task they
run (a Triton compile, an nvcc compile, a launch-path capture) has a bounded time, reported per kernel
as a ``timeout`` status.

Each scenario that could leave processes behind or hang runs in a subprocess with a timeout and kills
what it started; a compile stalls through a stand-in compiler (nvcc on PATH, ptxas through
``TRITON_PTXAS_PATH``) that sleeps instead of compiling.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process groups")


def _gone(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie whose parent is gone counts: it runs nothing and holds no memory)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except FileNotFoundError:
        return True
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False
    return state in ("Z", "X")


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """The pids still running after ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not all(_gone(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if not _gone(p)]


def _kill(pids: list[int]) -> None:
    """Clean up after a failed check: the test's own descendants only."""
    for pid in pids:
        if not _gone(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _start(code: str, *args: str, env: dict[str, str] | None = None) -> tuple[subprocess.Popen, list[str]]:
    """A Python process running ``code``; returns it and the words of the first line it prints."""
    proc = subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"the parent process printed nothing: {proc.communicate()[1][-3000:]}")
    return proc, line.split()


# -- workers die with their parent ------------------------------------------------------------------
POOL_PARENT = r"""
import time
from xbackend.fleet import _worker, compile as fc
print(*sorted({fc.run_in_worker(_worker.ping, workers=2) for _ in range(20)}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_compile_workers_exit_when_their_parent_is_killed(sig: int) -> None:
    parent, words = _start(POOL_PARENT)
    workers = [int(w) for w in words]
    try:
        assert workers and parent.pid not in workers
        assert not any(_gone(p) for p in workers)
        parent.send_signal(sig)
        parent.wait(timeout=30)  # not communicate(): a surviving worker holds the pipes open
        left = _wait_gone(workers, 5.0)
        assert not left, f"compile workers {left} outlived their parent ({signal.Signals(sig).name})"
    finally:
        parent.kill()
        _kill(workers)
        parent.communicate()


WATCHED = r"""
import sys, time
from xbackend.fleet._pool import watch_parent
watch_parent(int(sys.argv[1]), interval=0.1)
print("watching", flush=True)
time.sleep(600)
"""
WATCH_PARENT = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_the_parent_watchdog_alone_ends_a_worker() -> None:
    """The portable path (no prctl): a process that only watches its parent's pid."""
    parent, words = _start(WATCH_PARENT, WATCHED)
    child = int(words[0])
    try:
        assert parent.stdout.readline().strip() == "watching", "the child never started watching"
        parent.kill()
        parent.wait(timeout=30)
        assert not _wait_gone([child], 5.0), "the watched child outlived its parent"
    finally:
        parent.kill()
        _kill([child])
        parent.communicate()


# -- every task is bounded ---------------------------------------------------------------------------
def _stuck(seconds: float) -> None:
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    time.sleep(seconds)


def test_a_task_that_overruns_is_a_timeout_and_its_worker_is_replaced() -> None:
    from xbackend.fleet import _pool, _worker
    from xbackend.fleet import compile as fc

    fc.shutdown()
    try:
        first = fc.run_in_worker(_worker.ping, workers=1)
        t0 = time.monotonic()
        with pytest.raises(_pool.TaskTimeout, match=r"time\.sleep took longer than 1 s"):
            fc.run_in_worker(time.sleep, 120, workers=1, task_timeout=1)
        assert time.monotonic() - t0 < 1 + _pool.GRACE_S + 5
        assert fc.run_in_worker(_worker.ping, workers=1) == first  # a Python-level stall: the worker survives
        # A stall the worker cannot interrupt (here: SIGALRM ignored, as native code holding the GIL
        # would): the parent kills the worker at the bound plus the grace, and starts another.
        with pytest.raises(_pool.TaskTimeout, match=r"took longer than 1 s; its worker was killed"):
            fc.run_in_worker(_stuck, 120, workers=1, task_timeout=1)
        assert not _wait_gone([first], 5.0)
        second = fc.run_in_worker(_worker.ping, workers=1)
        assert second != first
    finally:
        fc.shutdown()


def test_the_bound_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    from xbackend.fleet import _pool

    monkeypatch.delenv(_pool.TIMEOUT_ENV, raising=False)
    assert _pool.compile_timeout() == _pool.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(_pool.TIMEOUT_ENV, "42.5")
    assert _pool.compile_timeout() == 42.5
    for bad in ("soon", "0", "-1", "inf"):
        monkeypatch.setenv(_pool.TIMEOUT_ENV, bad)
        assert _pool.compile_timeout() == _pool.DEFAULT_TIMEOUT_S
        assert f"{_pool.TIMEOUT_ENV}={bad!r}" in caplog.text


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), "5", True])
def test_a_bad_timeout_argument_is_an_error_naming_it(bad) -> None:
    from xbackend._device import simulated
    from xbackend.fleet import compile as fc

    with pytest.raises(ValueError, match=f"compile_target: timeout expected a finite number of seconds > 0, got {bad!r}"):
        fc.compile_target("h100", simulated("h100"), [], timeout=bad)


STALLING = """#!/bin/sh
case "$*" in *--version*) exec "{real}" --version ;; esac
echo $$ >> "{pids}"
exec sleep 600
"""

FLEET_TWICE = r"""
import sys
from xbackend.cli import main
args = ["fleet", "--compile", "--targets", "h100", "--op", "gated_residual,rmsnorm", "--dtype", "bf16",
        "--quality", "lossless"]
print("exit", main([*args, "--json"]), file=sys.stderr, flush=True)
print("=" * 20, flush=True)
print("exit", main(args), file=sys.stderr, flush=True)
"""


@pytest.mark.slow
def test_a_stalled_nvcc_and_a_stalled_ptxas_give_timeout_rows(tmp_path: Path) -> None:
    """``xbackend fleet --compile`` with both compilers stalling: each kernel is a ``timeout`` row (JSON
    and text), the run fails, and no stalled compiler is left running."""
    import triton.backends.nvidia

    bundled = Path(triton.backends.nvidia.__file__).parent / "bin"
    ptxas = ("ptxas", "ptxas-blackwell")  # Triton 3.9 runs the second for sm90 and later
    if not all((bundled / tool).exists() for tool in ptxas):
        pytest.skip("Triton has no bundled ptxas here")
    bin_dir, pids = tmp_path / "bin", tmp_path / "stalled.pids"
    bin_dir.mkdir()
    for tool, real in (("nvcc", "/bin/false"), *((tool, bundled / tool) for tool in ptxas)):
        (bin_dir / tool).write_text(STALLING.format(real=real, pids=pids))
        (bin_dir / tool).chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           **{f"TRITON_{tool.upper().replace('-', '_')}_PATH": str(bin_dir / tool) for tool in ptxas},
           "TRITON_CACHE_DIR": str(tmp_path / "triton"), "XBACKEND_COMPILE_TIMEOUT": "3"}
    env.pop("TRITON_INTERPRET", None)
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-c", FLEET_TWICE], capture_output=True, text=True, env=env,
                             timeout=400)
    except subprocess.TimeoutExpired:
        pytest.fail("xbackend fleet --compile did not return: a stalled compiler is waited for without bound")
    finally:
        stalled = [int(p) for p in pids.read_text().split()] if pids.exists() else []
        left = _wait_gone(stalled, 5.0)
        _kill(stalled)
    assert stalled, (out.stdout[-2000:], out.stderr[-3000:])
    assert not left, f"stalled compilers {left} still running after the run"
    assert out.stderr.count("exit 1") == 2, out.stderr[-3000:]
    document, text = out.stdout.split("=" * 20)
    (target,) = json.loads(document)["targets"]
    kernels = target["kernels"]
    by_impl = {impl: [k for k in kernels if k["chosen"] == impl] for impl in ("cuda:cuda_vec", "cuda:triton")}
    for impl, rows in by_impl.items():
        assert rows, (impl, kernels)
        for row in rows:
            assert row["status"].startswith("timeout: ") and "3 s" in row["status"], row
            assert row["problem"] == row["status"], row
    assert "nvcc" in by_impl["cuda:cuda_vec"][0]["status"]
    assert "Triton compile" in by_impl["cuda:triton"][0]["status"]
    assert f"{len(kernels)} rows: 0 ok, 0 failed, {len(kernels)} timed out" in text
    assert text.count("! ") == len(kernels) and "timeout: " in text
    # Six stalls of 3 s (a native source and a Triton specialisation, or more, per run), each bounded:
    # far below one stalled compile's 600 s.
    assert time.monotonic() - t0 < 300
