"""Which C++ constructs crash a JIT-built torch extension on this machine?

    python3 lab/gpu/cpp_throw_check.py [BUILD_DIR]

Builds a CPU-only extension with ``torch.utils.cpp_extension.load_inline`` (this machine's host
compiler, like xbackend's CUDA extensions) and runs each case in its own subprocess, so a crash in one
does not hide the others; prints each case's exit status. On the H200 image (torch 2.11 + cu130, g++
13.3, pybind11 3.1; 2026-11-30, lab/results/h200/cpp_throw_check.txt) every case that formats through a
``std::ostringstream`` died with SIGSEGV (exit -11): ``str_stream``, and TORCH_CHECK with arguments
(``caught``, ``escaping``: c10::str formats the message through one), while a literal-only TORCH_CHECK
caught in place (``check_false_caught``), a std::runtime_error through pybind11 (``std``), returned
strings and tensors were fine. On the CPU build machine (torch 2.13) all cases behave. So the
gated_residual binding builds its messages by concatenation and returns them instead of throwing
(xbackend/kernels/gated_residual_binding.cpp).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile

SOURCE = r"""
#include <torch/extension.h>
#include <sstream>
#include <stdexcept>
#include <string>
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
py::object str_literal(const at::Tensor& x) { return py::str("literal"); }
py::object str_stream(const at::Tensor& x, int64_t k) {
  std::ostringstream out;
  out << "stream " << k;
  return py::str(out.str());
}
std::string std_string(const at::Tensor& x) { return std::string("std::string"); }
py::object tensor_object(const at::Tensor& x) { return py::cast(x + 1); }
int64_t check_false_caught(const at::Tensor& x, int64_t k) {
  try {
    TORCH_CHECK(k == 0, "k must be 0");
  } catch (...) {
    return -1;
  }
  return 0;
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("escaping", &escaping);
  m.def("std_error", &std_error);
  m.def("caught", &caught);
  m.def("str_literal", &str_literal);
  m.def("str_stream", &str_stream);
  m.def("std_string", &std_string);
  m.def("tensor_object", &tensor_object);
  m.def("check_false_caught", &check_false_caught);
}
"""

CASES = {
    "caught": lambda m, x: m.caught(x, 3),
    "escaping": lambda m, x: m.escaping(x, 3),
    "std": lambda m, x: m.std_error(x),
    "str_literal": lambda m, x: m.str_literal(x),
    "str_stream": lambda m, x: m.str_stream(x, 3),
    "std_string": lambda m, x: m.std_string(x),
    "tensor_object": lambda m, x: m.tensor_object(x),
    "check_false_caught": lambda m, x: m.check_false_caught(x, 3),
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
    import torch

    print(f"torch {torch.__version__}, pybind11 ABI {getattr(torch._C, '_PYBIND11_BUILD_ABI', '?')}, "
          f"cxx11 abi {torch._C._GLIBCXX_USE_CXX11_ABI}", flush=True)
    build(build_dir)
    for case in CASES:
        proc = subprocess.run([sys.executable, __file__, build_dir, case], capture_output=True, text=True)
        line = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        print(f"{case:<18} exit {proc.returncode:>4}  {line}", flush=True)


if __name__ == "__main__":
    main()
