// experts.cu's mul_mat_experts_cached_multi_q8 (verify windows over activation rows
// quantised once by quantise_act_q8_window into the scratch) against the per-pair
// mul_mat_experts_cached, bit for bit: Qwen3-30B-A3B-like rows (k 768: a short last step;
// 2,048: two steps), windows of 2..5 tokens of 8 used experts, activations per token and
// per slot, experts with no slot (rows untouched), ids past n_expert and negative ones
// (NaN rows), an expert with more pairs than a pass takes (two passes), row counts no
// multiple of a unit's 16, and grids with a block per unit, few blocks (grid-stride) and
// 4-warp blocks (formats Q4_K, Q6_K, Q8_0, IQ2_XS and Q4_1, for Q8_1's sums, unless
// named). Then what it refuses gives NaN: float weights, more than MVW_PAIRS pairs.
// Included by main.cpp after its helpers.
#pragma once

// A window's routing for the window-unit tests: `n_tokens` tokens of `n_used` experts of
// `n_exp`, distinct within a token where there are enough; with 4 experts, expert 0 in
// every fourth pair (9 valid pairs of it after the tests' bad ids: more than a pass's 8).
static std::vector<int32_t> window_ids(int n_tokens, int n_used, int n_exp) {
    std::vector<int32_t> ids((size_t)n_tokens * n_used);
    for (int t = 0; t < n_tokens; t++)
        for (int j = 0; j < n_used; j++) {
            int32_t e;
            bool dup;
            do {
                e = (int32_t)(rng() % n_exp);
                dup = false;
                for (int q = 0; q < j; q++) dup = dup || ids[t * n_used + q] == e;
            } while (dup && n_used <= n_exp);
            ids[t * n_used + j] = e;
        }
    if (n_exp == 4)
        for (size_t p = 0; p < ids.size(); p += 4) ids[p] = 0;
    return ids;
}

static void test_cached_q8() {
    const uint4 poison = {0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au};
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;  // float weights keep mul_mat_experts_cached_multi
        if (fmt_only.empty() ? (f.id != T_Q4_K && f.id != T_Q6_K && f.id != T_Q8_0 && f.id != T_IQ2_XS &&
                                f.id != T_Q4_1)
                             : fmt_only.find(std::string(",") + f.name + ",") == std::string::npos)
            continue;
        struct Case { int m, k, n_exp, n_tokens; };
        const std::vector<Case> cases = {
            {40, 768, 16, 2}, {40, 2048, 16, 3}, {24, 768, 12, 4}, {40, 2048, 16, 5}, {20, 768, 4, 5},
        };
        const int n_used = 8;
        for (const Case& c : cases) {
            if (c.k % f.qk != 0) continue;
            const size_t rb = (size_t)(c.k / f.qk) * f.bytes;
            const uint64_t offset = 64, slot_bytes = offset + rb * c.m + 32;
            // Two thirds of the experts resident, in shuffled slots; the rest left to the pool.
            std::vector<int32_t> table(c.n_exp, -1);
            int n_slots = 0;
            for (int e = 0; e < c.n_exp; e++)
                if (e % 3 != 1) table[e] = n_slots++;
            for (int e = 0; e + 2 < c.n_exp; e += 4) std::swap(table[e], table[e + 2]);
            std::vector<uint8_t> slots;
            for (int s = 0; s < n_slots; s++) {
                slots.insert(slots.end(), offset, 0xAB);
                auto we = random_weights(f, c.m, c.k);
                slots.insert(slots.end(), we.begin(), we.end());
                slots.insert(slots.end(), 32, 0xEE);
            }
            const int pairs = c.n_tokens * n_used;
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                // window_ids' routing, then a repeat and bad ids.
                std::vector<int32_t> ids = window_ids(c.n_tokens, n_used, c.n_exp);
                ids[3] = ids[2];        // the same expert twice in a token
                ids[1] = c.n_exp;       // past n_expert: NaN rows
                ids[4] = -1;            // negative: NaN rows
                ids[9] = c.n_exp + 5;   // another invalid id, same key
                const int xr = per_slot ? pairs : c.n_tokens;
                std::vector<float> x((size_t)xr * c.k);
                for (int r = 0; r < xr; r++)
                    for (int i = 0; i < c.k; i++) x[(size_t)r * c.k + i] = urand(0.25f + r % 5);
                x[5] = 0.0f;
                std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
                std::vector<float> a((size_t)pairs * c.m, -7.0f);
                launch(ops_grid(a.size()), 256, [&] {
                    mul_mat_experts_cached(slots.data(), table.data(), x.data(), ids.data(), a.data(), f.id, c.m,
                                           c.k, c.n_tokens, n_used, per_slot, c.n_exp, slot_bytes, offset);
                });
                // The scratch: the launch's rows mvq_row_stride apart, 16-byte aligned.
                const size_t stride = ((size_t)c.k * 5 / 4 + 15) / 16 * 16;
                std::vector<uint4> act_buf(stride * xr / 16 + 1);
                uint8_t* act = (uint8_t*)act_buf.data();
                // The backend's grid (a block per unit a window can have) per token, few
                // blocks per slot (grid-stride), and 4-warp blocks once: each launch of many
                // 256-thread blocks takes the emulator long.
                struct Cfg { unsigned g, b; };
                std::vector<Cfg> cfgs = {per_slot ? Cfg{3, 256}
                                                  : Cfg{(unsigned)(std::min(pairs, c.n_exp + 1) * ((c.m + 15) / 16)), 256}};
                if (&c == &cases[0]) cfgs.push_back({5, 128});
                for (const Cfg& g : cfgs) {
                    std::fill(act_buf.begin(), act_buf.end(), poison);
                    std::vector<float> b(a.size(), -7.0f);
                    const unsigned qgrid = (unsigned)xr * ((c.k + 255) / 256);
                    auto args = [&](auto kernel) {
                        kernel(slots.data(), table.data(), x.data(), ids.data(), b.data(), f.id, c.m, c.k,
                               c.n_tokens, n_used, per_slot, c.n_exp, slot_bytes, offset, act);
                    };
                    launch(qgrid, 256, [&] { args(quantise_act_q8_window); });
                    launch(g.g, g.b, [&] { args(mul_mat_experts_cached_multi_q8); });
                    bool untouched = true, nan_rows = true;
                    for (int p = 0; p < pairs; p++)
                        for (int r = 0; r < c.m; r++) {
                            const float v = b[(size_t)p * c.m + r];
                            if (ids[p] < 0 || ids[p] >= c.n_exp) nan_rows = nan_rows && std::isnan(v);
                            else if (table[ids[p]] < 0) untouched = untouched && v == -7.0f;
                        }
                    char what[200];
                    snprintf(what, sizeof what,
                             "mul_mat_experts_cached_multi_q8 %s m %d k %d tokens %d per_slot %d grid %u/%u",
                             f.name, c.m, c.k, c.n_tokens, per_slot, g.g, g.b);
                    report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 && untouched && nan_rows ? 0.0 : 1.0,
                           0);
                }
            }
        }
    }
    // Refused (the backend never sends these): float weights, 9 tokens of 8 (72 pairs).
    const Fmt& f16 = FORMATS[1];
    const Fmt& q4k = FORMATS[10];
    std::vector<uint8_t> slots(64 * 1024, 0);
    std::vector<int32_t> table = {0, 0}, ids(72, 0);
    std::vector<float> x(72 * 256, 1.0f);
    std::vector<uint4> act_buf(72 * 320 / 16 + 1);
    bool nan = true;
    for (auto [ty, n_tokens] : std::vector<std::pair<int, int>>{{f16.id, 2}, {q4k.id, 9}}) {
        std::vector<float> y((size_t)n_tokens * 8 * 4, 0.0f);
        launch(4, 256, [&] {
            mul_mat_experts_cached_multi_q8(slots.data(), table.data(), x.data(), ids.data(), y.data(), ty, 4, 256,
                                            n_tokens, 8, 0, 2, 8192, 0, (uint8_t*)act_buf.data());
        });
        nan = nan && std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); });
    }
    report("mul_mat_experts_cached_multi_q8 float weights or 72 pairs: NaN", nan ? 0.0 : 1.0, 0);
}
