"""The key of a cached extension build: a digest of everything the binary depends on, so a build
directory only ever holds the build of one content (``_cache`` says where and how it is built).

ninja decides whether to rebuild by comparing mtimes, and a file restored with an older mtime (an
image rollback, ``docker COPY``, ``rsync -a``, a conda package) would leave the build of other content
in place. The digest covers the content of every source and of every header they include from the
package, the compile flags and the toolchain's versions; torch's own and the toolkit's headers are
covered by those versions.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from ._cache import cache_root

__all__ = ["extension_dir", "extension_inputs", "sources_digest"]

# An #include line; the name between quotes or angle brackets. One inside a comment or a disabled #if
# block counts too: hashing a header that is not compiled costs a rebuild, never a stale binary.
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"\n]+)[>"]', re.MULTILINE)


def extension_inputs(sources: Iterable[Path], include_dirs: Iterable[Path] = ()) -> list[Path]:
    """``sources`` and every header they include, directly or through another header, that is found
    beside the including file or in ``include_dirs`` (the package's own headers). A header found in
    neither is the toolchain's or torch's, whose versions the key holds instead. Raises
    FileNotFoundError naming a source that does not exist."""
    dirs = [Path(d) for d in include_dirs]
    found: dict[Path, None] = {}
    todo = [Path(s) for s in sources]
    for source in todo:
        if not source.is_file():
            raise FileNotFoundError(f"source {source} not found")
    while todo:
        path = todo.pop(0).resolve()
        if path in found:
            continue
        found[path] = None
        for name in _INCLUDE.findall(path.read_bytes()):
            rel = Path(name.decode(errors="replace"))
            header = next((d / rel for d in (path.parent, *dirs) if (d / rel).is_file()), None)
            if header is not None:
                todo.append(header)
    return list(found)


def sources_digest(sources: Iterable[Path], include_dirs: Iterable[Path] = (), flags: Iterable[str] = (),
                   toolchain: Iterable[str] = ()) -> str:
    """A sha256 (hex) of what a build of ``sources`` depends on: the name and content of each file of
    extension_inputs(), the compile flags and the toolchain's identity strings (versions)."""
    sources = [Path(s) for s in sources]
    # Names relative to the first source's directory: the key is the same wherever the package is installed.
    root = sources[0].resolve().parent if sources else Path("/")
    h = hashlib.sha256()
    for path in sorted(extension_inputs(sources, include_dirs), key=lambda p: str(_relative(p, root))):
        data = path.read_bytes()
        h.update(b"file\0%s\0%d\0" % (str(_relative(path, root)).encode(), len(data)) + data)
    for kind, items in (("flag", flags), ("tool", toolchain)):
        for item in items:
            h.update(f"{kind}\0{item}\0".encode())
    return h.hexdigest()


def _relative(path: Path, root: Path) -> Path:
    try:
        return path.relative_to(root)
    except ValueError:
        return Path(path.name)


def extension_dir(name: str, tag: str, sources: Sequence[Path], *, include_dirs: Sequence[Path] = (),
                  flags: Sequence[str] = (), toolchain: Sequence[str] = ()) -> Path:
    """``cache_root()/torch_extensions/<tag>/<name>_<digest>``: the nominal build directory (pass it to
    safe_dir() or find_safe_dir()) of an extension, keyed by sources_digest() of its sources, headers,
    flags and toolchain, and of ``tag`` (the short version string that groups the cache by torch)."""
    digest = sources_digest(sources, include_dirs, flags, (tag, *toolchain))
    safe_tag = re.sub(r"[^A-Za-z0-9_-]", "_", tag)
    return cache_root() / "torch_extensions" / safe_tag / f"{name}_{digest[:16]}"
