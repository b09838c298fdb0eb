// out = x + update * gate, rounded exactly as eager PyTorch does it: the product is computed in fp32
// and rounded to the dtype, then the sum is computed in fp32 and rounded. __fmul_rn / __fadd_rn pin
// each fp32 rounding so the compiler cannot contract them into an FMA (which would change fp32
// results in the last bit).
//
// Three paths, picked on the host:
//  * flat      full gate laid out like x: one 16-byte pack of x, update and gate per step.
//  * row tile  each thread owns one 16-byte column pack of R consecutive rows; when the R rows share
//              a gate row (broadcast [B,1,D], [1,..,1,D]) the gate pack is loaded once for all R.
//              A per-token gate ([B,L,1]) is one scalar per row. R is 1 for vector gates unless the
//              caller asks otherwise (measured fastest, see launch_row_tile), 1..4 for per-token.
//  * scalar    anything misaligned or with D not a multiple of the pack width.

#include "gated_residual.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace xbackend_gr {
namespace {

constexpr int kThreads = 256;  // most threads per block (launch bound)
// Threads per block by default, flat and row tile: torch.compile's pointwise shape (1024 elements
// per 4 warps). On an H200 (bf16, lab/gpu/gated_residual_variants.py) 128-thread blocks with one pack
// per thread and plain loads matched compile at every workload shape, where 256-thread blocks, several
// packs per thread and ld.global.nc loads were 0.5-4.5% slower at [1, 4096..4608, 3072] and
// [1, 8160, 4096].
constexpr int kBlockThreads = 128;
constexpr int kMaxDevices = 64;

template <typename T>
struct Math;

template <>
struct Math<float> {
  static __device__ __forceinline__ float combine(float x, float u, float g) {
    return __fadd_rn(x, __fmul_rn(u, g));
  }
};

template <>
struct Math<__nv_bfloat16> {
  static __device__ __forceinline__ __nv_bfloat16 combine(__nv_bfloat16 x, __nv_bfloat16 u,
                                                          __nv_bfloat16 g) {
    const __nv_bfloat16 p =
        __float2bfloat16_rn(__fmul_rn(__bfloat162float(u), __bfloat162float(g)));
    return __float2bfloat16_rn(__fadd_rn(__bfloat162float(x), __bfloat162float(p)));
  }
};

template <>
struct Math<__half> {
  static __device__ __forceinline__ __half combine(__half x, __half u, __half g) {
    const __half p = __float2half_rn(__fmul_rn(__half2float(u), __half2float(g)));
    return __float2half_rn(__fadd_rn(__half2float(x), __half2float(p)));
  }
};

// 16 bytes of T: the widest load a thread can issue.
template <typename T>
struct alignas(16) Pack {
  static constexpr int kSize = 16 / sizeof(T);
  T v[kSize];
};

// Cache hints for 16-byte loads. x and update stream through once: plain ld.global (the .nc path
// __ldg takes measured slower), or L1::evict_first with the gate on L1::evict_last (pick_evict_first
// says when). A broadcast gate row is re-read by every row that shares it: always evict_last.
// Hints are template arguments: a runtime choice between two loads made the per-token kernels with
// 2-4 rows per thread 3-20% slower on the H200 (lab/results/h200/gated_residual_sweep_s6_runtime_hint.txt).
enum Hint : int { kPlain = 0, kEvictFirst = 1, kEvictLast = 2 };

template <Hint kHint, typename T>
__device__ __forceinline__ Pack<T> load(const T* p) {
  uint4 r;
  if constexpr (kHint == kEvictLast) {
    asm volatile("ld.global.L1::evict_last.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else if constexpr (kHint == kEvictFirst) {
    asm volatile("ld.global.L1::evict_first.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
  }
  Pack<T> out;
  *reinterpret_cast<uint4*>(&out) = r;
  return out;
}

template <typename T>
__device__ __forceinline__ T load_scalar(const T* p) {
  return p[0];
}

template <typename T>
__device__ __forceinline__ void store(T* p, const Pack<T>& v) {
  *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(&v);
}

template <typename T>
__device__ __forceinline__ Pack<T> combine(const Pack<T>& x, const Pack<T>& u, const Pack<T>& g) {
  Pack<T> o;
#pragma unroll
  for (int i = 0; i < Pack<T>::kSize; ++i) o.v[i] = Math<T>::combine(x.v[i], u.v[i], g.v[i]);
  return o;
}

template <typename T>
__device__ __forceinline__ Pack<T> combine(const Pack<T>& x, const Pack<T>& u, T g) {
  Pack<T> o;
#pragma unroll
  for (int i = 0; i < Pack<T>::kSize; ++i) o.v[i] = Math<T>::combine(x.v[i], u.v[i], g);
  return o;
}

// Each thread handles kPacks packs, spaced a block apart so a warp's accesses stay contiguous; all
// loads are issued before the first use so several are in flight per thread.
template <typename T, int kPacks, Hint kStream>
__global__ void __launch_bounds__(kThreads)
    flat_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ u,
                const T* __restrict__ g, int64_t n) {
  constexpr int N = Pack<T>::kSize;
  constexpr Hint kGate = kStream == kEvictFirst ? kEvictLast : kPlain;
  const int64_t n_packs = n / N;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * (blockDim.x * kPacks) + threadIdx.x;
  Pack<T> xs[kPacks], us[kPacks], gs[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = base + k * static_cast<int64_t>(blockDim.x);
    if (p < n_packs) {
      xs[k] = load<kStream>(x + p * N);
      us[k] = load<kStream>(u + p * N);
      gs[k] = load<kGate>(g + p * N);
    }
  }
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const int64_t p = base + k * static_cast<int64_t>(blockDim.x);
    if (p < n_packs) store(out + p * N, combine(xs[k], us[k], gs[k]));
  }
  // The last n % N elements do not fill a pack.
  const int64_t tail = n_packs * N + threadIdx.x;
  if (blockIdx.x == 0 && tail < n) out[tail] = Math<T>::combine(x[tail], u[tail], g[tail]);
}

// How a row tile finds its gate rows.
enum GateRows : int {
  kPerTile = 0,  // all R rows share one gate row (inner % R == 0)
  kPerRow = 1,   // gate row == x row (inner == 1)
  kDivide = 2,   // gate row == x row / inner
  kSingle = 3,   // one gate row for all rows (inner >= rows): no 64-bit division per thread
};

template <typename T, int R, bool kPerToken, int kGateRows, Hint kStream>
__global__ void __launch_bounds__(kThreads)
    row_tile_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ u,
                    const T* __restrict__ g, int64_t rows, int64_t d, int64_t inner,
                    int64_t g_row_stride) {
  constexpr int N = Pack<T>::kSize;
  constexpr int G = kGateRows == kPerTile || kGateRows == kSingle ? 1 : R;  // gate loads per thread
  using Gate = std::conditional_t<kPerToken, T, Pack<T>>;

  // 2-D grid (column block, row tile), x fastest so consecutive blocks stream consecutive memory;
  // row tiles past gridDim.y (65535) loop.
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c * N >= d) return;
  const int64_t col = c * N;
  const int64_t tile_rows = static_cast<int64_t>(blockDim.y) * R;
  for (int64_t row0 = static_cast<int64_t>(blockIdx.y) * tile_rows + threadIdx.y * R; row0 < rows;
       row0 += static_cast<int64_t>(gridDim.y) * tile_rows) {

    Pack<T> xs[R], us[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r < rows) {
        const int64_t off = (row0 + r) * d + col;
        xs[r] = load<kStream>(x + off);
        us[r] = load<kStream>(u + off);
      }
    }
    Gate gs[G];
#pragma unroll
    for (int r = 0; r < G; ++r) {
      if (row0 + r < rows) {
        int64_t grow;
        if constexpr (kGateRows == kSingle) {
          grow = 0;
        } else if constexpr (kGateRows == kPerTile) {
          grow = row0 / inner;
        } else if constexpr (kGateRows == kPerRow) {
          grow = row0 + r;
        } else {
          grow = (row0 + r) / inner;
        }
        if constexpr (kPerToken) {
          gs[r] = load_scalar(g + grow * g_row_stride);
        } else if constexpr (kGateRows == kPerRow) {
          // read once
          gs[r] = load<kStream == kEvictFirst ? kEvictLast : kPlain>(g + grow * g_row_stride + col);
        } else {
          gs[r] = load<kEvictLast>(g + grow * g_row_stride + col);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (row0 + r < rows) {
        store(out + (row0 + r) * d + col, combine(xs[r], us[r], gs[G == 1 ? 0 : r]));
      }
    }
  }
}

template <typename T, bool kPerToken>
__global__ void __launch_bounds__(kThreads)
    scalar_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ u,
                  const T* __restrict__ g, int64_t rows, int64_t d, int64_t inner,
                  int64_t g_row_stride) {
  const int64_t n = rows * d;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t row = i / d;
    const int64_t goff = (row / inner) * g_row_stride + (kPerToken ? 0 : i - row * d);
    out[i] = Math<T>::combine(x[i], u[i], g[goff]);
  }
}

// A device attribute, read once per device (a failed query reads as `fallback`).
int device_attribute(cudaDeviceAttr attr, int device, int fallback, int (&cache)[kMaxDevices]) {
  int value = 0;
  if (device >= 0 && device < kMaxDevices && cache[device] > 0) return cache[device];
  if (cudaDeviceGetAttribute(&value, attr, device) != cudaSuccess || value <= 0) {
    cudaGetLastError();  // a failed query must not surface as the launch's error
    return fallback;
  }
  if (device >= 0 && device < kMaxDevices) cache[device] = value;
  return value;
}

int sm_count(int device) {
  static int cache[kMaxDevices] = {};
  return device_attribute(cudaDevAttrMultiProcessorCount, device, 1, cache);
}

int l2_bytes(int device) {
  static int cache[kMaxDevices] = {};
  return device_attribute(cudaDevAttrL2CacheSize, device, 0, cache);
}

// L1::evict_first on the streamed loads when one input (x_bytes) fits in half the L2. On an H200
// (60 MB L2, bf16, lab/gpu/gated_residual_variants.py, lab/results/h200/gated_residual_variants.txt) it made
// every schedule 6-7% faster at [1, 4096..4608, 3072] (28 MB per input), 13-15% at [1, 512, 3072]
// and 4% at [1, 126, 2048], but 1.6% slower at [1, 4096, 4608] (38 MB), neutral at [1, 8160, 4096]
// and 4.5% slower at [1, 32640, 4096]. Half the L2 sits between the last win and the first loss.
bool pick_evict_first(const Args& a, int64_t x_bytes) {
  if (a.load_hint != 0) return a.load_hint == 2;
  return 2 * x_bytes <= static_cast<int64_t>(l2_bytes(a.device));
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15) == 0; }

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Per-token gates: fewest rows per thread that still leave a full wave of resident threads (2048
// per SM), so big tensors get 4 rows (more loads in flight), small ones spread over every SM.
int pick_rows_per_thread(int64_t rows, int64_t packs_per_row, int sms) {
  const int64_t wave = static_cast<int64_t>(sms) * 2048;
  for (int r : {4, 2}) {
    if (ceil_div(rows, r) * packs_per_row >= wave) return r;
  }
  return 1;
}

template <typename T, int R, bool kPerToken, Hint kStream>
void launch_row_tile_r(const Args& a, dim3 grid, dim3 block, cudaStream_t stream) {
  auto* out = static_cast<T*>(a.out);
  auto* x = static_cast<const T*>(a.x);
  auto* u = static_cast<const T*>(a.update);
  auto* g = static_cast<const T*>(a.gate);
  if (a.inner >= a.rows) {
    row_tile_kernel<T, R, kPerToken, kSingle, kStream>
        <<<grid, block, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner, a.gate_row_stride);
  } else if (a.inner == 1) {
    row_tile_kernel<T, R, kPerToken, kPerRow, kStream>
        <<<grid, block, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner, a.gate_row_stride);
  } else if (R == 1 || a.inner % R == 0) {
    row_tile_kernel<T, R, kPerToken, kPerTile, kStream>
        <<<grid, block, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner, a.gate_row_stride);
  } else {
    row_tile_kernel<T, R, kPerToken, kDivide, kStream>
        <<<grid, block, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner, a.gate_row_stride);
  }
}

// Returns false (launching nothing) when the column blocks would not fit in gridDim.x.
template <typename T, bool kPerToken>
bool launch_row_tile(const Args& a, int sms, bool ef, cudaStream_t stream) {
  constexpr int N = Pack<T>::kSize;
  const int64_t packs = a.d / N;
  const int64_t max_cols = a.block_cols > 0 ? a.block_cols : kBlockThreads;
  const int64_t col_blocks = ceil_div(packs, max_cols);
  int64_t bdx = ceil_div(packs, col_blocks);
  if (bdx > 32) bdx = ceil_div(bdx, 32) * 32;
  // Narrow rows: stack several rows of threads in one block so blocks stay max_cols wide.
  const int64_t bdy = bdx >= max_cols ? 1 : max_cols / bdx;
  // Vector gates take one row per thread: on an H200 (bf16, D 3072..4608) that beat 2, 4 and 8 rows
  // by 3-12% even though the gate pack is then reloaded per row; it hits L1/L2, while several rows
  // per thread put 8 KB-strided streams into every warp instruction.
  int r = a.rows_per_thread;
  if (r == 0) r = kPerToken ? pick_rows_per_thread(a.rows, packs, sms) : 1;
  const int64_t tiles = ceil_div(a.rows, r * bdy);
  if (col_blocks > INT32_MAX) return false;
  const dim3 block(static_cast<unsigned>(bdx), static_cast<unsigned>(bdy));
  const auto grid_y = static_cast<unsigned>(tiles < 65535 ? tiles : 65535);  // more tiles loop
  const dim3 grid(static_cast<unsigned>(col_blocks), grid_y);
  switch (r) {
    // evict_first is instantiated for one row per thread only (the default for vector gates and for
    // small per-token tensors, where it was measured); more rows per thread load plainly.
    case 1:
      if (ef) {
        launch_row_tile_r<T, 1, kPerToken, kEvictFirst>(a, grid, block, stream);
      } else {
        launch_row_tile_r<T, 1, kPerToken, kPlain>(a, grid, block, stream);
      }
      break;
    case 2: launch_row_tile_r<T, 2, kPerToken, kPlain>(a, grid, block, stream); break;
    case 4: launch_row_tile_r<T, 4, kPerToken, kPlain>(a, grid, block, stream); break;
    default: launch_row_tile_r<T, 8, kPerToken, kPlain>(a, grid, block, stream); break;
  }
  return true;
}

template <typename T>
void launch_typed(const Args& a, cudaStream_t stream) {
  constexpr int N = Pack<T>::kSize;
  auto* out = static_cast<T*>(a.out);
  auto* x = static_cast<const T*>(a.x);
  auto* u = static_cast<const T*>(a.update);
  auto* g = static_cast<const T*>(a.gate);
  const int sms = sm_count(a.device);
  const int64_t n = a.rows * a.d;
  const bool ef = pick_evict_first(a, n * static_cast<int64_t>(sizeof(T)));
  const bool packs_aligned = aligned16(out) && aligned16(x) && aligned16(u);
  const bool full = !a.per_token && a.inner == 1 && (a.rows <= 1 || a.gate_row_stride == a.d);

  if (full && packs_aligned && aligned16(g)) {
    const int64_t n_packs = n / N;
    const int packs = a.packs_per_thread > 0 ? a.packs_per_thread : 1;
    const int64_t want = ceil_div(n_packs, static_cast<int64_t>(kBlockThreads) * packs);
    if (want <= INT32_MAX) {
      const unsigned blocks = static_cast<unsigned>(want > 0 ? want : 1);  // block 0 owns the tail
      switch (packs) {
        case 1:
          if (ef) {
            flat_kernel<T, 1, kEvictFirst><<<blocks, kBlockThreads, 0, stream>>>(out, x, u, g, n);
          } else {
            flat_kernel<T, 1, kPlain><<<blocks, kBlockThreads, 0, stream>>>(out, x, u, g, n);
          }
          break;
        case 2: flat_kernel<T, 2, kPlain><<<blocks, kBlockThreads, 0, stream>>>(out, x, u, g, n); break;
        default: flat_kernel<T, 4, kPlain><<<blocks, kBlockThreads, 0, stream>>>(out, x, u, g, n); break;
      }
      return;
    }
  }
  const bool gate_packs = a.per_token || (aligned16(g) && a.gate_row_stride % N == 0);
  if (packs_aligned && a.d % N == 0 && gate_packs) {
    const bool launched = a.per_token ? launch_row_tile<T, true>(a, sms, ef, stream)
                                      : launch_row_tile<T, false>(a, sms, ef, stream);
    if (launched) return;
  }
  const int64_t max_blocks = static_cast<int64_t>(sms) * 8;
  const int64_t want = ceil_div(n, kThreads);
  const unsigned blocks = static_cast<unsigned>(want < max_blocks ? want : max_blocks);
  if (a.per_token) {
    scalar_kernel<T, true><<<blocks, kThreads, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner,
                                                             a.gate_row_stride);
  } else {
    scalar_kernel<T, false><<<blocks, kThreads, 0, stream>>>(out, x, u, g, a.rows, a.d, a.inner,
                                                              a.gate_row_stride);
  }
}

}  // namespace

cudaError_t launch(const Args& args, cudaStream_t stream) {
  if (args.rows * args.d == 0) return cudaSuccess;
  switch (args.dtype) {
    case DType::kFloat32: launch_typed<float>(args, stream); break;
    case DType::kFloat16: launch_typed<__half>(args, stream); break;
    case DType::kBFloat16: launch_typed<__nv_bfloat16>(args, stream); break;
    default: return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace xbackend_gr
