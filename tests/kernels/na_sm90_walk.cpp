// Host run of na_sm90.cu's walk (na_sm90_walk.cuh, the functions the kernel computes) over every tile,
// thread and row of each shape read from stdin ("N0 N1 N2 ks0 ks1 ks2" a line). For each shape it
// checks that the blocks are loaded in the order they are consumed (the 3-slot ring's prologue and
// refill counters against the consumer's) and that every stored row's masked columns, mapped to keys
// through the wgmma accumulator layout and the TMA box, are a ks0 x ks1 x ks2 box of in-range keys,
// each key once. It prints the box's start per query position along each axis, for
// test_na_sm90.py to compare with the op's reference windows, or the first violation.
//
//   c++ -std=c++17 -O2 -I xbackend/kernels tests/kernels/na_sm90_walk.cpp -o walk
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "na_sm90_walk.cuh"

using namespace xb_na_sm90;

namespace {

constexpr int kStages = 3;  // na_sm90.cu's ring

struct Query {
    int count = 0;
    int lo[3] = {1 << 30, 1 << 30, 1 << 30};
    int hi[3] = {-1, -1, -1};
    std::vector<bool> seen;  // over the tile's key box, indexed from its corner
};

std::string run(const int n[3], const int ks[3], std::vector<int> starts[3]) {
    char msg[256];
    for (int a = 0; a < 3; ++a) starts[a].assign(n[a], -1);
    const int nt[3] = {(n[0] + 3) / 4, (n[1] + 3) / 4, (n[2] + 3) / 4};
    for (int t0 = 0; t0 < nt[0]; ++t0)
        for (int t1 = 0; t1 < nt[1]; ++t1)
            for (int t2 = 0; t2 < nt[2]; ++t2) {
                const int a0 = 4 * t0, a1 = 4 * t1, a2 = 4 * t2;
                const Box box0 = axis_box(a0, n[0], ks[0]), box1 = axis_box(a1, n[1], ks[1]);
                const Box box2 = axis_box(a2, n[2], ks[2]);
                if (box2.hi - box2.lo > kBoxW) {
                    std::snprintf(msg, sizeof msg, "tile %d,%d,%d: axis-2 box %d wider than a block", a0, a1, a2,
                                  box2.hi - box2.lo);
                    return msg;
                }
                const int lo0 = box0.lo, lo1 = box1.lo, lo2 = box2.lo;
                const int nb1 = blocks_along(box1), n_blocks = blocks_along(box0) * nb1;
                // The consumer's order, and the loader's: blocks 0-2 by index, then its carried counters.
                std::vector<std::pair<int, int>> eat, load;
                for (int i = 0, c0 = lo0, c1 = lo1; i < n_blocks; ++i, next_block(c0, c1, lo1, nb1)) eat.push_back({c0, c1});
                for (int i = 0; i < kStages && i < n_blocks; ++i) load.push_back({lo0 + 2 * (i / nb1), lo1 + 2 * (i % nb1)});
                for (int i = kStages, e0 = lo0 + 2 * (kStages / nb1), e1 = lo1 + 2 * (kStages % nb1); i < n_blocks;
                     ++i, next_block(e0, e1, lo1, nb1))
                    load.push_back({e0, e1});
                if (eat != load) {
                    std::snprintf(msg, sizeof msg, "tile %d,%d,%d: loads and consumption differ in order", a0, a1, a2);
                    return msg;
                }
                const int bw[3] = {box0.hi - lo0 + 1, box1.hi - lo1 + 1, kBoxW};
                std::vector<Query> rows(64);
                for (auto &q : rows) q.seen.assign(bw[0] * bw[1] * bw[2], false);
                for (int warp = 0; warp < 4; ++warp)
                    for (int lane = 0; lane < 32; ++lane) {
                        const int r0 = warp * 16 + (lane >> 2), r1 = r0 + 8;
                        const int qs0 = row_start(a0, warp, n[0], ks[0]);
                        const int qs1_0 = row_start(a1, (r0 >> 2) & 3, n[1], ks[1]);
                        const int qs1_1 = row_start(a1, (r1 >> 2) & 3, n[1], ks[1]);
                        const SlotMasks sm = slot_masks(lane, lo2, row_start(a2, r0 & 3, n[2], ks[2]), ks[2]);
                        for (const auto &[c0, c1] : eat) {
                            const uint32_t t0 = in_win(c0, qs0, ks[0]), t1 = in_win(c0 + 1, qs0, ks[0]);
                            const uint32_t h00 = in_win(c1, qs1_0, ks[1]), h01 = in_win(c1 + 1, qs1_0, ks[1]);
                            const uint32_t h10 = in_win(c1, qs1_1, ks[1]), h11 = in_win(c1 + 1, qs1_1, ks[1]);
                            const uint32_t masks[2] = {row_mask(sm, t0, t1, h00, h01), row_mask(sm, t0, t1, h10, h11)};
                            for (int half = 0; half < 2; ++half) {
                                const int r = half ? r1 : r0;
                                for (int i = 0; i < 14; ++i) {
                                    if (!((masks[half] >> i) & 1)) continue;
                                    // Slot i holds accumulator column 8 (i / 2) + 2 (lane % 4) + i % 2; the
                                    // block's rows are its TMA box [2][2][14], axis 2 fastest.
                                    const int c = 8 * (i / 2) + 2 * (lane % 4) + i % 2;
                                    const int key[3] = {c0 + c / 28, c1 + (c / 14) % 2, lo2 + c % 14};
                                    for (int a = 0; a < 3; ++a) {
                                        if (key[a] < 0 || key[a] >= n[a]) {
                                            std::snprintf(msg, sizeof msg, "tile %d,%d,%d row %d: key out of axis %d",
                                                          a0, a1, a2, r, a);
                                            return msg;
                                        }
                                    }
                                    Query &q = rows[r];
                                    const int at = ((key[0] - lo0) * bw[1] + (key[1] - lo1)) * bw[2] + (key[2] - lo2);
                                    if (q.seen[at]) {
                                        std::snprintf(msg, sizeof msg, "tile %d,%d,%d row %d: a key twice", a0, a1, a2, r);
                                        return msg;
                                    }
                                    q.seen[at] = true;
                                    ++q.count;
                                    for (int a = 0; a < 3; ++a) {
                                        q.lo[a] = key[a] < q.lo[a] ? key[a] : q.lo[a];
                                        q.hi[a] = key[a] > q.hi[a] ? key[a] : q.hi[a];
                                    }
                                }
                            }
                        }
                    }
                for (int r = 0; r < 64; ++r) {
                    const int pos[3] = {a0 + r / 16, a1 + (r / 4) % 4, a2 + r % 4};
                    if (pos[0] >= n[0] || pos[1] >= n[1] || pos[2] >= n[2]) continue;  // not stored
                    const Query &q = rows[r];
                    // No key twice, ks0 ks1 ks2 keys, each axis spanning ks: exactly the box from q.lo.
                    bool box = q.count == ks[0] * ks[1] * ks[2];
                    for (int a = 0; a < 3; ++a) box = box && q.hi[a] - q.lo[a] == ks[a] - 1;
                    if (!box) {
                        std::snprintf(msg, sizeof msg, "query %d,%d,%d: %d keys, not a %dx%dx%d box", pos[0], pos[1],
                                      pos[2], q.count, ks[0], ks[1], ks[2]);
                        return msg;
                    }
                    for (int a = 0; a < 3; ++a) {
                        int &s = starts[a][pos[a]];
                        if (s != -1 && s != q.lo[a]) {
                            std::snprintf(msg, sizeof msg, "axis %d position %d: window start %d and %d", a, pos[a], s,
                                          q.lo[a]);
                            return msg;
                        }
                        s = q.lo[a];
                    }
                }
            }
    return "";
}

}  // namespace

int main() {
    int n[3], ks[3];
    while (std::scanf("%d %d %d %d %d %d", &n[0], &n[1], &n[2], &ks[0], &ks[1], &ks[2]) == 6) {
        std::vector<int> starts[3];
        const std::string err = run(n, ks, starts);
        std::printf("%d %d %d %d %d %d |", n[0], n[1], n[2], ks[0], ks[1], ks[2]);
        if (!err.empty()) {
            std::printf(" error %s\n", err.c_str());
            continue;
        }
        for (int a = 0; a < 3; ++a) {
            for (int s : starts[a]) std::printf(" %d", s);
            std::printf(a < 2 ? " |" : "\n");
        }
    }
    return 0;
}
