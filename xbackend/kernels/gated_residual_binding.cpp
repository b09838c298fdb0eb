// Python binding for the gated_residual CUDA kernels: one plain pybind function taking tensors, so a
// call costs a pybind dispatch, one allocation and one launch (no dispatcher, no Python-side plan).

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "gated_residual.cuh"

namespace {

using xbackend_gr::Args;
using xbackend_gr::DType;

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "gated_residual: dtype ", t, " not supported");
  }
}

// Same rules (and messages) as xbackend/kernels/_gated_residual_layout.py::analyze, which callers
// use through supports(); repeated here so a direct call can never launch on a layout the kernels
// do not handle.
Args plan(const at::Tensor& x, const at::Tensor& update, const at::Tensor& gate) {
  Args a{};
  a.dtype = to_dtype(x.scalar_type());
  TORCH_CHECK(update.scalar_type() == x.scalar_type() && gate.scalar_type() == x.scalar_type(),
              "gated_residual: x, update and gate must share one dtype");
  TORCH_CHECK(x.is_cuda(), "gated_residual: needs a CUDA tensor");
  TORCH_CHECK(update.device() == x.device() && gate.device() == x.device(),
              "gated_residual: tensors on different devices");
  const int64_t nd = x.dim();
  TORCH_CHECK(nd >= 1, "gated_residual: x must have at least one dim");
  TORCH_CHECK(update.sizes() == x.sizes(), "gated_residual: update shape differs from x");
  TORCH_CHECK(gate.dim() <= nd, "gated_residual: gate has more dims than x");
  TORCH_CHECK(x.is_contiguous(), "gated_residual: x must be contiguous");
  TORCH_CHECK(update.is_contiguous(), "gated_residual: update must be contiguous");

  const int64_t pad = nd - gate.dim();
  auto gsize = [&](int64_t i) { return i < pad ? int64_t{1} : gate.size(i - pad); };
  auto gstride = [&](int64_t i) { return i < pad ? int64_t{0} : gate.stride(i - pad); };
  const int64_t d = x.size(nd - 1);
  if (gsize(nd - 1) == d) {
    a.per_token = false;
    TORCH_CHECK(d <= 1 || gstride(nd - 1) == 1, "gated_residual: gate last dim must be contiguous");
  } else {
    TORCH_CHECK(gsize(nd - 1) == 1, "gated_residual: gate last dim must be D or 1");
    a.per_token = true;
  }

  // Gate row = x row / inner, where inner is the product of the trailing row dims the gate
  // broadcasts over; every row dim before the last one the gate varies along must match x.
  int64_t last = -1;
  for (int64_t i = 0; i < nd - 1; ++i) {
    TORCH_CHECK(gsize(i) == 1 || gsize(i) == x.size(i), "gated_residual: gate does not broadcast to x");
    if (gsize(i) != 1) last = i;
  }
  for (int64_t i = 0; i < last; ++i) {
    TORCH_CHECK(gsize(i) == x.size(i),
                "gated_residual: gate broadcasts over an outer dim but not an inner one");
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
    } else {
      TORCH_CHECK(gstride(i) == expected, "gated_residual: gate rows are not evenly strided");
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
  return a;
}

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& update, const at::Tensor& gate,
                          int64_t rows_per_thread, int64_t packs_per_thread, int64_t block_cols) {
  TORCH_CHECK(rows_per_thread == 0 || rows_per_thread == 1 || rows_per_thread == 2 ||
                  rows_per_thread == 4 || rows_per_thread == 8,
              "gated_residual: rows_per_thread must be 0 (auto), 1, 2, 4 or 8, got ", rows_per_thread);
  TORCH_CHECK(packs_per_thread == 0 || packs_per_thread == 1 || packs_per_thread == 2 ||
                  packs_per_thread == 4,
              "gated_residual: packs_per_thread must be 0 (auto), 1, 2 or 4, got ", packs_per_thread);
  TORCH_CHECK(block_cols == 0 || (block_cols >= 32 && block_cols <= 256 && block_cols % 32 == 0),
              "gated_residual: block_cols must be 0 (auto) or a multiple of 32 in 32..256, got ",
              block_cols);
  Args a = plan(x, update, gate);
  at::Tensor out = at::empty(x.sizes(), x.options());
  if (out.numel() == 0) return out;
  a.out = out.data_ptr();
  a.rows_per_thread = static_cast<int>(rows_per_thread);
  a.packs_per_thread = static_cast<int>(packs_per_thread);
  a.block_cols = static_cast<int>(block_cols);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = xbackend_gr::launch(a, c10::cuda::getCurrentCUDAStream(a.device).stream());
  TORCH_CHECK(err == cudaSuccess, "gated_residual: kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("gated_residual", &gated_residual,
        "x + update * gate as a new tensor, rounded like eager PyTorch", py::arg("x"),
        py::arg("update"), py::arg("gate"), py::arg("rows_per_thread") = 0,
        py::arg("packs_per_thread") = 0, py::arg("block_cols") = 0);
}
