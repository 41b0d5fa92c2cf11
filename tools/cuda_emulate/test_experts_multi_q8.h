// model.cu's mul_mat_experts_multi_q8 (verify windows over resident experts, activation
// rows quantised once by quantise_act_q8_experts) against the per-pair mul_mat_experts_vec,
// bit for bit: Qwen3-30B-A3B-like rows (k 768: a short last step; 2,048: two steps),
// windows of 2..5 tokens of 8 used experts, activations per token and per slot, the same
// expert twice in a token, negative ids (NaN rows), an expert with more pairs than a pass
// takes (two passes), row counts no multiple of a unit's 16, and grids of a block per unit,
// few blocks (grid-stride) and 4-warp blocks (formats Q4_K, Q6_K, Q8_0, IQ2_XS and Q4_1 for
// Q8_1's sums, unless named). Then what it refuses gives NaN: float weights, more than
// MVW_PAIRS pairs. Included by main.cpp after its helpers.
#pragma once

static void test_experts_multi_q8() {
    const uint4 poison = {0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au};
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;  // float weights keep mul_mat_experts
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
            // Experts a few bytes apart beyond their matrices (an expert_bytes that is not
            // the matrix's: the layout of a GGUF tensor's experts is the caller's).
            const size_t rb = (size_t)(c.k / f.qk) * f.bytes, eb = rb * c.m + 4;
            std::vector<uint8_t> w;
            for (int e = 0; e < c.n_exp; e++) {
                auto we = random_weights(f, c.m, c.k);
                w.insert(w.end(), we.begin(), we.end());
                w.insert(w.end(), eb - rb * c.m, 0xEE);
            }
            w.insert(w.end(), 32, 0xEE);
            const int pairs = c.n_tokens * n_used;
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                // window_ids' routing, then a repeat and bad ids.
                std::vector<int32_t> ids = window_ids(c.n_tokens, n_used, c.n_exp);
                ids[3] = ids[2];  // the same expert twice in a token
                ids[1] = -1;      // negative: NaN rows
                ids[9] = -3;      // another, the same key
                const int xr = per_slot ? pairs : c.n_tokens;
                std::vector<float> x((size_t)xr * c.k);
                for (int r = 0; r < xr; r++)
                    for (int i = 0; i < c.k; i++) x[(size_t)r * c.k + i] = urand(0.25f + r % 5);
                x[5] = 0.0f;
                std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
                std::vector<float> a((size_t)pairs * c.m, -7.0f);
                launch(3, 128, [&] {
                    mul_mat_experts_vec(w.data(), x.data(), ids.data(), a.data(), f.id, c.m, c.k, c.n_tokens, n_used,
                                        per_slot, eb);
                });
                // The scratch: the launch's rows mvq_row_stride apart, 16-byte aligned.
                const size_t stride = ((size_t)c.k * 5 / 4 + 15) / 16 * 16;
                std::vector<uint4> act_buf(stride * xr / 16 + 1);
                uint8_t* act = (uint8_t*)act_buf.data();
                // The backend's grid (a block per unit a window can have) per token, few
                // blocks per slot (grid-stride), and 4-warp blocks once.
                struct Cfg { unsigned g, b; };
                std::vector<Cfg> cfgs = {per_slot ? Cfg{3, 256}
                                                  : Cfg{(unsigned)(std::min(pairs, c.n_exp + 1) * ((c.m + 15) / 16)), 256}};
                if (&c == &cases[0]) cfgs.push_back({5, 128});
                for (const Cfg& g : cfgs) {
                    std::fill(act_buf.begin(), act_buf.end(), poison);
                    std::vector<float> b(a.size(), -7.0f);
                    const unsigned qgrid = (unsigned)xr * ((c.k + 255) / 256);
                    auto args = [&](auto kernel) {
                        kernel(w.data(), x.data(), ids.data(), b.data(), f.id, c.m, c.k, c.n_tokens, n_used, per_slot,
                               eb, act);
                    };
                    launch(qgrid, 256, [&] { args(quantise_act_q8_experts); });
                    launch(g.g, g.b, [&] { args(mul_mat_experts_multi_q8); });
                    bool nan_rows = true;
                    for (int p = 0; p < pairs; p++)
                        for (int r = 0; r < c.m; r++)
                            if (ids[p] < 0) nan_rows = nan_rows && std::isnan(b[(size_t)p * c.m + r]);
                    char what[200];
                    snprintf(what, sizeof what, "mul_mat_experts_multi_q8 %s m %d k %d tokens %d per_slot %d grid %u/%u",
                             f.name, c.m, c.k, c.n_tokens, per_slot, g.g, g.b);
                    report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 && nan_rows ? 0.0 : 1.0, 0);
                }
            }
        }
    }
    // Refused (the backend never sends these): float weights, 9 tokens of 8 (72 pairs).
    const Fmt& f16 = FORMATS[1];
    const Fmt& q4k = FORMATS[10];
    std::vector<uint8_t> w(64 * 1024, 0);
    std::vector<int32_t> ids(72, 0);
    std::vector<float> x(72 * 256, 1.0f);
    std::vector<uint4> act_buf(72 * 320 / 16 + 1);
    bool nan = true;
    for (auto [ty, n_tokens] : std::vector<std::pair<int, int>>{{f16.id, 2}, {q4k.id, 9}}) {
        std::vector<float> y((size_t)n_tokens * 8 * 4, 0.0f);
        launch(4, 256, [&] {
            mul_mat_experts_multi_q8(w.data(), x.data(), ids.data(), y.data(), ty, 4, 256, n_tokens, 8, 0, 8192,
                                     (uint8_t*)act_buf.data());
        });
        nan = nan && std::all_of(y.begin(), y.end(), [](float v) { return std::isnan(v); });
    }
    report("mul_mat_experts_multi_q8 float weights or 72 pairs: NaN", nan ? 0.0 : 1.0, 0);
}

// fused.cu's experts_gate_up_multi_q8 (a window's gate, up and SwiGLU over resident
// experts, the rows quantised once by quantise_act_q8_gate_up) against experts_gate_up's
// per-pair units, bit for bit: windows of 2..5 tokens, the same expert twice in a token,
// negative ids (NaN rows), an expert with more pairs than a pass takes, 8- and 4-warp
// blocks, few blocks (grid-stride).
static void test_gate_up_multi_q8() {
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (fmt_only.empty() ? (f.id != T_Q4_K && f.id != T_Q6_K && f.id != T_Q4_1)
                             : fmt_only.find(std::string(",") + f.name + ",") == std::string::npos)
            continue;
        struct Case { int m, k, n_exp, n_tokens; };
        for (const Case& c : std::vector<Case>{{20, 768, 16, 2}, {12, 2048, 12, 5}, {10, 768, 4, 5}}) {
            if (c.k % f.qk != 0) continue;
            const size_t rb = (size_t)(c.k / f.qk) * f.bytes, eb = rb * c.m + 4;
            std::vector<uint8_t> wg, wu;
            for (int e = 0; e < c.n_exp; e++)
                for (auto* w : {&wg, &wu}) {
                    auto we = random_weights(f, c.m, c.k);
                    w->insert(w->end(), we.begin(), we.end());
                    w->insert(w->end(), eb - rb * c.m, 0xEE);
                }
            const int n_used = 8, pairs = c.n_tokens * n_used;
            std::vector<int32_t> ids(pairs);
            for (int t = 0; t < c.n_tokens; t++)
                for (int j = 0; j < n_used; j++) ids[t * n_used + j] = (int32_t)((t * 3 + j * 5 + rng() % 2) % c.n_exp);
            ids[3] = ids[2];
            ids[1] = -1;
            std::vector<float> x((size_t)c.n_tokens * c.k);
            for (auto& v : x) v = urand(1.5f);
            std::vector<float> a((size_t)pairs * c.m, -7.0f);
            launch(5, 128, [&] {
                experts_gate_up(wg.data(), wu.data(), x.data(), ids.data(), a.data(), f.id, c.m, c.k, c.n_tokens,
                                n_used, eb, eb);
            });
            const size_t stride = ((size_t)c.k * 5 / 4 + 15) / 16 * 16;
            std::vector<uint4> act_buf(stride * c.n_tokens / 16 + 1);
            uint8_t* act = (uint8_t*)act_buf.data();
            struct Cfg { unsigned g, b; };
            for (const Cfg& g : std::vector<Cfg>{{(unsigned)(pairs * ((c.m + 3) / 4)), 128}, {3, 256}}) {
                std::vector<float> b(a.size(), -7.0f);
                auto args = [&](auto kernel) {
                    kernel(wg.data(), wu.data(), x.data(), ids.data(), b.data(), f.id, c.m, c.k, c.n_tokens, n_used,
                           eb, eb, act);
                };
                launch((unsigned)c.n_tokens * ((c.k + 255) / 256), 256, [&] { args(quantise_act_q8_gate_up); });
                launch(g.g, g.b, [&] { args(experts_gate_up_multi_q8); });
                char what[200];
                snprintf(what, sizeof what, "experts_gate_up_multi_q8 %s m %d k %d tokens %d grid %u/%u", f.name,
                         c.m, c.k, c.n_tokens, g.g, g.b);
                report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 ? 0.0 : 1.0, 0);
            }
        }
    }
}

// fused.cu's experts_gate_up_cached (the cache's gate, up and SwiGLU in one launch) against
// experts_gate_up over the same experts resident, bit for bit for the pairs whose expert
// has a slot: every other expert left to the pool (rows untouched), slots in another order
// than the experts, the up matrix at an offset within the slot; ids past n_expert and
// negative ones give NaN rows.
static void test_gate_up_cached() {
    for (const Fmt& f : FORMATS) {
        if (f.id != T_Q4_K && f.id != T_Q6_K) continue;
        const int m = 12, k = 512, n_exp = 6, n_tokens = 2, n_used = 4, pairs = n_tokens * n_used;
        const size_t rb = (size_t)(k / f.qk) * f.bytes, mat = rb * m, off_g = 32, off_u = off_g + mat + 16;
        const size_t slot_bytes = off_u + mat + 16;
        std::vector<uint8_t> wg, wu;
        for (int e = 0; e < n_exp; e++) {
            auto g = random_weights(f, m, k), u = random_weights(f, m, k);
            wg.insert(wg.end(), g.begin(), g.end());
            wu.insert(wu.end(), u.begin(), u.end());
        }
        std::vector<int32_t> table(n_exp, -1);
        std::vector<uint8_t> slots;
        for (int e = n_exp - 1; e >= 0; e--) {
            if (e % 2 == 1) continue;  // the pool's
            table[e] = (int32_t)(slots.size() / slot_bytes);
            slots.resize(slots.size() + slot_bytes, 0xEE);
            uint8_t* slot = slots.data() + table[e] * slot_bytes;
            std::copy(wg.begin() + e * mat, wg.begin() + (e + 1) * mat, slot + off_g);
            std::copy(wu.begin() + e * mat, wu.begin() + (e + 1) * mat, slot + off_u);
        }
        std::vector<int32_t> ids = {0, 1, 2, 4, 3, 5, 0, 2};
        std::vector<float> x((size_t)n_tokens * k);
        for (auto& v : x) v = urand(1.5f);
        std::vector<float> want((size_t)pairs * m, -7.0f);
        launch(3, 128, [&] {
            experts_gate_up(wg.data(), wu.data(), x.data(), ids.data(), want.data(), f.id, m, k, n_tokens, n_used,
                            mat, mat);
        });
        ids[1] = n_exp;  // past the experts: NaN
        ids[5] = -1;     // negative: NaN
        std::vector<float> got(want.size(), -7.0f);
        launch(5, 128, [&] {
            experts_gate_up_cached(slots.data(), table.data(), x.data(), ids.data(), got.data(), f.id, m, k, n_tokens,
                                   n_used, n_exp, slot_bytes, off_g, off_u);
        });
        bool ok = true;
        for (int p = 0; p < pairs; p++)
            for (int r = 0; r < m; r++) {
                const float g = got[(size_t)p * m + r], w = want[(size_t)p * m + r];
                if (ids[p] < 0 || ids[p] >= n_exp) ok = ok && std::isnan(g);
                else if (table[ids[p]] < 0) ok = ok && g == -7.0f;
                else ok = ok && memcmp(&g, &w, 4) == 0;
            }
        char what[120];
        snprintf(what, sizeof what, "experts_gate_up_cached %s vs experts_gate_up (bit-exact)", f.name);
        report(what, ok ? 0.0 : 1.0, 0);
    }
}
