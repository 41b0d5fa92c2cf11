// attention_short.cuh's rows (a block per token and query head, spans up to
// ATT_SHORT_MAX_SPAN) bit for bit against attention.cuh's cluster path, which computed every
// row before (att_unit_split, here without clusters: one rank), at spans of 0-3,000 rows
// (short, at the threshold, past it), GQA groups of 1, 3, 8 and 12 (two head groups), head
// dimensions 40 (the f16 cache's odd score split), 64, 96 (P·V leaves threads out), 128 and
// 256 (two row passes a chunk), both caches, blocks of 256 and 128: `attention` and
// `attention_q8` on a grid of a block per (token, query head) and of 3 blocks, and each
// window row launched alone. The GPU's order (16 ranks: a block of the cluster per chunk,
// merged in rank order) cannot run here, so att_head_short<16> and <3> (several chunks a
// rank; and the lean variant at 16) are checked against a host model of att_unit_split's
// order for R ranks, and the model at R = 1 against att_unit_split itself. Each case prints
// the output's bit hash: built against another kernels-cuda/ (-I), the hashes show whether
// `attention` changed.

// att_unit_split over every unit: `attention` as it was before the short path.
template <class Kv>
static void att_split_all(const float* q, const int32_t* pos, float* out, uint32_t nt, uint32_t nh,
                          uint32_t nkv, uint32_t hd, uint32_t n_ctx, float scale, Kv cache) {
    __shared__ AttSmem sm;
    const uint64_t units = att_units(nt, nh, nkv);
    for (uint64_t un = att_cluster_id(); un < units; un += att_clusters())
        att_unit_split(sm, q, pos, out, un, nh, nkv, hd, n_ctx, scale, cache);
}

#ifdef ATT_SHORT_MAX_SPAN
// att_head_short<R> over every row (short spans only).
template <uint32_t R, bool Lean, class Kv>
static void att_short_all(const float* q, const int32_t* pos, float* out, uint32_t nt, uint32_t nh,
                          uint32_t nkv, uint32_t hd, uint32_t n_ctx, float scale, Kv cache) {
    __shared__ AttSmem sm;
    AttShortSmem& ss = *reinterpret_cast<AttShortSmem*>(&sm);
    for (uint64_t it = blockIdx.x; it < (uint64_t)nt * nh; it += gridDim.x) {
        const uint64_t t = it / nh, span = att_span(pos[t], n_ctx);
        float qv[2];
        att_short_query(q, t, (uint32_t)(it % nh), nh, hd, qv);
        if (span <= ATT_SHORT_MAX_SPAN) att_head_short<R, Lean>(ss, qv, out, t, (uint32_t)(it % nh), (uint32_t)span, nh, nkv, hd, scale, cache);
    }
}
#endif

// The butterfly of warp_max / warp_sum_f64: lane 0's value.
template <class T, class F>
static T lane0_butterfly(std::vector<T> v, F op) {
    for (int o = 16; o > 0; o >>= 1) {
        std::vector<T> w(v);
        for (int l = 0; l < 32; l++) w[l] = op(v[l], v[l ^ o]);
        v = w;
    }
    return v[0];
}

// Row (query row qrow, K/V head kvh, span rows) as att_unit_split orders its sums for R
// ranks (chunk c on rank c mod R) in blocks of T threads.
template <class Kv>
static void att_ranks_ref(const Kv& cache, const float* qrow, uint32_t kvh, uint32_t span, uint32_t hd,
                          uint32_t T, uint32_t R, float scale, float* o) {
    Kv kv = cache;
    kv.head_at = (uint64_t)kvh * cache.head_stride;
    std::vector<float> qs(ATT_Q_STRIDE, 0.0f);
    for (uint32_t d = 0; d < hd; d++) qs[Kv::q_at(0, d, hd)] = Kv::rounds_query ? round_to_f16(qrow[d]) : qrow[d];
    std::vector<float> s(span);
    for (uint32_t j = 0; j < span; j++) {
        float part[4][ATT_HEADS] = {};
        for (uint32_t qt = 0; qt < 4; qt++) kv.score_part(qs.data(), j, qt, 1, part[qt]);
        s[j] = ((part[0][0] + part[1][0]) + (part[2][0] + part[3][0])) * scale;
    }
    const uint32_t chunks = (span + ATT_CHUNK - 1) / ATT_CHUNK, ranks = std::min(R, chunks);
    std::vector<float> cmax(chunks);
    std::vector<double> csum(chunks);
    for (uint32_t c = 0; c < chunks; c++) {
        std::vector<float> m(32, -INFINITY);
        for (uint32_t r = c * ATT_CHUNK; r < std::min(span, (c + 1) * ATT_CHUNK); r++) m[r % 32] = fmaxf(m[r % 32], s[r]);
        cmax[c] = lane0_butterfly(m, [](float a, float b) { return fmaxf(a, b); });
    }
    float mx = -INFINITY;
    for (uint32_t r = 0; r < ranks; r++) {
        float pm = -INFINITY;
        for (uint32_t c = r; c < chunks; c += R) pm = fmaxf(pm, cmax[c]);
        mx = fmaxf(mx, pm);
    }
    for (uint32_t c = 0; c < chunks; c++) {
        std::vector<double> l(32, 0.0);
        for (uint32_t r = c * ATT_CHUNK; r < std::min(span, (c + 1) * ATT_CHUNK); r++) {
            s[r] = Kv::exp(s[r] - mx, r, span);
            l[r % 32] += (double)s[r];
        }
        csum[c] = lane0_butterfly(l, [](double a, double b) { return a + b; });
    }
    double total = 0.0;
    for (uint32_t r = 0; r < ranks; r++) {
        double ps = 0.0;
        for (uint32_t c = r; c < chunks; c += R) ps += csum[c];
        total += ps;
    }
    const float inv = (float)(1.0 / total);
    for (auto& x : s) x = Kv::probability(x * inv);
    const uint32_t pairs = hd / 2, subsets = T / pairs;
    for (uint32_t d = 0; d < hd; d++) o[d] = 0.0f;
    for (uint32_t r = 0; r < ranks; r++) {
        std::vector<float> b(hd, 0.0f);
        for (uint32_t sb = 0; sb < subsets; sb++)
            for (uint32_t p = 0; p < pairs; p++) {
                float a0 = 0.0f, a1 = 0.0f;
                for (uint32_t c = r; c < chunks; c += R)
                    for (uint32_t j = c * ATT_CHUNK + sb; j < std::min(span, (c + 1) * ATT_CHUNK); j += subsets) {
                        float va, vb;
                        kv.v_pair(j, p, va, vb);
                        a0 = fmaf(s[j], va, a0);
                        a1 = fmaf(s[j], vb, a1);
                    }
                b[2 * p] += a0;
                b[2 * p + 1] += a1;
            }
        for (uint32_t d = 0; d < hd; d++) o[d] += b[d];
    }
}

static void test_attention_short() {
    struct C { bool q8; int nh, nkv, hd, block; std::vector<int> pos; } cases[] = {
        // Qwen3-30B-A3B's heads: one chunk, its edge, two chunks, the threshold, past it
        {false, 32, 4, 128, 256, {0, 62, 63, 64, 199, 511, 512, 999}},
        {true, 32, 4, 128, 256, {63, 64, 450, 700}},
        {false, 8, 2, 128, 256, {2999, 300}}, {true, 8, 2, 128, 256, {2999, 300}},
        // two head groups of a K/V head (12), smaller blocks, a position outside the cache
        {false, 12, 1, 64, 128, {5, 70, 130, 5000}}, {true, 12, 1, 64, 128, {5, 70, 130, 5000}},
        // P·V leaving threads out (96), the f16 cache's odd score split (40), two row passes (256)
        {false, 4, 4, 96, 256, {64, 333}}, {true, 4, 4, 96, 256, {64, 333}},
        {false, 6, 2, 40, 128, {17, 260}}, {false, 4, 2, 256, 256, {100, 450}}, {true, 4, 2, 256, 256, {100, 450}},
    };
    for (auto& c : cases) {
        const int nt = (int)c.pos.size(), kvd = c.nkv * c.hd, g = c.nh / c.nkv, row = c.nh * c.hd;
        int ctx = 1;
        for (int p : c.pos) if (p != 5000) ctx = std::max(ctx, p + 1);
        std::vector<float> q((size_t)nt * row), k((size_t)ctx * kvd), v((size_t)ctx * kvd);
        for (auto& x : q) x = urand(2);
        for (auto& x : k) x = urand(2);
        for (auto& x : v) x = urand(1);
        std::vector<uint16_t> kc, vc;
        if (c.q8) {
            const size_t words = (size_t)ctx * kvd / 32 * 17;
            kc.assign(words, 0);
            vc.assign(words, 0);
            std::vector<int32_t> all(ctx);
            for (int i = 0; i < ctx; i++) all[i] = i;
            launch(ops_grid((uint64_t)ctx * kvd / 32), 256, [&] { kv_store_q8(k.data(), v.data(), all.data(), kc.data(), vc.data(), kvd, ctx, ctx); });
        } else {
            kc.resize(k.size());
            vc.resize(v.size());
            for (size_t i = 0; i < k.size(); i++) { kc[i] = f32_to_f16(k[i]); vc[i] = f32_to_f16(v[i]); }
        }
        const float scale = 1.0f / sqrtf((float)c.hd);
        const uint64_t head = c.hd;
        const AttKvF16 f16{kc.data(), vc.data(), (uint64_t)kvd, head, 0, (uint32_t)c.hd};
        const AttKvQ8 q8v{kc.data(), vc.data(), (uint64_t)kvd / 32 * 17, head / 32 * 17, 0, (uint32_t)c.hd};
        auto attend = [&](const float* qq, const int32_t* pp, float* out, int n, unsigned grid) {
            if (c.q8)
                launch(grid, c.block, [&] { attention_q8(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, c.hd, ctx, scale); });
            else
                launch(grid, c.block, [&] { attention(qq, pp, kc.data(), vc.data(), out, n, c.nh, c.nkv, c.hd, ctx, scale); });
        };
        std::vector<float> out(q.size(), -7.0f), out3(q.size(), -7.0f), alone(q.size(), -7.0f);
        attend(q.data(), c.pos.data(), out.data(), nt, (unsigned)(nt * c.nh));
        attend(q.data(), c.pos.data(), out3.data(), nt, 3);
        for (int t = 0; t < nt; t++) attend(q.data() + t * row, c.pos.data() + t, alone.data() + t * row, 1, (unsigned)c.nh);
        std::string what = std::string(c.q8 ? "attention_q8" : "attention") + " heads " + std::to_string(c.nh) + "/" +
                           std::to_string(c.nkv) + " hd=" + std::to_string(c.hd) + " block " + std::to_string(c.block) + " pos";
        for (int p : c.pos) what += " " + std::to_string(p);
        printf("%s: bits %016llx\n", what.c_str(), (unsigned long long)bits_hash(out));
        report(what + " grid of 3 vs a block a head", same(out, out3) ? 0 : 1, 0.5);
        report(what + " rows alone vs window", same(out, alone) ? 0 : 1, 0.5);
        // The cluster path over every row (attention before the short path).
        std::vector<float> split(q.size(), -7.0f);
        const unsigned units = (unsigned)(nt * c.nkv * ((g + 7) / 8));
        launch(units, c.block, [&] {
            if (c.q8)
                att_split_all(q.data(), c.pos.data(), split.data(), nt, c.nh, c.nkv, c.hd, ctx, scale, q8v);
            else
                att_split_all(q.data(), c.pos.data(), split.data(), nt, c.nh, c.nkv, c.hd, ctx, scale, f16);
        });
        report(what + " vs att_unit_split on every row", same(out, split) ? 0 : 1, 0.5);
#ifdef ATT_SHORT_MAX_SPAN
        // The host model of the ranks' order: at R = 1 att_unit_split's bits here; at 16 and
        // 3 att_head_short<R>'s.
        auto model = [&](uint32_t R, std::vector<float>& m) {
            m.assign(q.size(), -7.0f);
            for (int t = 0; t < nt; t++) {
                const int p = c.pos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1;
                for (int h = 0; h < c.nh; h++) {
                    const float* qrow = q.data() + (size_t)(t * c.nh + h) * c.hd;
                    float* o = m.data() + (size_t)(t * c.nh + h) * c.hd;
                    if (c.q8)
                        att_ranks_ref(q8v, qrow, h / g, span, c.hd, c.block, R, scale, o);
                    else
                        att_ranks_ref(f16, qrow, h / g, span, c.hd, c.block, R, scale, o);
                }
            }
        };
        std::vector<float> m1;
        model(1, m1);
        report(what + " host model R=1 vs att_unit_split", same(m1, split) ? 0 : 1, 0.5);
        // 17: R = 16, lean (attention_long's loads in flight)
        for (uint32_t R : {16u, 3u, 17u}) {
            std::vector<float> m, got(q.size(), -7.0f);
            model(R == 17 ? 16 : R, m);
            auto run = [&](auto kv) {
                const int32_t* p = c.pos.data();
                if (R == 16) att_short_all<16, false>(q.data(), p, got.data(), nt, c.nh, c.nkv, c.hd, ctx, scale, kv);
                if (R == 3) att_short_all<3, false>(q.data(), p, got.data(), nt, c.nh, c.nkv, c.hd, ctx, scale, kv);
                if (R == 17) att_short_all<16, true>(q.data(), p, got.data(), nt, c.nh, c.nkv, c.hd, ctx, scale, kv);
            };
            launch((unsigned)(nt * c.nh), c.block, [&] {
                if (c.q8)
                    run(q8v);
                else
                    run(f16);
            });
            bool ok = true;
            int moved = 0;  // short rows whose bits the order changes (the check is not vacuous)
            for (int t = 0; t < nt; t++) {
                const int p = c.pos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1;
                if (span > ATT_SHORT_MAX_SPAN) continue;
                ok = ok && memcmp(&got[(size_t)t * row], &m[(size_t)t * row], (size_t)row * 4) == 0;
                moved += memcmp(&m1[(size_t)t * row], &m[(size_t)t * row], (size_t)row * 4) != 0;
            }
            report(what + " att_head_short<" + (R == 17 ? std::string("16, lean") : std::to_string(R)) + "> vs host model (" + std::to_string(moved) +
                       " rows not R=1's)", ok ? 0 : 1, 0.5);
        }
#endif
    }
}
