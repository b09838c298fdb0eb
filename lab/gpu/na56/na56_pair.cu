// The 56-key-block NA kernel (na56.cu) with p.v over pairs of blocks: two blocks' 112 keys are 7
// whole k16 steps, so p.v does no padded step (na56.cu pads every 56-key block to 64: 1/8 of p.v's
// tensor-core work). V of a pair lands in 112 contiguous rows (56 rows = 7 KiB, a multiple of the
// 1 KiB swizzle atom, so the second block's rows continue the first's pattern). Shared memory: q 8 KiB,
// K 2 x 7 KiB, V 2 pairs x 14 KiB (4 CTAs an SM). Same inputs and rules as na56.cu.
//
//   nvcc -arch=sm_90a -cubin -O3 -o na56_pair.cubin lab/gpu/na56/na56_pair.cu
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../../../xbackend/kernels/sm90_ptx.cuh"

#include <type_traits>

#define KS 11
#define K_BYTES (56 * 128)
#define PAIR_BYTES (112 * 128)
#define Q_BYTES (64 * 128)

using namespace xb_sm90;

// s[28] (=|+) q . k over one k16 step: m64n56k16, q from registers.
__device__ __forceinline__ void wgmma_qk_rs(float (&d)[28], const uint32_t (&a)[4], uint64_t db, int accumulate) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %33, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n56k16.f32.bf16.bf16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27}, {%28, %29, %30, %31}, %32, p, 1, 1, 0;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));
}

__device__ __forceinline__ int win_start(int m, int n) { return min(max(m - KS / 2, 0), n - KS); }

__device__ __forceinline__ bool in_win(int key, int start) { return (unsigned)(key - start) < (unsigned)KS; }

extern "C" __global__ void __launch_bounds__(128, 4)
    na56_pair_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
                  const __grid_constant__ CUtensorMap tv, __nv_bfloat16 *__restrict__ out,
                  const __nv_bfloat16 *__restrict__ qg, const float *__restrict__ knorm, int *__restrict__ flags,
                  int N0, int N1, int N2, int heads, float qk_scale, float shift_max) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_k[2];
    __shared__ __align__(8) uint64_t full_v[2];
    __shared__ __align__(8) uint64_t q_bar;
    __shared__ float row_bound[64];
    __shared__ int tile_ok;

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sv = base + Q_BYTES + 2 * K_BYTES;
    const uint32_t sq_a = smem_u32(base), sk_a = sq_a + Q_BYTES, sv_a = smem_u32(sv);

    const int nt2 = N2 >> 2, nt1 = N1 >> 2;
    const int tile = blockIdx.x;
    const int bh = blockIdx.y;
    const int b = bh / heads, head = bh - b * heads;
    const int a0 = (tile / (nt1 * nt2)) << 2;
    const int a1 = ((tile / nt2) % nt1) << 2;
    const int a2 = (tile % nt2) << 2;
    const int lo0 = win_start(a0, N0), lo1 = win_start(a1, N1), lo2 = win_start(a2, N2);
    const int hi0 = win_start(a0 + 3, N0) + KS, hi1 = win_start(a1 + 3, N1) + KS;
    const int nb1 = (hi1 - lo1 + 1) >> 1;
    const int n_blocks = ((hi0 - lo0 + 1) >> 1) * nb1;
    const int n_pairs = (n_blocks + 1) >> 1;
    const int col = head * 64;

    // A last single block's p.v reads its pair slot's rows 56-63 (p is zero there): never stale NaN.
    for (int i = tid; i < 2 * 64; i += 128) {
        *reinterpret_cast<uint4 *>(sv + (i >> 6) * PAIR_BYTES + 56 * 128 + (i & 63) * 16) = make_uint4(0, 0, 0, 0);
    }
    if (tid == 0) {
        for (int s = 0; s < 2; ++s) {
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
        mbar_expect_tx(bar, K_BYTES);
        tma_load_5d(sk_a + slot * K_BYTES, &tk, bar, col, lo2, d1, d0, b);
    };
    // V of pair p (blocks 2p and 2p + 1, the second if it exists) into pair slot p % 2; (d0, d1) is
    // block 2p's first key, advanced past the pair.
    auto step = [&](int &d0, int &d1) {
        d1 += 2;
        if (d1 >= lo1 + 2 * nb1) {
            d1 = lo1;
            d0 += 2;
        }
    };
    auto load_v_pair = [&](int p, int &d0, int &d1) {
        const int slot = p & 1, two = (2 * p + 1 < n_blocks) ? 2 : 1;
        uint32_t bar = smem_u32(&full_v[slot]);
        mbar_expect_tx(bar, two * K_BYTES);
        tma_load_5d(sv_a + slot * PAIR_BYTES, &tv, bar, col, lo2, d1, d0, b);
        step(d0, d1);
        if (two == 2) {
            tma_load_5d(sv_a + slot * PAIR_BYTES + K_BYTES, &tv, bar, col, lo2, d1, d0, b);
            step(d0, d1);
        }
    };
    int ek0 = lo0, ek1 = lo1, ev0 = lo0, ev1 = lo1;  // next K block / next V pair to load (tid 0)
    if (tid == 0) {
        mbar_expect_tx(smem_u32(&q_bar), Q_BYTES);
        tma_load_5d(sq_a, &tq, smem_u32(&q_bar), col, a2, a1, a0, b);
        for (int i = 0; i < 2 && i < n_blocks; ++i) {
            load_k(i, ek0, ek1);
            step(ek0, ek1);
        }
        for (int p = 0; p < 2 && p < n_pairs; ++p) load_v_pair(p, ev0, ev1);
    }

    {
        int r = tid >> 1, half = tid & 1;
        int t = a0 + (r >> 4), h = a1 + ((r >> 2) & 3), w = a2 + (r & 3);
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
        float m = sqrtf(ss) * knorm[bh] * fabsf(qk_scale);
        if (half == 0) row_bound[r] = m;
        int ok = __syncthreads_and(m <= shift_max);
        if (tid == 0) tile_ok = ok;
    }
    __syncthreads();
    if (!tile_ok) {
        if (tid == 0) flags[(size_t)bh * gridDim.x + tile] = 1;
        mbar_wait(smem_u32(&q_bar), 0);
        for (int i = 0; i < 2 && i < n_blocks; ++i) mbar_wait(smem_u32(&full_k[i]), 0);
        for (int p = 0; p < 2 && p < n_pairs; ++p) mbar_wait(smem_u32(&full_v[p]), 0);
        return;
    }

    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const float negm0 = -row_bound[r0], negm1 = -row_bound[r1];
    const int qs0_0 = win_start(a0 + (r0 >> 4), N0), qs0_1 = win_start(a0 + (r1 >> 4), N0);
    const int qs1_0 = win_start(a1 + ((r0 >> 2) & 3), N1), qs1_1 = win_start(a1 + ((r1 >> 2) & 3), N1);
    const int qs2_0 = win_start(a2 + (r0 & 3), N2), qs2_1 = win_start(a2 + (r1 & 3), N2);
    uint32_t wmask0 = 0, wmask1 = 0, g0m = 0, g1m = 0, g2m = 0, g3m = 0;
#pragma unroll
    for (int i = 0; i < 14; ++i) {
        int c = 8 * (i >> 1) + 2 * (lane & 3) + (i & 1);
        int g = (c / 28) * 2 + (c / 14) % 2;
        int w = lo2 + c % 14;
        wmask0 |= (uint32_t)in_win(w, qs2_0) << i;
        wmask1 |= (uint32_t)in_win(w, qs2_1) << i;
        g0m |= (uint32_t)(g == 0) << i;
        g1m |= (uint32_t)(g == 1) << i;
        g2m |= (uint32_t)(g == 2) << i;
        g3m |= (uint32_t)(g == 3) << i;
    }

    float acc[32];
#pragma unroll
    for (int i = 0; i < 32; ++i) acc[i] = 0.f;
    float l0 = 0.f, l1 = 0.f;
    float s[28];
    uint32_t pk[2][7][2];  // p of the pair's two blocks: [block][8-column group][row r0, row r1]
    mbar_wait(smem_u32(&q_bar), 0);
    const uint64_t dq = desc_sw128(sq_a);

    int c0 = lo0, c1 = lo1;
    for (int p = 0; p < n_pairs; ++p) {
#pragma unroll
        for (int hb = 0; hb < 2; ++hb) {
            const int i = 2 * p + hb;
            if (i < n_blocks) {
                const int slot = i & 1;
                mbar_wait(smem_u32(&full_k[slot]), (i >> 1) & 1);
                const uint64_t dk = desc_sw128(sk_a + slot * K_BYTES);
                wg_fence();
#pragma unroll
                for (int k = 0; k < 4; ++k) wgmma_qk(s, dq + 2 * k, dk + 2 * k, k);
                wg_commit();
                wg_wait<0>();  // q.k(i) and, at a pair's first block, the previous pair's p.v
                fence_regs(s);
                fence_regs(acc);
                asm volatile("bar.sync 1, 128;" ::: "memory");  // every warp is past both
                if (tid == 0) {
                    if (i + 2 < n_blocks) {
                        load_k(slot, ek0, ek1);
                        step(ek0, ek1);
                    }
                    if (hb == 0 && p >= 1 && p + 1 < n_pairs) load_v_pair(p + 1, ev0, ev1);
                }
                const uint32_t t00 = in_win(c0, qs0_0), t01 = in_win(c0 + 1, qs0_0);
                const uint32_t t10 = in_win(c0, qs0_1), t11 = in_win(c0 + 1, qs0_1);
                const uint32_t h00 = in_win(c1, qs1_0), h01 = in_win(c1 + 1, qs1_0);
                const uint32_t h10 = in_win(c1, qs1_1), h11 = in_win(c1 + 1, qs1_1);
                const uint32_t m0 = wmask0 & (((t00 & h00) ? g0m : 0) | ((t00 & h01) ? g1m : 0) |
                                              ((t01 & h00) ? g2m : 0) | ((t01 & h01) ? g3m : 0));
                const uint32_t m1 = wmask1 & (((t10 & h10) ? g0m : 0) | ((t10 & h11) ? g1m : 0) |
                                              ((t11 & h10) ? g2m : 0) | ((t11 & h11) ? g3m : 0));
#pragma unroll
                for (int j = 0; j < 7; ++j) {
                    float p0 = ex2(fmaf(s[4 * j + 0], qk_scale, ((m0 >> (2 * j)) & 1) ? negm0 : -INFINITY));
                    float p1 = ex2(fmaf(s[4 * j + 1], qk_scale, ((m0 >> (2 * j + 1)) & 1) ? negm0 : -INFINITY));
                    float p2 = ex2(fmaf(s[4 * j + 2], qk_scale, ((m1 >> (2 * j)) & 1) ? negm1 : -INFINITY));
                    float p3 = ex2(fmaf(s[4 * j + 3], qk_scale, ((m1 >> (2 * j + 1)) & 1) ? negm1 : -INFINITY));
                    l0 += p0 + p1;
                    l1 += p2 + p3;
                    pk[hb][j][0] = pack_bf16(p0, p1);
                    pk[hb][j][1] = pack_bf16(p2, p3);
                }
                c1 += 2;
                if (c1 >= lo1 + 2 * nb1) {
                    c1 = lo1;
                    c0 += 2;
                }
            }
        }
        const bool two = 2 * p + 1 < n_blocks;
        // A last single block: its group 7 (rows 56-63 of the slot, zero in shared memory) is zero.
        pk[1][0][0] = two ? pk[1][0][0] : 0u;
        pk[1][0][1] = two ? pk[1][0][1] : 0u;
        mbar_wait(smem_u32(&full_v[p & 1]), (p >> 1) & 1);
        const uint64_t dv = desc_sw128(sv_a + (p & 1) * PAIR_BYTES);
        // 112 keys (a single last block: its 64): k16 step kk takes 8-column groups 2 kk and 2 kk + 1.
        auto pv_steps = [&](auto n_steps) {
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < decltype(n_steps)::value; ++kk) {
                const int g = 2 * kk, h = 2 * kk + 1;
                const uint32_t a[4] = {pk[g / 7][g % 7][0], pk[g / 7][g % 7][1], pk[h / 7][h % 7][0],
                                       pk[h / 7][h % 7][1]};
                wgmma_pv(acc, a, dv + 128 * kk);
            }
            wg_commit();
        };
        if (two) {
            pv_steps(std::integral_constant<int, 7>{});
        } else {
            pv_steps(std::integral_constant<int, 4>{});
        }
    }
    wg_wait<0>();
    fence_regs(acc);

    l0 += __shfl_xor_sync(0xffffffff, l0, 1);
    l0 += __shfl_xor_sync(0xffffffff, l0, 2);
    l1 += __shfl_xor_sync(0xffffffff, l1, 1);
    l1 += __shfl_xor_sync(0xffffffff, l1, 2);
    const float inv0 = 1.f / l0, inv1 = 1.f / l1;
    const size_t rs = (size_t)heads * 64;
    auto row_ptr = [&](int r) {
        int t = a0 + (r >> 4), h = a1 + ((r >> 2) & 3), w = a2 + (r & 3);
        return out + ((((size_t)b * N0 + t) * N1 + h) * N2 + w) * rs + col;
    };
    __nv_bfloat16 *o0 = row_ptr(r0), *o1 = row_ptr(r1);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
        int c = 8 * j + 2 * (lane & 3);
        *reinterpret_cast<uint32_t *>(o0 + c) = pack_bf16(acc[4 * j + 0] * inv0, acc[4 * j + 1] * inv0);
        *reinterpret_cast<uint32_t *>(o1 + c) = pack_bf16(acc[4 * j + 2] * inv1, acc[4 * j + 3] * inv1);
    }
}
