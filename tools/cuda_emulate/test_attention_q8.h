// attention_q8 (attention.cuh over kv_store_q8's blocks, AttKvQ8) at every kind of
// head_dim the host takes (a multiple of 32: 32 and 96 split a row's four score threads
// off q8_0 block edges, 64 and 128 on them) against the f64 softmax of the dequantised
// cache with the query unrounded (att_ref, test_attention_long.h), and at the fewest
// threads a block may have on a grid of 1 (other P·V row subsets: float rounding apart). Spans of one chunk (a block alone) and of several (the cluster's
// blocks merged); GQA groups of 1, 3 and 12 (two head groups). The output's bit hash is
// printed, so that a change meant to keep some head_dim's results can be checked by it.
static uint64_t bits_hash(const std::vector<float>& x) {
    uint64_t h = 1469598103934665603ull;
    for (float f : x) {
        uint32_t b;
        memcpy(&b, &f, 4);
        h = (h ^ b) * 1099511628211ull;
    }
    return h;
}

static void test_attention_q8() {
    struct C { int nt, nh, nkv, hd, pos0; } cases[] = {
        {3, 4, 2, 32, 0},   {2, 12, 1, 32, 300}, {3, 8, 2, 64, 0},  {2, 6, 2, 64, 300},
        {3, 4, 4, 96, 0},   {2, 6, 2, 96, 300},  {1, 32, 32, 96, 90}, {3, 8, 2, 128, 0},
        {2, 12, 1, 128, 300}};
    for (auto c : cases) {
        int kvd = c.nkv * c.hd, ctx = c.pos0 + c.nt, g = c.nh / c.nkv;
        std::vector<float> q(c.nt * c.nh * c.hd), k((size_t)ctx * kvd), v((size_t)ctx * kvd);
        for (auto& x : q) x = urand(2);
        for (auto& x : k) x = urand(2);
        for (auto& x : v) x = urand(1);
        size_t words = (size_t)ctx * kvd / 32 * 17;
        std::vector<uint16_t> kc(words, 0), vc(words, 0);
        std::vector<int32_t> all(ctx);
        for (int i = 0; i < ctx; i++) all[i] = i;
        launch(ops_grid((uint64_t)ctx * kvd / 32), 256, [&] { kv_store_q8(k.data(), v.data(), all.data(), kc.data(), vc.data(), kvd, ctx, ctx); });
        std::vector<float> kd(k.size()), vd(v.size());
        for (size_t b = 0; b < k.size() / 32; b++)
            for (int i = 0; i < 32; i++) {
                kd[b * 32 + i] = f16_to_f32(kc[b * 17]) * (float)(int8_t)(kc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
                vd[b * 32 + i] = f16_to_f32(vc[b * 17]) * (float)(int8_t)(vc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
            }
        std::vector<int32_t> apos(c.nt);
        for (int t = 0; t < c.nt; t++) apos[t] = c.pos0 + t;
        float scale = 1.0f / sqrtf((float)c.hd);
        unsigned units = (unsigned)(c.nt * c.nkv * ((g + 7) / 8));
        std::vector<float> out(q.size(), -7.0f), out1(q.size(), -7.0f);
        launch(units, 256, [&] { attention_q8(q.data(), apos.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        // the fewest threads a block may have (whole warps, head_dim / 2 at least), a grid of 1
        const unsigned small = (unsigned)std::max(32, (c.hd / 2 + 31) / 32 * 32);
        launch(1, small, [&] { attention_q8(q.data(), apos.data(), kc.data(), vc.data(), out1.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        double worst = 0;
        for (int t = 0; t < c.nt; t++)
            for (int h = 0; h < c.nh; h++) {
                std::vector<double> o;
                att_ref(q, kd, vd, t, h, c.nh, g, c.hd, kvd, apos[t] + 1, scale, o);
                for (int i = 0; i < c.hd; i++) {
                    const double e = fabs(out[(size_t)(t * c.nh + h) * c.hd + i] - o[i]);
                    if (!(e <= worst)) worst = e;  // NaN kept
                }
            }
        char what[160];
        snprintf(what, sizeof what, "attention_q8 t=%d heads %d/%d hd=%d pos0=%d bits %016llx", c.nt, c.nh, c.nkv, c.hd,
                 c.pos0, (unsigned long long)bits_hash(out));
        // f32 scores and P·V over exact int8 values (test_attention_long's short q8 rows);
        // a quarter reading the wrong block or scale is off by ~0.1-1.
        report(what, worst, 2e-5);
        snprintf(what, sizeof what, "attention_q8 hd=%d block 256 vs %u, grid 1", c.hd, small);
        double d1 = 0;
        for (size_t i = 0; i < out.size(); i++) d1 = std::max(d1, (double)fabsf(out[i] - out1[i]));
        report(what, d1, 1e-6);
    }
}
