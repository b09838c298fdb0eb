"""Where xbackend keeps the extensions it builds, when it trusts what it finds there, and how two
processes building the same extension wait for each other.

Location. The C++ dispatch key extension and the CUDA kernels are built with
``torch.utils.cpp_extension.load`` into ``$XBACKEND_CACHE_DIR/torch_extensions/<tag>/<name>_<digest>/``
(default root ``~/.cache/xbackend``; the tag names the torch, Python or CUDA versions). The digest
(``_cachekey.extension_dir``) covers the content of every source and of every header they include from the
package, the compile flags and the toolchain: a build directory only ever holds the build of one
content. ninja's own check compares mtimes, and a file restored with an older mtime (an image rollback,
``docker COPY``, ``rsync -a``) would otherwise leave the build of other content in place.

Ownership. A cached extension is native code that runs with the rights of whoever imports it, so
xbackend loads or builds one only where no other user can have changed it (POSIX; "owned" means by
the current user or by root, who can change anything anyway):

* the cache root and each directory below it down to the build directory: owned, not writable by
  group or others;
* each file in the build directory: owned; a binary (``.so``) also not writable by group or others;
* each directory above the root: owned, and not writable by group or others unless sticky like
  ``/tmp`` (where others cannot rename what is ours), so nobody can swap the root itself.

Directories xbackend creates get mode 0700, and a binary it built loses any group/other write bit.
Where the rule fails, xbackend warns once per process, naming the path, and uses the same tree under
the first safe one of ``<root>/xbackend-<uid>`` (a private tree inside a shared sticky root, or beside
the unsafe part) and a fresh temporary directory (removed at exit, so each process builds again). To
fix it, ``chown`` or ``chmod go-w`` the named path, or set ``XBACKEND_CACHE_DIR`` to a directory only
you can write.

Build lock. A build holds ``xbackend.lock`` in its build directory, created exclusively; it records
the owner's pid, host and process start, and the owner refreshes its mtime every ``HEARTBEAT_S``
seconds while it builds. Another process waits at most ``$XBACKEND_BUILD_LOCK_TIMEOUT`` seconds
(default 300; the dispatch-key extension built in 13-14 s on a 2-core CPU: ``xbackend build`` with an
empty ``XBACKEND_CACHE_DIR``, torch 2.13.0 CPU, 2026-12-05), then gives up with one warning naming the
lock file, and the caller falls back (Python dispatch keys, or the next impl). A lock is stale, and taken over,
when its owner is gone (on this host and pid namespace: its pid is not running or names a process
started later) or it was not refreshed for ``STALE_AFTER_S`` seconds (an owner killed on another host,
or stopped), unless a process still works in that directory (``kill -9`` of a build leaves its ninja
and compiler running there). A live owner's lock is never taken: two compilers in one directory
corrupt the build. While it holds the lock, xbackend deletes torch's own ``lock`` file there before
``load()``: no other xbackend build is running in that directory, so a killed build left that file,
and torch would wait for it forever.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import shutil
import socket
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

__all__ = [
    "BuildLockTimeout", "build_lock", "cache_root", "check_owned", "env_seconds", "find_safe_dir", "load_extension",
    "lock_timeout", "safe_dir", "warn_once",
]

log = logging.getLogger("xbackend")

CACHE_ENV = "XBACKEND_CACHE_DIR"
LOCK_TIMEOUT_ENV = "XBACKEND_BUILD_LOCK_TIMEOUT"
LOCK_NAME = "xbackend.lock"
DEFAULT_LOCK_TIMEOUT_S = 300.0
HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0  # twelve missed heartbeats: well past any scheduling hiccup or clock skew
_POLL_S = 0.1
_BINARIES = (".so", ".pyd", ".dylib", ".dll")
_FIX = f"fix: chown or chmod go-w that path, or set {CACHE_ENV} to a directory only you can write"

_warned: set[str] = set()
_tmp_base: Path | None = None
_tmp_lock = threading.Lock()


def cache_root() -> Path:
    """``$XBACKEND_CACHE_DIR``, default ``~/.cache/xbackend``."""
    root = os.environ.get(CACHE_ENV)
    return Path(root) if root else Path.home() / ".cache" / "xbackend"


def warn_once(key: str, message: str) -> None:
    """Log ``message`` as a warning the first time this process sees ``key`` (e.g. a bad environment
    value that may be read at every call)."""
    if key not in _warned:
        _warned.add(key)
        log.warning("%s", message)


# -- ownership --------------------------------------------------------------------------------------
def check_owned(path: Path, *, shared_ok: bool = False) -> str | None:
    """Why code at ``path`` (or below it) must not be trusted, or None: it must be owned by the current
    user or root and not writable by group or others. With ``shared_ok`` a sticky directory writable by
    others passes (like ``/tmp``: others cannot rename or delete what is ours in it). Always None where
    there are no POSIX owners."""
    if not hasattr(os, "getuid"):
        return None
    try:
        st = os.stat(path)
    except OSError as e:
        return f"{path} cannot be read ({e.strerror or e})"
    if st.st_uid not in (os.getuid(), 0):
        return f"{path} is owned by uid {st.st_uid}"
    sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
    if st.st_mode & 0o022 and not (shared_ok and sticky):
        return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):#o})"
    return None


def _tree_problem(base: Path, rel: Path) -> str | None:
    """Why ``base/rel`` is no place to load or build code, or None (the rule in the module docstring).
    Parts that do not exist yet pass: xbackend creates them private."""
    for parent in reversed(base.parents):
        if os.path.lexists(parent) and (why := check_owned(parent, shared_ok=True)):
            return why
    d = base
    for part in (None, *rel.parts):
        d = d if part is None else d / part
        if not os.path.lexists(d):
            return None
        if why := check_owned(d):
            return why
    if not d.is_dir():
        return f"{d} is not a directory"
    if not hasattr(os, "getuid"):
        return None
    try:
        with os.scandir(d) as entries:
            for entry in entries:
                why = None
                if entry.name.endswith(_BINARIES):
                    why = check_owned(Path(entry.path))
                elif (uid := entry.stat(follow_symlinks=False).st_uid) not in (os.getuid(), 0):
                    why = f"{entry.path} is owned by uid {uid}"
                if why is not None:
                    return why
    except OSError as e:
        return f"{d} cannot be listed ({e.strerror or e})"
    return None


def _make(path: Path) -> str | None:
    """Create ``path`` and its missing parents with mode 0700; why not, or None."""
    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    for d in reversed(missing):
        try:
            d.mkdir(mode=0o700)
        except FileExistsError:
            pass  # made by a concurrent process: checked like the rest afterwards
        except OSError as e:
            return f"{d} cannot be created ({e.strerror or e})"
    return None


def _private_tmp(create: bool) -> Path | None:
    global _tmp_base
    with _tmp_lock:
        if _tmp_base is None and create:
            _tmp_base = Path(tempfile.mkdtemp(prefix="xbackend-"))  # mode 0700, ours
            atexit.register(shutil.rmtree, _tmp_base, ignore_errors=True)
        return _tmp_base


def _resolve(path: Path, create: bool) -> Path | None:
    nominal = cache_root()
    rel = path.relative_to(nominal)  # a ValueError here is a caller's bug: only the cache is checked
    real = Path(os.path.realpath(nominal))  # the parents that matter are those of the real root
    private = f"xbackend-{os.getuid()}" if hasattr(os, "getuid") else "xbackend-private"
    problems: list[str] = []
    for base, shown in ((real, nominal), (real / private, nominal / private)):
        why = _tree_problem(base, rel)
        if why is None and create:
            why = _make(base / rel) or _tree_problem(base, rel)
        if why is None:
            if problems:
                warn_once("; ".join(problems), f"xbackend: {'; '.join(problems)}; using {shown / rel} instead ({_FIX})")
            return shown / rel
        problems.append(why)
    tmp = _private_tmp(create)
    key = "; ".join(problems)
    if tmp is None:
        warn_once(key, f"xbackend: {key}; no prebuilt extension is loaded from there ({_FIX})")
        return None
    target = tmp / rel
    if create and (why := _make(target)):
        raise OSError(why)
    warn_once(key, f"xbackend: {key}; building in {target} instead, a temporary directory removed at exit ({_FIX})")
    return target


def safe_dir(path: Path) -> Path:
    """Where to build what belongs at ``path`` (a directory under cache_root()): ``path`` itself, created
    0700 where missing, when its tree passes the ownership rule of this module; else the same place
    under the first safe fallback (``<root>/xbackend-<uid>``, then a temporary directory), with one
    warning naming the unsafe path. Raises OSError only when no directory can be created at all."""
    where = _resolve(path, create=True)
    if where is None:  # create=True always ends in a directory; this keeps the type honest
        raise OSError(f"no private directory for {path}")
    return where


def find_safe_dir(path: Path) -> Path | None:
    """Where a previously built copy of ``path`` may be loaded from, creating nothing: like safe_dir(),
    but None when only a temporary directory not made yet in this process would do."""
    return _resolve(path, create=False)


# -- the build lock ---------------------------------------------------------------------------------
class BuildLockTimeout(RuntimeError):
    """A live process held the build lock longer than this one waits; the message names the file and the fix."""


def env_seconds(name: str, default: float, *, positive: bool = False) -> float:
    """``$name`` as a finite number of seconds (``default`` when unset or empty). Any other value, or
    (with ``positive``) 0, is ``default`` with one warning: no bound read from the environment is ever
    infinite."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and (value > 0 if positive else value >= 0):
        return value
    warn_once(f"{name}={raw}", f"xbackend: {name}={raw!r} is not a finite number of seconds "
              f"{'> 0' if positive else '>= 0'}; using {default:g}")
    return default


def lock_timeout() -> float:
    """``$XBACKEND_BUILD_LOCK_TIMEOUT`` in seconds (default 300); never infinite, so no wait is unbounded."""
    return env_seconds(LOCK_TIMEOUT_ENV, DEFAULT_LOCK_TIMEOUT_S)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first, start time at index 19), where there is a /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()
    return fields if len(fields) > 19 else None


def _pidns() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def _owner() -> dict[str, Any]:
    fields = _proc_stat(os.getpid())
    return {"pid": os.getpid(), "host": socket.gethostname(), "pidns": _pidns(),
            "start": fields[19] if fields else None, "since": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "token": uuid.uuid4().hex}


def _running(pid: int, start: object) -> bool:
    """Whether the process that wrote a lock record is still running here. A pid now naming a process
    started at another time, or a zombie, is not it: after a container restart the same pids come back."""
    if pid <= 0:
        return False  # os.kill(0, ...) would mean this process group
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user
    except OSError:
        return True  # cannot tell: assume alive, the age bound still applies
    fields = _proc_stat(pid)
    if fields is None:
        return True
    return fields[0] != "Z" and (start is None or fields[19] == start)


def _compiling_in(directory: Path) -> int | None:
    """A process (not this one) whose working directory is ``directory``, or None. torch runs ninja
    there, and a build killed with -9 leaves its ninja and compiler running: a second build must not
    start under them. None where there is no /proc to tell."""
    target = os.path.realpath(directory)
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        if pid != os.getpid():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/cwd") == target:
                    return pid
    return None


def _owner_gone(record: dict[str, Any] | None, mtime: float) -> str | None:
    """Why the lock's owner is gone, or None while it may still be building."""
    age = time.time() - mtime
    if age > STALE_AFTER_S:
        return f"no heartbeat for {age:.0f} s"
    if record is None or os.name != "posix":  # os.kill(pid, 0) is no probe on Windows
        return None
    pid = record.get("pid")
    here = record.get("host") == socket.gethostname() and record.get("pidns") == _pidns()
    if here and isinstance(pid, int) and not _running(pid, record.get("start")):
        return f"pid {pid} is not running"
    return None


def _read(lock: Path) -> tuple[bytes, dict[str, Any] | None, float] | None:
    """(raw bytes, parsed record, mtime) of the lock, or None when there is none now."""
    try:
        with open(lock, "rb") as f:
            mtime = os.fstat(f.fileno()).st_mtime
            raw = f.read(4096)
    except FileNotFoundError:
        return None
    try:
        record = json.loads(raw)
    except ValueError:  # being written right now, or its owner died between create and write
        record = None
    return raw, record if isinstance(record, dict) else None, mtime


def _take_over(lock: Path, raw: bytes, why: str) -> bool:
    """Remove a stale lock: True when it is gone, False when it cannot be removed or a new owner
    created it after it was read (then it is put back, and waited for like any live one)."""
    aside = lock.with_name(f"{lock.name}.{uuid.uuid4().hex}.stale")
    try:
        os.replace(lock, aside)  # atomic: of several processes taking it over, one gets it
    except FileNotFoundError:
        return True  # released, or taken over by another: try again
    except OSError:
        return False
    try:
        if aside.read_bytes() != raw:
            with contextlib.suppress(OSError):
                os.link(aside, lock)
            return False
    finally:
        aside.unlink(missing_ok=True)
    log.warning("xbackend: took over the stale build lock %s (%s)", lock, why)
    return True


def _timeout_message(lock: Path, record: dict[str, Any] | None, waited: float, gone: str | None,
                     compiler: int | None) -> str:
    holder = "its owner unknown"
    if record is not None:
        holder = f"held by pid {record.get('pid')} on {record.get('host')} since {record.get('since')}"
    if compiler is not None:
        holder += f"; {gone}, but pid {compiler} still works in that directory"
    return (f"waited {waited:g} s for the build lock {lock} ({holder}); if no build is running, delete that "
            f"file; to wait longer set {LOCK_TIMEOUT_ENV}=<seconds>")


def _heartbeat(lock: Path, stop: threading.Event) -> None:
    while not stop.wait(HEARTBEAT_S):
        try:
            os.utime(lock)
        except OSError:
            return


@contextlib.contextmanager
def build_lock(directory: Path, timeout: float | None = None) -> Iterator[None]:
    """Hold ``directory/xbackend.lock`` (see the module docstring). Waits at most ``timeout`` seconds
    (default lock_timeout()) for a live owner, taking over a stale lock at once; raises
    BuildLockTimeout when the wait runs out."""
    lock = Path(directory) / LOCK_NAME
    limit = lock_timeout() if timeout is None else timeout
    deadline = time.monotonic() + limit
    me = _owner()
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        except FileExistsError:
            seen = _read(lock)
            if seen is not None:
                raw, record, mtime = seen
                gone = _owner_gone(record, mtime)
                # An owner gone but its compiler still running is waited for like a live owner.
                compiler = _compiling_in(lock.parent) if gone is not None else None
                if gone is not None and compiler is None and _take_over(lock, raw, gone):
                    continue
                if time.monotonic() >= deadline:
                    raise BuildLockTimeout(_timeout_message(lock, record, limit, gone, compiler)) from None
                time.sleep(max(0.0, min(_POLL_S, deadline - time.monotonic())))
            continue
        with os.fdopen(fd, "w") as f:
            json.dump(me, f)
        break
    stop = threading.Event()
    beat = threading.Thread(target=_heartbeat, args=(lock, stop), name="xbackend-build-lock", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stop.set()
        beat.join()
        seen = _read(lock)
        if seen is not None and seen[1] is not None and seen[1].get("token") == me["token"]:
            lock.unlink(missing_ok=True)  # only our own: after a take-over it is someone else's


def load_extension(build_dir: Path, **load_kwargs: Any) -> ModuleType:
    """``torch.utils.cpp_extension.load(build_directory=build_dir, **load_kwargs)`` under build_lock(),
    for a ``build_dir`` from safe_dir(). Raises what load() raises, and BuildLockTimeout."""
    from torch.utils.cpp_extension import load

    with build_lock(build_dir):
        torch_lock = build_dir / "lock"
        if os.path.lexists(torch_lock):
            # Every xbackend build here holds our lock first, so a killed build left this one, and
            # torch's FileBaton would poll for it forever.
            torch_lock.unlink(missing_ok=True)
            log.warning("xbackend: removed the stale torch build lock %s (left by a killed build)", torch_lock)
        module = load(build_directory=str(build_dir), **load_kwargs)
    _drop_group_write(getattr(module, "__file__", None))
    return module


def _drop_group_write(binary: str | None) -> None:
    """Under a umask of 002 the linker makes the binary group-writable, and the next process would
    refuse it: ours, so clear those bits."""
    if binary is None or not hasattr(os, "getuid"):
        return
    with contextlib.suppress(OSError):
        st = os.stat(binary)
        if st.st_uid == os.getuid() and st.st_mode & 0o022:
            os.chmod(binary, stat.S_IMODE(st.st_mode) & ~0o022)
