// Interface between the torch binding (rmsnorm_binding.cpp, host compiler) and the kernels
// (rmsnorm.cu, nvcc). Kept free of torch headers so the .cu compiles in seconds.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace xbackend_rms {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };
enum class Flavour : int { kTorch = 0, kDiffusers = 1 };

// x and out are contiguous rows x d; weight is [d] or null.
struct Args {
  void* out;
  const void* x;
  const void* weight;
  int64_t rows;
  int64_t d;
  float eps;
  float factor;  // diffusers: MeanOps' fp32 factor (num_outputs / numel); unused for torch
  Flavour flavour;
  DType dtype;
  int warps_per_block;  // one warp per row; 0 picks
  int smem_bytes;       // dynamic shared memory per block (unused by the kernel): caps blocks per SM
  int64_t max_blocks;   // > 0: at most this many blocks, each warp striding over rows
  int stages;           // > 0: the staged kernel, this many row buffers per warp in shared memory
  int load_hint;        // torch register kernel: 0 __ldg, 1 .cg, 2 .cs, 3 L1::no_allocate
};

// Largest D each flavour keeps in registers (longer rows: the Triton kernel).
constexpr int64_t kMaxD = 6144;
// Rows (warps) per block at most: 256 threads let a kernel use up to 255 registers.
constexpr int kMaxWarps = 8;

// Enqueues the kernel on `stream` and returns the launch status (cudaGetLastError), or
// cudaErrorInvalidValue for a shape the kernels do not take.
cudaError_t launch(const Args& args, cudaStream_t stream);

}  // namespace xbackend_rms
