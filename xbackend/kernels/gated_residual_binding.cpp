// Python binding for the gated_residual CUDA kernels: one METH_FASTCALL function written against
// the CPython API (no pybind11, no dispatcher), so a call costs argument unpacking, one caching-
// allocator allocation and one launch. The host budget of a whole get_op call at small shapes is 1.2x
// of one eager launch, and pybind11's overload dispatch plus at::empty's dispatcher round trip were
// most of what this binding could still save.
//
// Errors are raised as RuntimeError / TypeError with messages built by string concatenation: on the
// H200 image (torch 2.11 + cu130, extensions JIT-built by its g++ 13.3) any std::ostringstream in the
// extension ended the process with SIGSEGV, and with it every TORCH_CHECK whose message has
// arguments (c10::str formats through one); plain strings were fine (lab/gpu/cpp_throw_check.py,
// lab/results/h200/cpp_throw_check.txt). No C++ exception leaves this file: torch's own (thrown and
// formatted inside libtorch) are caught at the entry point and raised as Python exceptions.

#include <torch/csrc/autograd/python_variable.h>

#include <ATen/cuda/EmptyTensor.h>
#include <c10/core/ScalarType.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <string>

#include "gated_residual.cuh"

namespace {

using xbackend_gr::Args;
using xbackend_gr::DType;

PyObject* g_out_of_memory = nullptr;  // torch.OutOfMemoryError, looked up at import

std::string text(const char* s) { return s; }
std::string text(int64_t v) { return std::to_string(v); }

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::string out = "gated_residual: ";
  ((out += text(parts)), ...);
  return out;
}

// Same rules (and messages) as xbackend/kernels/_gated_residual_layout.py::analyze, which callers
// use through supports(); repeated here so a direct call can never launch on a layout the kernels
// do not handle. Returns the reason, or "" with `a` filled in.
std::string plan(const at::Tensor& x, const at::Tensor& update, const at::Tensor& gate, Args& a) {
  switch (x.scalar_type()) {
    case at::kFloat: a.dtype = DType::kFloat32; break;
    case at::kHalf: a.dtype = DType::kFloat16; break;
    case at::kBFloat16: a.dtype = DType::kBFloat16; break;
    default: return message("dtype ", c10::toString(x.scalar_type()), " not supported");
  }
  if (update.scalar_type() != x.scalar_type() || gate.scalar_type() != x.scalar_type()) {
    return message("x, update and gate must share one dtype");
  }
  if (!x.is_cuda()) return message("needs a CUDA tensor");
  if (update.device() != x.device() || gate.device() != x.device()) {
    return message("tensors on different devices");
  }
  const int64_t nd = x.dim();
  if (nd < 1) return message("x must have at least one dim");
  if (update.sizes() != x.sizes()) return message("update shape differs from x");
  if (gate.dim() > nd) return message("gate has more dims than x");
  if (!x.is_contiguous()) return message("x must be contiguous");
  if (!update.is_contiguous()) return message("update must be contiguous");

  const int64_t pad = nd - gate.dim();
  auto gsize = [&](int64_t i) { return i < pad ? int64_t{1} : gate.size(i - pad); };
  auto gstride = [&](int64_t i) { return i < pad ? int64_t{0} : gate.stride(i - pad); };
  const int64_t d = x.size(nd - 1);
  if (gsize(nd - 1) == d) {
    a.per_token = false;
    if (d > 1 && gstride(nd - 1) != 1) return message("gate last dim must be contiguous");
  } else {
    if (gsize(nd - 1) != 1) return message("gate last dim must be D or 1");
    a.per_token = true;
  }

  // Gate row = x row / inner, where inner is the product of the trailing row dims the gate
  // broadcasts over; every row dim before the last one the gate varies along must match x.
  int64_t last = -1;
  for (int64_t i = 0; i < nd - 1; ++i) {
    if (gsize(i) != 1 && gsize(i) != x.size(i)) return message("gate does not broadcast to x");
    if (gsize(i) != 1) last = i;
  }
  for (int64_t i = 0; i < last; ++i) {
    if (gsize(i) != x.size(i)) {
      return message("gate broadcasts over an outer dim but not an inner one");
    }
  }
  int64_t rows = 1;
  int64_t inner = 1;
  for (int64_t i = 0; i < nd - 1; ++i) {
    rows *= x.size(i);
    if (i > last) inner *= x.size(i);
  }
  int64_t stride = 0;
  int64_t expected = 0;
  bool have_expected = false;
  for (int64_t i = last; i >= 0; --i) {
    if (gsize(i) == 1) continue;
    if (!have_expected) {
      stride = gstride(i);
    } else if (gstride(i) != expected) {
      return message("gate rows are not evenly strided");
    }
    expected = gstride(i) * gsize(i);
    have_expected = true;
  }

  a.rows = rows;
  a.d = d;
  a.inner = inner > 0 ? inner : 1;
  a.gate_row_stride = stride;
  a.x = x.data_ptr();
  a.update = update.data_ptr();
  a.gate = gate.data_ptr();
  a.device = x.get_device();
  return {};
}

std::string check_knobs(int64_t rows_per_thread, int64_t packs_per_thread, int64_t block_cols,
                        int64_t load_hint) {
  const auto one_of = [](int64_t v, std::initializer_list<int64_t> allowed) {
    for (const int64_t a : allowed) {
      if (v == a) return true;
    }
    return false;
  };
  if (!one_of(rows_per_thread, {0, 1, 2, 4, 8})) {
    return message("rows_per_thread must be 0 (auto), 1, 2, 4 or 8, got ", rows_per_thread);
  }
  if (!one_of(packs_per_thread, {0, 1, 2, 4})) {
    return message("packs_per_thread must be 0 (auto), 1, 2 or 4, got ", packs_per_thread);
  }
  if (block_cols != 0 && (block_cols < 32 || block_cols > 256 || block_cols % 32 != 0)) {
    return message("block_cols must be 0 (auto) or a multiple of 32 in 32..256, got ", block_cols);
  }
  if (!one_of(load_hint, {0, 1, 2})) {
    return message("load_hint must be 0 (auto), 1 (plain) or 2 (evict_first), got ", load_hint);
  }
  return {};
}

PyObject* raise(PyObject* type, const std::string& msg) {
  PyErr_SetString(type, msg.c_str());
  return nullptr;
}

constexpr int kKnobs = 4;
const char* const kArgNames[] = {"x",          "update",         "gate", "rows_per_thread",
                                 "packs_per_thread", "block_cols", "load_hint"};

PyObject* gated_residual_impl(PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 && nargs != 3 + kKnobs) {
    return raise(PyExc_TypeError,
                 message("takes 3 tensors and optionally 4 ints (rows_per_thread, "
                         "packs_per_thread, block_cols, load_hint) positionally, got ",
                         static_cast<int64_t>(nargs), " arguments"));
  }
  for (int i = 0; i < 3; ++i) {
    if (!THPVariable_Check(args[i])) {
      return raise(PyExc_TypeError, message(kArgNames[i], " must be a torch.Tensor, got ",
                                            Py_TYPE(args[i])->tp_name));
    }
  }
  int64_t knobs[kKnobs] = {0, 0, 0, 0};
  for (Py_ssize_t i = 3; i < nargs; ++i) {
    if (!PyLong_Check(args[i])) {
      return raise(PyExc_TypeError, message(kArgNames[i], " must be an int, got ",
                                            Py_TYPE(args[i])->tp_name));
    }
    knobs[i - 3] = PyLong_AsLongLong(args[i]);
    if (knobs[i - 3] == -1 && PyErr_Occurred()) return nullptr;
  }
  const at::Tensor& x = THPVariable_Unpack(args[0]);
  const at::Tensor& update = THPVariable_Unpack(args[1]);
  const at::Tensor& gate = THPVariable_Unpack(args[2]);

  Args a{};
  std::string err = check_knobs(knobs[0], knobs[1], knobs[2], knobs[3]);
  if (err.empty()) err = plan(x, update, gate, a);
  if (!err.empty()) return raise(PyExc_RuntimeError, err);
  a.rows_per_thread = static_cast<int>(knobs[0]);
  a.packs_per_thread = static_cast<int>(knobs[1]);
  a.block_cols = static_cast<int>(knobs[2]);
  a.load_hint = static_cast<int>(knobs[3]);

  const auto device = static_cast<c10::DeviceIndex>(a.device);
  // Straight to the CUDA caching allocator: at::empty would add a dispatcher round trip.
  at::Tensor out = at::detail::empty_cuda(x.sizes(), x.scalar_type(), x.device(), std::nullopt);
  if (out.numel() > 0) {
    a.out = out.data_ptr();
    // A device guard by hand, from c10's non-throwing calls (CUDAGuard throws on a CUDA error).
    // MaybeSetDevice restores without creating a context on an unused device.
    c10::DeviceIndex prev = -1;
    cudaError_t status = c10::cuda::GetDevice(&prev);
    if (status == cudaSuccess && prev != device) status = c10::cuda::SetDevice(device);
    if (status == cudaSuccess) {
      status = xbackend_gr::launch(a, c10::cuda::getCurrentCUDAStream(device).stream());
    }
    if (prev >= 0 && prev != device) {
      const cudaError_t restored = c10::cuda::MaybeSetDevice(prev);
      if (status == cudaSuccess) status = restored;
    }
    if (status != cudaSuccess) {
      cudaGetLastError();  // reported here; must not surface as the next kernel's launch error
      return raise(PyExc_RuntimeError, message("kernel launch failed: ", cudaGetErrorString(status)));
    }
  }
  return THPVariable_Wrap(std::move(out));
}

// gated_residual(x, update, gate[, rows_per_thread, packs_per_thread, block_cols, load_hint]) -> Tensor
// A C++ exception must not leave a METH_FASTCALL function (it would terminate the process): torch
// throws for tensors without sizes or strides (nested), and the allocation throws when out of memory.
PyObject* gated_residual(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  try {
    return gated_residual_impl(args, nargs);
  } catch (const c10::OutOfMemoryError& e) {
    return raise(g_out_of_memory != nullptr ? g_out_of_memory : PyExc_MemoryError,
                 e.what_without_backtrace());
  } catch (const c10::Error& e) {
    return raise(PyExc_RuntimeError, message("torch error: ", e.what_without_backtrace()));
  } catch (const std::exception& e) {
    // torch's python_error carries a Python exception that is already set: keep that one.
    if (PyErr_Occurred() != nullptr) return nullptr;
    return raise(PyExc_RuntimeError, message("C++ error: ", e.what()));
  } catch (...) {
    if (PyErr_Occurred() != nullptr) return nullptr;
    return raise(PyExc_RuntimeError, message("unknown C++ exception"));
  }
}

PyMethodDef methods[] = {
    {"gated_residual", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(gated_residual)),
     METH_FASTCALL,
     "gated_residual(x, update, gate[, rows_per_thread, packs_per_thread, block_cols, load_hint]): "
     "x + update * gate as a new tensor, rounded like eager PyTorch. Knobs 0 = chosen from the shape; "
     "load_hint 2 (L1::evict_first) applies to one row or one pack per thread only"},
    {nullptr, nullptr, 0, nullptr}};

#define XB_STR2(x) #x
#define XB_STR(x) XB_STR2(x)
#define XB_CAT2(a, b) a##b
#define XB_CAT(a, b) XB_CAT2(a, b)

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, XB_STR(TORCH_EXTENSION_NAME),
                          "xbackend gated_residual CUDA kernels (see cuda_gated_residual.py)", -1,
                          methods};

}  // namespace

PyMODINIT_FUNC XB_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  PyObject* torch = PyImport_ImportModule("torch");
  if (torch == nullptr) return nullptr;
  g_out_of_memory = PyObject_GetAttrString(torch, "OutOfMemoryError");  // kept for the process
  Py_DECREF(torch);
  if (g_out_of_memory == nullptr) PyErr_Clear();
  return PyModule_Create(&module_def);
}
