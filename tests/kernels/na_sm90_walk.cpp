// Host run of na_sm90.cu's walk (na_sm90_walk.cuh, the functions the kernel computes) over every tile,
// thread and row of each shape read from stdin ("N0 N1 N2 ks0 ks1 ks2" a line). For each shape it
// checks that the blocks are loaded in the order they are consumed (the 3-slot ring's prologue and
// refill counters against the consumer's), that every stored row's masked columns, mapped to keys
// through the wgmma accumulator layout and the TMA box, are a ks0 x ks1 x ks2 box of in-range keys,
// each key once, and that the tile walks no more blocks than the union of its rows' windows needs.
// It prints the box's start per query position along each axis, for test_na_sm90.py to compare with
// the op's reference windows, or the first violation.
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
    for (int ti = 0; ti < nt[0]; ++ti)
        for (int tj = 0; tj < nt[1]; ++tj)
            for (int tk = 0; tk < nt[2]; ++tk) {
                const int a0 = 4 * ti, a1 = 4 * tj, a2 = 4 * tk;
                const Walk wk = tile_walk(a0, a1, a2, n[0], n[1], n[2], ks[0], ks[1], ks[2]);
                const int lo0 = wk.lo0, lo1 = wk.lo1, lo2 = wk.lo2, corner[3] = {lo0, lo1, lo2};
                // The consumer's order, and the loader's: blocks 0-2 by index, then its carried counters.
                std::vector<std::pair<int, int>> eat, load;
                for (int i = 0, c0 = lo0, c1 = lo1; i < wk.n_blocks; ++i, next_block(wk, c0, c1)) eat.push_back({c0, c1});
                for (int i = 0; i < kStages && i < wk.n_blocks; ++i) {
                    int d0, d1;
                    block_at(wk, i, d0, d1);
                    load.push_back({d0, d1});
                }
                int e0, e1;
                block_at(wk, kStages, e0, e1);
                for (int i = kStages; i < wk.n_blocks; ++i, next_block(wk, e0, e1)) load.push_back({e0, e1});
                if (eat != load) {
                    std::snprintf(msg, sizeof msg, "tile %d,%d,%d: loads and consumption differ in order", a0, a1, a2);
                    return msg;
                }
                // The key box's extent along each axis (the walk's blocks cover it: 2 x 2 x 14 keys each).
                const int bw[3] = {2 * (wk.n_blocks / wk.nb1), 2 * wk.nb1, 14};
                std::vector<Query> rows(64);
                for (auto &q : rows) q.seen.assign(bw[0] * bw[1] * bw[2], false);
                for (int warp = 0; warp < 4; ++warp)
                    for (int lane = 0; lane < 32; ++lane) {
                        // The wgmma accumulator layout: a thread's rows are 16 warp + lane / 4 and 8 more.
                        const int r0 = warp * 16 + lane / 4, r1 = r0 + 8;
                        const Rows tr = thread_rows(wk, warp, lane, a0, a1, a2, n[0], n[1], n[2], ks[0], ks[1], ks[2]);
                        for (const auto &[c0, c1] : eat) {
                            const Masks mk = block_masks(tr, c0, c1);
                            const uint32_t masks[2] = {mk.m0, mk.m1};
                            for (int half = 0; half < 2; ++half) {
                                const int r = half ? r1 : r0;
                                for (int i = 0; i < 14; ++i) {
                                    if (!((masks[half] >> i) & 1)) continue;
                                    // Slot i holds accumulator column 8 (i / 2) + 2 (lane % 4) + i % 2; the
                                    // block's rows are its TMA box [2][2][14], axis 2 fastest.
                                    const int c = 8 * (i / 2) + 2 * (lane % 4) + i % 2;
                                    const int key[3] = {c0 + c / 28, c1 + (c / 14) % 2, lo2 + c % 14};
                                    for (int a = 0; a < 3; ++a) {
                                        if (key[a] < 0 || key[a] >= n[a] || key[a] - corner[a] >= bw[a]) {
                                            std::snprintf(msg, sizeof msg,
                                                          "tile %d,%d,%d row %d: key out of axis %d or of the box", a0,
                                                          a1, a2, r, a);
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
                // The box is the union of the stored rows' windows (no block walked for nothing): its
                // corner is their smallest start, and its extent ceil(union / 2) blocks of 2 along axes
                // 0 and 1, at most one block of 14 along axis 2.
                int ulo[3] = {1 << 30, 1 << 30, 1 << 30}, uhi[3] = {-1, -1, -1};
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
                        ulo[a] = q.lo[a] < ulo[a] ? q.lo[a] : ulo[a];
                        uhi[a] = q.hi[a] + 1 > uhi[a] ? q.hi[a] + 1 : uhi[a];
                    }
                }
                for (int a = 0; a < 3; ++a) {
                    const int want = a < 2 ? 2 * ((uhi[a] - ulo[a] + 1) / 2) : 14;
                    if (corner[a] != ulo[a] || bw[a] != want || uhi[a] - ulo[a] > want) {
                        std::snprintf(msg, sizeof msg, "tile %d,%d,%d: axis %d walks [%d, %d), the rows need [%d, %d)",
                                      a0, a1, a2, a, corner[a], corner[a] + bw[a], ulo[a], uhi[a]);
                        return msg;
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
