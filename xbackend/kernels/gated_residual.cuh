// Interface between the torch binding (gated_residual_binding.cpp, host compiler) and the kernels
// (gated_residual.cu, nvcc). Kept free of torch headers so the .cu compiles in seconds.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace xbackend_gr {

enum class DType : int { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

// x and update are contiguous rows x d; x row r reads gate row r / inner, which starts
// gate_row_stride elements after the previous one and holds d elements (or one, per_token).
struct Args {
  void* out;
  const void* x;
  const void* update;
  const void* gate;
  int64_t rows;
  int64_t d;
  int64_t inner;
  int64_t gate_row_stride;
  bool per_token;
  DType dtype;
  int device;           // only used to look up the multiprocessor count
  int rows_per_thread;   // 0: chosen from the shape; else 1, 2, 4 or 8
  int packs_per_thread;  // flat path: 0 (= 1) or 1, 2, 4
  int block_cols;        // row tile: threads per block, 0 (= 128) or 32..256 by 32 (rows stack)
  // x / update loads: 0 chosen by size, 1 plain, 2 L1::evict_first. evict_first exists for one row
  // (row tile) or one pack (flat) per thread only; other launches and the scalar path load plainly.
  int load_hint;
};

// Enqueues the kernel on `stream` and returns the launch status (cudaGetLastError).
cudaError_t launch(const Args& args, cudaStream_t stream);

}  // namespace xbackend_gr
