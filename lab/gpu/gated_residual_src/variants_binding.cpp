// pybind entry of the gated residual schedule experiment (variants.cu).
#include <torch/extension.h>

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "variants.cuh"

namespace {

at::Tensor run(const at::Tensor& x, const at::Tensor& update, const at::Tensor& gate, int64_t schedule,
               int64_t loads, int64_t threads) {
  TORCH_CHECK(x.is_cuda() && x.is_contiguous() && update.is_contiguous() && gate.is_contiguous());
  TORCH_CHECK(update.sizes() == x.sizes() && update.scalar_type() == x.scalar_type() &&
              gate.scalar_type() == x.scalar_type());
  const bool full = gate.sizes() == x.sizes();
  TORCH_CHECK(full || gate.numel() == x.size(-1), "variants: full gate or one gate row only");
  xbackend_grv::Args a{};
  at::Tensor out = at::empty_like(x);
  a.out = out.data_ptr();
  a.x = x.data_ptr();
  a.update = update.data_ptr();
  a.gate = gate.data_ptr();
  a.n = x.numel();
  a.d = x.size(-1);
  a.full_gate = full;
  a.dtype = x.scalar_type() == at::kFloat ? 0 : x.scalar_type() == at::kHalf ? 1 : 2;
  a.schedule = static_cast<int>(schedule);
  a.loads = static_cast<int>(loads);
  a.threads = static_cast<int>(threads);
  const c10::cuda::CUDAGuard guard(x.device());
  const cudaError_t err = xbackend_grv::launch(a, c10::cuda::getCurrentCUDAStream().stream());
  TORCH_CHECK(err == cudaSuccess, "variants: ", cudaGetErrorString(err));
  return out;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("run", &run); }
