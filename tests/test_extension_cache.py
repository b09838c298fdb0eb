"""A cached extension is the build of the sources as they are now: a header rolled back to other
content with an older mtime (an image rollback, ``rsync -a``, ``docker COPY``) is built again, not
taken from the build of the other content. A real build (torch's cpp_extension and the host C++
compiler, a few seconds for a file that includes only Python.h), each in its own process as a
deployment would run it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None or shutil.which("ninja") is None,
                       reason="needs a C++ compiler and ninja"),
]

SOURCE = r"""
#include <Python.h>
#include "value.h"
#define XB_STR2(x) #x
#define XB_STR(x) XB_STR2(x)
#define XB_CAT2(a, b) a##b
#define XB_CAT(a, b) XB_CAT2(a, b)
static PyModuleDef module_def = {PyModuleDef_HEAD_INIT, XB_STR(TORCH_EXTENSION_NAME), nullptr, -1, nullptr};
PyMODINIT_FUNC XB_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* m = PyModule_Create(&module_def);
  if (m != nullptr) PyModule_AddIntConstant(m, "VALUE", XB_VALUE);
  return m;
}
"""

# Builds (or loads from the cache) the extension as the CUDA kernels' JitExtension does, prints VALUE.
BUILD = r"""
import sys
from pathlib import Path
from xbackend.kernels._cuda_build import JitExtension
ext = JitExtension("xb_cache_e2e", ("ext.cpp",), "test e2e", source_dir=Path(sys.argv[1]), gencode=("-DXB_UNUSED",))
print(ext._build().VALUE)
"""


def _value(src: Path, cache: Path) -> int:
    env = {**os.environ, "XBACKEND_CACHE_DIR": str(cache)}
    out = subprocess.run([sys.executable, "-c", BUILD, str(src)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return int(out.stdout.split()[-1])


def test_a_header_rolled_back_with_an_older_mtime_is_built_again(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "cache"
    src.mkdir()
    (src / "ext.cpp").write_text(SOURCE)
    header = src / "value.h"
    header.write_text("#define XB_VALUE 1\n")
    assert _value(src, cache) == 1
    built = header.stat().st_mtime
    header.write_text("#define XB_VALUE 2\n")
    os.utime(header, (built - 3600, built - 3600))  # older than the build of XB_VALUE 1
    assert _value(src, cache) == 2
    header.write_text("#define XB_VALUE 1\n")
    os.utime(header, (built - 7200, built - 7200))
    assert _value(src, cache) == 1
