// The index math of na_sm90.cu's walk, host and device: which key box a 4 x 4 x 4 query tile walks,
// in which order its 2 x 2 x 14 blocks are loaded and consumed, and which of a thread's 14 score
// columns of a block fall in each of its rows' windows. The kernel computes exactly these functions;
// tests/kernels/na_sm90_walk.cpp runs them on the host over every tile, thread and row of many
// shapes, so a wrong mask is caught on a machine without a GPU.
#pragma once

#include <stdint.h>

#ifdef __CUDACC__
#define XB_WALK __host__ __device__ __forceinline__
#else
#define XB_WALK inline
#endif

namespace xb_na_sm90 {

// Keys of a block along axis 2 (a tile's box there is window + 3 <= 14): a block is 2 x 2 x 14 = 56
// keys, q.k's wgmma n = 56.
constexpr int kBoxW = 14;

XB_WALK int imin(int a, int b) { return a < b ? a : b; }
XB_WALK int imax(int a, int b) { return a > b ? a : b; }

// NATTEN's window start: centred, shifted inward at the axis ends.
XB_WALK int win_start(int m, int n, int ks) { return imin(imax(m - ks / 2, 0), n - ks); }

XB_WALK bool in_win(int key, int start, int ks) { return (unsigned)(key - start) < (unsigned)ks; }

// The window start of the tile's query at offset o (0-3) from its first, a; a query past the axis end
// takes the last query's window (its row is computed, bounded, and not stored).
XB_WALK int row_start(int a, int o, int n, int ks) { return win_start(imin(a + o, n - 1), n, ks); }

// The tile's key box along one axis, [lo, hi): its first query's window start to its last's end.
struct Box {
    int lo, hi;
};
XB_WALK Box axis_box(int a, int n, int ks) { return {win_start(a, n, ks), row_start(a, 3, n, ks) + ks}; }

// Blocks along axes 0 and 1 are two keys deep: ceil(extent / 2) of them (the last may reach one key
// past the box, masked).
XB_WALK int blocks_along(Box box) { return (box.hi - box.lo + 1) >> 1; }

// A tile's walk: its key box's corner and its blocks (n_blocks, nb1 of them along axis 1).
struct Walk {
    int lo0, lo1, lo2, nb1, n_blocks;
};
XB_WALK Walk tile_walk(int a0, int a1, int a2, int n0, int n1, int n2, int ks0, int ks1, int ks2) {
    const Box b0 = axis_box(a0, n0, ks0), b1 = axis_box(a1, n1, ks1);
    const int nb1 = blocks_along(b1);
    return {b0.lo, b1.lo, axis_box(a2, n2, ks2).lo, nb1, blocks_along(b0) * nb1};
}

// Block i's corner along axes 0 and 1 (axis 1 fastest), by a divide: for the ring's first loads and
// the refill counters' start. The loop steps by next_block instead.
XB_WALK void block_at(const Walk &w, int i, int &c0, int &c1) {
    c0 = w.lo0 + 2 * (i / w.nb1);
    c1 = w.lo1 + 2 * (i % w.nb1);
}

// The walk's next block after (c0, c1). Both the consumer and the loader step by it.
XB_WALK void next_block(const Walk &w, int &c0, int &c1) {
    c1 += 2;
    if (c1 >= w.lo1 + 2 * w.nb1) {
        c1 = w.lo1;
        c0 += 2;
    }
}

// Score column of slot i (0-13) of lane's thread (the wgmma accumulator layout: columns 8 j + 2 (lane
// % 4) + {0, 1}); a block's 56 rows are its TMA box, key (c / 28, c / 14 % 2, c % 14) from its corner.
XB_WALK int slot_column(int lane, int i) { return 8 * (i >> 1) + 2 * (lane & 3) + (i & 1); }

// Over the 14 slots: those in the row's axis-2 window (fixed for the tile, since every block spans the
// box along axis 2) and those of each (axis-0 offset, axis-1 offset) group g = 2 d0 + d1.
struct SlotMasks {
    uint32_t win, g0, g1, g2, g3;
};
XB_WALK SlotMasks slot_masks(int lane, int lo2, int qs2, int ks2) {
    SlotMasks m{0, 0, 0, 0, 0};
#ifdef __CUDACC__
#pragma unroll
#endif
    for (int i = 0; i < kBoxW; ++i) {
        const int c = slot_column(lane, i);
        const int g = (c / (2 * kBoxW)) * 2 + (c / kBoxW) % 2;
        m.win |= (uint32_t)in_win(lo2 + c % kBoxW, qs2, ks2) << i;
        m.g0 |= (uint32_t)(g == 0) << i;
        m.g1 |= (uint32_t)(g == 1) << i;
        m.g2 |= (uint32_t)(g == 2) << i;
        m.g3 |= (uint32_t)(g == 3) << i;
    }
    return m;
}

// A row's slots inside its window in the block whose axis-0 rows c0, c0 + 1 pass the row's axis-0 test
// (t0, t1) and axis-1 rows c1, c1 + 1 pass (h0, h1).
XB_WALK uint32_t row_mask(const SlotMasks &m, uint32_t t0, uint32_t t1, uint32_t h0, uint32_t h1) {
    return m.win & (((t0 & h0) ? m.g0 : 0u) | ((t0 & h1) ? m.g1 : 0u) | ((t1 & h0) ? m.g2 : 0u) |
                    ((t1 & h1) ? m.g3 : 0u));
}

// A thread's two rows, r0 = 16 warp + lane / 4 and r1 = r0 + 8 (the wgmma accumulator layout); row r is
// query (r / 16, r / 4 % 4, r % 4) of the tile. r0 % 16 < 8, so the two rows share their axis-0 and
// axis-2 windows (one test, not two, a block) and differ along axis 1.
struct Rows {
    int qs0, qs1_0, qs1_1, ks0, ks1;
    SlotMasks sm;
};
XB_WALK Rows thread_rows(const Walk &w, int warp, int lane, int a0, int a1, int a2, int n0, int n1, int n2, int ks0,
                         int ks1, int ks2) {
    const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
    return {row_start(a0, warp, n0, ks0), row_start(a1, (r0 >> 2) & 3, n1, ks1), row_start(a1, (r1 >> 2) & 3, n1, ks1),
            ks0, ks1, slot_masks(lane, w.lo2, row_start(a2, r0 & 3, n2, ks2), ks2)};
}

// The slots of rows r0 (m0) and r1 (m1) inside their windows in the block at (c0, c1).
struct Masks {
    uint32_t m0, m1;
};
XB_WALK Masks block_masks(const Rows &r, int c0, int c1) {
    const uint32_t t0 = in_win(c0, r.qs0, r.ks0), t1 = in_win(c0 + 1, r.qs0, r.ks0);
    const uint32_t h00 = in_win(c1, r.qs1_0, r.ks1), h01 = in_win(c1 + 1, r.qs1_0, r.ks1);
    const uint32_t h10 = in_win(c1, r.qs1_1, r.ks1), h11 = in_win(c1 + 1, r.qs1_1, r.ks1);
    return {row_mask(r.sm, t0, t1, h00, h01), row_mask(r.sm, t0, t1, h10, h11)};
}

}  // namespace xb_na_sm90
