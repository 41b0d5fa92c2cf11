// Runs every kernel of kernels-cuda/model.cu on the CPU under a small SIMT emulator (emu.h:
// one std::thread per GPU thread, real barriers for __syncthreads and warp shuffles) and
// checks it against plain host references: products against the f64 product of the
// dequantised weights and the kernel's quantised activations, embed_rows bit for bit
// against the (gguf-checked, tools/cuda_host_check.py) dequantisation, the rest against
// their definitions. Catches indexing, synchronisation and launch-shape bugs (a missed
// barrier deadlocks and is reported) before a GPU is used. Slow: minutes for `mm`.
//
//   g++ -std=c++20 -O2 -ffp-contract=off -Wno-attributes -Ikernels-cuda \
//       tools/cuda_emulate/main.cpp -o /tmp/cuda_emulate -lpthread
//   /tmp/cuda_emulate [small|rope|router|embed|attention|attention_prefill|attention_prefill_q8|attention_q8|attention_short|attention_long|attention_flash|experts|mm|vec|fused|products|qkv_rope|qkv_q8_rows|mma|mmq|vec_q8|vec_q8_rows|cached|cached_multi|cached_q8|experts_multi_q8|gate_up_multi_q8|gate_up_cached|argmax [FORMAT,FORMAT...]]
#include "emu.h"
// mmq.cuh lists few slots at once here, so test_mmq reaches its list flushes.
#define MMQ_LIST 128
#define MMQ_WINDOW 64
// attention_long.cuh's long path from 100 rows, in pieces of 4+ rows and rounds of two
// chunks, so that test_attention_long reaches its groups, pieces and rounds at small spans
// (build with -DATT_LONG_REAL for the kernels' own thresholds: slower).
#ifndef ATT_LONG_REAL
#define ATT_LONG_MIN_SPAN 100
#define ATT_LONG_MIN_PIECE 4
#define ATT_LONG_ROUND_CHUNKS 2
#define ATT_FLASH_PIECES 32
#define ATT_FLASH_GROUPS 2
#endif
#include "model.cu"
#include "fused.cu"
#include "experts.cu"
#include "sample.cu"
#include <random>
#include <string>
#include <functional>

static std::mt19937_64 rng(42);
static float urand(float s) { return (float)((rng() >> 40) / double(1ull << 24) * 2.0 - 1.0) * s; }
static int fails = 0;
static std::string fmt_only;

static void report(const std::string& what, double worst, double tol) {
    bool ok = worst <= tol && !std::isnan(worst);
    if (!ok) fails++;
    printf("%-60s worst %.3e tol %.1e %s\n", what.c_str(), worst, tol, ok ? "" : "FAILED");
}

struct Fmt { int id; int qk; int bytes; int act; const char* name; };
static const Fmt FORMATS[] = {
    {T_F32, 1, 4, -1, "F32"}, {T_F16, 1, 2, -2, "F16"}, {T_BF16, 1, 2, -3, "BF16"},
    {T_Q4_0, 32, 18, ACT_Q8_0, "Q4_0"}, {T_Q4_1, 32, 20, ACT_Q8_1, "Q4_1"},
    {T_Q5_0, 32, 22, ACT_Q8_0, "Q5_0"}, {T_Q5_1, 32, 24, ACT_Q8_1, "Q5_1"},
    {T_Q8_0, 32, 34, ACT_Q8_0, "Q8_0"}, {T_Q2_K, 256, 84, ACT_Q8_K, "Q2_K"},
    {T_Q3_K, 256, 110, ACT_Q8_K, "Q3_K"}, {T_Q4_K, 256, 144, ACT_Q8_K, "Q4_K"},
    {T_Q5_K, 256, 176, ACT_Q8_K, "Q5_K"}, {T_Q6_K, 256, 210, ACT_Q8_K, "Q6_K"},
    {T_IQ2_XXS, 256, 66, ACT_Q8_K, "IQ2_XXS"}, {T_IQ2_XS, 256, 74, ACT_Q8_K, "IQ2_XS"},
    {T_IQ2_S, 256, 82, ACT_Q8_K, "IQ2_S"}, {T_IQ3_XXS, 256, 98, ACT_Q8_K, "IQ3_XXS"},
    {T_IQ3_S, 256, 110, ACT_Q8_K, "IQ3_S"}, {T_IQ4_NL, 32, 18, ACT_Q8_0, "IQ4_NL"},
    {T_IQ4_XS, 256, 136, ACT_Q8_K, "IQ4_XS"}, {T_MXFP4, 32, 17, ACT_Q8_0, "MXFP4"},
};

static std::vector<int> f16_offsets(int id) {
    switch (id) {
        case T_Q4_0: case T_Q5_0: case T_Q8_0: case T_IQ4_NL: case T_IQ2_XXS: case T_IQ2_XS:
        case T_IQ2_S: case T_IQ3_XXS: case T_IQ3_S: case T_IQ4_XS: return {0};
        case T_Q4_1: case T_Q5_1: case T_Q4_K: case T_Q5_K: return {0, 2};
        case T_Q2_K: return {80, 82};
        case T_Q3_K: return {108};
        case T_Q6_K: return {208};
        default: return {};
    }
}

static std::vector<uint8_t> random_weights(const Fmt& f, int rows, int k) {
    std::vector<uint8_t> w;
    if (f.qk == 1) {
        for (int i = 0; i < rows * k; i++) {
            float v = urand(1.0f);
            if (f.id == T_F32) { uint8_t b[4]; memcpy(b, &v, 4); w.insert(w.end(), b, b + 4); }
            else { uint16_t h = f.id == T_F16 ? f32_to_f16(v) : f32_to_bf16(v); w.push_back(h & 255); w.push_back(h >> 8); }
        }
        return w;
    }
    size_t nb = (size_t)rows * k / f.qk;
    w.resize(nb * f.bytes);
    for (auto& b : w) b = rng() & 255;
    for (size_t i = 0; i < nb; i++) {
        uint8_t* blk = &w[i * f.bytes];
        if (f.id == T_MXFP4) blk[0] = 118 + rng() % 8;
        for (int o : f16_offsets(f.id)) { uint16_t h = f32_to_f16(0.002f + 0.02f * (urand(1) + 1)); blk[o] = h & 255; blk[o + 1] = h >> 8; }
    }
    return w;
}

// Dequantised row r (host call of the verified decode).
static std::vector<float> deq_row(const Fmt& f, const uint8_t* w, int k) {
    std::vector<float> out(k);
    if (f.qk == 1) {
        for (int i = 0; i < k; i++) out[i] = f.id == T_F32 ? ((const float*)w)[i] : f.id == T_F16 ? f16_to_f32(((const uint16_t*)w)[i]) : bf16_to_f32(((const uint16_t*)w)[i]);
        return out;
    }
    for (int j = 0; j < k / 32; j++) {
        Sub s;
        switch (f.id) {
#define C(id, F) case id: F::decode(w + (j / (F::QK / 32)) * F::BYTES, j % (F::QK / 32), s); dequant_sub<F>(s, &out[32 * j]); break;
            QUANT_FORMATS(C)
#undef C
        }
    }
    return out;
}

// The activation as the kernel sees it (quantised and back), and for Q8_1 per-32 s - d·Σq.
static std::vector<double> act_ref(const Fmt& f, const float* x, int k, std::vector<double>& s_corr) {
    std::vector<double> a(k);
    s_corr.assign(k / 32 + 1, 0.0);
    if (f.act == -1) { for (int i = 0; i < k; i++) a[i] = x[i]; return a; }
    if (f.act == -2) { for (int i = 0; i < k; i++) a[i] = round_to_f16(x[i]); return a; }
    if (f.act == -3) { for (int i = 0; i < k; i++) a[i] = round_to_bf16(x[i]); return a; }
    if (f.act == ACT_Q8_K) {
        for (int b = 0; b < k; b += 256) {
            float amax = 0, vmax = 0;
            for (int j = 0; j < 256; j++) if (fabsf(x[b + j]) > amax) { amax = fabsf(x[b + j]); vmax = x[b + j]; }
            if (amax == 0) { for (int j = 0; j < 256; j++) a[b + j] = 0; continue; }
            float is = -127.0f / vmax, d = 1.0f / is;
            for (int j = 0; j < 256; j++) a[b + j] = (double)std::min(__float2int_rn(is * x[b + j]), 127) * d;
        }
        return a;
    }
    for (int b = 0; b < k; b += 32) {
        float amax = 0;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[b + j]));
        float d = amax / 127.0f, id = d != 0 ? 1.0f / d : 0.0f, dr = round_to_f16(d);
        int sum = 0;
        for (int j = 0; j < 32; j++) { int q = (int)roundf(x[b + j] * id); a[b + j] = (double)q * dr; sum += q; }
        s_corr[b / 32] = (double)round_to_f16((float)sum * d) - (double)sum * dr;
    }
    return a;
}

static bool has_offset(int id) { return id == T_Q4_1 || id == T_Q5_1; }
static float block_m(const Fmt& f, const uint8_t* blk) { return f16_to_f32((uint16_t)(blk[2] | blk[3] << 8)); }

// Reference y[t][r] and its scale Σ|w·x|.
static void mm_ref(const Fmt& f, const uint8_t* w, size_t row_bytes, const float* x, int m, int k, int n, std::vector<double>& y, std::vector<double>& mag) {
    y.assign((size_t)n * m, 0); mag.assign((size_t)n * m, 0);
    for (int t = 0; t < n; t++) {
        std::vector<double> sc;
        auto a = act_ref(f, x + (size_t)t * k, k, sc);
        for (int r = 0; r < m; r++) {
            auto wr = deq_row(f, w + r * row_bytes, k);
            double s = 0, g = 0;
            for (int i = 0; i < k; i++) { s += wr[i] * a[i]; g += fabs(wr[i] * x[(size_t)t * k + i]); }
            if (has_offset(f.id)) for (int j = 0; j < k / 32; j++) s += block_m(f, w + r * row_bytes + j * f.bytes) * sc[j];
            y[(size_t)t * m + r] = s; mag[(size_t)t * m + r] = g + 1e-6;
        }
    }
}

static double worst_rel(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale) {
    double w = 0;
    for (size_t i = 0; i < got.size(); i++) {
        double e = fabs((double)got[i] - want[i]) / scale[i];
        if (std::isnan(e) || !std::isfinite(got[i])) return NAN;
        w = std::max(w, e);
    }
    return w;
}

static void test_mul_mat() {
    struct Shape { int m, k, n; };
    for (const Fmt& f : FORMATS) {
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        std::vector<Shape> shapes = {{37, 512, 1}, {45, 512, 17}, {16, 20480, 1}, {16, 20480, 11}};
        if (f.qk == 1) { shapes.push_back({7, 100, 3}); shapes.push_back({5, 33, 1}); }
        for (auto [m, k, n] : shapes) {
            auto w = random_weights(f, m, k);
            std::vector<float> x((size_t)n * k);
            for (auto& v : x) v = urand(2.0f);
            if (n >= 2 && k >= 512) { x[5] = -2.5f; x[9] = 2.5f; std::fill(x.begin() + k + 256, x.begin() + k + 512, 0.0f); }
            size_t rb = f.qk == 1 ? (size_t)k * f.bytes : (size_t)(k / f.qk) * f.bytes;
            // weights at an offset that breaks 16-byte alignment
            size_t off = f.qk == 1 ? 4 : 2;
            std::vector<uint8_t> buf(off + w.size() + 32, 0xA5);
            memcpy(buf.data() + off, w.data(), w.size());
            std::vector<double> y, mag;
            mm_ref(f, w.data(), rb, x.data(), m, k, n, y, mag);
            std::vector<float> out0;
            struct Cfg { unsigned g, b; } cfgs[] = {{ops_grid((uint64_t)n * m), 256}, {3, 128}, {1, 384}};
            for (auto c : cfgs) {
                std::vector<float> out((size_t)n * m, -1.0f);
                launch(c.g, c.b, [&] { mul_mat(buf.data() + off, x.data(), out.data(), f.id, m, k, n); });
                char what[160];
                snprintf(what, sizeof what, "mul_mat %s %dx%d n=%d grid %u block %u", f.name, m, k, n, c.g, c.b);
                report(what, worst_rel(out, y, mag), 1e-5);
                if (out0.empty() && n == 11) {
                    // rows of the tile of 8 and of 3, each alone: bit-exact
                    for (int t : {0, 7, 8, 10}) {
                        std::vector<float> alone(m);
                        launch(ops_grid(m), 256, [&] { mul_mat(buf.data() + off, x.data() + (size_t)t * k, alone.data(), f.id, m, k, 1); });
                        if (memcmp(alone.data(), out.data() + (size_t)t * m, m * 4) != 0) { printf("  row %d alone differs FAILED\n", t); fails++; }
                    }
                }
                if (out0.empty()) out0 = out;
                else if (memcmp(out0.data(), out.data(), out.size() * 4) != 0) { printf("  not bit-equal across shapes FAILED\n"); fails++; }
            }
        }
    }
}

static void test_experts() {
    for (const Fmt& f : FORMATS) {
        int m = 24, k = 512, n_tokens = 3, n_used = 2, n_exp = 5;
        for (int per_slot = 0; per_slot < 2; per_slot++) {
            size_t rb = f.qk == 1 ? (size_t)k * f.bytes : (size_t)(k / f.qk) * f.bytes;
            size_t eb = rb * m + 32;
            std::vector<uint8_t> w;
            for (int e = 0; e < n_exp; e++) { auto we = random_weights(f, m, k); w.insert(w.end(), we.begin(), we.end()); w.insert(w.end(), 32, 0xEE); }
            std::vector<int32_t> ids(n_tokens * n_used);
            for (auto& i : ids) i = rng() % n_exp;
            int xr = per_slot ? n_tokens * n_used : n_tokens;
            std::vector<float> x((size_t)xr * k);
            for (auto& v : x) v = urand(2.0f);
            std::vector<float> out((size_t)n_tokens * n_used * m);
            launch(ops_grid(out.size()), 256, [&] { mul_mat_experts(w.data(), x.data(), ids.data(), out.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
            std::vector<double> yall, magall;
            for (int s = 0; s < n_tokens * n_used; s++) {
                std::vector<double> y, mag;
                int row = per_slot ? s : s / n_used;
                mm_ref(f, w.data() + ids[s] * eb, rb, x.data() + (size_t)row * k, m, k, 1, y, mag);
                yall.insert(yall.end(), y.begin(), y.end()); magall.insert(magall.end(), mag.begin(), mag.end());
            }
            char what[160];
            snprintf(what, sizeof what, "mul_mat_experts %s per_slot %d", f.name, per_slot);
            report(what, worst_rel(out, yall, magall), 1e-5);
        }
    }
}

static void test_embed() {
    for (const Fmt& f : FORMATS) {
        int rows = 10, dim = 512;
        auto t = random_weights(f, rows, dim);
        size_t rb = f.qk == 1 ? (size_t)dim * f.bytes : (size_t)(dim / f.qk) * f.bytes;
        std::vector<uint32_t> ids = {3, 0, 9, 3, 7};
        std::vector<float> out(ids.size() * dim);
        launch(ops_grid(out.size()), 256, [&] { embed_rows(t.data(), ids.data(), out.data(), f.id, dim, ids.size()); });
        double worst = 0;
        for (size_t i = 0; i < ids.size(); i++) {
            auto r = deq_row(f, t.data() + ids[i] * rb, dim);
            for (int j = 0; j < dim; j++) if (memcmp(&r[j], &out[i * dim + j], 4) != 0) worst = 1;
        }
        report(std::string("embed_rows ") + f.name + " (bit-exact)", worst, 0);
    }
}

static void test_small_ops() {
    // rms_norm
    for (auto [rows, dim] : std::vector<std::pair<int, int>>{{1, 576}, {7, 4096}, {120, 64}, {3, 100}, {2, 13}}) {
        std::vector<float> x(rows * dim), w(dim), y(rows * dim);
        for (auto& v : x) v = urand(3); for (auto& v : w) v = urand(1.5);
        launch(ops_grid(rows * dim), 256, [&] { rms_norm(x.data(), w.data(), y.data(), rows, dim, 1e-6f); });
        double worst = 0;
        for (int r = 0; r < rows; r++) {
            double s = 0; for (int i = 0; i < dim; i++) s += (double)x[r * dim + i] * x[r * dim + i];
            double sc = 1 / sqrt(s / dim + 1e-6);
            for (int i = 0; i < dim; i++) worst = std::max(worst, fabs(y[r * dim + i] - x[r * dim + i] * sc * w[i]) / std::max(1e-6, fabs(x[r * dim + i] * sc * w[i])));
        }
        report("rms_norm " + std::to_string(rows) + "x" + std::to_string(dim), worst, 1e-5);
    }
    // add, swiglu, add_rows, sigmoid_gate_add, moe_combine, kv_store
    {
        int n = 1000;
        std::vector<float> a(n), b(n), y(n);
        for (auto& v : a) v = urand(4); for (auto& v : b) v = urand(4);
        launch(ops_grid(n), 256, [&] { add(a.data(), b.data(), y.data(), n); });
        double w1 = 0; for (int i = 0; i < n; i++) w1 = std::max(w1, (double)fabsf(y[i] - (a[i] + b[i])));
        report("add", w1, 0);
        launch(ops_grid(n), 256, [&] { swiglu(a.data(), b.data(), y.data(), n); });
        double w2 = 0; for (int i = 0; i < n; i++) { double r = a[i] / (1 + exp(-(double)a[i])) * b[i]; w2 = std::max(w2, fabs(y[i] - r) / std::max(1e-6, fabs(r))); }
        report("swiglu", w2, 1e-6);
        int rows = 30, dim = 37;
        std::vector<float> x(rows * dim), x0, bb(dim), g(rows), o(rows * dim), o0;
        for (auto& v : x) v = urand(2); for (auto& v : bb) v = urand(2); for (auto& v : g) v = urand(3); for (auto& v : o) v = urand(2);
        g[3] = 0.0f;
        x0 = x; o0 = o;
        launch(ops_grid(rows * dim), 256, [&] { add_rows(x.data(), bb.data(), rows, dim); });
        double w3 = 0; for (int i = 0; i < rows * dim; i++) w3 = std::max(w3, (double)fabsf(x[i] - (x0[i] + bb[i % dim])));
        report("add_rows", w3, 0);
        launch(ops_grid(rows * dim), 256, [&] { sigmoid_gate_add(x0.data(), g.data(), o.data(), rows, dim); });
        double w4 = 0; for (int i = 0; i < rows * dim; i++) { double r = o0[i] + x0[i] / (1 + exp(-(double)g[i / dim])); w4 = std::max(w4, fabs(o[i] - r)); }
        report("sigmoid_gate_add", w4, 1e-5);
        int nt = 5, nu = 3, m = 40;
        std::vector<float> yy(nt * nu * m), ww(nt * nu), out(nt * m);
        for (auto& v : yy) v = urand(2); for (auto& v : ww) v = urand(1);
        launch(ops_grid(nt * m), 256, [&] { moe_combine(yy.data(), ww.data(), out.data(), nt, nu, m); });
        double w5 = 0;
        for (int t = 0; t < nt; t++) for (int i = 0; i < m; i++) { double r = 0; for (int j = 0; j < nu; j++) r += (double)ww[t * nu + j] * yy[(t * nu + j) * m + i]; w5 = std::max(w5, fabs(out[t * m + i] - r)); }
        report("moe_combine", w5, 1e-5);
        int kvd = 64, p0 = 3, ntk = 4;
        std::vector<float> kk(ntk * kvd), vv(ntk * kvd);
        for (auto& v : kk) v = urand(2); for (auto& v : vv) v = urand(2);
        std::vector<uint16_t> kc(10 * kvd, 7), vc(10 * kvd, 7);
        std::vector<int32_t> kpos(ntk);
        for (int t = 0; t < ntk; t++) kpos[t] = p0 + t;
        launch(ops_grid(ntk * kvd), 256, [&] { kv_store(kk.data(), vv.data(), kpos.data(), kc.data(), vc.data(), kvd, ntk, 10); });
        double w6 = 0;
        for (int i = 0; i < 10 * kvd; i++) {
            bool in = i >= p0 * kvd && i < (p0 + ntk) * kvd;
            uint16_t ek = in ? f32_to_f16(kk[i - p0 * kvd]) : 7, ev = in ? f32_to_f16(vv[i - p0 * kvd]) : 7;
            if (kc[i] != ek || vc[i] != ev) w6 = 1;
        }
        report("kv_store", w6, 0);
    }
}

static void test_rope() {
    int nt = 6, nh = 4, hd = 64;
    std::vector<int32_t> pos = {0, 1, 17, 511, 4095, 30000};
    struct C { unsigned mode; int nrot; float fs, ef, af; } cases[] = {{0, 64, 1, 0, 1}, {2, 64, 1, 0, 1}, {2, 32, 1, 0, 1}, {0, 48, 0.25f, 1, 1}, {2, 64, 0.5f, 0.5f, 0.9f}};
    for (auto c : cases) {
        std::vector<float> x(nt * nh * hd);
        for (auto& v : x) v = urand(2);
        auto x0 = x;
        launch(ops_grid(x.size()), 256, [&] { rope(x.data(), pos.data(), nt, nh, hd, c.nrot, c.mode, 10000.0f, c.fs, c.ef, c.af, 32.0f, 1.0f, 4096); });
        // Reference: the same definition in double (YaRN as ggml's rope_yarn).
        auto corr = [&](float beta) { return c.nrot * log(4096.0 / (beta * 2 * M_PI)) / (2 * log(10000.0)); };
        double lo = std::max(0.0, floor(corr(32))), hi = std::min(c.nrot - 1.0, ceil(corr(1)));
        double worst = 0;
        for (int t = 0; t < nt; t++) for (int h = 0; h < nh; h++) for (int i = 0; i < c.nrot / 2; i++) {
            double te = pos[t] * pow(10000.0, -2.0 * i / c.nrot), ti = c.fs * te, th = ti, ms = c.af;
            if (c.ef != 0) { double y = (i - lo) / std::max(0.001, hi - lo); double ramp = (1 - std::min(1.0, std::max(0.0, y))) * c.ef; th = ti * (1 - ramp) + te * ramp; ms *= 1 + 0.1 * log(1.0 / c.fs); }
            int a = c.mode == 2 ? i : 2 * i, b = c.mode == 2 ? i + c.nrot / 2 : 2 * i + 1;
            const float* s = &x0[(t * nh + h) * hd];
            double r0 = s[a] * cos(th) * ms - s[b] * sin(th) * ms, r1 = s[a] * sin(th) * ms + s[b] * cos(th) * ms;
            const float* g = &x[(t * nh + h) * hd];
            worst = std::max({worst, fabs(g[a] - r0), fabs(g[b] - r1)});
        }
        for (int t = 0; t < nt; t++) for (int h = 0; h < nh; h++) for (int d = c.nrot; d < hd; d++) if (x[(t * nh + h) * hd + d] != x0[(t * nh + h) * hd + d]) worst = 1;
        char what[120]; snprintf(what, sizeof what, "rope mode %u n_rot %d fs %g ef %g", c.mode, c.nrot, c.fs, c.ef);
        // f32 angles of positions up to 30000 (theta built by repeated multiplication)
        report(what, worst, 2e-2);
    }
}

static void test_attention() {
    struct C { int nt, nh, nkv, hd, pos0; } cases[] = {{1, 9, 3, 64, 0}, {1, 8, 2, 128, 700}, {1, 2, 2, 64, 4200}, {20, 8, 2, 64, 0}, {7, 6, 1, 96, 37}, {3, 4, 2, 6, 5}};
    for (auto c : cases) {
        int kvd = c.nkv * c.hd, ctx = c.pos0 + c.nt;
        std::vector<float> q(c.nt * c.nh * c.hd), k(ctx * kvd), v(ctx * kvd);
        for (auto& x : q) x = urand(2); for (auto& x : k) x = urand(2); for (auto& x : v) x = urand(1);
        std::vector<uint16_t> kc(ctx * kvd), vc(ctx * kvd);
        for (int i = 0; i < ctx * kvd; i++) { kc[i] = f32_to_f16(k[i]); vc[i] = f32_to_f16(v[i]); }
        std::vector<float> out(c.nt * c.nh * c.hd);
        float scale = 1.0f / sqrtf((float)c.hd);
        std::vector<int32_t> apos(c.nt);
        for (int t = 0; t < c.nt; t++) apos[t] = c.pos0 + t;
        launch(ops_grid(c.nt * c.nh), 256, [&] { attention(q.data(), apos.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        auto out1 = out;
        launch(c.nt * c.nh, 128, [&] { attention(q.data(), apos.data(), kc.data(), vc.data(), out1.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        double worst = 0;
        int g = c.nh / c.nkv;
        for (int t = 0; t < c.nt; t++) for (int h = 0; h < c.nh; h++) {
            int span = c.pos0 + t + 1, off = (h / g) * c.hd;
            std::vector<double> s(span);
            double mx = -1e300;
            for (int j = 0; j < span; j++) { double d = 0; for (int i = 0; i < c.hd; i++) d += (double)round_to_f16(q[(t * c.nh + h) * c.hd + i]) * f16_to_f32(kc[j * kvd + off + i]); s[j] = d * scale; mx = std::max(mx, s[j]); }
            double sum = 0; for (auto& x : s) { x = exp(x - mx); sum += x; }
            for (int i = 0; i < c.hd; i++) { double o = 0; for (int j = 0; j < span; j++) o += s[j] / sum * f16_to_f32(vc[j * kvd + off + i]); worst = std::max(worst, fabs(out[(t * c.nh + h) * c.hd + i] - o)); }
        }
        char what[120]; snprintf(what, sizeof what, "attention t=%d heads %d/%d hd=%d pos0=%d", c.nt, c.nh, c.nkv, c.hd, c.pos0);
        // the kernel rounds each probability to f16 (as ggml's f16 P·V): up to 2^-11 of it
        report(what, worst, 2e-3);
        double d2 = 0; for (size_t i = 0; i < out.size(); i++) d2 = std::max(d2, (double)fabsf(out[i] - out1[i]));
        report(std::string(what) + " block 128 vs 256", d2, 1e-6);
    }
}

// attention_prefill (attention_prefill.cuh, tensor-core fragments through the emulator's
// shuffles) against the float softmax, for tiles that do not divide the batch, spans that
// are not whole chunks, GQA groups of 1, 3, 4 and 8, head_dim 64, 96 and 128, and (the
// last case) positions out of order with some outside the cache (output 0).
static void test_attention_prefill() {
    struct C { int nt, nh, nkv, hd, pos0, grid, block; bool shuffled; } cases[] = {
        {70, 8, 1, 128, 130, 3, 256, false}, {100, 6, 2, 64, 37, 2, 256, false},
        {65, 4, 4, 96, 0, 5, 128, false}, {80, 8, 2, 64, 0, 4, 256, true}};
    for (auto c : cases) {
        int kvd = c.nkv * c.hd, ctx = c.pos0 + c.nt;
        std::vector<float> q(c.nt * c.nh * c.hd), k(ctx * kvd), v(ctx * kvd);
        for (auto& x : q) x = urand(2); for (auto& x : k) x = urand(2); for (auto& x : v) x = urand(1);
        std::vector<uint16_t> kc(ctx * kvd), vc(ctx * kvd);
        for (int i = 0; i < ctx * kvd; i++) { kc[i] = f32_to_f16(k[i]); vc[i] = f32_to_f16(v[i]); }
        std::vector<int32_t> apos(c.nt);
        for (int t = 0; t < c.nt; t++) apos[t] = c.pos0 + t;
        if (c.shuffled) {
            for (int t = c.nt - 1; t > 0; t--) std::swap(apos[t], apos[rng() % (t + 1)]);
            apos[3] = -1; apos[17] = ctx; apos[40] = 0;
        }
        std::vector<float> out(c.nt * c.nh * c.hd, -7.0f);
        float scale = 1.0f / sqrtf((float)c.hd);
        emu_dynamic_smem_bytes = atp_smem_bytes(c.hd);
        launch(c.grid, c.block, [&] { attention_prefill(q.data(), apos.data(), kc.data(), vc.data(), out.data(), c.nt, c.nh, c.nkv, c.hd, ctx, scale); });
        double worst = 0;
        int g = c.nh / c.nkv;
        for (int t = 0; t < c.nt; t++) for (int h = 0; h < c.nh; h++) {
            int p = apos[t], span = (p < 0 || p >= ctx) ? 0 : p + 1, off = (h / g) * c.hd;
            std::vector<double> s(span);
            double mx = -1e300;
            for (int j = 0; j < span; j++) { double d = 0; for (int i = 0; i < c.hd; i++) d += (double)round_to_f16(q[(t * c.nh + h) * c.hd + i]) * f16_to_f32(kc[j * kvd + off + i]); s[j] = d * scale; mx = std::max(mx, s[j]); }
            double sum = 0; for (auto& x : s) { x = exp(x - mx); sum += x; }
            for (int i = 0; i < c.hd; i++) { double o = 0; for (int j = 0; j < span; j++) o += s[j] / sum * f16_to_f32(vc[j * kvd + off + i]); worst = std::max(worst, fabs(out[(t * c.nh + h) * c.hd + i] - o)); }
        }
        char what[120]; snprintf(what, sizeof what, "attention_prefill t=%d heads %d/%d hd=%d pos0=%d%s", c.nt, c.nh, c.nkv, c.hd, c.pos0, c.shuffled ? " shuffled" : "");
        // Each probability rounded to f16 before P·V (up to 2^-11 of it, |v| ≤ 1): a
        // one-row mask error or a wrong scale moves some output by far more (see
        // model_ops/attention.rs).
        report(what, worst, 1e-3);
    }
}

static void test_router() {
    struct C { int nt, ne, k, norm, ties; } cases[] = {{1, 8, 2, 1, 0}, {7, 60, 4, 0, 0}, {33, 128, 8, 1, 0}, {5, 512, 10, 1, 0}, {9, 64, 6, 1, 1}, {3, 16, 16, 0, 1}};
    for (auto c : cases) {
        std::vector<float> l(c.nt * c.ne);
        for (auto& v : l) v = c.ties ? (float)(rng() % 5) * 0.5f : urand(6);
        std::vector<int32_t> ids(c.nt * c.k);
        std::vector<float> w(c.nt * c.k);
        launch(ops_grid(c.nt), 256, [&] { router_topk(l.data(), ids.data(), w.data(), c.nt, c.ne, c.k, c.norm); });
        double worst = 0; int bad_ids = 0;
        for (int t = 0; t < c.nt; t++) {
            const float* r = &l[t * c.ne];
            double mx = *std::max_element(r, r + c.ne), s = 0;
            std::vector<double> p(c.ne);
            for (int e = 0; e < c.ne; e++) { p[e] = exp(r[e] - mx); s += p[e]; }
            for (auto& v : p) v /= s;
            std::vector<int> ord(c.ne);
            for (int e = 0; e < c.ne; e++) ord[e] = e;
            std::stable_sort(ord.begin(), ord.end(), [&](int a, int b) { return r[a] > r[b]; });
            double ws = 0; for (int j = 0; j < c.k; j++) ws += p[ord[j]];
            for (int j = 0; j < c.k; j++) {
                if (ids[t * c.k + j] != ord[j]) bad_ids++;
                double want = p[ord[j]] / (c.norm ? ws : 1.0);
                worst = std::max(worst, fabs(w[t * c.k + j] - want) / want);
            }
        }
        char what[120]; snprintf(what, sizeof what, "router_topk %dx%d k=%d norm=%d ties=%d (%d ids differ)", c.nt, c.ne, c.k, c.norm, c.ties, bad_ids);
        report(what, bad_ids ? 1.0 : worst, 1e-5);
    }
    // router_pick_fast against router_topk_row's pick loop (fast = false): the same ids and
    // weight bits, including ties, k = 32, the register-cached limit of 256 experts, rows
    // with a NaN (the loop's own result) and rows past the limit.
    struct F { int ne, k, norm, kind; } fcases[] = {{128, 8, 1, 0}, {128, 8, 0, 1}, {64, 32, 1, 1}, {256, 32, 0, 0},
                                                   {100, 7, 1, 2}, {40, 40, 1, 0}, {300, 8, 1, 0}, {128, 8, 1, 3}, {128, 1, 1, 0}};
    for (auto c : fcases) {
        const int nt = 4;
        std::vector<float> l(nt * c.ne);
        for (auto& v : l) v = c.kind == 1 ? (float)(rng() % 4) * 0.25f : c.kind == 3 ? 1.0f : urand(6);
        if (c.kind == 2) l[5] = NAN;
        std::vector<int32_t> ids0(nt * c.k, -7), ids1(nt * c.k, -9);
        std::vector<float> w0(nt * c.k, -7.0f), w1(nt * c.k, -9.0f);
        for (int fast = 0; fast < 2; fast++) {
            int32_t* ids = fast ? ids1.data() : ids0.data();
            float* w = fast ? w1.data() : w0.data();
            launch(2, 64, [&] {
                const uint64_t warps = global_threads() / 32;
                for (uint64_t t = global_thread() / 32; t < (uint64_t)nt; t += warps) {
                    const float* r = l.data() + t * c.ne;
                    router_topk_row([r](uint32_t e) { return r[e]; }, ids + t * c.k, w + t * c.k, c.ne, c.k, c.norm, fast != 0);
                }
            });
        }
        const bool ok = ids0 == ids1 && memcmp(w0.data(), w1.data(), w0.size() * 4) == 0;
        char what[120]; snprintf(what, sizeof what, "router pick fast vs loop %dx%d k=%d norm=%d kind=%d (bit-exact)", nt, c.ne, c.k, c.norm, c.kind);
        report(what, ok ? 0.0 : 1.0, 0);
    }
}


// matvec.cuh's one-token kernels against the tiled ones: bit for bit, every format.
static void test_vec() {
    for (const Fmt& f : FORMATS) {
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        struct Shape { int m, k, n; };
        for (auto [m, k, n] : std::vector<Shape>{{37, 512, 1}, {19, 9216, 1}, {21, 512, 3}, {13, 1802, 1}}) {
            if (k % f.qk != 0) continue;  // a float row of 1,802: a partial last step, rows off 16-byte alignment
            auto w = random_weights(f, m, k);
            std::vector<float> x((size_t)n * k);
            for (auto& v : x) v = urand(2.0f);
            std::vector<float> tiled((size_t)n * m, -1.0f), vec((size_t)n * m, -2.0f);
            launch(ops_grid((uint64_t)n * m), 256, [&] { mul_mat(w.data(), x.data(), tiled.data(), f.id, m, k, n); });
            launch(5, 128, [&] { mul_mat_vec(w.data(), x.data(), vec.data(), f.id, m, k, n); });
            char what[160];
            snprintf(what, sizeof what, "mul_mat_vec %s %dx%d n=%d vs mul_mat (bit-exact)", f.name, m, k, n);
            report(what, memcmp(tiled.data(), vec.data(), tiled.size() * 4) == 0 ? 0.0 : 1.0, 0);
            if (f.qk == 1) for (auto [grid, block] : std::vector<std::pair<int, int>>{{7, 32}, {3, 64}}) {
                std::vector<float> vf((size_t)n * m, -3.0f);
                launch(grid, block, [&] { mul_mat_vec_f(w.data(), x.data(), vf.data(), f.id, m, k, n); });
                snprintf(what, sizeof what, "mul_mat_vec_f %s %dx%d n=%d block %d vs mul_mat (bit-exact)", f.name, m, k, n, block);
                report(what, memcmp(tiled.data(), vf.data(), tiled.size() * 4) == 0 ? 0.0 : 1.0, 0);
            }
        }
        int m = 24, k = 512, n_used = 2, n_exp = 5;
        size_t rb = f.qk == 1 ? (size_t)k * f.bytes : (size_t)(k / f.qk) * f.bytes;
        size_t eb = rb * m + 32;
        std::vector<uint8_t> w;
        for (int e = 0; e < n_exp; e++) { auto we = random_weights(f, m, k); w.insert(w.end(), we.begin(), we.end()); w.insert(w.end(), 32, 0xEE); }
        for (int n_tokens : {1, 3}) for (int per_slot = 0; per_slot < 2; per_slot++) {
            std::vector<int32_t> ids(n_tokens * n_used);
            for (auto& i : ids) i = rng() % n_exp;
            int xr = per_slot ? n_tokens * n_used : n_tokens;
            std::vector<float> x((size_t)xr * k);
            for (auto& v : x) v = urand(2.0f);
            std::vector<float> a((size_t)n_tokens * n_used * m, -1.0f), b(a.size(), -2.0f);
            launch(ops_grid(a.size()), 256, [&] { mul_mat_experts(w.data(), x.data(), ids.data(), a.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
            launch(3, 128, [&] { mul_mat_experts_vec(w.data(), x.data(), ids.data(), b.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
            char what[160];
            snprintf(what, sizeof what, "mul_mat_experts_vec %s n_tokens %d per_slot %d (bit-exact)", f.name, n_tokens, per_slot);
            report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 ? 0.0 : 1.0, 0);
        }
    }
}


// mma.cuh's tensor-core variants against the tiled kernels: bit for bit, for every token
// tile the shared memory allows (32, 16, 8), row tails, a K of more than 32 sub-blocks.
static bool same(const std::vector<float>& a, const std::vector<float>& b);
static void test_mma() {
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        struct Shape { int m, k, n; };
        for (auto [m, k, n] : std::vector<Shape>{{72, 1280, 40}, {16, 512, 9}}) {
            auto w = random_weights(f, m, k);
            std::vector<float> x((size_t)n * k);
            for (auto& v : x) v = urand(2.0f);
            x[3] = 0.0f;
            std::fill(x.begin() + k, x.begin() + k + 256, 0.0f);  // an all-zero Q8_K block
            size_t off = 2;  // weights off 16-byte alignment
            std::vector<uint8_t> buf(off + w.size() + 32, 0xA5);
            memcpy(buf.data() + off, w.data(), w.size());
            std::vector<float> tiled((size_t)n * m, -1.0f);
            launch(ops_grid((uint64_t)n * m), 256, [&] { mul_mat(buf.data() + off, x.data(), tiled.data(), f.id, m, k, n); });
            uint64_t rb = (uint64_t)(k / f.qk) * f.bytes;
            for (int tokens : {32, 16, 8}) {
                emu_dynamic_smem_bytes = mma_layout(rb, k, tokens).bytes;
                std::vector<float> out((size_t)n * m, -2.0f);
                launch(3, 256, [&] { mul_mat_mma(buf.data() + off, x.data(), out.data(), f.id, m, k, n); });
                char what[160];
                snprintf(what, sizeof what, "mul_mat_mma %s %dx%d n=%d tile %d vs mul_mat (bit-exact)", f.name, m, k, n, tokens);
                report(what, same(tiled, out) ? 0.0 : 1.0, 0);
                if (tokens == 32) {  // 2-warp blocks take the 8 warp tasks in turn
                    std::vector<float> small((size_t)n * m, -3.0f);
                    launch(2, 64, [&] { mul_mat_mma(buf.data() + off, x.data(), small.data(), f.id, m, k, n); });
                    report(std::string(what) + " block 64", same(tiled, small) ? 0.0 : 1.0, 0);
                }
            }
        }
        // Grouped experts: 40 tokens x 2 slots over 5 experts, one invalid id.
        int m = 24, k = 512, n_tokens = 40, n_used = 2, n_exp = 5;
        size_t rb = (size_t)(k / f.qk) * f.bytes, eb = rb * m + 32;
        std::vector<uint8_t> w;
        for (int e = 0; e < n_exp; e++) { auto we = random_weights(f, m, k); w.insert(w.end(), we.begin(), we.end()); w.insert(w.end(), 32, 0xEE); }
        for (int per_slot = 0; per_slot < 2; per_slot++) {
            std::vector<int32_t> ids(n_tokens * n_used);
            for (auto& i : ids) i = rng() % n_exp;
            ids[7] = -1;
            int xr = per_slot ? n_tokens * n_used : n_tokens;
            std::vector<float> x((size_t)xr * k);
            for (auto& v : x) v = urand(2.0f);
            std::vector<float> a((size_t)n_tokens * n_used * m, -1.0f), b(a.size(), -2.0f);
            launch(7, 256, [&] { mul_mat_experts(w.data(), x.data(), ids.data(), a.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
            emu_dynamic_smem_bytes = mma_layout(rb, k, 32).bytes + 4 * n_tokens * n_used;
            launch(4, 256, [&] { mul_mat_experts_mma(w.data(), x.data(), ids.data(), b.data(), f.id, m, k, n_tokens, n_used, per_slot, eb); });
            char what[160];
            snprintf(what, sizeof what, "mul_mat_experts_mma %s per_slot %d vs mul_mat_experts (bit-exact)", f.name, per_slot);
            report(what, memcmp(a.data(), b.data(), a.size() * 4) == 0 ? 0.0 : 1.0, 0);
        }
    }
}

static bool same(const std::vector<float>& a, const std::vector<float>& b) { return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 4) == 0; }
static bool same16(const std::vector<uint16_t>& a, const std::vector<uint16_t>& b) { return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * 2) == 0; }

// fused.cu's kernels against the model.cu sequences they replace: bit for bit.
static void test_fused() {
    // add_rms_norm = add, rms_norm; combine_add_rms_norm = moe_combine, add, rms_norm; slot
    // counts around combine's batches of COMBINE_SLOTS, rows past ROW_VALS values a thread
    for (auto [dim, nu] : std::vector<std::pair<int, int>>{{2048, 4}, {2048, 8}, {1000, 5}, {4200, 1}, {4200, 6}}) {
        int rows = 3;
        std::vector<float> a(rows * dim), b(rows * dim), w(dim), ys(rows * nu * dim), ws(rows * nu);
        for (auto& v : a) v = urand(3); for (auto& v : b) v = urand(3); for (auto& v : w) v = urand(1.5);
        for (auto& v : ys) v = urand(2); for (auto& v : ws) v = urand(1);
        std::vector<float> sum0(rows * dim), y0(rows * dim), sum1(rows * dim), y1(rows * dim), comb(rows * dim);
        launch(ops_grid(rows * dim), 256, [&] { add(a.data(), b.data(), sum0.data(), rows * dim); });
        launch(rows, 256, [&] { rms_norm(sum0.data(), w.data(), y0.data(), rows, dim, 1e-6f); });
        launch(rows, 256, [&] { add_rms_norm(a.data(), b.data(), sum1.data(), w.data(), y1.data(), rows, dim, 1e-6f); });
        report("add_rms_norm vs add + rms_norm (bit-exact) dim " + std::to_string(dim), same(sum0, sum1) && same(y0, y1) ? 0 : 1, 0);
        launch(ops_grid(rows * dim), 256, [&] { moe_combine(ys.data(), ws.data(), comb.data(), rows, nu, dim); });
        launch(ops_grid(rows * dim), 256, [&] { add(a.data(), comb.data(), sum0.data(), rows * dim); });
        launch(rows, 256, [&] { rms_norm(sum0.data(), w.data(), y0.data(), rows, dim, 1e-6f); });
        launch(rows, 256, [&] { combine_add_rms_norm(ys.data(), ws.data(), a.data(), sum1.data(), w.data(), y1.data(), rows, nu, dim, 1e-6f); });
        report("combine_add_rms_norm vs moe_combine + add + rms_norm (bit-exact) dim " + std::to_string(dim) + " slots " + std::to_string(nu), same(sum0, sum1) && same(y0, y1) ? 0 : 1, 0);
    }
    struct C { int nt, nh, nkv, hd, n_rot, mode, norm; float ext; } cases[] = {
        {2, 4, 2, 128, 128, 2, 1, 0.0f}, {3, 2, 1, 64, 32, 0, 0, 0.0f}, {1, 4, 4, 128, 128, 2, 1, 1.0f}};
    for (auto c : cases) {
        int ctx = 8, kvd = c.nkv * c.hd;
        std::vector<float> q(c.nt * c.nh * c.hd), k(c.nt * kvd), v(c.nt * kvd), qn(c.hd), kn(c.hd);
        for (auto& x : q) x = urand(2); for (auto& x : k) x = urand(2); for (auto& x : v) x = urand(2);
        for (auto& x : qn) x = urand(1.5); for (auto& x : kn) x = urand(1.5);
        std::vector<int32_t> pos(c.nt);
        for (int t = 0; t < c.nt; t++) pos[t] = 3 + t;
        float fb = 1e6f, fs = 0.5f, af = 1.0f, bf = 32.0f, bs = 1.0f;
        unsigned orig = 4096;
        // the sequence
        std::vector<float> q0 = q, k0 = k;
        if (c.norm) {
            launch(c.nt * c.nh, 32, [&] { rms_norm(q.data(), qn.data(), q0.data(), c.nt * c.nh, c.hd, 1e-6f); });
            launch(c.nt * c.nkv, 32, [&] { rms_norm(k.data(), kn.data(), k0.data(), c.nt * c.nkv, c.hd, 1e-6f); });
        }
        launch(ops_grid(c.nt * c.nh * c.hd), 256, [&] { rope(q0.data(), pos.data(), c.nt, c.nh, c.hd, c.n_rot, c.mode, fb, fs, c.ext, af, bf, bs, orig); });
        launch(ops_grid(c.nt * kvd), 256, [&] { rope(k0.data(), pos.data(), c.nt, c.nkv, c.hd, c.n_rot, c.mode, fb, fs, c.ext, af, bf, bs, orig); });
        std::vector<uint16_t> kc0(ctx * kvd, 7), vc0(ctx * kvd, 7), kc1 = kc0, vc1 = vc0;
        launch(ops_grid(c.nt * kvd), 256, [&] { kv_store(k0.data(), v.data(), pos.data(), kc0.data(), vc0.data(), kvd, c.nt, ctx); });
        // fused
        std::vector<float> q1(q.size(), -1.0f);
        int heads = c.nt * (c.nh + 2 * c.nkv);
        launch((heads * 32 + 255) / 256, 256, [&] { qk_norm_rope_store(q.data(), k.data(), v.data(), qn.data(), kn.data(), pos.data(), q1.data(), kc1.data(), vc1.data(), c.nt, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.n_rot, c.mode, fb, fs, c.ext, af, bf, bs, orig); });
        char what[160];
        snprintf(what, sizeof what, "qk_norm_rope_store t=%d heads %d/%d hd=%d rot=%d mode=%d norm=%d ext=%g (bit-exact)", c.nt, c.nh, c.nkv, c.hd, c.n_rot, c.mode, c.norm, c.ext);
        report(what, same(q0, q1) && same16(kc0, kc1) && same16(vc0, vc1) ? 0 : 1, 0);
    }
    for (const Fmt& f : FORMATS) {
        if (f.qk == 1) continue;
        if (!fmt_only.empty() && fmt_only.find(std::string(",") + f.name + ",") == std::string::npos) continue;
        int m = 24, k = 512, n_used = 3, n_exp = 5, n_tokens = 2;
        size_t rb = (size_t)(k / f.qk) * f.bytes, eb = rb * m + 32;
        std::vector<uint8_t> wg, wu;
        for (int e = 0; e < n_exp; e++) {
            auto a = random_weights(f, m, k), b = random_weights(f, m, k);
            wg.insert(wg.end(), a.begin(), a.end()); wg.insert(wg.end(), 32, 0xEE);
            wu.insert(wu.end(), b.begin(), b.end()); wu.insert(wu.end(), 32, 0xEE);
        }
        std::vector<int32_t> ids(n_tokens * n_used);
        for (auto& i : ids) i = rng() % n_exp;
        std::vector<float> x((size_t)n_tokens * k);
        for (auto& v : x) v = urand(2.0f);
        size_t n = (size_t)n_tokens * n_used * m;
        std::vector<float> g(n), u(n), y0(n), y1(n, -1.0f);
        launch(ops_grid(n), 256, [&] { mul_mat_experts(wg.data(), x.data(), ids.data(), g.data(), f.id, m, k, n_tokens, n_used, 0, eb); });
        launch(ops_grid(n), 256, [&] { mul_mat_experts(wu.data(), x.data(), ids.data(), u.data(), f.id, m, k, n_tokens, n_used, 0, eb); });
        launch(ops_grid(n), 256, [&] { swiglu(g.data(), u.data(), y0.data(), n); });
        launch(4, 128, [&] { experts_gate_up(wg.data(), wu.data(), x.data(), ids.data(), y1.data(), f.id, m, k, n_tokens, n_used, eb, eb); });
        report(std::string("experts_gate_up ") + f.name + " vs 2x mul_mat_experts + swiglu (bit-exact)", same(y0, y1) ? 0 : 1, 0);
    }
}

// fused.cu's one-token products of one activation against the model.cu launches they
// replace: bit for bit. mul_mat_qkv with matrices of different activation formats (a block
// must not reuse one format's staged quants for another); router_matvec_topk launched
// twice (its last block must leave the ticket at 0) and with more tokens than warps.
static void test_fused_products() {
    struct Qkv { int tq, tk, tv, k, n; } qkvs[] = {
        {T_Q4_K, T_Q4_K, T_Q6_K, 512, 1}, {T_Q4_K, T_Q8_0, T_Q4_1, 512, 2}, {T_Q4_0, T_Q4_0, T_F32, 256, 1},
        {T_IQ2_XS, T_IQ2_XS, T_Q4_K, 9216, 1}};
    auto fmt = [](int id) { for (const Fmt& f : FORMATS) if (f.id == id) return f; return FORMATS[0]; };
    for (auto c : qkvs) {
        const int mq = 40, mk = 13, mv = 8;
        auto wq = random_weights(fmt(c.tq), mq, c.k), wk = random_weights(fmt(c.tk), mk, c.k), wv = random_weights(fmt(c.tv), mv, c.k);
        std::vector<float> x((size_t)c.n * c.k);
        for (auto& v : x) v = urand(2.0f);
        std::vector<float> q0((size_t)c.n * mq), k0((size_t)c.n * mk), v0((size_t)c.n * mv);
        std::vector<float> q1(q0.size(), -1.0f), k1(k0.size(), -1.0f), v1(v0.size(), -1.0f);
        launch(ops_grid(q0.size()), 256, [&] { mul_mat(wq.data(), x.data(), q0.data(), c.tq, mq, c.k, c.n); });
        launch(ops_grid(k0.size()), 256, [&] { mul_mat(wk.data(), x.data(), k0.data(), c.tk, mk, c.k, c.n); });
        launch(ops_grid(v0.size()), 256, [&] { mul_mat(wv.data(), x.data(), v0.data(), c.tv, mv, c.k, c.n); });
        for (unsigned grid : {3u, 40u}) {
            launch(grid, 128, [&] { mul_mat_qkv(wq.data(), wk.data(), wv.data(), x.data(), q1.data(), k1.data(), v1.data(), c.tq, c.tk, c.tv, mq, mk, mv, c.k, c.n); });
            char what[160];
            snprintf(what, sizeof what, "mul_mat_qkv %s/%s/%s k=%d n=%d grid %u vs 3x mul_mat (bit-exact)", fmt(c.tq).name, fmt(c.tk).name, fmt(c.tv).name, c.k, c.n, grid);
            report(what, same(q0, q1) && same(k0, k1) && same(v0, v1) ? 0 : 1, 0);
        }
    }
    struct Router { int type, ne, k, nt, top, norm; unsigned grid, block; } routers[] = {
        {T_F32, 128, 512, 1, 8, 1, 64, 32}, {T_F32, 60, 256, 3, 4, 0, 5, 32}, {T_Q8_0, 128, 512, 1, 8, 1, 16, 128},
        {T_F32, 300, 256, 2, 40, 1, 7, 64}, {T_Q4_K, 64, 512, 5, 6, 1, 9, 64}};
    for (auto c : routers) {
        auto w = random_weights(fmt(c.type), c.ne, c.k);
        std::vector<float> x((size_t)c.nt * c.k);
        for (auto& v : x) v = urand(2.0f);
        std::vector<float> l0((size_t)c.nt * c.ne), w0((size_t)c.nt * c.top), l1(l0.size(), -1.0f), w1(w0.size(), -1.0f);
        std::vector<int32_t> i0((size_t)c.nt * c.top), i1(i0.size(), -7);
        launch(ops_grid(l0.size()), 256, [&] { mul_mat(w.data(), x.data(), l0.data(), c.type, c.ne, c.k, c.nt); });
        launch(ops_grid(c.nt), 256, [&] { router_topk(l0.data(), i0.data(), w0.data(), c.nt, c.ne, c.top, c.norm); });
        uint32_t done = 0;
        bool ok = true;
        for (int rep = 0; rep < 2; rep++) {
            std::fill(w1.begin(), w1.end(), -1.0f);
            std::fill(i1.begin(), i1.end(), -7);
            launch(c.grid, c.block, [&] { router_matvec_topk(w.data(), x.data(), l1.data(), i1.data(), w1.data(), &done, c.type, c.ne, c.k, c.nt, c.top, c.norm); });
            ok = ok && same(l0, l1) && same(w0, w1) && i0 == i1 && done == 0;
        }
        char what[160];
        snprintf(what, sizeof what, "router_matvec_topk %s %d experts top %d n=%d grid %ux%u vs mul_mat + router_topk (bit-exact)", fmt(c.type).name, c.ne, c.top, c.nt, c.grid, c.block);
        report(what, ok ? 0 : 1, 0);
    }
}

// fused.cu's products that end in a norm (the last block adds and normalises) against the
// launches they replace: bit for bit with add_rms_norm's / combine_add_rms_norm's block
// (one block per row of block_per_row's threads: 64 for 512 values, 256 for 2048).
static void test_fused_norms() {
    auto fmt = [](int id) { for (const Fmt& f : FORMATS) if (f.id == id) return f; return FORMATS[0]; };
    struct O { int type, m, k, n; unsigned block; } outs[] = {{T_Q4_K, 512, 512, 1, 64}, {T_Q8_0, 2048, 256, 2, 256}, {T_F16, 512, 256, 1, 64}};
    for (auto c : outs) {
        auto w = random_weights(fmt(c.type), c.m, c.k);
        std::vector<float> x((size_t)c.n * c.k), a((size_t)c.n * c.m), nw(c.m);
        for (auto& v : x) v = urand(2.0f); for (auto& v : a) v = urand(3.0f); for (auto& v : nw) v = urand(1.5f);
        std::vector<float> y0(a.size()), s0(a.size()), o0(a.size()), y1(a.size(), -1), s1(a.size(), -1), o1(a.size(), -1);
        launch(ops_grid(y0.size()), 256, [&] { mul_mat(w.data(), x.data(), y0.data(), c.type, c.m, c.k, c.n); });
        launch(c.n, c.block, [&] { add_rms_norm(a.data(), y0.data(), s0.data(), nw.data(), o0.data(), c.n, c.m, 1e-6f); });
        uint32_t done = 0;
        bool ok = true;
        for (int rep = 0; rep < 2; rep++) {
            unsigned grid = (unsigned)((c.m + 2 * c.block / 32 - 1) / (2 * c.block / 32) * c.n);
            launch(grid, c.block, [&] { mul_mat_add_rms_norm(w.data(), x.data(), y1.data(), a.data(), s1.data(), nw.data(), o1.data(), &done, c.type, c.m, c.k, c.n, 1e-6f); });
            ok = ok && same(y0, y1) && same(s0, s1) && same(o0, o1) && done == 0;
        }
        char what[160];
        snprintf(what, sizeof what, "mul_mat_add_rms_norm %s %dx%d n=%d block %u vs mul_mat + add_rms_norm (bit-exact)", fmt(c.type).name, c.m, c.k, c.n, c.block);
        report(what, ok ? 0 : 1, 0);
    }
    struct D { int type, m, k, nt, nu; unsigned block; } downs[] = {{T_Q4_K, 512, 256, 1, 4, 64}, {T_Q6_K, 2048, 256, 1, 3, 256}, {T_Q4_0, 512, 64, 2, 3, 64}};
    for (auto c : downs) {
        const int n_exp = 5;
        const Fmt f = fmt(c.type);
        size_t eb = (size_t)(c.k / f.qk) * f.bytes * c.m + 32;
        std::vector<uint8_t> w;
        for (int e = 0; e < n_exp; e++) { auto we = random_weights(f, c.m, c.k); w.insert(w.end(), we.begin(), we.end()); w.insert(w.end(), 32, 0xEE); }
        const int slots = c.nt * c.nu;
        std::vector<int32_t> ids(slots);
        for (auto& i : ids) i = rng() % n_exp;
        std::vector<float> x((size_t)slots * c.k), wts(slots), res((size_t)c.nt * c.m), nw(c.m);
        for (auto& v : x) v = urand(2.0f); for (auto& v : wts) v = urand(1.0f); for (auto& v : res) v = urand(3.0f); for (auto& v : nw) v = urand(1.5f);
        std::vector<float> ys0((size_t)slots * c.m), s0(res.size()), o0(res.size()), ys1(ys0.size(), -1), s1(res.size(), -1), o1(res.size(), -1);
        launch(ops_grid(ys0.size()), 256, [&] { mul_mat_experts(w.data(), x.data(), ids.data(), ys0.data(), c.type, c.m, c.k, c.nt, c.nu, 1, eb); });
        launch(c.nt, c.block, [&] { combine_add_rms_norm(ys0.data(), wts.data(), res.data(), s0.data(), nw.data(), o0.data(), c.nt, c.nu, c.m, 1e-6f); });
        uint32_t done = 0;
        bool ok = true;
        for (int rep = 0; rep < 2; rep++) {
            unsigned grid = rep == 0 ? 7 : (unsigned)((c.m + 2 * c.block / 32 - 1) / (2 * c.block / 32) * slots);
            launch(grid, c.block, [&] { experts_down_norm(w.data(), x.data(), ids.data(), ys1.data(), wts.data(), res.data(), s1.data(), nw.data(), o1.data(), &done, c.type, c.m, c.k, c.nt, c.nu, eb, 1e-6f); });
            ok = ok && same(ys0, ys1) && same(s0, s1) && same(o0, o1) && done == 0;
        }
        char what[160];
        snprintf(what, sizeof what, "experts_down_norm %s %dx%d tokens %d slots %d block %u vs mul_mat_experts + combine_add_rms_norm (bit-exact)", f.name, c.m, c.k, c.nt, c.nu, c.block);
        report(what, ok ? 0 : 1, 0);
    }
}

// mul_mat_qkv_rope against mul_mat_qkv + qk_norm_rope_store: bit for bit, with units
// inside a head, units spanning two heads (head_dim 8, 16 rows a unit) and a grid-stride
// grid; launched twice (every head's ticket must be back at 0).
static void test_qkv_rope() {
    auto fmt = [](int id) { for (const Fmt& f : FORMATS) if (f.id == id) return f; return FORMATS[0]; };
    struct C { int tq, tk, tv, k, nt, nh, nkv, hd, rot, mode, norm; unsigned grid, block; } cases[] = {
        {T_Q4_K, T_Q4_K, T_Q4_K, 256, 1, 4, 2, 128, 128, 2, 1, 0, 128},
        {T_Q8_0, T_Q4_K, T_Q6_K, 256, 2, 2, 1, 64, 32, 0, 0, 5, 256},
        {T_Q4_0, T_Q4_0, T_Q4_0, 64, 1, 4, 2, 8, 8, 2, 1, 0, 256}};
    for (auto c : cases) {
        const int mq = c.nh * c.hd, mkv = c.nkv * c.hd, ctx = 8, heads = c.nh + 2 * c.nkv;
        auto wq = random_weights(fmt(c.tq), mq, c.k), wk = random_weights(fmt(c.tk), mkv, c.k), wv = random_weights(fmt(c.tv), mkv, c.k);
        std::vector<float> x((size_t)c.nt * c.k), qn(c.hd), kn(c.hd);
        for (auto& v : x) v = urand(2.0f); for (auto& v : qn) v = urand(1.5f); for (auto& v : kn) v = urand(1.5f);
        std::vector<int32_t> pos(c.nt);
        for (int t = 0; t < c.nt; t++) pos[t] = 3 + t;
        float fb = 1e6f, fs = 1.0f, ef = 0.0f, af = 1.0f, bf = 32.0f, bs = 1.0f;
        unsigned orig = 4096;
        std::vector<float> q(c.nt * mq), k(c.nt * mkv), v(c.nt * mkv), q0(c.nt * mq);
        std::vector<uint16_t> kc0(ctx * mkv, 7), vc0(ctx * mkv, 7);
        launch(40, 128, [&] { mul_mat_qkv(wq.data(), wk.data(), wv.data(), x.data(), q.data(), k.data(), v.data(), c.tq, c.tk, c.tv, mq, mkv, mkv, c.k, c.nt); });
        launch((c.nt * heads * 32 + 255) / 256, 256, [&] { qk_norm_rope_store(q.data(), k.data(), v.data(), qn.data(), kn.data(), pos.data(), q0.data(), kc0.data(), vc0.data(), c.nt, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.rot, c.mode, fb, fs, ef, af, bf, bs, orig); });
        std::vector<uint32_t> done(c.nt * heads, 0);
        bool ok = true;
        const int rows = std::min((int)c.block / 32, 8) * 2;
        const unsigned grid = c.grid ? c.grid : (unsigned)(c.nt * ((mq + rows - 1) / rows + 2 * ((mkv + rows - 1) / rows)));
        for (int rep = 0; rep < 2; rep++) {
            std::vector<float> q1(q.size(), -1), k1(k.size(), -1), v1(v.size(), -1), qo(q0.size(), -1);
            std::vector<uint16_t> kc1(ctx * mkv, 7), vc1(ctx * mkv, 7);
            launch(grid, c.block, [&] { mul_mat_qkv_rope(wq.data(), wk.data(), wv.data(), x.data(), q1.data(), k1.data(), v1.data(), qn.data(), kn.data(), pos.data(), qo.data(), kc1.data(), vc1.data(), done.data(), c.tq, c.tk, c.tv, c.k, c.nt, c.nh, c.nkv, c.hd, ctx, c.norm, 1e-6f, c.rot, c.mode, fb, fs, ef, af, bf, bs, orig); });
            ok = ok && same(q, q1) && same(k, k1) && same(v, v1) && same(q0, qo) && same16(kc0, kc1) && same16(vc0, vc1);
            for (auto d : done) ok = ok && d == 0;
        }
        char what[200];
        snprintf(what, sizeof what, "mul_mat_qkv_rope %s/%s/%s t=%d heads %d/%d hd=%d grid %ux%u vs mul_mat_qkv + qk_norm_rope_store (bit-exact)", fmt(c.tq).name, fmt(c.tk).name, fmt(c.tv).name, c.nt, c.nh, c.nkv, c.hd, grid, c.block);
        report(what, ok ? 0 : 1, 0);
    }
}

#include "test_mmq.h"
#include "test_vec_q8.h"
#include "test_vec_q8_rows.h"
#include "test_qkv_q8_rows.h"
#include "test_cached.h"
#include "test_cached_q8.h"
#include "test_experts_multi_q8.h"
#include "test_attention_long.h"
#include "test_attention_flash.h"
#include "test_attention_prefill_q8.h"
#include "test_attention_q8.h"
#include "test_argmax.h"
#include "test_attention_short.h"

int main(int argc, char** argv) {
    std::string only = argc > 1 ? argv[1] : "";
    if (argc > 2) fmt_only = std::string(",") + argv[2] + ",";
    if (only.empty() || only == "small") test_small_ops();
    if (only.empty() || only == "rope") test_rope();
    if (only.empty() || only == "router") test_router();
    if (only.empty() || only == "embed") test_embed();
    if (only.empty() || only == "attention") test_attention();
    if (only.empty() || only == "attention" || only == "attention_prefill") test_attention_prefill();
    if (only.empty() || only == "attention" || only == "attention_prefill" || only == "attention_prefill_q8")
        test_attention_prefill_q8();
    if (only.empty() || only == "attention" || only == "attention_q8") test_attention_q8();
    if (only.empty() || only == "attention" || only == "attention_short") test_attention_short();
    if (only.empty() || only == "attention" || only == "attention_long") test_attention_long();
    if (only.empty() || only == "attention" || only == "attention_flash") test_attention_flash();
    if (only.empty() || only == "experts") test_experts();
    if (only.empty() || only == "mm") test_mul_mat();
    if (only == "vec") test_vec();
    if (only == "vec" || only == "vec_q8") test_vec_q8();
    if (only == "vec" || only == "vec_q8" || only == "vec_q8_rows") test_vec_q8_rows();
    if (only == "fused") test_fused();
    if (only == "fused" || only == "products") test_fused_products();
    if (only == "fused" || only == "products") test_fused_norms();
    if (only == "fused" || only == "products" || only == "qkv_rope") test_qkv_rope();
    if (only == "fused" || only == "qkv_q8_rows") test_qkv_q8_rows();
    if (only == "mma") test_mma();
    if (only == "mmq") test_mmq();
    if (only == "cached") test_cached_grouped();
    if (only == "cached" || only == "cached_multi") test_cached_multi();
    if (only == "cached" || only == "cached_q8") test_cached_q8();
    if (only == "cached" || only == "experts_multi_q8") test_experts_multi_q8();
    if (only == "cached" || only == "gate_up_multi_q8") test_gate_up_multi_q8();
    if (only == "cached" || only == "gate_up_cached") test_gate_up_cached();
    if (only.empty() || only == "argmax") test_argmax();
    printf("%d failed\n", fails);
    return fails != 0;
}
