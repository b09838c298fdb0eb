"""Do C++ exceptions survive in a JIT-built torch extension on this machine?

    python3 gpu/cpp_throw_check.py [BUILD_DIR]

Builds a CPU-only extension with ``torch.utils.cpp_extension.load_inline`` (this machine's host
compiler, like xbackend's CUDA extensions) and runs each case in its own subprocess, so a crash in one
does not hide the others: ``caught`` (TORCH_CHECK thrown and caught inside the function, a str
returned), ``escaping`` (TORCH_CHECK thrown through pybind11: should be RuntimeError), ``std`` (a
std::runtime_error through pybind11). Prints each case's exit status. On the H200 image (torch 2.11 +
cu130, 2026-11-30; results/h200/cpp_throw_check.txt) ``caught`` and ``escaping`` died with SIGSEGV
(exit -11) and ``std`` raised RuntimeError; on the CPU build machine (torch 2.13) all three behave. So
the gated_residual binding reports errors as a returned message and never throws
(xbackend/kernels/gated_residual_binding.cpp).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

SOURCE = r"""
#include <torch/extension.h>
#include <stdexcept>
at::Tensor escaping(const at::Tensor& x, int64_t k) {
  TORCH_CHECK(k == 0, "escaping: k must be 0, got ", k);
  return x + 1;
}
at::Tensor std_error(const at::Tensor& x) { throw std::runtime_error("std: thrown"); }
py::object caught(const at::Tensor& x, int64_t k) {
  try {
    TORCH_CHECK(k == 0, "caught: k must be 0, got ", k);
    return py::cast(x + 1);
  } catch (const std::exception& e) {
    return py::str(e.what());
  }
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("escaping", &escaping);
  m.def("std_error", &std_error);
  m.def("caught", &caught);
}
"""

CASES = {
    "caught": lambda m, x: m.caught(x, 3),
    "escaping": lambda m, x: m.escaping(x, 3),
    "std": lambda m, x: m.std_error(x),
}


def build(build_dir: str):
    from torch.utils.cpp_extension import load_inline

    return load_inline("xbackend_throw_check", cpp_sources=[SOURCE], build_directory=build_dir, verbose=False)


def main() -> None:
    if len(sys.argv) > 2:  # child: build dir, case
        import torch

        module = build(sys.argv[1])
        try:
            got = CASES[sys.argv[2]](module, torch.zeros(2))
            print(f"{sys.argv[2]}: returned {str(got)[:60]!r}", flush=True)
        except RuntimeError as exc:
            print(f"{sys.argv[2]}: RuntimeError {str(exc).splitlines()[0][:60]!r}", flush=True)
        return
    build_dir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp()
    build(build_dir)
    for case in CASES:
        proc = subprocess.run([sys.executable, __file__, build_dir, case], capture_output=True, text=True)
        line = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"{case:<9} exit {proc.returncode:>4}  {line}", flush=True)


if __name__ == "__main__":
    main()
