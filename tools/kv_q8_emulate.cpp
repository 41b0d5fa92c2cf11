// Runs kernels-cuda's int8 K/V kernels (kv_q8.cuh: kv_store_q8, attention_q8, entered
// through model.cu) on the CPU under tools/cuda_emulate's SIMT emulator and checks them
// against host references: every stored block bit for bit against ggml's q8_0 reference
// quantisation, attention against the f64 softmax-weighted sum of the dequantised rows,
// with several launch shapes (a row's result must not depend on the grid or block).
//
//   g++ -std=c++20 -O2 -ffp-contract=off -Wno-attributes -Ikernels-cuda -Itools/cuda_emulate \
//       tools/kv_q8_emulate.cpp -o /tmp/kv_q8_emulate -lpthread && /tmp/kv_q8_emulate
#include "emu.h"
#include "model.cu"
#include <random>

static std::mt19937_64 rng(7);
static float urand(float s) { return (float)((rng() >> 40) / double(1ull << 24) * 2.0 - 1.0) * s; }
static int fails = 0;

static void check(bool ok, const char* what) {
    if (!ok) fails++;
    printf("%-64s %s\n", what, ok ? "ok" : "FAILED");
}

// ggml's quantize_row_q8_0_ref for one block, as 17 u16 words.
static void ref_block(const float* x, uint16_t* out) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    out[0] = f32_to_f16(d);
    uint8_t q[32];
    for (int i = 0; i < 32; i++) q[i] = (uint8_t)(int8_t)std::roundf(x[i] * id);
    memcpy(out + 1, q, 32);
}

static float dq(const uint16_t* row, int i) {
    const uint16_t* b = row + (i / 32) * 17;
    return f16_to_f32(b[0]) * (float)((const int8_t*)(b + 1))[i % 32];
}

int main() {
    const int nh = 4, nkv = 2, hd = 64, n_ctx = 40, kvd = nkv * hd, words = kvd / 32 * 17;
    const int nt = 3;  // tokens at positions 5, 21, 39
    std::vector<float> k(n_ctx * kvd), v(n_ctx * kvd), q(nt * nh * hd);
    for (auto& x : k) x = urand(2.0f);
    for (auto& x : v) x = urand(1.5f);
    for (int i = 64; i < 96; i++) k[i] = 0.0f;  // an all-zero block
    for (auto& x : q) x = urand(1.0f);
    std::vector<uint16_t> kc(n_ctx * words, 0xffff), vc(n_ctx * words, 0xffff);
    // Rows 0..n_ctx in two launches (a batch of 33 at positions 0.., then 7 more).
    for (auto [p0, n] : {std::pair{0, 33}, std::pair{33, 7}}) {
        std::vector<int32_t> pos(n);
        for (int t = 0; t < n; t++) pos[t] = p0 + t;
        launch(ops_grid((uint64_t)n * kvd / 32), 256, [&] {
            kv_store_q8(k.data() + p0 * kvd, v.data() + p0 * kvd, pos.data(), kc.data(), vc.data(),
                        kvd, n, n_ctx);
        });
    }
    std::vector<uint16_t> want(words);
    bool same = true;
    for (int p = 0; p < n_ctx; p++)
        for (auto [src, cache] : {std::pair{&k, &kc}, std::pair{&v, &vc}}) {
            for (int b = 0; b < kvd / 32; b++) ref_block(src->data() + p * kvd + b * 32, want.data() + b * 17);
            same &= memcmp(want.data(), cache->data() + p * words, words * 2) == 0;
        }
    check(same, "kv_store_q8: every block equals ggml's q8_0 reference");

    const int32_t pos[nt] = {5, 21, 39};
    const float scale = 0.125f;
    std::vector<float> out(nt * nh * hd);
    launch(nt * nh, 256, [&] {
        attention_q8(q.data(), pos, kc.data(), vc.data(), out.data(), nt, nh, nkv, hd, n_ctx, scale);
    });
    double worst = 0.0;
    for (int t = 0; t < nt; t++)
        for (int h = 0; h < nh; h++) {
            const int kvh = h / (nh / nkv);
            std::vector<double> s(pos[t] + 1);
            double mx = -1e300, sum = 0.0;
            for (int j = 0; j <= pos[t]; j++) {
                double dot = 0.0;
                for (int d = 0; d < hd; d++)
                    dot += (double)q[(t * nh + h) * hd + d] * dq(kc.data() + j * words, kvh * hd + d);
                s[j] = dot * scale;
                mx = std::max(mx, s[j]);
            }
            for (auto& x : s) sum += (x = std::exp(x - mx));
            for (int d = 0; d < hd; d++) {
                double o = 0.0;
                for (int j = 0; j <= pos[t]; j++) o += s[j] / sum * dq(vc.data() + j * words, kvh * hd + d);
                worst = std::max(worst, std::fabs(o - out[(t * nh + h) * hd + d]));
            }
        }
    char what[120];
    snprintf(what, sizeof what, "attention_q8 vs f64 reference (worst %.2e, tol 1e-5)", worst);
    check(worst <= 1e-5, what);
    // Other launch shapes: one token alone, 128-thread blocks, a 5-block grid.
    for (auto [grid, block] : {std::pair{1u, 128u}, std::pair{5u, 64u}, std::pair{3u, 256u}}) {
        std::vector<float> o2(nt * nh * hd);
        launch(grid, block, [&] {
            attention_q8(q.data(), pos, kc.data(), vc.data(), o2.data(), nt, nh, nkv, hd, n_ctx, scale);
        });
        if (block == 256) {
            snprintf(what, sizeof what, "attention_q8 grid %u block 256 equals grid 12", grid);
            check(o2 == out, what);
        } else {
            double w = 0.0;
            for (size_t i = 0; i < out.size(); i++) w = std::max(w, (double)std::fabs(o2[i] - out[i]));
            snprintf(what, sizeof what, "attention_q8 grid %u block %u within 1e-6 of block 256 (%.1e)", grid, block, w);
            check(w <= 1e-6, what);
        }
    }
    std::vector<float> alone(nh * hd);
    launch(nh, 256, [&] {
        attention_q8(q.data() + 2 * nh * hd, pos + 2, kc.data(), vc.data(), alone.data(), 1, nh, nkv, hd, n_ctx, scale);
    });
    check(std::equal(alone.begin(), alone.end(), out.begin() + 2 * nh * hd),
          "attention_q8: a token alone equals the same token in a batch");
    return fails ? 1 : 0;
}
