// experts.cu's grouped form of mul_mat_experts_cached (verify windows with an expert cache)
// against the per-pair kernel: bit for bit, resident and non-resident experts, ids past
// n_expert and negative ones, activations per token and per slot. Included by main.cpp.
#pragma once

static void test_cached_grouped() {
    for (const Fmt& f : FORMATS) {
        if (fmt_only.empty() ? (f.id != T_Q4_K && f.id != T_Q8_0 && f.id != T_F16 && f.id != T_IQ2_XS && f.id != T_Q4_1)
                             : fmt_only.find(std::string(",") + f.name + ",") == std::string::npos)
            continue;
        const int m = 40, k = 512, n_exp = 6, n_slots = 4;
        const size_t rb = f.qk == 1 ? (size_t)k * f.bytes : (size_t)(k / f.qk) * f.bytes;
        const uint64_t offset = 64, slot_bytes = offset + rb * m + 32;
        std::vector<uint8_t> slots;
        for (int s = 0; s < n_slots; s++) {
            slots.insert(slots.end(), offset, 0xAB);
            auto we = random_weights(f, m, k);
            slots.insert(slots.end(), we.begin(), we.end());
            slots.insert(slots.end(), 32, 0xEE);
        }
        // Experts 0, 2, 4, 5 resident (in shuffled slots), 1 and 3 left to the CPU pool.
        const std::vector<int32_t> table = {2, -1, 0, -1, 3, 1};
        for (auto [n_tokens, n_used] : std::vector<std::pair<int, int>>{{3, 2}, {5, 3}, {9, 2}})
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                const int pairs = n_tokens * n_used;
                std::vector<int32_t> ids(pairs);
                for (auto& i : ids) i = rng() % n_exp;
                ids[1] = n_exp;  // past n_expert: NaN rows
                if (pairs > 4) ids[4] = -1;  // invalid: NaN rows
                const int xr = per_slot ? pairs : n_tokens;
                std::vector<float> x((size_t)xr * k);
                for (auto& v : x) v = urand(2.0f);
                std::vector<float> a((size_t)pairs * m, -7.0f), b(a.size(), -7.0f);
                launch(ops_grid(a.size()), 256, [&] {
                    mul_mat_experts_cached(slots.data(), table.data(), x.data(), ids.data(), a.data(), f.id, m, k,
                                           n_tokens, n_used, per_slot, n_exp, slot_bytes, offset);
                });
                launch(3, 256, [&] {
                    mul_mat_experts_cached_grouped(slots.data(), table.data(), x.data(), ids.data(), b.data(), f.id,
                                                   m, k, n_tokens, n_used, per_slot, n_exp, slot_bytes, offset);
                });
                bool untouched = true;  // the pool's pairs keep what was there
                for (int p = 0; p < pairs; p++)
                    if (ids[p] >= 0 && ids[p] < n_exp && table[ids[p]] < 0)
                        for (int r = 0; r < m; r++) untouched = untouched && b[(size_t)p * m + r] == -7.0f;
                char what[200];
                snprintf(what, sizeof what, "mul_mat_experts_cached_grouped %s tokens %d used %d per_slot %d (bit-exact)",
                         f.name, n_tokens, n_used, per_slot);
                report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 && untouched ? 0.0 : 1.0, 0);
            }
    }
}

// experts.cu's mul_mat_experts_cached_multi (verify windows: an expert's rows read once for
// every pair routed to it) against the per-pair kernel, bit for bit: windows of 1..8 tokens
// and one past MVW_PAIRS pairs (its per-pair units), experts shared by several tokens and
// by more than one pass of MVW_TOKENS pairs, experts with no slot (rows untouched), ids
// past n_expert and negative ones (NaN rows), activations per token and per slot, rows
// longer than a pass's chunk (k 2,304: a 2,048-value chunk, then 256), grids with a block
// per unit and with few blocks (grid-stride, staged quants reused), 8 and 4 warps a block.
static void test_cached_multi() {
    for (const Fmt& f : FORMATS) {
        if (fmt_only.empty() ? (f.id != T_Q4_K && f.id != T_Q8_0 && f.id != T_F16 && f.id != T_IQ2_XS &&
                                f.id != T_Q4_1 && f.id != T_Q6_K && f.id != T_MXFP4)
                             : fmt_only.find(std::string(",") + f.name + ",") == std::string::npos)
            continue;
        struct Case { int m, k, n_exp, n_tokens, n_used; };
        const std::vector<Case> cases = {
            {40, 512, 16, 2, 8},  {40, 512, 16, 3, 4}, {40, 512, 16, 5, 8}, {24, 512, 12, 8, 8},
            {40, 512, 6, 8, 8},   {40, 512, 16, 1, 8}, {20, 512, 16, 9, 8}, {40, 512, 16, 7, 6},
            {20, 2304, 10, 6, 4},
        };
        for (const Case& c : cases) {
            if (c.k % f.qk != 0) continue;
            const size_t rb = f.qk == 1 ? (size_t)c.k * f.bytes : (size_t)(c.k / f.qk) * f.bytes;
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
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                const int pairs = c.n_tokens * c.n_used;
                // Routing as a model's (distinct experts within a token), from a pool of
                // experts shared across the window; then a repeat within a token and bad ids.
                std::vector<int32_t> ids(pairs);
                for (int t = 0; t < c.n_tokens; t++)
                    for (int j = 0; j < c.n_used; j++) {
                        int32_t e;
                        bool dup;
                        do {
                            e = (int32_t)(rng() % c.n_exp);
                            dup = false;
                            for (int q = 0; q < j; q++) dup = dup || ids[t * c.n_used + q] == e;
                        } while (dup && c.n_used <= c.n_exp);
                        ids[t * c.n_used + j] = e;
                    }
                if (pairs > 3) ids[3] = ids[2];            // the same expert twice in a token
                if (pairs > 1) ids[1] = c.n_exp;           // past n_expert: NaN rows
                if (pairs > 4) ids[4] = -1;                // negative: NaN rows
                if (pairs > 9) ids[9] = c.n_exp + 5;       // another invalid id, same rank
                const int xr = per_slot ? pairs : c.n_tokens;
                std::vector<float> x((size_t)xr * c.k);
                for (auto& v : x) v = urand(2.0f);
                std::vector<float> a((size_t)pairs * c.m, -7.0f);
                launch(ops_grid(a.size()), 256, [&] {
                    mul_mat_experts_cached(slots.data(), table.data(), x.data(), ids.data(), a.data(), f.id, c.m,
                                           c.k, c.n_tokens, c.n_used, per_slot, c.n_exp, slot_bytes, offset);
                });
                struct Cfg { unsigned g, b; } cfgs[] = {
                    {(unsigned)(pairs * ((c.m + 15) / 16)), 256}, {3, 256}, {5, 128}};
                for (const Cfg& g : cfgs) {
                    std::vector<float> b(a.size(), -7.0f);
                    launch(g.g, g.b, [&] {
                        mul_mat_experts_cached_multi(slots.data(), table.data(), x.data(), ids.data(), b.data(),
                                                     f.id, c.m, c.k, c.n_tokens, c.n_used, per_slot, c.n_exp,
                                                     slot_bytes, offset);
                    });
                    bool untouched = true, nan_rows = true;
                    for (int p = 0; p < pairs; p++)
                        for (int r = 0; r < c.m; r++) {
                            const float v = b[(size_t)p * c.m + r];
                            if (ids[p] < 0 || ids[p] >= c.n_exp) nan_rows = nan_rows && std::isnan(v);
                            else if (table[ids[p]] < 0) untouched = untouched && v == -7.0f;
                        }
                    char what[200];
                    snprintf(what, sizeof what,
                             "mul_mat_experts_cached_multi %s m %d k %d tokens %d used %d per_slot %d grid %u/%u",
                             f.name, c.m, c.k, c.n_tokens, c.n_used, per_slot, g.g, g.b);
                    report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 && untouched && nan_rows ? 0.0 : 1.0,
                           0);
                }
            }
        }
    }
}
