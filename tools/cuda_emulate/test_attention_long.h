// attention_long / attention_long_q8 (attention_long.cuh) with the thresholds lowered
// (main.cpp: ATT_LONG_MIN_SPAN 100, ATT_LONG_MIN_PIECE 4, ATT_LONG_ROUND_CHUNKS 2; or the
// kernels' own with -DATT_LONG_REAL, where only the last two cases have long rows), so
// that spans of a few hundred rows take several groups, pieces and rounds: against the
// f64 softmax of the cache's values; a window whose rows straddle the threshold row for
// row bit for bit equal to each row launched alone and to another grid; its short rows
// bit for bit `attention`'s (the same path); the counters back to 0 after each launch.

// The f64 attention of row (t, h) over the (dequantised) cache rows 0..span-1.
static void att_ref(const std::vector<float>& qr, const std::vector<float>& kd, const std::vector<float>& vd,
                    int t, int h, int nh, int g, int hd, int kvd, int span, float scale, std::vector<double>& o) {
    int off = (h / g) * hd;
    std::vector<double> s(span);
    double mx = -1e300;
    for (int j = 0; j < span; j++) {
        double d = 0;
        for (int i = 0; i < hd; i++) d += (double)qr[(t * nh + h) * hd + i] * kd[(size_t)j * kvd + off + i];
        s[j] = d * scale;
        mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (auto& x : s) { x = exp(x - mx); sum += x; }
    o.assign(hd, 0.0);
    for (int j = 0; j < span; j++)
        for (int i = 0; i < hd; i++) o[i] += s[j] / sum * vd[(size_t)j * kvd + off + i];
}

static void test_attention_long() {
    const size_t scratch_bytes = ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS + ATT_LONG_PARTIAL_BYTES;
    std::vector<uint8_t> scratch(scratch_bytes, 0);
    auto counters_zero = [&] {
        const uint32_t* c = (const uint32_t*)(scratch.data() + ATT_LONG_SCRATCH_AT);
        for (int i = 0; i < ATT_LONG_COUNTERS; i++) if (c[i] != 0) return false;
        return true;
    };
    struct C { bool q8; int nh, nkv, hd, block; std::vector<int> pos; } cases[] = {
        // one row per launch: short, the first long span, several groups, several rounds
        {false, 8, 2, 64, 256, {99}}, {false, 8, 2, 64, 256, {100}}, {false, 8, 2, 64, 256, {299}},
        {false, 8, 2, 64, 256, {1999}}, {true, 8, 2, 64, 256, {100}}, {true, 8, 2, 64, 256, {1999}},
        // windows straddling the threshold; GQA groups of 3 and 12 (two head groups)
        {false, 6, 2, 64, 256, {97, 98, 99, 100, 101, 700}}, {true, 6, 2, 64, 256, {97, 98, 99, 100, 101, 700}},
        {false, 12, 1, 32, 128, {50, 99, 100, 600}}, {true, 12, 1, 64, 128, {50, 99, 100, 600}},
        // head_dim 96 (P·V subsets leave threads out at 256), a position outside the cache
        {false, 4, 4, 96, 256, {130, 64, 5000, 1023}},
        // the q8_0 cache at head_dim 96 and 32 (a row's score threads off block edges)
        {true, 4, 4, 96, 256, {130, 64, 5000, 1023}}, {true, 12, 1, 32, 128, {50, 99, 100, 600}},
        // at the threshold and 20 times past it (with -DATT_LONG_REAL: 1024 rows, 20480)
        {false, 8, 2, 64, 256, {ATT_LONG_MIN_SPAN - 1, ATT_LONG_MIN_SPAN, 20 * ATT_LONG_MIN_SPAN - 1}},
        {true, 8, 2, 64, 256, {ATT_LONG_MIN_SPAN - 1, ATT_LONG_MIN_SPAN, 20 * ATT_LONG_MIN_SPAN - 1}},
    };
    for (auto& c : cases) {
        int nt = (int)c.pos.size(), kvd = c.nkv * c.hd, g = c.nh / c.nkv;
        int ctx = 1;
        for (int p : c.pos) if (p != 5000) ctx = std::max(ctx, p + 1);
        std::vector<float> q(nt * c.nh * c.hd), k((size_t)ctx * kvd), v((size_t)ctx * kvd);
        for (auto& x : q) x = urand(2);
        for (auto& x : k) x = urand(2);
        for (auto& x : v) x = urand(1);
        std::vector<uint16_t> kc, vc;
        std::vector<float> kd(k.size()), vd(v.size()), qr(q);
        if (c.q8) {
            size_t words = (size_t)ctx * kvd / 32 * 17;
            kc.assign(words, 0); vc.assign(words, 0);
            std::vector<int32_t> all(ctx);
            for (int i = 0; i < ctx; i++) all[i] = i;
            launch(ops_grid((uint64_t)ctx * kvd / 32), 256, [&] { kv_store_q8(k.data(), v.data(), all.data(), kc.data(), vc.data(), kvd, ctx, ctx); });
            for (size_t b = 0; b < k.size() / 32; b++)
                for (int i = 0; i < 32; i++) {
                    kd[b * 32 + i] = f16_to_f32(kc[b * 17]) * (float)(int8_t)(kc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
                    vd[b * 32 + i] = f16_to_f32(vc[b * 17]) * (float)(int8_t)(vc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
                }
        } else {
            kc.resize(k.size()); vc.resize(v.size());
            for (size_t i = 0; i < k.size(); i++) { kc[i] = f32_to_f16(k[i]); vc[i] = f32_to_f16(v[i]); kd[i] = f16_to_f32(kc[i]); vd[i] = f16_to_f32(vc[i]); }
            for (auto& x : qr) x = round_to_f16(x);
        }
        float scale = 1.0f / sqrtf((float)c.hd);
        uint64_t units = (uint64_t)nt * c.nkv * ((g + 7) / 8);
        auto run = [&](const float* qq, const int32_t* pp, float* out, int n, unsigned grid, unsigned block) {
            if (c.q8)
                launch(grid, block, [&] { attention_long_q8(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, c.hd, ctx, scale, scratch.data()); });
            else
                launch(grid, block, [&] { attention_long(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, c.hd, ctx, scale, scratch.data()); });
        };
        std::vector<float> out(nt * c.nh * c.hd, -7.0f);
        run(q.data(), c.pos.data(), out.data(), nt, (unsigned)(units * ATT_LONG_GROUPS), c.block);
        bool zero = counters_zero();
        // Another grid (fewer blocks than items: grid-stride), the same bits.
        std::vector<float> out3(out.size(), -7.0f);
        run(q.data(), c.pos.data(), out3.data(), nt, 3, c.block);
        zero = zero && counters_zero();
        // Each row alone (its own q, pos and out offsets), the same bits.
        std::vector<float> alone(out.size(), -7.0f);
        int row = c.nh * c.hd;
        for (int t = 0; t < nt; t++)
            run(q.data() + t * row, c.pos.data() + t, alone.data() + t * row, 1, (unsigned)(c.nkv * ((g + 7) / 8) * ATT_LONG_GROUPS), c.block);
        zero = zero && counters_zero();
        // Short rows: `attention`'s (and attention_q8's) bits.
        std::vector<float> plain(out.size(), -7.0f);
        if (c.q8)
            launch((unsigned)units, c.block, [&] { attention_q8(q.data(), c.pos.data(), kc.data(), vc.data(), plain.data(), nt, c.nh, c.nkv, c.hd, ctx, scale); });
        else
            launch((unsigned)units, c.block, [&] { attention(q.data(), c.pos.data(), kc.data(), vc.data(), plain.data(), nt, c.nh, c.nkv, c.hd, ctx, scale); });
        double worst = 0, worst_short = 0;
        bool short_same = true;
        for (int t = 0; t < nt; t++) {
            int p = c.pos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1;
            for (int h = 0; h < c.nh; h++) {
                std::vector<double> o(c.hd, 0.0);
                if (span > 0) att_ref(qr, kd, vd, t, h, c.nh, g, c.hd, kvd, span, scale, o);
                for (int i = 0; i < c.hd; i++) {
                    size_t at = (size_t)(t * c.nh + h) * c.hd + i;
                    double& w = span > ATT_LONG_MIN_SPAN ? worst : worst_short;
                    w = std::max(w, fabs(out[at] - o[i]));
                    if (span <= ATT_LONG_MIN_SPAN && memcmp(&out[at], &plain[at], 4) != 0) short_same = false;
                }
            }
        }
        std::string what = std::string("attention_long") + (c.q8 ? "_q8" : "") + " heads " + std::to_string(c.nh) + "/" +
                           std::to_string(c.nkv) + " hd=" + std::to_string(c.hd) + " block " + std::to_string(c.block) + " pos";
        for (int p : c.pos) what += " " + std::to_string(p);
        // f32 online softmax, f32 P·V: far below the f16 cache's probability rounding
        // (2e-3 in test_attention); a row merged wrongly is off by ~|v| ~ 0.1-1.
        report(what + " long rows", worst, 2e-5);
        // the short path rounds the f16 cache's probabilities to f16 (test_attention)
        report(what + " short rows", worst_short, c.q8 ? 2e-5 : 2e-3);
        report(what + " grid of 3 vs items", same(out, out3) ? 0 : 1, 0.5);
        report(what + " rows alone vs window", same(out, alone) ? 0 : 1, 0.5);
        report(what + " short rows vs attention", short_same ? 0 : 1, 0.5);
        report(what + " counters back to 0", zero ? 0 : 1, 0.5);
    }
}
