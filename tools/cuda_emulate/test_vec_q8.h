// mul_mat_vec_q8 (matvec_q8.cuh: the activation quantised once by quantise_act_q8, weight
// rows staged a chunk of steps per warp) against mul_mat_vec: bit for bit, for every format
// mul_mat_vec quantises, rows of 768 to 9,216 values (not whole 1,024-value steps but for
// 2,048 and 4,096), row counts no multiple of a block's rows, weights off 16-byte
// alignment, and launch shapes that change the chunking: the whole row staged at once, one
// step at a time, three at a time; blocks of 2, 4 and 8 warps (4 compute); grids that
// cover the rows and grids that stride. The same for experts_gate_up_q8 (gate and up rows
// of 8 slots' experts, a warp each) against experts_gate_up, and mul_mat_experts_q8 (the
// token's row or a row per slot) against mul_mat_experts_vec. Included by main.cpp after
// its helpers.
#pragma once

static void test_vec_q8() {
    struct Shape { int m, k; };
    const Shape shapes[] = {{13, 768}, {9, 1280}, {7, 2048}, {6, 4096}, {5, 5120}, {11, 9216}};
    // act: the scratch (quants, scales, Q8_1 sums: 1.25 bytes a value), 16-byte aligned.
    std::vector<uint4> act_buf(9216 * 5 / 4 / 16 + 1);
    uint8_t* act = (uint8_t*)act_buf.data();
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;  // float weights stay with mul_mat_vec (nothing to quantise)
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        const uint32_t stage = ((1024 / f.qk) * f.bytes + 30) / 16 * 16;  // mvq_stage_u4 · 16
        for (auto [m, k] : shapes) {
            if (k % f.qk != 0) continue;
            auto w = random_weights(f, m, k);
            std::vector<float> x(k);
            for (auto& v : x) v = urand(2.0f);
            x[3] = 0.0f;
            if (k >= 512) std::fill(x.begin() + 256, x.begin() + 512, 0.0f);  // an all-zero block
            x[600] = -2.5f;  // Q8_K: largest magnitude twice, opposite signs
            x[601] = 2.5f;
            const size_t off = 2;  // weights off 16-byte alignment
            std::vector<uint8_t> buf(off + w.size() + 32, 0xA5);
            memcpy(buf.data() + off, w.data(), w.size());
            std::vector<float> ref(m, -1.0f);
            launch(5, 128, [&] { mul_mat_vec(buf.data() + off, x.data(), ref.data(), f.id, m, k, 1); });
            const int steps = (k + 1023) / 1024;
            struct Cfg { unsigned grid, block; int depth; } cfgs[] = {
                {(unsigned)(m + 3) / 4, 128, std::min(steps, 8)},  // the backend's launch
                {2, 128, 1},                                        // a step at a time, grid-stride
                {1, 256, 3},                                        // 8 warps (4 compute), one block
                {3, 64, 2},                                         // 2-warp blocks
            };
            for (auto c : cfgs) {
                const uint32_t nw = std::min(c.block / 32, 4u);
                emu_dynamic_smem_bytes = nw * c.depth * stage;
                std::fill(act_buf.begin(), act_buf.end(), uint4{0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au});
                std::vector<float> out(m, -2.0f);
                launch((k + 255) / 256, 256, [&] { quantise_act_q8(buf.data() + off, x.data(), out.data(), f.id, m, k, 1, act); });
                launch(c.grid, c.block, [&] { mul_mat_vec_q8(buf.data() + off, x.data(), out.data(), f.id, m, k, 1, act); });
                char what[160];
                snprintf(what, sizeof what, "mul_mat_vec_q8 %s %dx%d grid %u block %u depth %d vs mul_mat_vec (bit-exact)", f.name, m, k, c.grid, c.block, c.depth);
                report(what, memcmp(ref.data(), out.data(), m * 4) == 0 ? 0.0 : 1.0, 0);
            }
        }
    }
    // experts_gate_up_q8 against experts_gate_up, one token of 8 slots (one of them a
    // negative id: NaN rows), 10 experts off 16-byte alignment of each other.
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        const uint32_t stage = ((1024 / f.qk) * f.bytes + 30) / 16 * 16;
        for (auto [m, k] : std::vector<Shape>{{13, 768}, {6, 2048}, {5, 5120}}) {
            const int n_used = 8, n_exp = 10;
            const size_t rb = (size_t)(k / f.qk) * f.bytes, eg = rb * m + 2, eu = rb * m + 34;
            std::vector<uint8_t> wg, wu;
            for (int e = 0; e < n_exp; e++) {
                auto a = random_weights(f, m, k), b = random_weights(f, m, k);
                wg.insert(wg.end(), a.begin(), a.end()); wg.insert(wg.end(), eg - rb * m, 0xEE);
                wu.insert(wu.end(), b.begin(), b.end()); wu.insert(wu.end(), eu - rb * m, 0xEE);
            }
            wg.insert(wg.end(), 32, 0xEE); wu.insert(wu.end(), 32, 0xEE);
            std::vector<int32_t> ids(n_used);
            for (auto& i : ids) i = rng() % n_exp;
            ids[5] = -1;
            std::vector<float> x(k);
            for (auto& v : x) v = urand(2.0f);
            x[600] = -2.5f;
            x[601] = 2.5f;
            std::vector<float> ref((size_t)n_used * m, -1.0f);
            launch(4, 128, [&] { experts_gate_up(wg.data(), wu.data(), x.data(), ids.data(), ref.data(), f.id, m, k, 1, n_used, eg, eu); });
            const int steps = (k + 1023) / 1024;
            struct Cfg { unsigned grid, block; int depth; } cfgs[] = {
                {(unsigned)((m + 3) / 4 * n_used), 128, std::min(steps, 8)}, {3, 128, 1}, {2, 256, 3}, {5, 64, 2}};
            for (auto c : cfgs) {
                emu_dynamic_smem_bytes = std::min(c.block / 32, 4u) * 2 * c.depth * stage;
                std::vector<float> out(ref.size(), -2.0f);
                launch((k + 255) / 256, 256, [&] { quantise_act_q8_gate_up(wg.data(), wu.data(), x.data(), ids.data(), out.data(), f.id, m, k, 1, n_used, eg, eu, act); });
                launch(c.grid, c.block, [&] { experts_gate_up_q8(wg.data(), wu.data(), x.data(), ids.data(), out.data(), f.id, m, k, 1, n_used, eg, eu, act); });
                char what[160];
                snprintf(what, sizeof what, "experts_gate_up_q8 %s %dx%d grid %u block %u depth %d vs experts_gate_up (bit-exact)", f.name, m, k, c.grid, c.block, c.depth);
                report(what, memcmp(ref.data(), out.data(), ref.size() * 4) == 0 ? 0.0 : 1.0, 0);
            }
        }
    }
    // mul_mat_experts_q8 against mul_mat_experts_vec: one token of 8 slots (one a negative
    // id), the token's row or one row per slot (x_per_slot, the down projection's form).
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        const uint32_t stage = ((1024 / f.qk) * f.bytes + 30) / 16 * 16;
        for (auto [m, k] : std::vector<Shape>{{13, 768}, {5, 2048}, {6, 5120}}) {
            const int n_used = 8, n_exp = 10;
            const size_t rb = (size_t)(k / f.qk) * f.bytes, eb = rb * m + 2;
            std::vector<uint8_t> w;
            for (int e = 0; e < n_exp; e++) {
                auto a = random_weights(f, m, k);
                w.insert(w.end(), a.begin(), a.end()); w.insert(w.end(), eb - rb * m, 0xEE);
            }
            w.insert(w.end(), 32, 0xEE);
            std::vector<int32_t> ids(n_used);
            for (auto& i : ids) i = rng() % n_exp;
            ids[2] = -1;
            std::vector<float> x((size_t)n_used * k);
            for (auto& v : x) v = urand(2.0f);
            x[600] = -2.5f;
            x[601] = 2.5f;
            const size_t stride = ((size_t)k * 5 / 4 + 15) / 16 * 16;
            std::vector<uint4> slot_act(stride * n_used / 16 + 1);
            for (int per_slot = 0; per_slot < 2; per_slot++) {
                std::vector<float> ref((size_t)n_used * m, -1.0f);
                launch(3, 128, [&] { mul_mat_experts_vec(w.data(), x.data(), ids.data(), ref.data(), f.id, m, k, 1, n_used, per_slot, eb); });
                const int steps = (k + 1023) / 1024;
                struct Cfg { unsigned grid, block; int depth; } cfgs[] = {
                    {(unsigned)((m + 3) / 4 * n_used), 128, std::min(steps, 8)}, {3, 128, 1}, {2, 256, 3}};
                for (auto c : cfgs) {
                    emu_dynamic_smem_bytes = std::min(c.block / 32, 4u) * c.depth * stage;
                    uint8_t* sa = (uint8_t*)slot_act.data();
                    std::vector<float> out(ref.size(), -2.0f);
                    launch(5, 256, [&] { quantise_act_q8_experts(w.data(), x.data(), ids.data(), out.data(), f.id, m, k, 1, n_used, per_slot, eb, sa); });
                    launch(c.grid, c.block, [&] { mul_mat_experts_q8(w.data(), x.data(), ids.data(), out.data(), f.id, m, k, 1, n_used, per_slot, eb, sa); });
                    char what[160];
                    snprintf(what, sizeof what, "mul_mat_experts_q8 %s %dx%d per_slot %d grid %u block %u depth %d vs mul_mat_experts_vec (bit-exact)", f.name, m, k, per_slot, c.grid, c.block, c.depth);
                    report(what, memcmp(ref.data(), out.data(), ref.size() * 4) == 0 ? 0.0 : 1.0, 0);
                }
            }
        }
    }
    // Arguments it cannot take give NaN: no shared memory for a step, more than one token.
    const Fmt& f = FORMATS[10];  // Q4_K
    auto w = random_weights(f, 4, 1024);
    std::vector<float> x(2048, 1.0f), out(8, 0.0f);
    emu_dynamic_smem_bytes = 0;
    launch(1, 128, [&] { mul_mat_vec_q8(w.data(), x.data(), out.data(), f.id, 4, 1024, 1, act); });
    bool nan = std::all_of(out.begin(), out.begin() + 4, [](float v) { return std::isnan(v); });
    emu_dynamic_smem_bytes = 4 * 37 * 16;
    launch(1, 128, [&] { mul_mat_vec_q8(w.data(), x.data(), out.data(), f.id, 4, 1024, 2, act); });
    nan = nan && std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); });
    report("mul_mat_vec_q8 without shared memory or with 2 tokens: NaN", nan ? 0.0 : 1.0, 0);
}
