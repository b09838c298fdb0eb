// Experiment (gpu/gated_residual_variants.py): gated residual schedules shaped like torch.compile's
// pointwise kernel, to find what makes it 3-4% faster at [1, 4096..4608, 3072] bf16 (issue 3).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace xbackend_grv {

struct Args {
  void* out;
  const void* x;
  const void* update;
  const void* gate;
  int64_t n;        // elements of x
  int64_t d;        // row length
  bool full_gate;   // gate laid out like x; else one gate row of d elements
  int dtype;        // 0 fp32, 1 fp16, 2 bf16
  int schedule;     // 0 flat (1-D pack index), 1 grid2d (blockIdx.y = row)
  int loads;        // 0 ld.global.nc, 1 ld.global, 2 ld.global.L1::evict_first (gate: evict_last)
  int threads;      // threads per block
};

cudaError_t launch(const Args& args, cudaStream_t stream);

}  // namespace xbackend_grv
