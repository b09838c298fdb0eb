// RMSNorm rounded exactly like eager PyTorch on CUDA (torch 2.11), one warp per row, the row held in
// registers between the reduction and the output. Both flavours add in the order of the aten kernel
// they reproduce (notes/rmsnorm.md derives both; xbackend/kernels/triton_rmsnorm.py is the same
// arithmetic in Triton): the reduction tree is what must match, and IEEE addition commutes, so a lane
// here may play several of aten's threads as long as every pairing is the same.
//
// An experiment for issue 3 (gpu/rmsnorm_cuda.py; not registered): the Triton kernel is one 4-warp
// program per row because aten's torch flavour reduces over 128 threads; a warp can play those 128
// threads with 16-byte loads and no barrier. Bit-exact on an H200 (1680 cases), but slower than the
// Triton kernel at [1, 32640, 4096] bf16: 132.6-135.5 us vs 130.9-132.2 (notes/rmsnorm.md).
//
// Every fp32 step is an explicit __f*_rn (and the build passes --fmad=false), except the torch
// flavour's fold, which aten's nvcc contracts to fma(v, v, sigma2).

#include "rmsnorm.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace xbackend_rms {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kMaxThreads = kMaxWarps * 32;

// Rows stay in registers as packed 32-bit words (two 16-bit elements per word): bf16 kept as
// __nv_bfloat16 values takes a register per element and spills at D = 4096.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
  static __device__ __forceinline__ float up(const uint32_t* w, int i) { return __uint_as_float(w[i]); }
  static __device__ __forceinline__ void down(uint32_t* w, int i, float v) { w[i] = __float_as_uint(v); }
  static __device__ __forceinline__ float round(float v) { return v; }
};

template <>
struct Elem<__nv_bfloat16> {
  static __device__ __forceinline__ float up(const uint32_t* w, int i) {
    return __uint_as_float(i & 1 ? w[i >> 1] & 0xffff0000u : w[i >> 1] << 16);
  }
  static __device__ __forceinline__ void down(uint32_t* w, int i, float v) {
    const uint32_t b = __bfloat16_as_ushort(__float2bfloat16_rn(v));
    w[i >> 1] = i & 1 ? (w[i >> 1] & 0xffffu) | (b << 16) : b;
  }
  static __device__ __forceinline__ float round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }
};

template <>
struct Elem<__half> {
  static __device__ __forceinline__ float up(const uint32_t* w, int i) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w[i >> 1] >> (i & 1 ? 16 : 0))));
  }
  static __device__ __forceinline__ void down(uint32_t* w, int i, float v) {
    const uint32_t b = __half_as_ushort(__float2half_rn(v));
    w[i >> 1] = i & 1 ? (w[i >> 1] & 0xffffu) | (b << 16) : b;
  }
  static __device__ __forceinline__ float round(float v) { return __half2float(__float2half_rn(v)); }
};

// kWords 32-bit words (8 or 16 bytes) moved as one vector access.
template <int kWords>
struct Words {
  uint32_t w[kWords];
};

// Cache path of the row loads (an experiment knob): 0 __ldg (L1, non-coherent), 1 .cg (L2 only),
// 2 .cs (streaming), 3 L1::no_allocate.

template <int kHint>
__device__ __forceinline__ uint4 load16(const void* p) {
  if constexpr (kHint == 1) return __ldcg(static_cast<const uint4*>(p));
  if constexpr (kHint == 2) return __ldcs(static_cast<const uint4*>(p));
  if constexpr (kHint == 3) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
  }
  return __ldg(static_cast<const uint4*>(p));
}

template <int kWords>
__device__ __forceinline__ Words<kWords> load(const void* p) {
  static_assert(kWords == 2 || kWords == 4, "8- or 16-byte vectors");
  Words<kWords> out;
  if constexpr (kWords == 4) {
    const uint4 r = __ldg(static_cast<const uint4*>(p));
    out.w[0] = r.x, out.w[1] = r.y, out.w[2] = r.z, out.w[3] = r.w;
  } else {
    const uint2 r = __ldg(static_cast<const uint2*>(p));
    out.w[0] = r.x, out.w[1] = r.y;
  }
  return out;
}

template <int kWords>
__device__ __forceinline__ Words<kWords> zeros() {
  Words<kWords> out;
#pragma unroll
  for (int i = 0; i < kWords; ++i) out.w[i] = 0u;
  return out;
}

template <int kWords>
__device__ __forceinline__ void store(void* p, const Words<kWords>& v) {
  if constexpr (kWords == 4) {
    *static_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
  } else {
    *static_cast<uint2*>(p) = make_uint2(v.w[0], v.w[1]);
  }
}

// What nvcc emits for rsqrtf (aten's rsqrt on CUDA); spelled out so no flag can change it.
__device__ __forceinline__ float rsqrt_approx(float v) {
  float r;
  asm("rsqrt.approx.f32 %0, %1;" : "=f"(r) : "f"(v));
  return r;
}

// aten's cross-thread tree for the torch flavour over one warp's per-lane folds acc[j][e] (aten thread
// 32*kVpl*j + kVpl*lane + e), broadcast to every lane.
template <int kVpl, int kLoads>
__device__ __forceinline__ float torch_tree(float (&acc)[kLoads][kVpl]) {
  float s;
  if constexpr (kVpl == 2) {
    // aten lane 2q + e of aten warp 2j + h lives in lane 16h + q, slot [j][e]: aten's offsets
    // 16..2 are offsets 8..1 within each half warp, offset 1 is the two slots of one lane.
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
#pragma unroll
        for (int e = 0; e < kVpl; ++e) {
          acc[j][e] = __fadd_rn(acc[j][e], __shfl_down_sync(kFull, acc[j][e], o, 16));
        }
      }
    }
    // lane 0: w0 + w2, lane 16: w1 + w3
    s = __fadd_rn(__fadd_rn(acc[0][0], acc[0][1]), __fadd_rn(acc[1][0], acc[1][1]));
    s = __fadd_rn(s, __shfl_down_sync(kFull, s, 16));
  } else {
    // aten thread 32j + lane: aten warp j is slot j of every lane.
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
#pragma unroll
      for (int j = 0; j < kLoads; ++j) {
        acc[j][0] = __fadd_rn(acc[j][0], __shfl_down_sync(kFull, acc[j][0], o));
      }
    }
    s = __fadd_rn(__fadd_rn(acc[0][0], acc[2][0]), __fadd_rn(acc[1][0], acc[3][0]));
  }
  return __shfl_sync(kFull, s, 0);
}

// Torch flavour: aten's vectorized layer-norm kernel with rms_norm=true. On CUDA it runs 128
// threads (32 x 4) per row; thread t folds sigma2 = fma(v, v, sigma2) over the 4-element vectors
// t, t + 128, ... (vector by vector, element by element), the warps shuffle down 16, 8, 4, 2, 1 and
// shared memory combines the warps as (w0 + w2) + (w1 + w3); then rsqrtf(sigma2 / D + eps) and
// out = round(w * (rstd * x)). Here a lane's 16-byte load holds kVpl consecutive vectors, i.e. kVpl
// adjacent aten threads, and kLoads loads per iteration cover the rest of the 128.
template <typename T, int kIters, bool kWeight, int kHint>
__global__ void __launch_bounds__(kMaxThreads)
    torch_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                 int64_t rows, int d, float eps) {
  constexpr int kElems = 16 / sizeof(T);  // elements per 16-byte load
  constexpr int kVpl = kElems / 4;        // aten vectors per load: 2 (16-bit types) or 1 (fp32)
  constexpr int kLoads = 4 / kVpl;        // 128 vectors per aten iteration / 32 lanes / kVpl
  const int lane = threadIdx.x & 31;
  const int64_t row_step = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); row < rows;
       row += row_step) {
  const int nvec = d >> 2;
  const T* xr = x + row * d;

  Words<4> v[kIters][kLoads];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int vec = 128 * k + 32 * kVpl * j + kVpl * lane;  // d % kElems == 0: all kVpl or none
      if (vec < nvec) {
        const uint4 r = load16<kHint>(xr + 4 * vec);
        v[k][j].w[0] = r.x, v[k][j].w[1] = r.y, v[k][j].w[2] = r.z, v[k][j].w[3] = r.w;
      } else {
        v[k][j] = zeros<4>();
      }
    }
  }
  // acc[j][e] is aten thread 32*kVpl*j + kVpl*lane + e; zeros past the row add nothing.
  float acc[kLoads][kVpl];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
#pragma unroll
    for (int e = 0; e < kVpl; ++e) acc[j][e] = 0.f;
  }
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
#pragma unroll
      for (int e = 0; e < kVpl; ++e) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float f = Elem<T>::up(v[k][j].w, 4 * e + i);
          acc[j][e] = __fmaf_rn(f, f, acc[j][e]);
        }
      }
    }
  }
  const float s = torch_tree<kVpl, kLoads>(acc);
  const float rstd = rsqrt_approx(__fadd_rn(__fdiv_rn(s, static_cast<float>(d)), eps));

  T* orow = out + row * d;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int vec = 128 * k + 32 * kVpl * j + kVpl * lane;
      if (vec < nvec) {
        Words<4> o;
        Words<4> wv;
        if constexpr (kWeight) wv = load<4>(w + 4 * vec);
#pragma unroll
        for (int i = 0; i < kElems; ++i) {
          float y = __fmul_rn(rstd, Elem<T>::up(v[k][j].w, i));
          if constexpr (kWeight) y = __fmul_rn(Elem<T>::up(wv.w, i), y);
          Elem<T>::down(o.w, i, y);
        }
        store(orow + 4 * vec, o);
      }
    }
  }
  }
}

// Diffusers flavour: x.float().pow(2).mean(-1) is Reduce.cuh's MeanOps. For M >= 16 rows and
// 128 <= D < 8192 (the host checks the config) its block is (32, 16): a warp per row, lane x reads
// the 4-element vectors x, x + 32, ... into one accumulator per vector element, combines them
// ((a0 + a1) + a2) + a3 and the warp shuffles down 16..1; then sum * factor (fp32), + eps, rsqrtf;
// out = round(round(x * rstd) * w). The same mapping here: lane x is aten's lane x.
template <typename T, int kIters, bool kWeight>
__global__ void __launch_bounds__(kMaxThreads)
    diffusers_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w,
                     int64_t rows, int d, float eps, float factor) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int nvec = d >> 2;
  const T* xr = x + row * d;

  constexpr int kWords = sizeof(T);  // one 4-element vector: 2 words (16-bit types) or 4 (fp32)
  Words<kWords> v[kIters];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int vec = lane + 32 * k;
    v[k] = vec < nvec ? load<kWords>(xr + 4 * vec) : zeros<kWords>();
  }
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float f = Elem<T>::up(v[k].w, i);
      a[i] = __fadd_rn(a[i], __fmul_rn(f, f));  // pow(2) is its own rounded kernel
    }
  }
  float s = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_down_sync(kFull, s, o));
  s = __shfl_sync(kFull, s, 0);
  const float rstd = rsqrt_approx(__fadd_rn(__fmul_rn(s, factor), eps));

  T* orow = out + row * d;
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int vec = lane + 32 * k;
    if (vec < nvec) {
      Words<kWords> o;
      Words<kWords> wv;
      if constexpr (kWeight) wv = load<kWords>(w + 4 * vec);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float h = Elem<T>::round(__fmul_rn(Elem<T>::up(v[k].w, i), rstd));
        Elem<T>::down(o.w, i, kWeight ? __fmul_rn(h, Elem<T>::up(wv.w, i)) : h);
      }
      store(orow + 4 * vec, o);
    }
  }
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Iteration counts compiled; a row takes the smallest that covers it (the rest is predicated off).
constexpr int kTorchIters[] = {1, 2, 4, 6, 8, 10, 12};                // 128 vectors each
constexpr int kDiffusersIters[] = {2, 4, 8, 16, 24, 32, 40, 48};      // 32 vectors each

template <typename T, bool kWeight, int I = 0>
void launch_torch(const Args& a, int iters, dim3 grid, dim3 block, cudaStream_t stream) {
  if constexpr (I < static_cast<int>(sizeof(kTorchIters) / sizeof(int))) {
    if (iters <= kTorchIters[I]) {
      auto kernel = torch_kernel<T, kTorchIters[I], kWeight, 0>;
      if (a.load_hint == 1) kernel = torch_kernel<T, kTorchIters[I], kWeight, 1>;
      if (a.load_hint == 2) kernel = torch_kernel<T, kTorchIters[I], kWeight, 2>;
      if (a.load_hint == 3) kernel = torch_kernel<T, kTorchIters[I], kWeight, 3>;
      if (a.smem_bytes > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, a.smem_bytes);
      }
      kernel<<<grid, block, a.smem_bytes, stream>>>(
          static_cast<T*>(a.out), static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
          a.rows, static_cast<int>(a.d), a.eps);
    } else {
      launch_torch<T, kWeight, I + 1>(a, iters, grid, block, stream);
    }
  }
}

template <typename T, bool kWeight, int I = 0>
void launch_diffusers(const Args& a, int iters, dim3 grid, dim3 block, cudaStream_t stream) {
  if constexpr (I < static_cast<int>(sizeof(kDiffusersIters) / sizeof(int))) {
    if (iters <= kDiffusersIters[I]) {
      const auto kernel = diffusers_kernel<T, kDiffusersIters[I], kWeight>;
      if (a.smem_bytes > 48 * 1024) {
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, a.smem_bytes);
      }
      kernel<<<grid, block, a.smem_bytes, stream>>>(
          static_cast<T*>(a.out), static_cast<const T*>(a.x), static_cast<const T*>(a.weight),
          a.rows, static_cast<int>(a.d), a.eps, a.factor);
    } else {
      launch_diffusers<T, kWeight, I + 1>(a, iters, grid, block, stream);
    }
  }
}


// ---------------------------------------------------------------------------------------------
// Staged: rows arrive in shared memory by bulk copy (cp.async.bulk, Hopper's TMA engine) several
// rows ahead of the warp that reduces them, so the bytes in flight are not bounded by registers
// or L1 (the kernels above hold one row per warp; capping their residency showed how much in-flight
// data the H200 needs: 16 rows per SM reached 74% of copy_). Each warp owns `stages` row buffers
// and one mbarrier per buffer; lane 0 refills a buffer as soon as the warp has read it twice (the
// reduction, then the output). The arithmetic is the register kernels' exactly.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}

__device__ __forceinline__ void bulk_row_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}

__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

template <typename T>
__device__ __forceinline__ float torch_sum_staged(const T* row, int d, int lane) {
  constexpr int kElems = 16 / sizeof(T);
  constexpr int kVpl = kElems / 4;
  constexpr int kLoads = 4 / kVpl;
  const int nvec = d >> 2;
  float acc[kLoads][kVpl];
#pragma unroll
  for (int j = 0; j < kLoads; ++j) {
#pragma unroll
    for (int e = 0; e < kVpl; ++e) acc[j][e] = 0.f;
  }
#pragma unroll 2
  for (int base = 0; base < nvec; base += 128) {
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int vec = base + 32 * kVpl * j + kVpl * lane;
      if (vec < nvec) {
        const uint4 r = *reinterpret_cast<const uint4*>(row + 4 * vec);
        const uint32_t words[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int e = 0; e < kVpl; ++e) {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const float f = Elem<T>::up(words, 4 * e + i);
            acc[j][e] = __fmaf_rn(f, f, acc[j][e]);
          }
        }
      }
    }
  }
  return torch_tree<kVpl, kLoads>(acc);
}

template <typename T>
__device__ __forceinline__ float mean_sum_staged(const T* row, int d, int lane) {
  constexpr int kWords = sizeof(T);
  const int nvec = d >> 2;
  float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 4
  for (int vec = lane; vec < nvec; vec += 32) {
    Words<kWords> v;
    if constexpr (kWords == 4) {
      const uint4 r = *reinterpret_cast<const uint4*>(row + 4 * vec);
      v.w[0] = r.x, v.w[1] = r.y, v.w[2] = r.z, v.w[3] = r.w;
    } else {
      const uint2 r = *reinterpret_cast<const uint2*>(row + 4 * vec);
      v.w[0] = r.x, v.w[1] = r.y;
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float f = Elem<T>::up(v.w, i);
      a[i] = __fadd_rn(a[i], __fmul_rn(f, f));
    }
  }
  float s = __fadd_rn(__fadd_rn(__fadd_rn(a[0], a[1]), a[2]), a[3]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_down_sync(kFull, s, o));
  return __shfl_sync(kFull, s, 0);
}

template <typename T, Flavour kFlavour, bool kWeight>
__global__ void __launch_bounds__(kMaxThreads)
    staged_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ w, int64_t rows,
                  int d, float eps, float factor, int stages) {
  extern __shared__ __align__(128) unsigned char smem[];
  constexpr int kElems = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  const uint32_t row_bytes = static_cast<uint32_t>(d) * sizeof(T);
  const size_t bar_bytes = (static_cast<size_t>(warps) * stages * 8 + 127) / 128 * 128;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem) + warp * stages;
  unsigned char* buf = smem + bar_bytes + static_cast<size_t>(warp) * stages * row_bytes;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps;
  const int64_t first = static_cast<int64_t>(blockIdx.x) * warps + warp;

  if (lane == 0) {
    for (int st = 0; st < stages; ++st) mbar_init(&bars[st]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int st = 0; st < stages; ++st) {
      const int64_t r = first + st * step;
      if (r < rows) bulk_row_load(buf + st * row_bytes, x + r * d, row_bytes, &bars[st]);
    }
  }
  __syncwarp();
  int st = 0;
  uint32_t parity = 0;
  for (int64_t r = first; r < rows; r += step) {
    mbar_wait(&bars[st], parity);
    const T* row = reinterpret_cast<const T*>(buf + st * row_bytes);
    float rstd;
    if constexpr (kFlavour == Flavour::kTorch) {
      rstd = rsqrt_approx(__fadd_rn(__fdiv_rn(torch_sum_staged(row, d, lane), static_cast<float>(d)), eps));
    } else {
      rstd = rsqrt_approx(__fadd_rn(__fmul_rn(mean_sum_staged(row, d, lane), factor), eps));
    }
    T* orow = out + r * d;
#pragma unroll 2
    for (int c = lane * kElems; c < d; c += 32 * kElems) {
      const uint4 raw = *reinterpret_cast<const uint4*>(row + c);
      const uint32_t xw[4] = {raw.x, raw.y, raw.z, raw.w};
      Words<4> o;
      Words<4> wv;
      if constexpr (kWeight) wv = load<4>(w + c);
#pragma unroll
      for (int i = 0; i < kElems; ++i) {
        float y;
        if constexpr (kFlavour == Flavour::kTorch) {
          y = __fmul_rn(rstd, Elem<T>::up(xw, i));
          if constexpr (kWeight) y = __fmul_rn(Elem<T>::up(wv.w, i), y);
        } else {
          y = Elem<T>::round(__fmul_rn(Elem<T>::up(xw, i), rstd));
          if constexpr (kWeight) y = __fmul_rn(y, Elem<T>::up(wv.w, i));
        }
        Elem<T>::down(o.w, i, y);
      }
      store(orow + c, o);
    }
    __syncwarp();  // every lane has read this buffer: it may be refilled
    const int64_t next = r + stages * step;
    if (lane == 0 && next < rows) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      bulk_row_load(buf + st * row_bytes, x + next * d, row_bytes, &bars[st]);
    }
    if (++st == stages) st = 0, parity ^= 1u;
  }
}

template <typename T, Flavour kFlavour, bool kWeight>
cudaError_t launch_staged_typed(const Args& a, int warps, cudaStream_t stream) {
  const int64_t row_bytes = a.d * static_cast<int64_t>(sizeof(T));
  const int64_t bar_bytes = (static_cast<int64_t>(warps) * a.stages * 8 + 127) / 128 * 128;
  const int64_t smem = bar_bytes + static_cast<int64_t>(warps) * a.stages * row_bytes;
  if (smem > 227 * 1024) return cudaErrorInvalidValue;
  const auto kernel = staged_kernel<T, kFlavour, kWeight>;
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  int64_t blocks = ceil_div(a.rows, warps);
  if (a.max_blocks > 0 && blocks > a.max_blocks) blocks = a.max_blocks;
  kernel<<<static_cast<unsigned>(blocks), 32 * warps, static_cast<size_t>(smem), stream>>>(
      static_cast<T*>(a.out), static_cast<const T*>(a.x), static_cast<const T*>(a.weight), a.rows,
      static_cast<int>(a.d), a.eps, a.factor, a.stages);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_staged(const Args& a, int warps, cudaStream_t stream) {
  const bool wt = a.weight != nullptr;
  if (a.flavour == Flavour::kTorch) {
    return wt ? launch_staged_typed<T, Flavour::kTorch, true>(a, warps, stream)
              : launch_staged_typed<T, Flavour::kTorch, false>(a, warps, stream);
  }
  return wt ? launch_staged_typed<T, Flavour::kDiffusers, true>(a, warps, stream)
            : launch_staged_typed<T, Flavour::kDiffusers, false>(a, warps, stream);
}

template <typename T>
cudaError_t launch_typed(const Args& a, cudaStream_t stream) {
  const int warps = a.warps_per_block > 0 ? a.warps_per_block : 4;
  if (warps > kMaxThreads / 32) return cudaErrorInvalidValue;
  if (a.stages > 0) return launch_staged<T>(a, warps, stream);
  // Only the torch register kernel strides over rows; a capped diffusers grid would skip rows.
  if (a.max_blocks > 0 && a.flavour == Flavour::kDiffusers) return cudaErrorInvalidValue;
  int64_t blocks = ceil_div(a.rows, warps);
  if (a.max_blocks > 0 && blocks > a.max_blocks) blocks = a.max_blocks;
  if (blocks > INT32_MAX) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(blocks));
  const dim3 block(static_cast<unsigned>(32 * warps));
  const int64_t nvec = a.d / 4;
  if (a.flavour == Flavour::kTorch) {
    const int iters = static_cast<int>(ceil_div(nvec, 128));
    if (a.weight != nullptr) {
      launch_torch<T, true>(a, iters, grid, block, stream);
    } else {
      launch_torch<T, false>(a, iters, grid, block, stream);
    }
  } else {
    const int iters = static_cast<int>(ceil_div(nvec, 32));
    if (a.weight != nullptr) {
      launch_diffusers<T, true>(a, iters, grid, block, stream);
    } else {
      launch_diffusers<T, false>(a, iters, grid, block, stream);
    }
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch(const Args& args, cudaStream_t stream) {
  if (args.rows == 0) return cudaSuccess;
  const int64_t elems_per_load = args.dtype == DType::kFloat32 ? 4 : 8;  // 16 bytes (torch flavour)
  if (args.d <= 0 || args.d > kMaxD || args.d % elems_per_load != 0) return cudaErrorInvalidValue;
  // Below 16 rows or 128 columns aten's mean takes another block shape (another order).
  if (args.flavour == Flavour::kDiffusers && (args.d < 128 || args.rows < 16)) {
    return cudaErrorInvalidValue;
  }
  switch (args.dtype) {
    case DType::kFloat32: return launch_typed<float>(args, stream);
    case DType::kFloat16: return launch_typed<__half>(args, stream);
    case DType::kBFloat16: return launch_typed<__nv_bfloat16>(args, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace xbackend_rms
