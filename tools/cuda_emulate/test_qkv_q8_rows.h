// mul_mat_qkv_q8_rows (fused.cu: a verify window's Q, K and V over activation rows
// quantised once by quantise_act_q8_qkv) against mul_mat_vec_q8_rows of each matrix alone
// and the base mul_mat_qkv: bit for bit, n = 2..5 tokens, Q's rows not K's, V's format
// not Q's where they share an activation format, rows of 576 (SmolLM2's hidden; no
// K-quant takes it) and 2,048 values, the backend's grid and a grid-stride one. Formats
// of different activations and 9 tokens give NaN. Included by main.cpp after its helpers.
#pragma once

static void test_qkv_q8_rows() {
    auto fmt = [](int id) { for (const Fmt& f : FORMATS) if (f.id == id) return f; return FORMATS[0]; };
    struct Case { int tq, tk, tv, k, mq, mk; };
    const Case cases[] = {
        {T_Q4_K, T_Q4_K, T_Q6_K, 2048, 40, 13}, {T_Q6_K, T_Q6_K, T_Q4_K, 2048, 24, 8},
        {T_Q8_0, T_Q8_0, T_Q4_0, 2048, 40, 13}, {T_Q4_1, T_Q4_1, T_Q5_1, 2048, 24, 8},
        {T_Q8_0, T_Q8_0, T_Q8_0, 576, 36, 12}, {T_Q4_1, T_Q4_1, T_Q4_1, 576, 29, 9},
        {T_Q5_0, T_Q8_0, T_Q8_0, 576, 24, 8}};
    const size_t stride = ((size_t)2048 * 5 / 4 + 15) / 16 * 16;
    std::vector<uint4> act_buf(stride * MVQ_TOKENS / 16 + 1);
    uint8_t* act = (uint8_t*)act_buf.data();
    const uint4 poison = {0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au, 0x5a5a5a5au};
    for (const Case& c : cases) {
        const Fmt fq = fmt(c.tq), fk = fmt(c.tk), fv = fmt(c.tv);
        const int mq = c.mq, mk = c.mk, mv = c.mk, k = c.k;
        auto wq = random_weights(fq, mq, k), wk = random_weights(fk, mk, k), wv = random_weights(fv, mv, k);
        const Fmt* fs[3] = {&fq, &fk, &fv};
        const int ms[3] = {mq, mk, mv};
        const std::vector<uint8_t>* ws[3] = {&wq, &wk, &wv};
        uint32_t max_stage = 0;
        for (const Fmt* f : fs) max_stage = std::max(max_stage, (uint32_t)(((1024 / f->qk) * f->bytes + 30) / 16 * 16));
        const int steps = (k + 1023) / 1024;
        for (int n = 2; n <= 5; n++) {
            std::vector<float> x((size_t)n * k);
            for (int t = 0; t < n; t++)
                for (int i = 0; i < k; i++) x[(size_t)t * k + i] = urand(0.5f + t);
            // Each matrix alone: mul_mat_vec_q8_rows with its quantise_act_q8.
            std::vector<float> ref[3];
            for (int j = 0; j < 3; j++) {
                const Fmt& f = *fs[j];
                const uint32_t stage = ((1024 / f.qk) * f.bytes + 30) / 16 * 16;
                ref[j].assign((size_t)n * ms[j], -1.0f);
                emu_dynamic_smem_bytes = 4 * std::min(steps, 8) * stage;
                std::fill(act_buf.begin(), act_buf.end(), poison);
                const uint8_t* w = ws[j]->data();
                float* y = ref[j].data();
                launch(n * ((k + 255) / 256), 256, [&] { quantise_act_q8(w, x.data(), y, f.id, ms[j], k, n, act); });
                launch((ms[j] + 3) / 4, 128, [&] { mul_mat_vec_q8_rows(w, x.data(), y, f.id, ms[j], k, n, act); });
            }
            // The base kernel (the A/B's other side) agrees too.
            std::vector<float> bq((size_t)n * mq, -1.0f), bk((size_t)n * mk, -1.0f), bv((size_t)n * mv, -1.0f);
            launch(40, 128, [&] { mul_mat_qkv(wq.data(), wk.data(), wv.data(), x.data(), bq.data(), bk.data(), bv.data(), c.tq, c.tk, c.tv, mq, mk, mv, k, n); });
            report(std::string("mul_mat_qkv ") + fq.name + "/" + fk.name + "/" + fv.name + " k=" + std::to_string(k) + " n=" + std::to_string(n) + " vs mul_mat_vec_q8_rows (bit-exact)",
                   same(ref[0], bq) && same(ref[1], bk) && same(ref[2], bv) ? 0 : 1, 0);
            struct Cfg { unsigned grid, block; int depth; };
            const unsigned units = (mq + 3) / 4 + (mk + 3) / 4 + (mv + 3) / 4;
            const Cfg cfgs[] = {{units, 128, std::min(steps, 8)}, {3, 256, 1}};
            for (const Cfg& g : cfgs) {
                emu_dynamic_smem_bytes = 4 * g.depth * max_stage;
                std::fill(act_buf.begin(), act_buf.end(), poison);
                std::vector<float> q((size_t)n * mq + 4, -2.0f), kk((size_t)n * mk + 4, -2.0f), v((size_t)n * mv + 4, -2.0f);
                auto args = [&](auto kernel) { kernel(wq.data(), wk.data(), wv.data(), x.data(), q.data(), kk.data(), v.data(), c.tq, c.tk, c.tv, mq, mk, mv, k, n, act); };
                launch(n * ((k + 255) / 256), 256, [&] { args(quantise_act_q8_qkv); });
                launch(g.grid, g.block, [&] { args(mul_mat_qkv_q8_rows); });
                bool ok = memcmp(q.data(), ref[0].data(), ref[0].size() * 4) == 0 &&
                          memcmp(kk.data(), ref[1].data(), ref[1].size() * 4) == 0 &&
                          memcmp(v.data(), ref[2].data(), ref[2].size() * 4) == 0;
                for (auto* y : {&q, &kk, &v}) ok = ok && std::all_of(y->end() - 4, y->end(), [](float f) { return f == -2.0f; });
                char what[200];
                snprintf(what, sizeof what, "mul_mat_qkv_q8_rows %s/%s/%s %dx%dx%d k=%d n=%d grid %u block %u depth %d vs mul_mat_vec_q8_rows per matrix (bit-exact)",
                         fq.name, fk.name, fv.name, mq, mk, mv, k, n, g.grid, g.block, g.depth);
                report(what, ok ? 0.0 : 1.0, 0);
            }
        }
    }
    // Formats of different activations (Q4_K's Q8_K, Q8_0's) and 9 tokens: NaN.
    const int k = 1024, m = 4;
    auto wa = random_weights(fmt(T_Q4_K), m, k), wb = random_weights(fmt(T_Q8_0), m, k);
    std::vector<float> x(9 * k, 1.0f), q(9 * m, 0.0f), kk(9 * m, 0.0f), v(9 * m, 0.0f);
    emu_dynamic_smem_bytes = 4 * 37 * 16;
    launch(3, 128, [&] { mul_mat_qkv_q8_rows(wa.data(), wa.data(), wb.data(), x.data(), q.data(), kk.data(), v.data(), T_Q4_K, T_Q4_K, T_Q8_0, m, m, m, k, 2, act); });
    bool nan = std::all_of(v.begin(), v.begin() + 2 * m, [](float f) { return std::isnan(f); }) &&
               std::all_of(q.begin(), q.begin() + 2 * m, [](float f) { return std::isnan(f); });
    launch(3, 128, [&] { mul_mat_qkv_q8_rows(wa.data(), wa.data(), wa.data(), x.data(), q.data(), kk.data(), v.data(), T_Q4_K, T_Q4_K, T_Q4_K, m, m, m, k, 9, act); });
    nan = nan && std::all_of(kk.begin(), kk.end(), [](float f) { return std::isnan(f); });
    report("mul_mat_qkv_q8_rows with mixed activation formats or 9 tokens: NaN", nan ? 0.0 : 1.0, 0);
}
