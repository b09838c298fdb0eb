"""Environment switches that choose a kernel's launch path (``XBACKEND_NA_SM90``), read once per Runtime.

A runtime key is verified once, on the launch path the call took then; every later call with that key
runs unchecked (``VerifyMode`` ``first``). A kernel that picked its path from the environment at each
call could therefore run a path no verification ran, after ``os.environ`` changed mid-process. So a
kernel reads a switch through ``switch``: the process runtime reads it the first time any kernel asks
and answers that value for the rest of its life, whatever the environment says meanwhile.

A change takes effect in a new Runtime (a new process, ``xbackend.testing.fresh_runtime()``,
``xbackend._runtime.set_runtime(Runtime())``), whose caches start empty, so every key is verified again
on the path the new value picks. ``Runtime.switches`` holds the values read so far.

A kernel called outside any runtime (directly, as the fleet's capture workers and kernel tests call
them: no key is cached, nothing was verified) reads the environment at each call, so the fleet's
per-task environment (``compile_target(env=...)``) still picks the path it captures.
"""

from __future__ import annotations

from . import _runtime
from ._plugins import env_flag

__all__ = ["switch"]


def switch(name: str, default: bool) -> bool:
    """The boolean switch ``name`` (1/true/yes/on or 0/false/no/off; unset, empty or not a boolean:
    ``default``, the last with a warning once) as the process runtime read it first."""
    rt = _runtime.current()
    if rt is None:
        return env_flag(name, default=default)
    value = rt.switches.get(name)
    if value is None:
        # setdefault is atomic: two threads reading the first time answer the one value kept.
        value = rt.switches.setdefault(name, env_flag(name, default=default))
    return value
