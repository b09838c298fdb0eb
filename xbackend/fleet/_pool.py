"""The fleet's compile workers: a pool of Python processes, each task in it bounded in time, none of
them outliving the process that started it.

Start. Each worker is ``python -c`` with this process's environment less ``TRITON_INTERPRET`` (so
``@triton.jit`` gives compilable kernels there) and its ``sys.path``, in a session of its own: its
process group holds the ptxas Triton runs, so killing the group ends that too (nvcc runs in a session
of its own, ``run_compiler``). It imports torch and Triton (1.3-1.8 s on the 2-core CPU) before it
takes a task, so that cost counts against no task's bound.

Bound. Every task has ``timeout`` seconds (``compile_timeout()``: ``$XBACKEND_COMPILE_TIMEOUT``,
default ``DEFAULT_TIMEOUT_S``). In the worker an interval timer interrupts the task at the bound: a
compiler it waits on (Triton's ptxas, nvcc) is killed and the worker takes the next task. A task the
timer cannot interrupt (native code that never returns to Python) is killed with its worker, process
group and all, ``GRACE_S`` later, and another worker is started. Either way the task's future raises
TaskTimeout, so no caller waits without bound.

Parent death. A worker exits when its parent does: on Linux the kernel sends it SIGKILL
(``prctl(PR_SET_PDEATHSIG)``); everywhere a watchdog thread polls the parent pid and kills the
worker's process group and its compilers' sessions; and a worker reading its next task sees the
connection close. (After the kernel's SIGKILL, a compiler the worker had started ends with its own
compile.) POSIX only: the workers need process groups, SIGALRM and file-descriptor passing.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextlib
import ctypes
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from xbackend._cache import env_seconds

__all__ = ["DEFAULT_TIMEOUT_S", "GRACE_S", "TIMEOUT_ENV", "TaskTimeout", "WorkerDied", "WorkerPool",
           "compile_timeout", "run_compiler", "serve", "task_bound", "watch_parent"]

TIMEOUT_ENV = "XBACKEND_COMPILE_TIMEOUT"
# The slowest single task of a whole-fleet compile on the 2-core CPU is nvcc 13.0 of gated_residual.cu
# for sm100, 5.5 s; a Triton specialisation takes 1-3 s: 5 minutes is a stall, not a slow compile.
DEFAULT_TIMEOUT_S = 300.0
GRACE_S = 5.0  # the worker's own timer gets this long to end a task before the parent kills the worker
START_S = 120.0  # a worker's start: the interpreter, torch and Triton (1.3-1.8 s on the 2-core CPU)
STOP_S = 5.0  # an idle worker asked to exit gets this long before it is killed
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_BOOT = """
import sys
from multiprocessing.connection import Connection
conn = Connection(int(sys.argv[1]))
sys.path[:] = conn.recv()
from xbackend.fleet._pool import serve
serve(conn, int(sys.argv[2]))
"""


def compile_timeout() -> float:
    """``$XBACKEND_COMPILE_TIMEOUT`` seconds, default DEFAULT_TIMEOUT_S; a value that is not a finite
    number > 0 warns once and is the default."""
    return env_seconds(TIMEOUT_ENV, DEFAULT_TIMEOUT_S, positive=True)


def task_bound(timeout: float | None, what: str) -> float:
    """``timeout`` checked (a finite number of seconds > 0; ``what`` names the argument in the error),
    or compile_timeout() for None."""
    if timeout is None:
        return compile_timeout()
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
        raise ValueError(f"{what} expected a finite number of seconds > 0, got {timeout!r}")
    return float(timeout)


class TaskTimeout(RuntimeError):
    """A task ran past its bound. ``killed``: the worker did not end it itself and was killed."""

    def __init__(self, task: str, seconds: float, killed: bool) -> None:
        self.task, self.seconds, self.killed = task, seconds, killed
        super().__init__(f"{task} took longer than {seconds:g} s" + ("; its worker was killed" if killed else ""))


class WorkerDied(RuntimeError):
    """The worker running a task exited (a compiler crash took it down), or none could start."""


class _Expired(BaseException):
    """Raised in a worker by the task's timer: a BaseException, so the task's own ``except Exception``
    (a compile error is a result) does not take it for a compile error."""


# -- the worker side ------------------------------------------------------------------------------------
_SESSIONS: set[int] = set()  # compilers this worker runs in sessions of their own (run_compiler)


def run_compiler(cmd: list[str]) -> subprocess.CompletedProcess:
    """``cmd`` with its output captured, in a session of its own: nvcc runs cicc and ptxas, and killing
    the session ends them all when the task's bound interrupts the wait (or watch_parent ends the worker)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    _SESSIONS.add(proc.pid)
    try:
        out, err = proc.communicate()
    except BaseException:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        _SESSIONS.discard(proc.pid)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _exit_group() -> None:
    """End this process and the compilers it started: its process group when it leads one, and the
    sessions of run_compiler."""
    with contextlib.suppress(Exception):
        for session in list(_SESSIONS):
            with contextlib.suppress(OSError):
                os.killpg(session, signal.SIGKILL)
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)
    os._exit(1)


def watch_parent(parent_pid: int, interval: float = 0.5) -> threading.Thread:
    """A daemon thread that ends this process (and its process group, when it leads one) once its
    parent is no longer ``parent_pid``: an orphan is adopted by another process."""

    def run() -> None:
        while True:
            if os.getppid() != parent_pid:
                _exit_group()
            time.sleep(interval)

    thread = threading.Thread(target=run, name="xbackend-parent-watchdog", daemon=True)
    thread.start()
    return thread


def _die_with_parent(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):  # no libc or no prctl: the watchdog below still runs
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        _exit_group()
    watch_parent(parent_pid)


def _expire(signum: int, frame: Any) -> None:
    raise _Expired


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    signal.signal(signal.SIGALRM, _expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def serve(conn: Connection, parent_pid: int) -> None:
    """A worker's main loop: tasks from ``conn`` until it closes."""
    _die_with_parent(parent_pid)
    os.set_inheritable(conn.fileno(), False)  # Triton runs ptxas with close_fds=False
    os.environ.pop("TRITON_INTERPRET", None)
    with contextlib.suppress(Exception):  # a missing package fails the task that needs it, with its message
        import torch  # noqa: F401
        import triton  # noqa: F401

        import xbackend.fleet._worker  # noqa: F401
    conn.send(("ready", None, os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return
        if message is None:
            return
        task_id, timeout, payload = message
        start = time.monotonic()
        try:
            try:
                with _deadline(timeout):
                    fn, args, kwargs = pickle.loads(payload)
                    reply = ("ok", task_id, fn(*args, **kwargs))
            except _Expired:
                reply = ("timeout", task_id, time.monotonic() - start)
        except _Expired:  # the timer fired as the task returned
            reply = ("timeout", task_id, time.monotonic() - start)
        except BaseException as e:
            reply = ("error", task_id, e)
        try:
            conn.send(reply)
        except Exception as e:  # a result or exception that does not pickle
            conn.send(("error", task_id, RuntimeError(f"{type(e).__name__} sending the task's result: {e}")))


# -- the parent side ------------------------------------------------------------------------------------
@dataclass
class _Task:
    name: str
    payload: bytes
    timeout: float
    future: cf.Future = field(default_factory=cf.Future)


@dataclass
class _Worker:
    proc: subprocess.Popen
    conn: Connection
    since: float  # start of the worker, then of its current task
    ready: bool = False
    task: _Task | None = None


def _task_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or ""
    name = getattr(fn, "__qualname__", None) or repr(fn)
    return name if module in ("", "builtins") or module.startswith("xbackend.") else f"{module}.{name}"


class WorkerPool:
    """``size`` worker processes running ``submit``ted tasks, each bounded (module docstring)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self._path = list(sys.path)
        self._lock = threading.Lock()
        self._pending: collections.deque[_Task] = collections.deque()
        self._workers: list[_Worker] = []
        self._closing = False
        self._broken: str | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        # Workers are started from this thread only: PR_SET_PDEATHSIG fires when the thread that
        # started a worker ends, and this one lives as long as the pool.
        self._thread = threading.Thread(target=self._run, name="xbackend-compile-pool", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., Any], args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None, *,
               timeout: float) -> cf.Future:
        """``fn(*args, **kwargs)`` in a worker; the future raises TaskTimeout after ``timeout`` seconds
        of running, WorkerDied when its worker died. ``fn`` and the arguments must pickle."""
        task = _Task(_task_name(fn), pickle.dumps((fn, args, kwargs or {})), timeout)
        with self._lock:
            if self._closing or self._broken is not None:
                task.future.set_exception(WorkerDied(self._broken or "the compile pool is shut down"))
                return task.future
            self._pending.append(task)
        self._wake()
        return task.future

    def pids(self) -> list[int]:
        with self._lock:
            return [w.proc.pid for w in self._workers]

    def shutdown(self) -> None:
        """Stop the workers; a task queued or running fails with WorkerDied. A worker still running
        ``STOP_S`` after it was asked to exit is killed."""
        with self._lock:
            self._closing = True
        self._wake()
        self._thread.join()

    # -- the dispatcher thread --------------------------------------------------------------------------
    def _wake(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")

    def _start_worker(self) -> None:
        parent, child = socket.socketpair()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, str(child.fileno()), str(os.getpid())], pass_fds=[child.fileno()],
                env=self._env, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        finally:
            child.close()
        conn = Connection(parent.detach())
        self._workers.append(_Worker(proc, conn, time.monotonic()))
        with contextlib.suppress(OSError):  # one that died at once reads as closed in _step
            conn.send(self._path)

    def _kill(self, worker: _Worker) -> None:
        """Kill ``worker`` and the compilers in its process group, and forget it."""
        if worker.proc.returncode is None:  # not reaped yet, so its pid still names its group
            with contextlib.suppress(OSError):
                os.killpg(worker.proc.pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            worker.proc.kill()
        worker.proc.wait()
        worker.conn.close()
        self._workers.remove(worker)

    def _fail(self, worker: _Worker, error: BaseException) -> None:
        task, worker.task = worker.task, None
        if task is not None:
            task.future.set_exception(error)

    def _reply(self, worker: _Worker) -> None:
        try:
            kind, _, value = worker.conn.recv()
        except (EOFError, OSError):
            self._kill(worker)
            if worker.task is not None:
                self._fail(worker, WorkerDied(f"worker process {worker.proc.pid} died running {worker.task.name} "
                                              f"(exit code {worker.proc.returncode})"))
            elif not worker.ready:  # one that cannot start would fail again: stop rather than start workers forever
                self._broken = (f"a compile worker failed to start (exit code {worker.proc.returncode}; its error "
                                f"is on stderr)")
            return
        if kind == "ready":
            worker.ready = True
            return
        task, worker.task = worker.task, None
        if task is None:
            return
        if kind == "ok":
            task.future.set_result(value)
        elif kind == "timeout":
            task.future.set_exception(TaskTimeout(task.name, task.timeout, killed=False))
        else:
            task.future.set_exception(value)

    def _deadline(self, worker: _Worker) -> float | None:
        if worker.task is not None:
            return worker.since + worker.task.timeout + GRACE_S
        return None if worker.ready else worker.since + START_S

    def _dispatch(self) -> None:
        """Start missing workers, hand queued tasks to idle ones; under the lock."""
        if self._broken is not None:
            while self._pending:
                self._pending.popleft().future.set_exception(WorkerDied(self._broken))
            return
        while len(self._workers) < self.size:
            self._start_worker()
        now = time.monotonic()
        for worker in self._workers:
            while worker.ready and worker.task is None and self._pending:
                task = self._pending.popleft()
                if task.future.set_running_or_notify_cancel():
                    worker.task, worker.since = task, now
                    with contextlib.suppress(OSError):  # it died: its connection reads as closed
                        worker.conn.send((id(task), task.timeout, task.payload))

    def _step(self) -> None:
        with self._lock:
            self._dispatch()
            conns = [w.conn for w in self._workers]
            deadlines = [d for w in self._workers if (d := self._deadline(w)) is not None]
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        ready = wait([*conns, self._wake_r], timeout)
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_r, 4096):
                pass
        with self._lock:
            for worker in [w for w in self._workers if w.conn in ready]:
                self._reply(worker)
            now = time.monotonic()
            for worker in list(self._workers):
                deadline = self._deadline(worker)
                if deadline is None or now < deadline:
                    continue
                task = worker.task
                self._kill(worker)
                if task is not None:
                    self._fail(worker, TaskTimeout(task.name, task.timeout, killed=True))
                else:
                    self._broken = f"a compile worker did not start within {START_S:g} s"

    def _run(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._closing:
                        break
                self._step()
        except BaseException as e:  # the pool must never leave a future unresolved
            self._broken = f"the compile pool's dispatcher failed: {type(e).__name__}: {e}"
        finally:
            self._stop()

    def _stop(self) -> None:
        with self._lock:
            reason = self._broken or "the compile pool is shut down"
            while self._pending:
                self._pending.popleft().future.set_exception(WorkerDied(reason))
            for worker in self._workers:
                with contextlib.suppress(OSError):
                    worker.conn.send(None)
            deadline = time.monotonic() + STOP_S
            for worker in list(self._workers):
                if worker.task is None:  # an idle worker exits on None; a busy one is killed at once
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        worker.proc.wait(max(0.0, deadline - time.monotonic()))
                self._fail(worker, WorkerDied(reason))
                self._kill(worker)
            os.close(self._wake_r)
            os.close(self._wake_w)
