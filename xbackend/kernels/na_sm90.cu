// Neighborhood attention's shift launch for sm90a at head_dim 64: 3-D windows of at most 11 per
// axis walked in 2 x 2 x 14 key blocks (56 keys), which a Triton kernel cannot express (its block
// shapes are powers of two; na_triton's 2 x 2 x 16 blocks round a 14-wide key box up to 16).
//
// Semantics are na_triton's shift launch (na_triton_kernel.py, SHIFT): one CTA a 4 x 4 x 4 query
// tile of one (batch, head), rows in (axis 0, axis 1, axis 2) order; each row's exponent is shifted
// by its Cauchy-Schwarz bound |q| * max|k| * scale (log2 units), so the walk keeps no row max and
// never rescales; a tile whose largest bound exceeds shift_max walks nothing and sets its flag,
// indexed as na_triton's grid (tile + tiles * (batch * heads + head)), for na_triton's online launch;
// a tile whose accumulator ends with an inf or a NaN sets its flag to 2, for na_triton's safe walk.
//
// Per CTA: one warpgroup; q (64 rows), a 3-slot ring of K (56 rows) and V (64 rows, the last 8
// zero) moved by TMA in 128-byte swizzle; q.k as wgmma m64n56k16 (q and k in shared memory), the
// masked shifted exponents in registers, p.v as wgmma m64n64k16 with p from registers (its pad
// columns 56-63 zero). A tile's key box along axis 2 (window + 3 <= 14 keys) is one block wide, so
// each row's axis-2 test is a 14-bit mask fixed for the tile; the axis-0/1 tests give each block
// four (offset0, offset1) groups of columns.
//
// The walk's index math (key box, block order, masks) is na_sm90_walk.cuh's, which
// tests/kernels/na_sm90_walk.cpp runs on the host against the op's reference windows.
//
// Inputs (checked by na_sm90.py): bf16, contiguous [B, S0, S1, S2, heads, 64]; window k_i <= 11 and
// S_i >= k_i; stride 1, no dilation, no causal axis; scale > 0.
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include "na_sm90_walk.cuh"
#include "sm90_ptx.cuh"

namespace {

using namespace xb_sm90;
using namespace xb_na_sm90;

constexpr int kStages = 3;
constexpr int kKBytes = 4 * kBoxW * 128;  // a K block: 56 rows of 64 bf16
static_assert(4 * kBoxW == 56, "q.k is wgmma m64n56k16: a block is 2 x 2 x 14 keys");
constexpr int kVBytes = 64 * 128;  // a V slot: 56 loaded rows and 8 zero rows (p.v's last k16 step)
constexpr int kQBytes = 64 * 128;
constexpr int kSmem = kQBytes + kStages * (kKBytes + kVBytes) + 1024;  // + alignment slack (swizzle: 1024 B)

__global__ void __launch_bounds__(128, 4)
    na_shift_sm90(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, __nv_bfloat16 *__restrict__ out,
                  const __nv_bfloat16 *__restrict__ qg, const float *__restrict__ knorm, int *__restrict__ flags,
                  int N0, int N1, int N2, int heads, int ks0, int ks1, int ks2, float qk_scale, float shift_max) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_k[kStages];
    __shared__ __align__(8) uint64_t full_v[kStages];
    __shared__ __align__(8) uint64_t q_bar;
    __shared__ float row_bound[64];
    __shared__ int tile_ok;

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sv = base + kQBytes + kStages * kKBytes;
    const uint32_t sq_a = smem_u32(base), sk_a = sq_a + kQBytes, sv_a = smem_u32(sv);

    const int nt1 = (N1 + 3) >> 2, nt2 = (N2 + 3) >> 2;
    const int tile = blockIdx.x;
    const int bh = blockIdx.y;
    const int b = bh / heads, head = bh - b * heads;
    const int a0 = (tile / (nt1 * nt2)) << 2;
    const int a1 = ((tile / nt2) % nt1) << 2;
    const int a2 = (tile % nt2) << 2;
    const Walk wk = tile_walk(a0, a1, a2, N0, N1, N2, ks0, ks1, ks2);
    const int lo2 = wk.lo2, n_blocks = wk.n_blocks;
    const int col = head * 64;

    // V's rows 56-63 stay zero (p's pad columns are zero too: 0 * 0, never 0 * stale bits).
    for (int i = tid; i < kStages * 64; i += 128) {
        *reinterpret_cast<uint4 *>(sv + (i >> 6) * kVBytes + 56 * 128 + (i & 63) * 16) = make_uint4(0, 0, 0, 0);
    }
    if (tid == 0) {
        for (int s = 0; s < kStages; ++s) {
            mbar_init(smem_u32(&full_k[s]), 1);
            mbar_init(smem_u32(&full_v[s]), 1);
        }
        mbar_init(smem_u32(&q_bar), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    auto load_k = [&](int slot, int d0, int d1) {
        uint32_t bar = smem_u32(&full_k[slot]);
        mbar_expect_tx(bar, kKBytes);
        tma_load_5d(sk_a + slot * kKBytes, &tk, bar, col, lo2, d1, d0, b);
    };
    auto load_v = [&](int slot, int d0, int d1) {
        uint32_t bar = smem_u32(&full_v[slot]);
        mbar_expect_tx(bar, kKBytes);  // 56 rows, like K
        tma_load_5d(sv_a + slot * kVBytes, &tv, bar, col, lo2, d1, d0, b);
    };
    if (tid == 0) {
        mbar_expect_tx(smem_u32(&q_bar), kQBytes);
        tma_load_5d(sq_a, &tq, smem_u32(&q_bar), col, a2, a1, a0, b);  // rows past an axis end: zeros
        // block_at(wk, i) written out: through the function ptxas allocates the block loop's uniform
        // registers worse (296 against 288 SASS instructions a block; nvcc 13.0,
        // lab/gpu/na56/sass_loop.py).
        for (int i = 0; i < kStages && i < n_blocks; ++i) {
            load_k(i, wk.lo0 + 2 * (i / wk.nb1), wk.lo1 + 2 * (i % wk.nb1));
            load_v(i, wk.lo0 + 2 * (i / wk.nb1), wk.lo1 + 2 * (i % wk.nb1));
        }
    }

    // Row bounds |q| * max|k| * scale from global memory (two threads a row) while the loads fly. A
    // row past an axis end takes its clamped query's bound: a bound of a row of the tile either way.
    {
        const int r = tid >> 1, half = tid & 1;
        const int t = min(a0 + (r >> 4), N0 - 1), h = min(a1 + ((r >> 2) & 3), N1 - 1), w = min(a2 + (r & 3), N2 - 1);
        const __nv_bfloat16 *p =
            qg + ((((size_t)b * N0 + t) * N1 + h) * N2 + w) * (size_t)(heads * 64) + col + half * 32;
        float ss = 0.f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            uint4 u = reinterpret_cast<const uint4 *>(p)[j];
            const __nv_bfloat162 *e = reinterpret_cast<const __nv_bfloat162 *>(&u);
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                float2 f = __bfloat1622float2(e[k]);
                ss = fmaf(f.x, f.x, fmaf(f.y, f.y, ss));
            }
        }
        ss += __shfl_xor_sync(0xffffffff, ss, 1);
        const float m = sqrtf(ss) * knorm[bh] * fabsf(qk_scale);
        if (half == 0) row_bound[r] = m;
        // NaN or inf in q or k fails the test: such tiles go to the online walk.
        const int ok = __syncthreads_and(m <= shift_max);
        if (tid == 0) tile_ok = ok;
    }
    __syncthreads();
    if (!tile_ok) {
        if (tid == 0) flags[(size_t)bh * gridDim.x + tile] = 1;
        mbar_wait(smem_u32(&q_bar), 0);  // drain the issued loads before the CTA exits
        for (int i = 0; i < kStages && i < n_blocks; ++i) {
            mbar_wait(smem_u32(&full_k[i]), 0);
            mbar_wait(smem_u32(&full_v[i]), 0);
        }
        return;
    }

    // This thread's two rows and 14 score columns (the wgmma accumulator layout): row r0 and r0 + 8,
    // columns 8 j + 2 (lane % 4) + {0, 1} for j < 7.
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const float negm0 = -row_bound[r0], negm1 = -row_bound[r1];
    const Rows rows = thread_rows(wk, warp, lane, a0, a1, a2, N0, N1, N2, ks0, ks1, ks2);

    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    float l0 = 0.f, l1 = 0.f;
    float s[28];
    uint32_t pa[4][4];
    mbar_wait(smem_u32(&q_bar), 0);
    const uint64_t dq = desc_sw128(sq_a);

    int c0 = wk.lo0, c1 = wk.lo1;
    // The next block to load (block kStages), by carried counters: a divide costs ~40 instructions.
    int e0, e1;
    block_at(wk, kStages, e0, e1);
    for (int i = 0; i < n_blocks; ++i) {
        const int slot = i % kStages;
        mbar_wait(smem_u32(&full_k[slot]), (i / kStages) & 1);
        const uint64_t dk = desc_sw128(sk_a + slot * kKBytes);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_qk(s, dq + 2 * k, dk + 2 * k, k);  // +32 B a k16 step
        wg_commit();
        wg_wait<0>();  // this block's q.k and the previous block's p.v
        fence_regs(s);
        fence_regs(acc);
        // The previous block's slot is free once every warp's p.v has read it: refill it.
        if (i >= 1 && i + kStages - 1 < n_blocks) {
            asm volatile("bar.sync 1, 128;" ::: "memory");
            if (tid == 0) {
                load_k((i - 1) % kStages, e0, e1);
                load_v((i - 1) % kStages, e0, e1);
            }
            next_block(wk, e0, e1);
        }

        // exp2(s * scale - bound), -inf (so 0) outside each row's window; row sums per thread.
        const Masks mk = block_masks(rows, c0, c1);
        const uint32_t m0 = mk.m0, m1 = mk.m1;
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            const float p0 = ex2(fmaf(s[4 * j + 0], qk_scale, ((m0 >> (2 * j)) & 1) ? negm0 : -INFINITY));
            const float p1 = ex2(fmaf(s[4 * j + 1], qk_scale, ((m0 >> (2 * j + 1)) & 1) ? negm0 : -INFINITY));
            const float p2 = ex2(fmaf(s[4 * j + 2], qk_scale, ((m1 >> (2 * j)) & 1) ? negm1 : -INFINITY));
            const float p3 = ex2(fmaf(s[4 * j + 3], qk_scale, ((m1 >> (2 * j + 1)) & 1) ? negm1 : -INFINITY));
            l0 += p0 + p1;
            l1 += p2 + p3;
            // p.v's k16 step j / 2 takes {row r0, cols 0-7}, {r1, 0-7}, {r0, 8-15}, {r1, 8-15}.
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(p0, p1);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
        pa[3][2] = 0u;
        pa[3][3] = 0u;

        mbar_wait(smem_u32(&full_v[slot]), (i / kStages) & 1);
        const uint64_t dv = desc_sw128(sv_a + slot * kVBytes);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_pv(acc, pa[k], dv + 128 * k);  // +16 rows (2048 B) a k16 step
        wg_commit();

        next_block(wk, c0, c1);
    }
    wg_wait<0>();
    fence_regs(acc);

    // An inf or a NaN in this thread's accumulator (a non-finite V value times p = 0 outside a row's
    // window is NaN): flag 2, for na_triton's safe walk, which runs after the online launch. Once a
    // tile, after the walk: a sum keeps any inf or NaN (a finite overflow flags too, harmlessly).
    float total = 0.f;
#pragma unroll
    for (int i = 0; i < 32; ++i) total += acc[i];
    if (!isfinite(total)) flags[(size_t)bh * gridDim.x + tile] = 2;

    l0 += __shfl_xor_sync(0xffffffff, l0, 1);
    l0 += __shfl_xor_sync(0xffffffff, l0, 2);
    l1 += __shfl_xor_sync(0xffffffff, l1, 1);
    l1 += __shfl_xor_sync(0xffffffff, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    const size_t rs = (size_t)heads * 64;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = half ? r1 : r0;
        const int t = a0 + (r >> 4), h = a1 + ((r >> 2) & 3), w = a2 + (r & 3);
        if (t >= N0 || h >= N1 || w >= N2) continue;  // past an axis end: not stored
        const float inv = half ? inv1 : inv0;
        __nv_bfloat16 *o = out + ((((size_t)b * N0 + t) * N1 + h) * N2 + w) * rs + col;
#pragma unroll
        for (int j = 0; j < 8; ++j) {
            *reinterpret_cast<uint32_t *>(o + 8 * j + 2 * (lane & 3)) =
                pack_bf16(acc[4 * j + 2 * half] * inv, acc[4 * j + 2 * half + 1] * inv);
        }
    }
}

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (fn == nullptr) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult res;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &res) ==
                cudaSuccess &&
            res == cudaDriverEntryPointSuccess) {
            fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
        }
    }
    return fn;
}

// A 5-D map over [B, S0, S1, S2, heads * 64] bf16 (innermost first for the driver), 128-byte swizzle;
// boxes past an end are zero-filled.
bool encode(CUtensorMap *map, const void *ptr, int B, int N0, int N1, int N2, int heads, int box_w, int box_h,
            int box_t) {
    const cuuint64_t c = (cuuint64_t)heads * 64;
    cuuint64_t dims[5] = {c, (cuuint64_t)N2, (cuuint64_t)N1, (cuuint64_t)N0, (cuuint64_t)B};
    cuuint64_t strides[4] = {c * 2, c * 2 * N2, c * 2 * N2 * N1, c * 2 * N2 * N1 * N0};
    cuuint32_t box[5] = {64, (cuuint32_t)box_w, (cuuint32_t)box_h, (cuuint32_t)box_t, 1};
    cuuint32_t ones[5] = {1, 1, 1, 1, 1};
    return encode_fn()(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, const_cast<void *>(ptr), dims, strides, box, ones,
                       CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                       CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

// The shift launch on ``stream`` (the caller's current device): nullptr, or why it did not launch.
const char *xb_na_shift_sm90(const void *q, const void *k, const void *v, void *out, const float *knorm, int *flags,
                             int B, int N0, int N1, int N2, int heads, int ks0, int ks1, int ks2, float qk_scale,
                             float shift_max, cudaStream_t stream) {
    // na_sm90.py checks these (layout_reason) with the rest; repeated so no direct call launches outside them.
    const int ks[3] = {ks0, ks1, ks2}, n[3] = {N0, N1, N2};
    for (int a = 0; a < 3; ++a) {
        if (ks[a] < 1 || ks[a] > kBoxW - 3 || n[a] < ks[a]) return "na_sm90: windows must be 1-11 and fit their axes";
    }
    if (B < 1 || heads < 1 || (long long)B * heads > 65535) return "na_sm90: batch * heads must be 1-65535";
    if (encode_fn() == nullptr) return "the CUDA driver has no cuTensorMapEncodeTiled";
    CUtensorMap tq, tk, tv;
    if (!encode(&tq, q, B, N0, N1, N2, heads, 4, 4, 4) || !encode(&tk, k, B, N0, N1, N2, heads, kBoxW, 2, 2) ||
        !encode(&tv, v, B, N0, N1, N2, heads, kBoxW, 2, 2)) {
        return "cuTensorMapEncodeTiled rejected a tensor";
    }
    // Each CUDA call's own return value is its status: the last-error state is not read before the
    // launch (an earlier, unread error belongs to whoever launched it) and is cleared only of this call's.
    cudaError_t err = cudaFuncSetAttribute(na_shift_sm90, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem);
    if (err == cudaSuccess) {
        const unsigned tiles = (unsigned)(((N0 + 3) / 4) * ((N1 + 3) / 4) * ((N2 + 3) / 4));
        __nv_bfloat16 *o = static_cast<__nv_bfloat16 *>(out);
        const __nv_bfloat16 *qg = static_cast<const __nv_bfloat16 *>(q);
        void *args[] = {&tq, &tk, &tv, &o, &qg, &knorm, &flags, &N0, &N1, &N2, &heads, &ks0, &ks1, &ks2,
                        &qk_scale, &shift_max};
        err = cudaLaunchKernel(reinterpret_cast<const void *>(na_shift_sm90), dim3(tiles, B * heads), dim3(128), args,
                               kSmem, stream);
    }
    if (err != cudaSuccess) {
        (void)cudaGetLastError();  // this call's error, reported here, must not read as a later launch's
        return cudaGetErrorString(err);
    }
    return nullptr;
}
