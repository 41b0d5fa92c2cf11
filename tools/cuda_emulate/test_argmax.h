// argmax_rows (sample.cu) against argmax_row's rule (crates/core/src/kernel.rs): ties to
// the lowest index inside a piece and across pieces, NaN below every number, -0 equal to
// +0, rows of NaN and of -inf, lengths not a multiple of the block; one piece, several,
// more pieces than values, a grid-stride grid, launched twice (every ticket back at 0),
// and a block that is not whole warps (0xffffffff).
static uint32_t argmax_host(const float* r, uint32_t n) {
    uint32_t best = 0;
    float bv = NAN;
    for (uint32_t i = 0; i < n; i++)
        if (r[i] > bv || (std::isnan(bv) && !std::isnan(r[i]))) { best = i; bv = r[i]; }
    return best;
}

static void test_argmax() {
    const float nan = NAN, inf = INFINITY;
    float sub;
    uint32_t one = 1;
    memcpy(&sub, &one, 4);
    struct C { uint32_t n, split, grid, block; } cases[] = {
        {1000, 1, 0, 256}, {1000, 3, 0, 128}, {12302, 4, 0, 256}, {12302, 5, 3, 64},
        {17, 32, 0, 32}, {1000, 2, 0, 48}};
    for (auto c : cases) {
        const uint32_t n = c.n, mid = n / 2 + 1, last = n - 1;
        std::vector<std::vector<float>> rows;
        auto rnd = [&] { std::vector<float> r(n); for (auto& v : r) v = urand(4); return r; };
        auto r0 = rnd(); r0[3] = 9; r0[mid] = 9; r0[last] = 9; rows.push_back(r0);
        auto r1 = rnd(); r1[last] = 9; rows.push_back(r1);
        rows.push_back(std::vector<float>(n, 1.0f));
        auto r3 = rnd(); r3[0] = nan; r3[2] = 7.5f; r3[last] = 7.5f; rows.push_back(r3);
        rows.push_back(std::vector<float>(n, nan));
        rows.push_back(std::vector<float>(n, -inf));
        auto r6 = std::vector<float>(n, nan); r6[mid] = -inf; rows.push_back(r6);
        auto r7 = rnd(); r7[5] = nan; r7[9] = inf; r7[mid] = inf; rows.push_back(r7);
        auto r8 = std::vector<float>(n, -1.0f); r8[7] = -0.0f; r8[mid] = 0.0f; rows.push_back(r8);
        auto r9 = std::vector<float>(n, -1.0f); r9[7] = 0.0f; r9[mid] = -0.0f; rows.push_back(r9);
        auto r10 = std::vector<float>(n, 0.0f); r10[last] = sub; rows.push_back(r10);
        const uint32_t want_fixed[] = {3, last, 0, 2, 0, 0, mid, 9, 7, 7, last};
        const uint32_t nr = (uint32_t)rows.size();
        std::vector<float> x;
        for (auto& r : rows) x.insert(x.end(), r.begin(), r.end());
        std::vector<uint32_t> ids(nr, 7), done(nr, 0);
        std::vector<uint64_t> partial((size_t)nr * c.split, 0);
        const unsigned grid = c.grid ? c.grid : nr * c.split;
        bool ok = true;
        for (int rep = 0; rep < 2; rep++) {
            std::fill(ids.begin(), ids.end(), 7u);
            launch(grid, c.block, [&] { argmax_rows(x.data(), ids.data(), partial.data(), done.data(), nr, n, c.split); });
            for (uint32_t r = 0; r < nr; r++) {
                uint32_t want = c.block % 32 ? 0xffffffffu : argmax_host(&x[(size_t)r * n], n);
                if (c.block % 32 == 0 && r < 11 && want != want_fixed[r]) { printf("host rule row %u: %u vs %u\n", r, want, want_fixed[r]); ok = false; }
                if (ids[r] != want) { printf("  row %u: %u, expected %u\n", r, ids[r], want); ok = false; }
                ok = ok && done[r] == 0;
            }
        }
        char what[200];
        snprintf(what, sizeof what, "argmax_rows n=%u split %u grid %u x %u (%u rows, twice)", n, c.split, grid, c.block, nr);
        report(what, ok ? 0 : 1, 0);
    }
}
