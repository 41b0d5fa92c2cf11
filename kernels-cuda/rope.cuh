// RoPE as ggml_rope_ext applies it, with YaRN (ggml-cpu's rope_yarn: the angle built by
// repeated multiplication of theta in f32, rotate_pairs), in the host's f32 operations:
// shared by model.cu's rope and fused.cu's qk_norm_rope_store, so both rotate alike.
#pragma once

#include "common.cuh"

struct RopeParams {
    uint32_t n_rot, mode;  // mode 0: pairs (2i, 2i+1); 2 (neox): pairs (i, i + n_rot/2)
    float freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow;
    uint32_t n_ctx_orig;
};

// What every pair of a launch shares.
struct RopeConsts {
    float theta_scale, low, high;
};

__device__ __forceinline__ bool rope_params_ok(const RopeParams& p, uint32_t head_dim) {
    return (p.mode == 0 || p.mode == 2) && p.n_rot <= head_dim && (p.n_rot & 1) == 0;
}

// ggml_rope_yarn_corr_dim, in the host's f32 operations.
__device__ __forceinline__ float rope_corr_dim(uint32_t n_dims, uint32_t n_ctx_orig, float n_rot,
                                               float base) {
    const float turns = __fmul_rn(__fmul_rn(n_rot, 2.0f), 3.14159265358979323846f);
    const float l = log_host(__fdiv_rn((float)n_ctx_orig, turns));
    return __fdiv_rn(__fmul_rn((float)n_dims, l), __fmul_rn(2.0f, log_host(base)));
}

__device__ __forceinline__ RopeConsts rope_consts(const RopeParams& p) {
    RopeConsts c;
    c.theta_scale = (float)pow((double)p.freq_base, (double)__fdiv_rn(-2.0f, (float)p.n_rot));
    c.low = 0.0f;
    c.high = 0.0f;
    if (p.ext_factor != 0.0f) {
        const float start = floorf(rope_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base));
        const float end = ceilf(rope_corr_dim(p.n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base));
        const float hi = (float)p.n_rot - 1.0f;
        c.low = 0.0f > start ? 0.0f : start;
        c.high = hi < end ? hi : end;
    }
    return c;
}

// Rotates pair i (0 <= i < n_rot/2) of one head `hd` in place for a token at `pos`.
__device__ __forceinline__ void rope_pair(float* hd, int32_t pos, uint32_t i, const RopeParams& p,
                                          const RopeConsts& c) {
    float theta_extrap = (float)pos;
    for (uint32_t j = 0; j < i; j++) theta_extrap = __fmul_rn(theta_extrap, c.theta_scale);
    const float theta_interp = __fmul_rn(p.freq_scale, theta_extrap);
    float theta = theta_interp, mscale = p.attn_factor;
    if (p.ext_factor != 0.0f) {
        const float span = 0.001f > __fsub_rn(c.high, c.low) ? 0.001f : __fsub_rn(c.high, c.low);
        const float y = __fdiv_rn(__fsub_rn((float)i, c.low), span);
        const float ramp = __fsub_rn(1.0f, fminf(fmaxf(y, 0.0f), 1.0f));
        const float mix = __fmul_rn(ramp, p.ext_factor);
        theta = __fadd_rn(__fmul_rn(theta_interp, __fsub_rn(1.0f, mix)),
                          __fmul_rn(theta_extrap, mix));
        mscale = __fmul_rn(mscale, __fadd_rn(1.0f, __fmul_rn(0.1f, log_host(__fdiv_rn(1.0f, p.freq_scale)))));
    }
    const float cs = __fmul_rn((float)cos((double)theta), mscale);
    const float sn = __fmul_rn((float)sin((double)theta), mscale);
    const uint32_t half = p.n_rot / 2;
    const uint32_t a = p.mode == 2 ? i : 2 * i, b = p.mode == 2 ? i + half : 2 * i + 1;
    const float x0 = hd[a], x1 = hd[b];
    hd[a] = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
    hd[b] = __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}
