// mul_mat_vec_q8_rows (matvec_q8.cuh mvq_product_tokens: a verify window's n = 2..8
// activation rows quantised by quantise_act_q8, each weight row staged once for all of
// them) against one-token launches of mul_mat_vec_q8, row by row: bit for bit, for every
// format mul_mat_vec_q8 takes, rows of 768 to 9,216 values (not whole 1,024-value steps,
// and 9 steps: staged in chunks of MVQ_MAX_DEPTH), row counts no multiple of a block's
// rows, weights off 16-byte alignment, random activation rows of different scales, and
// launch shapes that change the chunking and grid-stride. Included by main.cpp after its
// helpers.
#pragma once

static void test_vec_q8_rows() {
    struct Shape { int m, k; };
    const Shape shapes[] = {{13, 768}, {9, 1280}, {7, 2048}, {6, 4096}, {5, 9216}};
    const int T = MVQ_TOKENS;
    // act: the scratch, T rows mvq_row_stride apart, 16-byte aligned.
    const size_t max_stride = ((size_t)9216 * 5 / 4 + 15) / 16 * 16;
    std::vector<uint4> act_buf(max_stride * T / 16 + 1);
    uint8_t* act = (uint8_t*)act_buf.data();
    const uint4 poison = {0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au};
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;  // float weights stay with mul_mat_vec
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        const uint32_t stage = ((1024 / f.qk) * f.bytes + 30) / 16 * 16;  // mvq_stage_u4 · 16
        for (auto [m, k] : shapes) {
            if (k % f.qk != 0) continue;
            auto w = random_weights(f, m, k);
            std::vector<float> x((size_t)T * k);
            for (int t = 0; t < T; t++) {
                float* r = x.data() + (size_t)t * k;
                for (int i = 0; i < k; i++) r[i] = urand(0.25f + t);
                r[3 + t] = 0.0f;
                if (t == 2 && k >= 512) std::fill(r + 256, r + 512, 0.0f);  // an all-zero block
                r[600] = -2.5f * (1 + t);  // Q8_K: largest magnitude twice, opposite signs
                r[601] = 2.5f * (1 + t);
            }
            const size_t off = 2;  // weights off 16-byte alignment
            std::vector<uint8_t> buf(off + w.size() + 32, 0xA5);
            memcpy(buf.data() + off, w.data(), w.size());
            const uint8_t* wp = buf.data() + off;
            const int steps = (k + 1023) / 1024;
            const unsigned grid = (unsigned)(m + 3) / 4;
            // Each row alone: the one-token launch the backend makes.
            std::vector<float> ref((size_t)T * m, -1.0f);
            for (int t = 0; t < T; t++) {
                emu_dynamic_smem_bytes = 4 * std::min(steps, 8) * stage;
                const float* xr = x.data() + (size_t)t * k;
                float* yr = ref.data() + (size_t)t * m;
                std::fill(act_buf.begin(), act_buf.end(), poison);
                launch((k + 255) / 256, 256, [&] { quantise_act_q8(wp, xr, yr, f.id, m, k, 1, act); });
                launch(grid, 128, [&] { mul_mat_vec_q8(wp, xr, yr, f.id, m, k, 1, act); });
            }
            struct Cfg { int n; unsigned grid, block; int depth; };
            std::vector<Cfg> cfgs;
            for (int n = 2; n <= T; n++) cfgs.push_back({n, grid, 128, std::min(steps, 8)});  // the backend's launch
            cfgs.push_back({T, 2, 128, 1});      // a step at a time, grid-stride
            cfgs.push_back({5, 1, 256, 3});      // 8 warps (4 compute), one block, chunks of 3
            cfgs.push_back({3, 3, 64, 2});       // 2-warp blocks
            for (auto c : cfgs) {
                const uint32_t nw = std::min(c.block / 32, 4u);
                emu_dynamic_smem_bytes = nw * c.depth * stage;
                std::fill(act_buf.begin(), act_buf.end(), poison);
                std::vector<float> out((size_t)T * m, -2.0f);
                const unsigned qgrid = c.n * ((k + 255) / 256);
                launch(qgrid, 256, [&] { quantise_act_q8(wp, x.data(), out.data(), f.id, m, k, c.n, act); });
                launch(c.grid, c.block, [&] { mul_mat_vec_q8_rows(wp, x.data(), out.data(), f.id, m, k, c.n, act); });
                // Rows 0..n bit for bit; nothing written past them.
                bool ok = memcmp(ref.data(), out.data(), (size_t)c.n * m * 4) == 0;
                ok = ok && std::all_of(out.begin() + (size_t)c.n * m, out.end(), [](float v) { return v == -2.0f; });
                char what[160];
                snprintf(what, sizeof what, "mul_mat_vec_q8_rows %s %dx%d n=%d grid %u block %u depth %d vs one-token rows (bit-exact)", f.name, m, k, c.n, c.grid, c.block, c.depth);
                report(what, ok ? 0.0 : 1.0, 0);
            }
        }
    }
    // Arguments it cannot take give NaN: no shared memory for a step, 0 or 9 tokens.
    const Fmt& f = FORMATS[10];  // Q4_K
    auto w = random_weights(f, 4, 1024);
    std::vector<float> x(9 * 1024, 1.0f), out(9 * 4, 0.0f);
    emu_dynamic_smem_bytes = 0;
    launch(1, 128, [&] { mul_mat_vec_q8_rows(w.data(), x.data(), out.data(), f.id, 4, 1024, 2, act); });
    bool nan = std::all_of(out.begin(), out.begin() + 8, [](float v) { return std::isnan(v); });
    emu_dynamic_smem_bytes = 4 * 37 * 16;
    launch(1, 128, [&] { mul_mat_vec_q8_rows(w.data(), x.data(), out.data(), f.id, 4, 1024, 9, act); });
    nan = nan && std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); });
    report("mul_mat_vec_q8_rows without shared memory or with 9 tokens: NaN", nan ? 0.0 : 1.0, 0);
}
