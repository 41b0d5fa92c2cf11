// attention_prefill_q8 (attention_prefill.cuh over kv_store_q8's blocks) against the f64
// softmax of the dequantised cache with the query unrounded (the CPU's int8 attention in
// exact arithmetic: att_ref, test_attention_long.h), against attention_q8 (the per-row
// kernel launches of up to 64 tokens keep), and bit for bit against
// attention_prefill over an f16 cache of f16(d·q) (the conversion in shared memory must
// give the products the same operands). Shapes: Qwen3-30B-A3B's 32/4 heads x 128 for a
// fresh prompt and a batch at a nonzero position (spans crossing chunk edges, a partial
// last tile), head_dim 64 with one K/V head (68-byte rows: heads at offsets 0, 4, 8, 12
// of their first 16-byte piece), head_dim 96 (102-byte heads), and positions out of order
// with some outside the cache (output 0).

static void test_attention_prefill_q8() {
    struct C { int nt, nh, nkv, hd, pos0, grid, block; bool shuffled; } cases[] = {
        {130, 32, 4, 128, 0, 8, 256, false}, {100, 32, 4, 128, 61, 7, 256, false},
        {70, 8, 1, 64, 130, 3, 256, false},  {65, 6, 2, 96, 0, 5, 128, false},
        {80, 8, 2, 64, 0, 4, 256, true}};
    for (auto c : cases) {
        int kvd = c.nkv * c.hd, ctx = c.pos0 + c.nt, g = c.nh / c.nkv;
        std::vector<float> q(c.nt * c.nh * c.hd), k((size_t)ctx * kvd), v((size_t)ctx * kvd);
        for (auto& x : q) x = urand(2);
        for (auto& x : k) x = urand(2);
        for (auto& x : v) x = urand(1);
        // 8 words of slack: the emulator's cp.async reads whole 16-byte pieces, which on a
        // GPU stay inside the allocation (kv.rs: layers 256-byte aligned).
        size_t words = (size_t)ctx * kvd / 32 * 17;
        std::vector<uint16_t> kc(words + 8, 0), vc(words + 8, 0);
        std::vector<int32_t> all(ctx);
        for (int i = 0; i < ctx; i++) all[i] = i;
        launch(ops_grid((uint64_t)ctx * kvd / 32), 256, [&] { kv_store_q8(k.data(), v.data(), all.data(), kc.data(), vc.data(), kvd, ctx, ctx); });
        // The cache's values: exact (the reference), and as f16 (attention_prefill's cache).
        std::vector<float> kd(k.size()), vd(v.size());
        std::vector<uint16_t> kh(k.size()), vh(v.size());
        for (size_t b = 0; b < k.size() / 32; b++)
            for (int i = 0; i < 32; i++) {
                kd[b * 32 + i] = f16_to_f32(kc[b * 17]) * (float)(int8_t)(kc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
                vd[b * 32 + i] = f16_to_f32(vc[b * 17]) * (float)(int8_t)(vc[b * 17 + 1 + i / 2] >> (8 * (i & 1)));
                kh[b * 32 + i] = f32_to_f16(kd[b * 32 + i]);
                vh[b * 32 + i] = f32_to_f16(vd[b * 32 + i]);
            }
        std::vector<int32_t> apos(c.nt);
        for (int t = 0; t < c.nt; t++) apos[t] = c.pos0 + t;
        if (c.shuffled) {
            for (int t = c.nt - 1; t > 0; t--) std::swap(apos[t], apos[rng() % (t + 1)]);
            apos[3] = -1; apos[17] = ctx; apos[40] = 0;
        }
        float scale = 1.0f / sqrtf((float)c.hd);
        std::vector<float> out(q.size(), -7.0f), f16(q.size(), -7.0f), rows(q.size(), -7.0f);
        emu_dynamic_smem_bytes = atp_q8_smem_bytes(c.hd);
        launch(c.grid, c.block, [&] { attention_prefill_q8(q.data(), apos.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        emu_dynamic_smem_bytes = atp_smem_bytes(c.hd);
        launch(c.grid, c.block, [&] { attention_prefill(q.data(), apos.data(), kh.data(), vh.data(), f16.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        emu_dynamic_smem_bytes = 0;
        launch((unsigned)(c.nt * c.nkv * ((g + 7) / 8)), 256, [&] { attention_q8(q.data(), apos.data(), kc.data(), vc.data(), rows.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        double worst = 0, worst_rows = 0;
        for (int t = 0; t < c.nt; t++)
            for (int h = 0; h < c.nh; h++) {
                int p = apos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1;
                std::vector<double> o(c.hd, 0.0);
                if (span > 0) att_ref(q, kd, vd, t, h, c.nh, g, c.hd, kvd, span, scale, o);
                for (int i = 0; i < c.hd; i++) {
                    size_t at = (size_t)(t * c.nh + h) * c.hd + i;
                    // NaN kept (std::max would drop it).
                    const double e = fabs(out[at] - o[i]), er = fabsf(out[at] - rows[at]);
                    if (!(e <= worst)) worst = e;
                    if (!(er <= worst_rows)) worst_rows = er;
                }
            }
        char what[120];
        snprintf(what, sizeof what, "attention_prefill_q8 t=%d heads %d/%d hd=%d pos0=%d%s", c.nt, c.nh, c.nkv, c.hd, c.pos0, c.shuffled ? " shuffled" : "");
        // attention_prefill's tolerance (model_ops/attention.rs PREFILL_TOL): f16 probabilities
        // (2^-11 of each weight) and here f16 queries and K/V values besides.
        report(what, worst, 1e-3);
        report(std::string(what) + " vs attention_q8", worst_rows, 1e-3);
        report(std::string(what) + " vs attention_prefill of f16(d*q)", same(out, f16) ? 0 : 1, 0.5);
    }
}
