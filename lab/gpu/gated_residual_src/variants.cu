// See variants.cuh. Same rounding as xbackend/kernels/gated_residual.cu (__fmul_rn, round, __fadd_rn,
// round); only the indexing and the load instructions differ between variants.
#include "variants.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace xbackend_grv {
namespace {

template <typename T>
__device__ __forceinline__ T combine1(T x, T u, T g);

template <>
__device__ __forceinline__ float combine1(float x, float u, float g) {
  return __fadd_rn(x, __fmul_rn(u, g));
}

template <>
__device__ __forceinline__ __nv_bfloat16 combine1(__nv_bfloat16 x, __nv_bfloat16 u, __nv_bfloat16 g) {
  const __nv_bfloat16 p = __float2bfloat16_rn(__fmul_rn(__bfloat162float(u), __bfloat162float(g)));
  return __float2bfloat16_rn(__fadd_rn(__bfloat162float(x), __bfloat162float(p)));
}

template <>
__device__ __forceinline__ __half combine1(__half x, __half u, __half g) {
  const __half p = __float2half_rn(__fmul_rn(__half2float(u), __half2float(g)));
  return __float2half_rn(__fadd_rn(__half2float(x), __half2float(p)));
}

template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// kLoads: 0 .nc (what __ldg emits), 1 plain, 2 L1::evict_first. Gate (kGate): .nc for 0, else evict_last.
template <int kLoads, bool kGate>
__device__ __forceinline__ uint4 ld16(const void* p) {
  uint4 r;
  if constexpr (kLoads == 0) {
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (kGate) {
    asm volatile("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else if constexpr (kLoads == 1) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  } else {
    asm volatile("ld.global.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  }
  return r;
}

template <typename T, int kLoads>
__device__ __forceinline__ void one_pack(T* out, const T* x, const T* u, const T* g) {
  const uint4 xr = ld16<kLoads, false>(x);
  const uint4 ur = ld16<kLoads, false>(u);
  const uint4 gr = ld16<kLoads, true>(g);
  Pack<T> xs, us, gs, o;
  *reinterpret_cast<uint4*>(&xs) = xr;
  *reinterpret_cast<uint4*>(&us) = ur;
  *reinterpret_cast<uint4*>(&gs) = gr;
#pragma unroll
  for (int i = 0; i < Pack<T>::kSize; ++i) o.v[i] = combine1<T>(xs.v[i], us.v[i], gs.v[i]);
  *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(&o);
}

// One pack per thread over the flat pack index (torch.compile's shape: XBLOCK elements per block);
// 32-bit index math (the host checks the range), gate column by a 32-bit remainder.
template <typename T, int kLoads, bool kFull>
__global__ void flat(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ u,
                     const T* __restrict__ g, uint32_t n_packs, uint32_t packs_per_row) {
  constexpr int N = Pack<T>::kSize;
  const uint32_t p = blockIdx.x * blockDim.x + threadIdx.x;
  if (p >= n_packs) return;
  const uint32_t gp = kFull ? p : p % packs_per_row;
  one_pack<T, kLoads>(out + static_cast<int64_t>(p) * N, x + static_cast<int64_t>(p) * N,
                      u + static_cast<int64_t>(p) * N, g + static_cast<int64_t>(gp) * N);
}

// Row = blockIdx.y, no division at all; one gate row.
template <typename T, int kLoads>
__global__ void grid2d(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ u,
                       const T* __restrict__ g, uint32_t packs_per_row) {
  constexpr int N = Pack<T>::kSize;
  const uint32_t c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= packs_per_row) return;
  const int64_t off = (static_cast<int64_t>(blockIdx.y) * packs_per_row + c) * N;
  one_pack<T, kLoads>(out + off, x + off, u + off, g + static_cast<int64_t>(c) * N);
}

template <typename T, int kLoads>
cudaError_t launch_loads(const Args& a, cudaStream_t s) {
  constexpr int N = Pack<T>::kSize;
  auto* out = static_cast<T*>(a.out);
  auto* x = static_cast<const T*>(a.x);
  auto* u = static_cast<const T*>(a.update);
  auto* g = static_cast<const T*>(a.gate);
  if (a.n % N || a.d % N || a.n / N > UINT32_MAX) return cudaErrorInvalidValue;
  const auto n_packs = static_cast<uint32_t>(a.n / N);
  const auto ppr = static_cast<uint32_t>(a.d / N);
  if (a.schedule == 0) {
    const unsigned blocks = (n_packs + a.threads - 1) / a.threads;
    if (a.full_gate) {
      flat<T, kLoads, true><<<blocks, a.threads, 0, s>>>(out, x, u, g, n_packs, ppr);
    } else {
      flat<T, kLoads, false><<<blocks, a.threads, 0, s>>>(out, x, u, g, n_packs, ppr);
    }
  } else {
    if (a.full_gate || a.n / a.d > 65535) return cudaErrorInvalidValue;
    const dim3 grid((ppr + a.threads - 1) / a.threads, static_cast<unsigned>(a.n / a.d));
    grid2d<T, kLoads><<<grid, a.threads, 0, s>>>(out, x, u, g, ppr);
  }
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_typed(const Args& a, cudaStream_t s) {
  switch (a.loads) {
    case 0: return launch_loads<T, 0>(a, s);
    case 1: return launch_loads<T, 1>(a, s);
    default: return launch_loads<T, 2>(a, s);
  }
}

}  // namespace

cudaError_t launch(const Args& a, cudaStream_t s) {
  switch (a.dtype) {
    case 0: return launch_typed<float>(a, s);
    case 1: return launch_typed<__half>(a, s);
    default: return launch_typed<__nv_bfloat16>(a, s);
  }
}

}  // namespace xbackend_grv
