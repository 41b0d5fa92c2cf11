// Golden outputs of the transformer ops (crates/core/kernels.txt, module `model`) as
// llama.cpp's ggml computes them, for crates/backend-cpu/tests/model_ops/golden.rs.
// Built and run by tools/gen_model_ops_golden.sh against the oracle's libggml:
//   ./gen_model_ops_golden OUT_DIR
// Each case is one file OUT_DIR/<case>.bin: a sequence of records
//   u32 name_len, name bytes, u32 dtype (0 f32, 1 i32, 2 u8, 3 u16), u64 n_bytes, bytes
// holding the inputs, the op's parameters and ggml's result. Everything runs on one
// thread so the results do not depend on the machine's core count.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ggml-cpu.h"
#include "ggml.h"

enum { DT_F32 = 0, DT_I32 = 1, DT_U8 = 2, DT_U16 = 3 };

static FILE *out;
static void rec(const char *name, int dtype, const void *data, uint64_t n) {
    uint32_t l = (uint32_t)strlen(name), d = (uint32_t)dtype;
    fwrite(&l, 4, 1, out);
    fwrite(name, 1, l, out);
    fwrite(&d, 4, 1, out);
    fwrite(&n, 8, 1, out);
    fwrite(data, 1, n, out);
}
static void rec_tensor(const char *name, const struct ggml_tensor *t, int dtype) {
    rec(name, dtype, t->data, ggml_nbytes(t));
}
static void open_case(const char *dir, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    out = fopen(path, "wb");
    if (!out) {
        perror(path);
        exit(1);
    }
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static float uniform(void) {  // [-1, 1)
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) & 0xFFFFFF) / (float)(1 << 23) - 1.0f;
}
static void fill(struct ggml_tensor *t, float scale) {
    float *p = (float *)t->data;
    for (int64_t i = 0; i < ggml_nelements(t); i++) p[i] = uniform() * scale;
}

static struct ggml_context *new_ctx(void) {
    struct ggml_init_params ip = {.mem_size = 64u << 20, .mem_buffer = NULL, .no_alloc = false};
    return ggml_init(ip);
}
static void compute(struct ggml_context *ctx, struct ggml_tensor *t) {
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, t);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
}

static void rope_case(const char *dir, const char *name, int mode, float freq_scale, float ext_factor,
                      float attn_factor) {
    const int head_dim = 64, n_rot = 48, n_heads = 3, n_tokens = 6, n_ctx_orig = 4096;
    const float freq_base = 10000.0f, beta_fast = 32.0f, beta_slow = 1.0f;
    const int32_t positions[6] = {0, 1, 5, 100, 2047, 9000};
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, head_dim, n_heads, n_tokens);
    struct ggml_tensor *pos = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_tokens);
    fill(x, 2.0f);
    memcpy(pos->data, positions, sizeof positions);
    struct ggml_tensor *y = ggml_rope_ext(ctx, x, pos, NULL, n_rot, mode, n_ctx_orig, freq_base, freq_scale,
                                          ext_factor, attn_factor, beta_fast, beta_slow);
    compute(ctx, y);
    open_case(dir, name);
    const int32_t ip[6] = {n_tokens, n_heads, head_dim, n_rot, mode, n_ctx_orig};
    const float fp[6] = {freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow};
    rec("int_params", DT_I32, ip, sizeof ip);
    rec("float_params", DT_F32, fp, sizeof fp);
    rec_tensor("x", x, DT_F32);
    rec_tensor("pos", pos, DT_I32);
    rec_tensor("y", y, DT_F32);
    fclose(out);
    ggml_free(ctx);
}

static void rms_norm_case(const char *dir) {
    const int rows = 3, dim = 576;
    const float eps = 1e-5f;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, dim, rows);
    struct ggml_tensor *w = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, dim);
    fill(x, 3.0f);
    fill(w, 1.5f);
    struct ggml_tensor *y = ggml_mul(ctx, ggml_rms_norm(ctx, x, eps), w);
    compute(ctx, y);
    open_case(dir, "rms_norm");
    const int32_t ip[2] = {rows, dim};
    rec("int_params", DT_I32, ip, sizeof ip);
    rec("float_params", DT_F32, &eps, sizeof eps);
    rec_tensor("x", x, DT_F32);
    rec_tensor("w", w, DT_F32);
    rec_tensor("y", y, DT_F32);
    fclose(out);
    ggml_free(ctx);
}

// Weights quantised by ggml's own quantiser, then y = x * w^T by ggml_mul_mat, for the
// first activation row alone (ggml's matrix-vector path) and for all five.
static void mul_mat_case(const char *dir, enum ggml_type type) {
    const int m = 8, k = 256, n = 5;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *wf = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, m);
    fill(wf, 1.0f);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, type, k, m);
    ggml_quantize_chunk(type, (const float *)wf->data, w->data, 0, m, k, NULL);
    struct ggml_tensor *x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, n);
    fill(x, 2.0f);
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, x);
    struct ggml_tensor *y1 = ggml_mul_mat(ctx, w, ggml_view_2d(ctx, x, k, 1, x->nb[1], 0));
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, y);
    ggml_build_forward_expand(gf, y1);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    char name[64];
    snprintf(name, sizeof name, "mul_mat_%s", ggml_type_name(type));
    open_case(dir, name);
    const int32_t ip[4] = {(int32_t)type, m, k, n};
    rec("int_params", DT_I32, ip, sizeof ip);
    rec_tensor("w", w, DT_U8);
    rec_tensor("x", x, DT_F32);
    rec_tensor("y", y, DT_F32);
    rec_tensor("y1", y1, DT_F32);
    fclose(out);
    ggml_free(ctx);
}

// llama.cpp's build_moe_ffn routing: softmax, top-k, weights, optional normalisation.
static void router_case(const char *dir) {
    const int n_expert = 32, n_tokens = 4, k = 4;
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *logits = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_expert, n_tokens);
    fill(logits, 4.0f);
    struct ggml_tensor *probs = ggml_soft_max(ctx, logits);
    struct ggml_tensor *ids = ggml_argsort_top_k(ctx, probs, k);
    struct ggml_tensor *w = ggml_get_rows(ctx, ggml_reshape_3d(ctx, probs, 1, n_expert, n_tokens), ids);
    w = ggml_reshape_2d(ctx, w, k, n_tokens);
    struct ggml_tensor *sum = ggml_clamp(ctx, ggml_sum_rows(ctx, w), 6.103515625e-5f, INFINITY);
    struct ggml_tensor *wn = ggml_div(ctx, w, sum);
    // top_k is a view of the whole argsort: copy its first k columns out.
    struct ggml_tensor *ids_k = ggml_cont(ctx, ids);
    struct ggml_cgraph *gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, ids_k);
    ggml_build_forward_expand(gf, w);
    ggml_build_forward_expand(gf, wn);
    ggml_graph_compute_with_ctx(ctx, gf, 1);
    open_case(dir, "router_topk");
    const int32_t ip[3] = {n_tokens, n_expert, k};
    rec("int_params", DT_I32, ip, sizeof ip);
    rec_tensor("logits", logits, DT_F32);
    rec_tensor("ids", ids_k, DT_I32);
    rec_tensor("weights", w, DT_F32);
    rec_tensor("weights_norm", wn, DT_F32);
    fclose(out);
    ggml_free(ctx);
}

// llama.cpp's attention without flash attention: kq = k*q (q rounded to f16 for the f16
// cache), causal mask, soft_max_ext with the scale, kqv = v^T * kq; GQA by broadcast.
static void attention_case(const char *dir) {
    const int n_head = 4, n_kv_head = 2, hd = 32, pos0 = 5, n_tokens = 3, ctx_len = pos0 + n_tokens;
    const float scale = 1.0f / sqrtf((float)hd);
    struct ggml_context *ctx = new_ctx();
    struct ggml_tensor *q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, n_tokens);
    fill(q, 2.0f);
    // The caches in strata's layout: [ctx][n_kv_head * hd] f16.
    struct ggml_tensor *kc = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, hd, n_kv_head, ctx_len);
    struct ggml_tensor *vc = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, hd, n_kv_head, ctx_len);
    ggml_fp16_t *kp = kc->data, *vp = vc->data;
    for (int i = 0; i < ctx_len * n_kv_head * hd; i++) {
        kp[i] = ggml_fp32_to_fp16(uniform() * 2.0f);
        vp[i] = ggml_fp32_to_fp16(uniform() * 3.0f);
    }
    // V transposed per head ([n_kv_head][hd][ctx]), as llama.cpp's non-FA cache holds it.
    struct ggml_tensor *vt = ggml_new_tensor_3d(ctx, GGML_TYPE_F16, ctx_len, hd, n_kv_head);
    ggml_fp16_t *vtp = vt->data;
    for (int h = 0; h < n_kv_head; h++)
        for (int d = 0; d < hd; d++)
            for (int i = 0; i < ctx_len; i++) vtp[(h * hd + d) * ctx_len + i] = vp[(i * n_kv_head + h) * hd + d];
    struct ggml_tensor *mask = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, ctx_len, n_tokens);
    float *mp = mask->data;
    for (int t = 0; t < n_tokens; t++)
        for (int i = 0; i < ctx_len; i++) mp[t * ctx_len + i] = i <= pos0 + t ? 0.0f : -INFINITY;
    struct ggml_tensor *qp = ggml_permute(ctx, q, 0, 2, 1, 3);   // [hd, n_tokens, n_head]
    struct ggml_tensor *kp3 = ggml_permute(ctx, kc, 0, 2, 1, 3); // [hd, ctx, n_kv_head]
    struct ggml_tensor *kq = ggml_mul_mat(ctx, kp3, qp);         // [ctx, n_tokens, n_head]
    kq = ggml_soft_max_ext(ctx, kq, mask, scale, 0.0f);
    struct ggml_tensor *kqv = ggml_mul_mat(ctx, vt, kq);         // [hd, n_tokens, n_head]
    struct ggml_tensor *o = ggml_cont(ctx, ggml_permute(ctx, kqv, 0, 2, 1, 3));  // [hd, n_head, n_tokens]
    compute(ctx, o);
    open_case(dir, "attention");
    const int32_t ip[5] = {n_tokens, n_head, n_kv_head, hd, pos0};
    rec("int_params", DT_I32, ip, sizeof ip);
    rec("float_params", DT_F32, &scale, sizeof scale);
    rec_tensor("q", q, DT_F32);
    rec_tensor("k_cache", kc, DT_U16);
    rec_tensor("v_cache", vc, DT_U16);
    rec_tensor("out", o, DT_F32);
    fclose(out);
    ggml_free(ctx);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
        return 2;
    }
    const char *dir = argv[1];
    rope_case(dir, "rope_normal", GGML_ROPE_TYPE_NORMAL, 1.0f, 0.0f, 1.0f);
    rope_case(dir, "rope_neox", GGML_ROPE_TYPE_NEOX, 1.0f, 0.0f, 1.0f);
    rope_case(dir, "rope_normal_yarn", GGML_ROPE_TYPE_NORMAL, 0.25f, 1.0f, 1.0f);
    rope_case(dir, "rope_neox_yarn", GGML_ROPE_TYPE_NEOX, 0.25f, 1.0f, 0.8f);
    rms_norm_case(dir);
    const enum ggml_type types[] = {GGML_TYPE_F32,  GGML_TYPE_F16,  GGML_TYPE_BF16, GGML_TYPE_Q4_0, GGML_TYPE_Q4_1,
                                    GGML_TYPE_Q5_0, GGML_TYPE_Q5_1, GGML_TYPE_Q8_0, GGML_TYPE_Q2_K, GGML_TYPE_Q3_K,
                                    GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K, GGML_TYPE_IQ4_NL,
                                    GGML_TYPE_IQ4_XS, GGML_TYPE_MXFP4};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        mul_mat_case(dir, types[i]);
    }
    router_case(dir);
    attention_case(dir);
    return 0;
}
