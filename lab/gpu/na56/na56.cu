// Neighborhood attention's shift walk at head_dim 64 with 56-key KV blocks: the experiment that asks
// whether a key box walked in 2 x 2 x 14 blocks (the exact 14 x 14 x 14 box of a 4 x 4 x 4 Q tile at
// window 11, no block rounded up along axis 2) beats na_triton's 2 x 2 x 16 blocks at the DiffVAE
// stage-5 tile. Triton block shapes are powers of two, so the 56-key block (a TMA box 14 keys wide, a
// wgmma m64n56k16 for q.k) needs hand-written PTX.
//
// One warpgroup (128 threads) a CTA, a 64-query tile (4 x 4 x 4, rows in (t, h, w) order), a 3-slot
// TMA ring of K (56 rows) and V (64 rows, the last 8 zero), scores in registers (28 a thread), the
// exponent shifted by each row's Cauchy-Schwarz bound (no row max, no rescale), p.v as a wgmma with p
// from registers. Window 11 on every axis, stride 1, no dilation, no causal axis, every extent a
// multiple of 4 and at least 11: the launcher checks.
//
//   nvcc -arch=sm_90a -cubin -O3 -o na56.cubin lab/gpu/na56/na56.cu
#include <cuda.h>
#include <cuda_bf16.h>
#include <stdint.h>

#include "../../../xbackend/kernels/sm90_ptx.cuh"

#define KS 11
#define STAGES 3
#define K_BYTES (56 * 128)
#define V_BYTES (64 * 128)
#define Q_BYTES (64 * 128)
#ifndef QREG
#define QREG 0
#endif
#ifndef SKIP
#define SKIP 0
#endif
#ifndef OVERLAP
#define OVERLAP 0
#endif
// LATE_REFILL: block i refills the freed slot after issuing its p.v, under the tensor cores, rather
// than between its q.k wait and its softmax (where the issuing warp holds up the warpgroup's p.v).
#ifndef LATE_REFILL
#define LATE_REFILL 0
#endif
#ifndef MIN_CTAS
#define MIN_CTAS 4
#endif

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

extern "C" __global__ void __launch_bounds__(128, MIN_CTAS)
    na56_fwd(const __grid_constant__ CUtensorMap tq, const __grid_constant__ CUtensorMap tk,
             const __grid_constant__ CUtensorMap tv, __nv_bfloat16 *__restrict__ out,
             const __nv_bfloat16 *__restrict__ qg, const float *__restrict__ knorm, int *__restrict__ flags, int N0,
             int N1, int N2, int heads, float qk_scale, float shift_max) {
    extern __shared__ uint8_t smem_raw[];
    __shared__ __align__(8) uint64_t full_k[STAGES];
    __shared__ __align__(8) uint64_t full_v[STAGES];
    __shared__ __align__(8) uint64_t q_bar;
    __shared__ float row_bound[64];
    __shared__ int tile_ok;

    const int tid = threadIdx.x;
    const int warp = tid >> 5;
    const int lane = tid & 31;
    uint8_t *base = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sq = base;
    uint8_t *sk = sq + Q_BYTES;
    uint8_t *sv = sk + STAGES * K_BYTES;
    const uint32_t sq_a = smem_u32(sq), sk_a = smem_u32(sk), sv_a = smem_u32(sv);

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
    const int col = head * 64;

    // V's rows 56-63 stay zero (p's pad columns are zero too: 0 * 0, never 0 * garbage).
    for (int i = tid; i < STAGES * 8 * 128 / 16; i += 128) {
        int s = i / 64, off = (i % 64) * 16;
        *reinterpret_cast<uint4 *>(sv + s * V_BYTES + 56 * 128 + off) = make_uint4(0, 0, 0, 0);
    }
    if (tid == 0) {
        for (int s = 0; s < STAGES; ++s) {
            mbar_init(smem_u32(&full_k[s]), 1);
            mbar_init(smem_u32(&full_v[s]), 1);
        }
        mbar_init(smem_u32(&q_bar), 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();

    if (tid == 0) {
        mbar_expect_tx(smem_u32(&q_bar), Q_BYTES);
        tma_load_5d(sq_a, &tq, smem_u32(&q_bar), col, a2, a1, a0, b);
        for (int i = 0; i < STAGES && i < n_blocks; ++i) {
            int c0 = lo0 + 2 * (i / nb1), c1 = lo1 + 2 * (i % nb1);
            mbar_expect_tx(smem_u32(&full_k[i]), K_BYTES);
            tma_load_5d(sk_a + i * K_BYTES, &tk, smem_u32(&full_k[i]), col, lo2, c1, c0, b);
            mbar_expect_tx(smem_u32(&full_v[i]), K_BYTES);
            tma_load_5d(sv_a + i * V_BYTES, &tv, smem_u32(&full_v[i]), col, lo2, c1, c0, b);
        }
    }

    // Row bounds |q| * max|k| * scale from global memory (two threads a row), while the loads fly.
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
        // Drain the issued loads before the CTA exits.
        mbar_wait(smem_u32(&q_bar), 0);
        for (int i = 0; i < STAGES && i < n_blocks; ++i) {
            mbar_wait(smem_u32(&full_k[i]), 0);
            mbar_wait(smem_u32(&full_v[i]), 0);
        }
        return;
    }

    // This thread's two rows and 14 score columns (wgmma accumulator layout).
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    const float negm0 = -row_bound[r0], negm1 = -row_bound[r1];
    const int qs0_0 = win_start(a0 + (r0 >> 4), N0), qs0_1 = win_start(a0 + (r1 >> 4), N0);
    const int qs1_0 = win_start(a1 + ((r0 >> 2) & 3), N1), qs1_1 = win_start(a1 + ((r1 >> 2) & 3), N1);
    const int qs2_0 = win_start(a2 + (r0 & 3), N2), qs2_1 = win_start(a2 + (r1 & 3), N2);
    // Column slot i (0..13): key column c = 8 (i / 2) + 2 (lane % 4) + i % 2 of the block's 56, which
    // is key (c / 28, c / 14 % 2, c % 14) of the 2 x 2 x 14 box. Masks over the 14 slots: the axis-2
    // window of each row (fixed for the tile: one block spans the box along axis 2) and each slot's
    // (axis-0, axis-1) offset group.
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
    uint32_t pa[4][4];

    mbar_wait(smem_u32(&q_bar), 0);
#if QREG
    // q as wgmma A fragments in registers (ldmatrix from the 128-byte-swizzled tile): 16 registers
    // against an 8 KiB shared-memory read a block.
    uint32_t qa[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        int m = lane >> 3, row = warp * 16 + (m & 1) * 8 + (lane & 7), chunk = 2 * k + (m >> 1);
        uint32_t addr = sq_a + row * 128 + ((chunk ^ (row & 7)) << 4);
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                     : "=r"(qa[k][0]), "=r"(qa[k][1]), "=r"(qa[k][2]), "=r"(qa[k][3])
                     : "r"(addr));
    }
#else
    const uint64_t dq = desc_sw128(sq_a);
#endif

    // q.k of the block in ``slot`` into s (asynchronous: committed, not waited).
    auto issue_qk = [&](int slot) {
        const uint64_t dk = desc_sw128(sk_a + slot * K_BYTES);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) {
#if QREG
            wgmma_qk_rs(s, qa[k], dk + 2 * k, k);
#else
            wgmma_qk(s, dq + 2 * k, dk + 2 * k, k);
#endif
        }
        wg_commit();
    };
    // p.v of the block in ``slot`` from pa into acc (asynchronous).
    auto issue_pv = [&](int slot) {
        const uint64_t dv = desc_sw128(sv_a + slot * V_BYTES);
        wg_fence();
#pragma unroll
        for (int k = 0; k < 4; ++k) wgmma_pv(acc, pa[k], dv + 128 * k);
        wg_commit();
    };
    // s -> exp2(s * scale - bound) in place, -inf (so 0) outside each row's window; row sums into l.
    auto softmax = [&](int c0, int c1) {
        const uint32_t t00 = in_win(c0, qs0_0), t01 = in_win(c0 + 1, qs0_0);
        const uint32_t t10 = in_win(c0, qs0_1), t11 = in_win(c0 + 1, qs0_1);
#if SKIP
        // A warp's 16 rows share one axis-0 query (row = 16 t + 4 h + w): where neither of the block's
        // two axis-0 offsets is in its window (one block in seven), p is 0 without the exponents.
        if (!(t00 | t01)) {
#pragma unroll
            for (int j = 0; j < 28; ++j) s[j] = 0.f;
            return;
        }
#endif
        const uint32_t h00 = in_win(c1, qs1_0), h01 = in_win(c1 + 1, qs1_0);
        const uint32_t h10 = in_win(c1, qs1_1), h11 = in_win(c1 + 1, qs1_1);
        const uint32_t m0 = wmask0 & (((t00 & h00) ? g0m : 0) | ((t00 & h01) ? g1m : 0) |
                                      ((t01 & h00) ? g2m : 0) | ((t01 & h01) ? g3m : 0));
        const uint32_t m1 = wmask1 & (((t10 & h10) ? g0m : 0) | ((t10 & h11) ? g1m : 0) |
                                      ((t11 & h10) ? g2m : 0) | ((t11 & h11) ? g3m : 0));
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            // s[4j + 0, 1]: row r0, slots 2j, 2j+1; s[4j + 2, 3]: row r1.
            s[4 * j + 0] = ex2(fmaf(s[4 * j + 0], qk_scale, ((m0 >> (2 * j)) & 1) ? negm0 : -INFINITY));
            s[4 * j + 1] = ex2(fmaf(s[4 * j + 1], qk_scale, ((m0 >> (2 * j + 1)) & 1) ? negm0 : -INFINITY));
            s[4 * j + 2] = ex2(fmaf(s[4 * j + 2], qk_scale, ((m1 >> (2 * j)) & 1) ? negm1 : -INFINITY));
            s[4 * j + 3] = ex2(fmaf(s[4 * j + 3], qk_scale, ((m1 >> (2 * j + 1)) & 1) ? negm1 : -INFINITY));
            l0 += s[4 * j + 0] + s[4 * j + 1];
            l1 += s[4 * j + 2] + s[4 * j + 3];
        }
    };
    // p as bf16 A fragments: k16 step j / 2 holds {row r0, cols 0-7}, {r1, 0-7}, {r0, 8-15}, {r1, 8-15}.
    auto pack_p = [&]() {
#pragma unroll
        for (int j = 0; j < 7; ++j) {
            pa[j >> 1][(j & 1) * 2 + 0] = pack_bf16(s[4 * j + 0], s[4 * j + 1]);
            pa[j >> 1][(j & 1) * 2 + 1] = pack_bf16(s[4 * j + 2], s[4 * j + 3]);
        }
        pa[3][2] = 0u;
        pa[3][3] = 0u;
    };
    auto load_k = [&](int slot, int d0, int d1) {
        uint32_t bar = smem_u32(&full_k[slot]);
        mbar_expect_tx(bar, K_BYTES);
        tma_load_5d(sk_a + slot * K_BYTES, &tk, bar, col, lo2, d1, d0, b);
    };
    auto load_v = [&](int slot, int d0, int d1) {
        uint32_t bar = smem_u32(&full_v[slot]);
        mbar_expect_tx(bar, K_BYTES);
        tma_load_5d(sv_a + slot * V_BYTES, &tv, bar, col, lo2, d1, d0, b);
    };
    auto step = [&](int &d0, int &d1) {
        d1 += 2;
        if (d1 >= lo1 + 2 * nb1) {
            d1 = lo1;
            d0 += 2;
        }
    };

    int c0 = lo0, c1 = lo1;
    // The next blocks to load, by carried counters (a divide costs ~40 instructions a trip).
    int ek0 = lo0 + 2 * (STAGES / nb1), ek1 = lo1 + 2 * (STAGES % nb1);
#if !OVERLAP
    for (int i = 0; i < n_blocks; ++i) {
        const int slot = i % STAGES;
        mbar_wait(smem_u32(&full_k[slot]), (i / STAGES) & 1);
        issue_qk(slot);
        wg_wait<0>();  // this block's q.k and the previous block's p.v
        fence_regs(s);
        fence_regs(acc);
        // The previous block's slot is free once every warp's p.v has read it: refill it.
        auto refill = [&]() {
            if (i >= 1 && i + STAGES - 1 < n_blocks) {
                asm volatile("bar.sync 1, 128;" ::: "memory");
                if (tid == 0) {
                    load_k((i - 1) % STAGES, ek0, ek1);
                    load_v((i - 1) % STAGES, ek0, ek1);
                }
                step(ek0, ek1);
            }
        };
        if (!LATE_REFILL) refill();
        softmax(c0, c1);
        pack_p();
        mbar_wait(smem_u32(&full_v[slot]), (i / STAGES) & 1);
        issue_pv(slot);
        if (LATE_REFILL) refill();
        step(c0, c1);
    }
#else
    // The softmax of block i under the tensor cores' p.v of block i - 1: q.k(i) and p.v(i - 1) are
    // issued together, q.k(i) waited, the softmax run, then p.v(i - 1) waited before p is rewritten.
    // K and V slots refill separately: K(i + 2) where K(i - 1) was, V(i + 1) where V(i - 2) was.
    int ev0 = ek0, ev1 = ek1;  // V's next block (block STAGES, loaded at i = 2)
    mbar_wait(smem_u32(&full_k[0]), 0);
    issue_qk(0);
    wg_wait<0>();
    fence_regs(s);
    softmax(c0, c1);
    pack_p();
    step(c0, c1);
    for (int i = 1; i < n_blocks; ++i) {
        const int slot = i % STAGES, prev = (i - 1) % STAGES;
        mbar_wait(smem_u32(&full_k[slot]), (i / STAGES) & 1);
        issue_qk(slot);
        mbar_wait(smem_u32(&full_v[prev]), ((i - 1) / STAGES) & 1);
        issue_pv(prev);
        wg_wait<1>();  // q.k(i); p.v(i - 1) may still run
        fence_regs(s);
        asm volatile("bar.sync 1, 128;" ::: "memory");  // every warp's q.k(i - 1) and p.v(i - 2) done
        if (i + STAGES - 1 < n_blocks) {
            if (tid == 0) load_k(prev, ek0, ek1);
            step(ek0, ek1);
        }
        if (i >= 2 && i + 1 < n_blocks) {
            if (tid == 0) load_v((i - 2) % STAGES, ev0, ev1);
            step(ev0, ev1);
        }
        softmax(c0, c1);
        wg_wait<0>();  // p.v(i - 1): its p registers are rewritten next
        fence_regs(acc);
        pack_p();
        step(c0, c1);
    }
    mbar_wait(smem_u32(&full_v[(n_blocks - 1) % STAGES]), ((n_blocks - 1) / STAGES) & 1);
    issue_pv((n_blocks - 1) % STAGES);
#endif
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
