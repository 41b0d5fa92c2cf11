// attention_flash / attention_flash_q8 (attention_flash.cuh) with the thresholds lowered
// (main.cpp: ATT_LONG_MIN_SPAN 100, ATT_FLASH_PIECES 32 in 2 groups; or the kernels' own
// with -DATT_LONG_REAL), so that spans of a few thousand rows take several pieces, both
// groups and partial steps: against the f64 softmax of the cache's (dequantised) values
// (att_ref, test_attention_long.h); a window whose rows straddle the threshold row for row
// bit for bit equal to each row launched alone, to another grid and (long rows) to another
// block size; its short rows bit for bit `attention`'s; the counters back to 0. The f16
// cache's staged path (attention_flash_run<true>, ATT_FLASH_STAGED) and the direct one
// bit for bit equal, whichever the kernel was built with (-DATT_FLASH_STAGED=1 runs every
// check above through the staged path).

static void test_attention_flash() {
    const size_t scratch_bytes = ATT_LONG_SCRATCH_AT + 4 * ATT_LONG_COUNTERS + ATT_FLASH_PARTIAL_BYTES;
    std::vector<uint8_t> scratch(scratch_bytes, 0);
    auto counters_zero = [&] {
        const uint32_t* c = (const uint32_t*)(scratch.data() + ATT_LONG_SCRATCH_AT);
        for (int i = 0; i < ATT_LONG_COUNTERS; i++) if (c[i] != 0) return false;
        return true;
    };
    struct C { bool q8; int nh, nkv, block; std::vector<int> pos; } cases[] = {
        // one row per launch: short, the first long span, several pieces, a partial step,
        // two groups of pieces of 128 rows, two groups of 256
        {false, 8, 2, 256, {99}}, {false, 8, 2, 256, {100}}, {false, 8, 2, 256, {300}},
        {false, 8, 2, 256, {2999}}, {false, 8, 2, 256, {5000}}, {true, 8, 2, 256, {100}},
        {true, 8, 2, 256, {2999}}, {true, 8, 2, 256, {5000}},
        // windows straddling the threshold; GQA groups of 3 and 12 (two head groups)
        {false, 6, 2, 256, {97, 98, 99, 100, 101, 700}}, {true, 6, 2, 256, {97, 98, 99, 100, 101, 700}},
        {false, 12, 1, 128, {50, 99, 100, 600}}, {true, 12, 1, 128, {50, 99, 100, 4200}},
        // a position outside the cache; blocks of 4 warps (two slices a warp)
        {false, 4, 4, 256, {130, 64, 9000, 1023}}, {false, 8, 2, 128, {2999, 4500}},
    };
    // The kernel built staged takes its K/V rings from the launch's dynamic shared memory.
    emu_dynamic_smem_bytes = ATT_FLASH_STAGED ? ATT_FLASH_SMEM : 0;
    for (auto& c : cases) {
        const int hd = 128;
        int nt = (int)c.pos.size(), kvd = c.nkv * hd, g = c.nh / c.nkv;
        int ctx = 1;
        for (int p : c.pos) if (p != 9000) ctx = std::max(ctx, p + 1);
        std::vector<float> q(nt * c.nh * hd), k((size_t)ctx * kvd), v((size_t)ctx * kvd);
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
        float scale = 1.0f / sqrtf((float)hd);
        uint64_t units = (uint64_t)nt * c.nkv * ((g + 7) / 8);
        auto run = [&](const float* qq, const int32_t* pp, float* out, int n, unsigned grid, unsigned block) {
            if (c.q8)
                launch(grid, block, [&] { attention_flash_q8(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, hd, ctx, scale, scratch.data()); });
            else
                launch(grid, block, [&] { attention_flash(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, hd, ctx, scale, scratch.data()); });
        };
        std::vector<float> out(nt * c.nh * hd, -7.0f);
        run(q.data(), c.pos.data(), out.data(), nt, (unsigned)(units * ATT_FLASH_GROUPS), c.block);
        bool zero = counters_zero();
        // Another grid (fewer blocks than items: grid-stride), the same bits.
        std::vector<float> out3(out.size(), -7.0f);
        run(q.data(), c.pos.data(), out3.data(), nt, 3, c.block);
        zero = zero && counters_zero();
        // Each row alone (its own q, pos and out offsets), the same bits.
        std::vector<float> alone(out.size(), -7.0f);
        int row = c.nh * hd;
        for (int t = 0; t < nt; t++)
            run(q.data() + t * row, c.pos.data() + t, alone.data() + t * row, 1, (unsigned)(c.nkv * ((g + 7) / 8) * ATT_FLASH_GROUPS), c.block);
        zero = zero && counters_zero();
        // Another block size (4 or 8 warps): the long rows' bits unchanged.
        std::vector<float> other(out.size(), -7.0f);
        run(q.data(), c.pos.data(), other.data(), nt, (unsigned)(units * ATT_FLASH_GROUPS), c.block == 256 ? 128 : 256);
        zero = zero && counters_zero();
        bool block_same = true;
        // The f16 cache: both data paths, the same bits (and the kernel's).
        bool staged_same = true;
        if (!c.q8) {
            auto path = [&](bool staged, std::vector<float>& o) {
                emu_dynamic_smem_bytes = staged ? (uint32_t)(c.block / 32 * ATT_FLASH_WARP_SMEM) : 0;
                launch((unsigned)(units * ATT_FLASH_GROUPS), c.block, [&] {
                    const AttKvF16 cache{kc.data(), vc.data(), (uint64_t)kvd, (uint64_t)hd, 0, (uint32_t)hd};
                    if (staged)
                        attention_flash_run<true>(q.data(), c.pos.data(), o.data(), nt, c.nh, c.nkv, hd, ctx, scale, cache, scratch.data());
                    else
                        attention_flash_run<false>(q.data(), c.pos.data(), o.data(), nt, c.nh, c.nkv, hd, ctx, scale, cache, scratch.data());
                });
                emu_dynamic_smem_bytes = ATT_FLASH_STAGED ? ATT_FLASH_SMEM : 0;
            };
            std::vector<float> direct(out.size(), -7.0f), staged(out.size(), -7.0f);
            path(false, direct);
            path(true, staged);
            staged_same = same(direct, staged) && same(out, staged);
            zero = zero && counters_zero();
        }
        // Short rows: `attention`'s (and attention_q8's) bits.
        std::vector<float> plain(out.size(), -7.0f);
        if (c.q8)
            launch((unsigned)units, c.block, [&] { attention_q8(q.data(), c.pos.data(), kc.data(), vc.data(), plain.data(), nt, c.nh, c.nkv, hd, ctx, scale); });
        else
            launch((unsigned)units, c.block, [&] { attention(q.data(), c.pos.data(), kc.data(), vc.data(), plain.data(), nt, c.nh, c.nkv, hd, ctx, scale); });
        double worst = 0, worst_short = 0;
        bool short_same = true;
        for (int t = 0; t < nt; t++) {
            int p = c.pos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1;
            for (int h = 0; h < c.nh; h++) {
                std::vector<double> o(hd, 0.0);
                if (span > 0) att_ref(qr, kd, vd, t, h, c.nh, g, hd, kvd, span, scale, o);
                for (int i = 0; i < hd; i++) {
                    size_t at = (size_t)(t * c.nh + h) * hd + i;
                    double& w = span > ATT_LONG_MIN_SPAN ? worst : worst_short;
                    w = std::max(w, fabs(out[at] - o[i]));
                    if (span > ATT_LONG_MIN_SPAN && memcmp(&out[at], &other[at], 4) != 0) block_same = false;
                    if (span <= ATT_LONG_MIN_SPAN && memcmp(&out[at], &plain[at], 4) != 0) short_same = false;
                }
            }
        }
        std::string what = std::string("attention_flash") + (c.q8 ? "_q8" : "") + " heads " + std::to_string(c.nh) + "/" +
                           std::to_string(c.nkv) + " hd=" + std::to_string(hd) + " block " + std::to_string(c.block) + " pos";
        for (int p : c.pos) what += " " + std::to_string(p);
        // f16 query (the q8_0 cache's: two f16 parts) and q8_0 V values, f16 unnormalised
        // probabilities: each weight within ~2^-11 of its own, random in sign (worst seen:
        // 6e-5 f16 and 1.5e-4 q8_0 at 101 rows, under 2e-5 from 3,000); a row merged
        // wrongly or a slice lost is off by ~|v|/pieces, 1e-3 and more.
        report(what + " long rows", worst, 2e-4);
        // the short path rounds the f16 cache's probabilities to f16 (test_attention)
        report(what + " short rows", worst_short, c.q8 ? 2e-5 : 2e-3);
        report(what + " grid of 3 vs items", same(out, out3) ? 0 : 1, 0.5);
        report(what + " rows alone vs window", same(out, alone) ? 0 : 1, 0.5);
        report(what + " short rows vs attention", short_same ? 0 : 1, 0.5);
        report(what + " long rows, other block size", block_same ? 0 : 1, 0.5);
        report(what + " counters back to 0", zero ? 0 : 1, 0.5);
        if (!c.q8) report(what + " staged vs direct K/V path", staged_same ? 0 : 1, 0.5);
    }
}
