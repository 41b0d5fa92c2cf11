// mul_mat_qkv_rope_q8_rows (fused.cu: a verify window's Q, K and V over rows quantised once
// by quantise_act_q8_qkv_rope, each head's norm, rope and cache append finished in the
// same launch) against mul_mat_qkv_q8_rows + qk_norm_rope_store of the same window, and
// each token alone against the one-token mul_mat_qkv_rope (a decode step): bit for bit,
// n = 2..5, the backend's grid (128-thread blocks, a unit a block) and a grid-stride one
// of 256-thread blocks (4 warps compute, all 8 finish heads), the tickets back at 0.
// Included by main.cpp after its helpers.
#pragma once

static void test_qkv_rope_q8_rows() {
    auto fmt = [](int id) { for (const Fmt& f : FORMATS) if (f.id == id) return f; return FORMATS[0]; };
    struct C { int tq, tk, tv, k, nh, nkv, hd, rot, mode, norm; } cases[] = {
        {T_Q4_K, T_Q4_K, T_Q4_K, 2048, 4, 2, 128, 128, 2, 1},
        {T_Q4_K, T_Q4_K, T_Q6_K, 1024, 3, 1, 64, 32, 0, 0},
        {T_Q8_0, T_Q8_0, T_Q4_0, 576, 3, 1, 64, 64, 2, 1}};
    const size_t stride = ((size_t)2048 * 5 / 4 + 15) / 16 * 16;
    std::vector<uint4> act_buf(stride * MVQ_TOKENS / 16 + 1);
    uint8_t* act = (uint8_t*)act_buf.data();
    const float fb = 1e6f, fs = 1.0f, ef = 0.0f, af = 1.0f, bf = 32.0f, bs = 1.0f;
    const unsigned orig = 4096;
    for (const C& c : cases) {
        const Fmt fq = fmt(c.tq), fk = fmt(c.tk), fv = fmt(c.tv);
        const int mq = c.nh * c.hd, mkv = c.nkv * c.hd, ctx = 16, heads = c.nh + 2 * c.nkv, k = c.k;
        auto wq = random_weights(fq, mq, k), wk = random_weights(fk, mkv, k), wv = random_weights(fv, mkv, k);
        std::vector<float> qn(c.hd), kn(c.hd);
        for (auto& v : qn) v = urand(1.5f);
        for (auto& v : kn) v = urand(1.5f);
        uint32_t max_stage = 0;
        for (const Fmt* f : {&fq, &fk, &fv}) max_stage = std::max(max_stage, (uint32_t)(((1024 / f->qk) * f->bytes + 30) / 16 * 16));
        const int steps = (k + 1023) / 1024;
        for (int n = 2; n <= 5; n++) {
            std::vector<float> x((size_t)n * k);
            for (auto& v : x) v = urand(2.0f);
            std::vector<int32_t> pos(n);
            for (int t = 0; t < n; t++) pos[t] = 2 + 3 * t;
            // The sequence: mul_mat_qkv_q8_rows, qk_norm_rope_store.
            std::vector<float> q((size_t)n * mq), kk((size_t)n * mkv), v((size_t)n * mkv), q0((size_t)n * mq);
            std::vector<uint16_t> kc0(ctx * mkv, 7), vc0(ctx * mkv, 7);
            const unsigned units = (mq + 3) / 4 + 2 * ((mkv + 3) / 4);
            emu_dynamic_smem_bytes = 4 * std::min(steps, 8) * max_stage;
            launch(n * ((k + 255) / 256), 256, [&] { quantise_act_q8_qkv(wq.data(), wk.data(), wv.data(), x.data(), q.data(), kk.data(), v.data(), c.tq, c.tk, c.tv, mq, mkv, mkv, k, n, act); });
            launch(units, 128, [&] { mul_mat_qkv_q8_rows(wq.data(), wk.data(), wv.data(), x.data(), q.data(), kk.data(), v.data(), c.tq, c.tk, c.tv, mq, mkv, mkv, k, n, act); });
            launch((n * heads * 32 + 255) / 256, 256, [&] { qk_norm_rope_store(q.data(), kk.data(), v.data(), qn.data(), kn.data(), pos.data(), q0.data(), kc0.data(), vc0.data(), n, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.rot, c.mode, fb, fs, ef, af, bf, bs, orig); });
            std::vector<uint32_t> done((size_t)n * heads, 0);
            struct Cfg { unsigned grid, block; int depth; };
            const Cfg cfgs[] = {{units, 128, std::min(steps, 8)}, {3, 256, 1}};
            for (const Cfg& g : cfgs) {
                bool ok = true;
                for (int rep = 0; rep < 2; rep++) {
                    std::vector<float> q1(q.size(), -1), k1(kk.size(), -1), v1(v.size(), -1), qo(q0.size(), -1);
                    std::vector<uint16_t> kc1(ctx * mkv, 7), vc1(ctx * mkv, 7);
                    auto args = [&](auto kernel) { kernel(wq.data(), wk.data(), wv.data(), x.data(), q1.data(), k1.data(), v1.data(), qn.data(), kn.data(), pos.data(), qo.data(), kc1.data(), vc1.data(), done.data(), c.tq, c.tk, c.tv, k, n, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.rot, c.mode, fb, fs, ef, af, bf, bs, orig, act); };
                    emu_dynamic_smem_bytes = 4 * g.depth * max_stage;
                    launch(n * ((k + 255) / 256), 256, [&] { args(quantise_act_q8_qkv_rope); });
                    launch(g.grid, g.block, [&] { args(mul_mat_qkv_rope_q8_rows); });
                    ok = ok && same(q, q1) && same(kk, k1) && same(v, v1) && same(q0, qo) && same16(kc0, kc1) && same16(vc0, vc1);
                    for (auto d : done) ok = ok && d == 0;
                }
                char what[220];
                snprintf(what, sizeof what, "mul_mat_qkv_rope_q8_rows %s/%s/%s k=%d heads %d/%d hd=%d n=%d grid %ux%u vs mul_mat_qkv_q8_rows + qk_norm_rope_store (bit-exact)",
                         fq.name, fk.name, fv.name, k, c.nh, c.nkv, c.hd, n, g.grid, g.block);
                report(what, ok ? 0 : 1, 0);
            }
            // Each token alone as a decode step (the one-token kernel, its grid).
            bool alone = true;
            for (int t = 0; t < n; t++) {
                std::vector<float> q1(mq), k1(mkv), v1(mkv), qo(mq);
                std::vector<uint16_t> kc1(ctx * mkv, 7), vc1(ctx * mkv, 7);
                const unsigned grid = (mq + 7) / 8 + 2 * ((mkv + 7) / 8);
                launch(grid, 128, [&] { mul_mat_qkv_rope(wq.data(), wk.data(), wv.data(), x.data() + (size_t)t * k, q1.data(), k1.data(), v1.data(), qn.data(), kn.data(), pos.data() + t, qo.data(), kc1.data(), vc1.data(), done.data(), c.tq, c.tk, c.tv, k, 1, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.rot, c.mode, fb, fs, ef, af, bf, bs, orig); });
                alone = alone && memcmp(qo.data(), q0.data() + (size_t)t * mq, mq * 4) == 0;
                const size_t row = (size_t)pos[t] * mkv;
                alone = alone && memcmp(kc1.data() + row, kc0.data() + row, mkv * 2) == 0 && memcmp(vc1.data() + row, vc0.data() + row, mkv * 2) == 0;
            }
            char what[200];
            snprintf(what, sizeof what, "mul_mat_qkv_rope_q8_rows %s/%s/%s k=%d n=%d: each token alone = a one-token mul_mat_qkv_rope (bit-exact)", fq.name, fk.name, fv.name, k, n);
            report(what, alone ? 0 : 1, 0);
        }
    }
}
