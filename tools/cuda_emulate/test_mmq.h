// mmq.cuh's kernels (mul_mat_mmq, mul_mat_experts_mmq) against the f64 product of the
// dequantised weights and the quantised activation (mm_ref), for the launches of more than
// 64 tokens they serve: float accumulation, so a tolerance instead of bit-exactness, tight
// enough (1e-6 of Σ|w·x|; every format measured ≤ 1.1e-7) that a wrong scale, min or
// sub-block fails by orders of magnitude.
// Token counts not multiples of the tile (tails of 6 and 36 tokens: fragments skipped),
// row tiles cut short, a K chunk cut short (32-value formats), x off 16-byte alignment,
// experts with no, one and many tokens (past the list's window, main.cpp shrinks MMQ_LIST
// to reach the flushes), an invalid id (NaN rows). Included by main.cpp after its helpers.
#pragma once

static const double MMQ_TOL = 1e-6;

static void mmq_dense_case(const Fmt& f, int m, int k, int n, int x_off) {
    auto w = random_weights(f, m, k);
    std::vector<float> xb((size_t)n * k + x_off);
    for (auto& v : xb) v = urand(2.0f);
    std::vector<float> x(xb.begin() + x_off, xb.end());  // the reference's copy
    x[3] = 0.0f;
    x[5] = -2.5f;  // Q8_K: largest magnitude twice, opposite signs
    x[9] = 2.5f;
    std::fill(x.begin() + k, x.begin() + k + std::min(k, 256), 0.0f);  // an all-zero block
    std::copy(x.begin(), x.end(), xb.begin() + x_off);
    size_t off = 2;  // weights off 16-byte alignment
    std::vector<uint8_t> buf(off + w.size() + 32, 0xA5);
    memcpy(buf.data() + off, w.data(), w.size());
    size_t rb = (size_t)(k / f.qk) * f.bytes;
    std::vector<double> y, mag;
    mm_ref(f, w.data(), rb, x.data(), m, k, n, y, mag);
    emu_dynamic_smem_bytes = mmq_bytes_for(f.id);
    std::vector<float> out((size_t)n * m, -2.0f);
    launch(3, 256, [&] { mul_mat_mmq(buf.data() + off, xb.data() + x_off, out.data(), f.id, m, k, n); });
    char what[160];
    snprintf(what, sizeof what, "mul_mat_mmq %s %dx%d n=%d%s", f.name, m, k, n, x_off ? " (x off 16 bytes)" : "");
    report(what, worst_rel(out, y, mag), MMQ_TOL);
}

static void mmq_experts_case(const Fmt& f, int per_slot) {
    const int m = 72, k = 512, n_tokens = 100, n_used = 3, n_exp = 5;
    const size_t rb = (size_t)(k / f.qk) * f.bytes, eb = rb * m + 32;
    std::vector<uint8_t> w;
    for (int e = 0; e < n_exp; e++) {
        auto we = random_weights(f, m, k);
        w.insert(w.end(), we.begin(), we.end());
        w.insert(w.end(), 32, 0xEE);
    }
    // Expert 0: no token; 1: one slot; 3: most slots; 2 and 4 a few; one invalid id.
    std::vector<int32_t> ids(n_tokens * n_used);
    for (auto& i : ids) { int r = (int)(rng() % 10); i = r < 7 ? 3 : r < 9 ? 2 : 4; }
    ids[10] = 1;
    ids[7] = -1;
    const int xr = per_slot ? n_tokens * n_used : n_tokens;
    std::vector<float> x((size_t)xr * k);
    for (auto& v : x) v = urand(2.0f);
    std::vector<float> out((size_t)n_tokens * n_used * m, -2.0f);
    emu_dynamic_smem_bytes = mmq_bytes_for(f.id) + 4 * MMQ_LIST;
    // Per slot: more blocks than mmq_expert_blocks takes (8 here), the rest leave at once.
    launch(per_slot ? 11 : 4, 256, [&] { mul_mat_experts_mmq(w.data(), x.data(), ids.data(), out.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
    std::vector<float> got;
    std::vector<double> yall, magall;
    bool nan_ok = true;
    for (int s = 0; s < n_tokens * n_used; s++) {
        if (ids[s] < 0) {
            for (int r = 0; r < m; r++) nan_ok &= std::isnan(out[(size_t)s * m + r]);
            continue;
        }
        std::vector<double> y, mag;
        const int row = per_slot ? s : s / n_used;
        mm_ref(f, w.data() + ids[s] * eb, rb, x.data() + (size_t)row * k, m, k, 1, y, mag);
        yall.insert(yall.end(), y.begin(), y.end());
        magall.insert(magall.end(), mag.begin(), mag.end());
        got.insert(got.end(), out.begin() + (size_t)s * m, out.begin() + (size_t)(s + 1) * m);
    }
    char what[160];
    snprintf(what, sizeof what, "mul_mat_experts_mmq %s %dx%d slots %d per_slot %d", f.name, m, k, n_tokens * n_used, per_slot);
    report(what, worst_rel(got, yall, magall), MMQ_TOL);
    report(std::string(what) + " invalid id: NaN rows", nan_ok ? 0.0 : 1.0, 0);
}

static void test_mmq() {
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        mmq_dense_case(f, 136, 768, 70, 0);  // two row tiles (the second short), 64 + 6 tokens
        mmq_dense_case(f, 40, 512, 100, 1);  // 64 + 36 tokens, x not 16-byte aligned
        if (f.qk == 32) mmq_dense_case(f, 24, 288, 20, 0);  // a chunk of 32 values
        for (int per_slot = 0; per_slot < 2; per_slot++) mmq_experts_case(f, per_slot);
    }
}
