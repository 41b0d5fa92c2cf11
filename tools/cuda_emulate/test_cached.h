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
