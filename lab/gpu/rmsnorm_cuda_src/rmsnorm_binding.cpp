// Python binding for the RMSNorm CUDA kernels: one plain pybind function, so a call costs a pybind
// dispatch, one allocation and one launch.

#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <optional>

#include "rmsnorm.cuh"

namespace {

using xbackend_rms::Args;
using xbackend_rms::DType;
using xbackend_rms::Flavour;

DType to_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return DType::kFloat32;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: TORCH_CHECK(false, "rmsnorm (cuda): x dtype ", t, " not supported; expected bf16, fp16 or fp32");
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

// The rules of gpu/rmsnorm_cuda.py::cuda_supports, checked here so a direct call can never launch on a
// layout the kernels do not handle.
at::Tensor rmsnorm(const at::Tensor& x, const std::optional<at::Tensor>& weight, double eps,
                   const std::string& flavour, double factor, int64_t warps_per_block,
                   int64_t smem_bytes, int64_t max_blocks, int64_t stages,
                   int64_t load_hint) {
  Args a{};
  a.dtype = to_dtype(x.scalar_type());
  TORCH_CHECK(flavour == "torch" || flavour == "diffusers",
              "rmsnorm (cuda): flavour must be 'torch' or 'diffusers', got '", flavour, "'");
  a.flavour = flavour == "torch" ? Flavour::kTorch : Flavour::kDiffusers;
  TORCH_CHECK(x.is_cuda(), "rmsnorm (cuda): x must be a CUDA tensor");
  TORCH_CHECK(x.dim() >= 1, "rmsnorm (cuda): x must have at least one dim");
  TORCH_CHECK(x.is_contiguous(), "rmsnorm (cuda): x must be contiguous");
  TORCH_CHECK(aligned16(x.data_ptr()), "rmsnorm (cuda): x must be 16-byte aligned");
  const int64_t d = x.size(-1);
  const int64_t per_load = 16 / static_cast<int64_t>(x.element_size());
  TORCH_CHECK(d > 0 && d <= xbackend_rms::kMaxD && d % per_load == 0, "rmsnorm (cuda): D must be a multiple of ",
              per_load, " in [", per_load, ", ", xbackend_rms::kMaxD, "], got ", d);
  TORCH_CHECK(warps_per_block >= 0 && warps_per_block <= xbackend_rms::kMaxWarps,
              "rmsnorm (cuda): warps_per_block must be 0 (auto) .. ", xbackend_rms::kMaxWarps, ", got ",
              warps_per_block);
  const int64_t rows = d > 0 ? x.numel() / d : 0;
  if (a.flavour == Flavour::kDiffusers) {
    TORCH_CHECK(d >= 128 && rows >= 16,
                "rmsnorm (cuda): the diffusers flavour needs D >= 128 and >= 16 rows (aten's mean "
                "reduce takes another block shape below), got D=", d, ", rows=", rows);
  }
  if (weight.has_value()) {
    const at::Tensor& w = *weight;
    TORCH_CHECK(w.scalar_type() == x.scalar_type(), "rmsnorm (cuda): weight dtype ", w.scalar_type(),
                " differs from x dtype ", x.scalar_type());
    TORCH_CHECK(w.dim() == 1 && w.size(0) == d, "rmsnorm (cuda): weight must be [", d, "], got ", w.sizes());
    TORCH_CHECK(w.device() == x.device(), "rmsnorm (cuda): weight on another device");
    TORCH_CHECK(w.is_contiguous() && aligned16(w.data_ptr()),
                "rmsnorm (cuda): weight must be contiguous and 16-byte aligned");
    a.weight = w.data_ptr();
  }
  at::Tensor out = at::empty(x.sizes(), x.options());
  a.out = out.data_ptr();
  a.x = x.data_ptr();
  a.rows = rows;
  a.d = d;
  a.eps = static_cast<float>(eps);
  a.factor = static_cast<float>(factor);
  a.warps_per_block = static_cast<int>(warps_per_block);
  TORCH_CHECK(smem_bytes >= 0 && smem_bytes <= 200 * 1024, "rmsnorm (cuda): smem_bytes out of range");
  a.smem_bytes = static_cast<int>(smem_bytes);
  a.max_blocks = max_blocks;
  TORCH_CHECK(stages >= 0 && stages <= 64, "rmsnorm (cuda): stages must be 0 .. 64, got ", stages);
  a.stages = static_cast<int>(stages);
  TORCH_CHECK(load_hint >= 0 && load_hint <= 3, "rmsnorm (cuda): load_hint must be 0 .. 3, got ", load_hint);
  a.load_hint = static_cast<int>(load_hint);
  if (rows == 0) return out;
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err =
      xbackend_rms::launch(a, c10::cuda::getCurrentCUDAStream(x.get_device()).stream());
  TORCH_CHECK(err == cudaSuccess, "rmsnorm (cuda): kernel launch failed: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("rmsnorm", &rmsnorm, "RMSNorm rounded like eager PyTorch (torch or diffusers flavour)",
        py::arg("x"), py::arg("weight"), py::arg("eps"), py::arg("flavour"), py::arg("factor") = 0.0,
        py::arg("warps_per_block") = 0, py::arg("smem_bytes") = 0, py::arg("max_blocks") = 0, py::arg("stages") = 0, py::arg("load_hint") = 0);
}
