// router_topk's work for one token (model.cu's router_topk, fused.cu's router_matvec_topk):
// softmax over the router's logits as ggml_soft_max computes it, then the top k.
#pragma once

#include "common.cuh"

#define ROUTER_CACHED 8  // probabilities per lane kept in registers (rows up to 256 experts)
#define ROUTER_MAX_K 32  // picks kept for the normalisation (more are read back)

// Σ_i exp(x_i − mx) over a row of n, as ggml_soft_max sums it: each whole vector's lanes in
// an f32 tree, added to an f64; the tail element by element. Called by a whole warp; every
// lane gets the sum.
template <class Load>
__device__ double softmax_sum(Load x, uint32_t n, float mx) {
    const int lane = threadIdx.x & 31;
    const uint32_t whole = n - n % GGML_LANES;
    double total = 0.0;
    for (uint32_t base = 0; base < n; base += 32) {
        const uint32_t e = base + lane;
        const float v = e < n ? ggml_softmax_exp(__fsub_rn(x(e), mx), e, n) : 0.0f;
        const float vec = ggml_vector_sum16(v);
        if (base + (lane & 16) + GGML_LANES <= whole) {
            if ((lane & 15) == 0) total += (double)vec;
        } else if (e < n) {
            total += (double)v;
        }
    }
    return warp_sum_f64(total);
}

// softmax_sum over a row held in registers: lane's value c is element lane + 32c (as
// softmax_sum reads them), the same operations in the same order.
__device__ double softmax_sum_cached(const float (&x)[ROUTER_CACHED], uint32_t n, float mx) {
    const int lane = threadIdx.x & 31;
    const uint32_t whole = n - n % GGML_LANES;
    double total = 0.0;
#pragma unroll
    for (int c = 0; c < ROUTER_CACHED; c++) {
        const uint32_t base = 32 * c;
        if (base >= n) break;
        const uint32_t e = base + lane;
        const float v = e < n ? ggml_softmax_exp(__fsub_rn(x[c], mx), e, n) : 0.0f;
        const float vec = ggml_vector_sum16(v);
        if (base + (lane & 16) + GGML_LANES <= whole) {
            if ((lane & 15) == 0) total += (double)vec;
        } else if (e < n) {
            total += (double)v;
        }
    }
    return warp_sum_f64(total);
}

// router_topk_row's picks from probabilities held in registers (as it caches them), for
// k <= 32 and no NaN or negative p: the same picks, weights and order, with fewer
// dependent steps. Each pick (the largest p ordered strictly after the previous one, ties
// to the lower index) takes two warp reductions (redux.sync) instead of five rounds of
// shuffles: the largest key = p's bits + 1 (p >= +0, so its bits order as p does; 0: no
// candidate), then the lowest index holding it. Pick j stays in lane j, so the
// normalisation's sum (f64, in pick order) and the k divisions run across the lanes, not
// in lane 0 from a local array. Called by a whole warp.
__device__ __forceinline__ void router_pick_fast(const float (&cached)[ROUTER_CACHED],
                                                 int32_t* ids, float* weights,
                                                 uint32_t n_expert, uint32_t k, uint32_t norm) {
    const int lane = threadIdx.x & 31;
    uint32_t prev_key = 0xffffffffu;  // above every key: the first pick has no predecessor
    int prev_i = -1;
    float my_p = -F32_INF;
    int my_i = 0x7fffffff;
    for (uint32_t j = 0; j < k; j++) {
        uint32_t best_key = 0;
        int best_i = 0x7fffffff;
#pragma unroll
        for (int c = 0; c < ROUTER_CACHED; c++) {
            const int e = lane + 32 * c;
            const uint32_t key = __float_as_uint(cached[c]) + 1u;
            const bool after = key < prev_key || (key == prev_key && e > prev_i);
            if ((uint32_t)e < n_expert && after && (key > best_key || (key == best_key && e < best_i))) {
                best_key = key;
                best_i = e;
            }
        }
        const uint32_t top = __reduce_max_sync(FULL_MASK, best_key);
        const int at = (int)__reduce_min_sync(FULL_MASK, best_key == top ? (uint32_t)best_i : 0xffffffffu);
        const int pick = top == 0 ? 0x7fffffff : at;
        if (lane == (int)j) {
            my_p = top == 0 ? -F32_INF : __uint_as_float(top - 1u);
            my_i = pick;
        }
        prev_key = top;
        prev_i = pick;
    }
    float w = my_p;
    if (norm != 0 && k > 0) {
        double s = 0.0;
        for (uint32_t j = 0; j < k; j++) s += (double)__shfl_sync(FULL_MASK, my_p, (int)j);
        w = __fdiv_rn(my_p, fmaxf((float)s, 6.103515625e-05f));
    }
    if ((uint32_t)lane < k) {
        ids[lane] = my_i;
        weights[lane] = w;
    }
}

// p = softmax(logits[t]) (ggml's exponentials and sum); ids[t] = the k
// largest p, descending, ties to the lower index; weights = those p, divided by their sum
// (at least the smallest normal f16, as llama.cpp clamps it) when norm != 0.

// p = softmax(logits) of one token's row of n_expert (read through row(e)); ids[j] = the k
// largest p, descending, ties to the lower index; weights = those p, divided by their sum
// (at least the smallest normal f16, as llama.cpp clamps it) when norm != 0. Called by a
// whole warp. `fast`: router_pick_fast where it applies (false: the emulator's reference).
template <class Row>
__device__ void router_topk_row(Row row, int32_t* ids, float* weights, uint32_t n_expert,
                                uint32_t k, uint32_t norm, bool fast = true) {
    const int lane = threadIdx.x & 31;
    // A row that fits (n_expert <= 32 · ROUTER_CACHED) is loaded once, every load in
    // flight together, and its probabilities kept in registers; the k picks then only
    // compare. The same operations either way.
    const bool fits = n_expert <= 32 * ROUTER_CACHED;
    float cached[ROUTER_CACHED];
    float mx = -F32_INF;
    double total;
    if (fits) {
#pragma unroll
        for (int c = 0; c < ROUTER_CACHED; c++) {
            const uint32_t e = lane + 32 * c;
            cached[c] = e < n_expert ? row(e) : -F32_INF;
        }
#pragma unroll
        for (int c = 0; c < ROUTER_CACHED; c++) mx = fmaxf(mx, cached[c]);
        mx = warp_max(mx);
        total = softmax_sum_cached(cached, n_expert, mx);
    } else {
        for (uint32_t e = lane; e < n_expert; e += 32) mx = fmaxf(mx, row(e));
        mx = warp_max(mx);
        total = softmax_sum(row, n_expert, mx);
    }
    const float inv = (float)(1.0 / total);
    if (fits) {
#pragma unroll
        for (int c = 0; c < ROUTER_CACHED; c++) {
            const uint32_t e = lane + 32 * c;
            cached[c] = e < n_expert
                            ? __fmul_rn(ggml_softmax_exp(__fsub_rn(cached[c], mx), e, n_expert), inv)
                            : -F32_INF;
        }
    }
    if (fast && fits && k <= 32) {
        bool odd = false;  // NaN or a sign bit: router_pick_fast's keys would misorder them
#pragma unroll
        for (int c = 0; c < ROUTER_CACHED; c++)
            odd |= lane + 32u * c < n_expert && (__float_as_uint(cached[c]) >> 31 != 0 || cached[c] != cached[c]);
        if (__ballot_sync(FULL_MASK, odd) == 0) return router_pick_fast(cached, ids, weights, n_expert, k, norm);
    }
    // The picks' probabilities (every lane has each after the reduction), for the
    // normalisation without reading the outputs back.
    float picked[ROUTER_MAX_K];
    // Each pick is the largest p ordered strictly after the previous pick.
    float prev_p = F32_INF;
    int prev_i = -1;
    for (uint32_t j = 0; j < k; j++) {
        float best_p = -F32_INF;
        int best_i = 0x7fffffff;
        if (fits) {
#pragma unroll
            for (int c = 0; c < ROUTER_CACHED; c++) {
                const uint32_t e = lane + 32 * c;
                const float p = cached[c];
                const bool after = p < prev_p || (p == prev_p && (int)e > prev_i);
                if (e < n_expert && after && (p > best_p || (p == best_p && (int)e < best_i))) {
                    best_p = p;
                    best_i = (int)e;
                }
            }
        } else {
            for (uint32_t e = lane; e < n_expert; e += 32) {
                const float p =
                    __fmul_rn(ggml_softmax_exp(__fsub_rn(row(e), mx), e, n_expert), inv);
                const bool after = p < prev_p || (p == prev_p && (int)e > prev_i);
                if (after && (p > best_p || (p == best_p && (int)e < best_i))) {
                    best_p = p;
                    best_i = (int)e;
                }
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float p2 = __shfl_xor_sync(FULL_MASK, best_p, o);
            const int i2 = __shfl_xor_sync(FULL_MASK, best_i, o);
            if (p2 > best_p || (p2 == best_p && i2 < best_i)) {
                best_p = p2;
                best_i = i2;
            }
        }
        if (j < ROUTER_MAX_K) picked[j] = best_p;
        if (lane == 0) {
            ids[j] = best_i;
            if (norm == 0 || k > ROUTER_MAX_K) weights[j] = best_p;
        }
        prev_p = best_p;
        prev_i = best_i;
    }
    if (norm != 0 && lane == 0 && k > 0) {
        double s = 0.0;
        if (k <= ROUTER_MAX_K) {
            for (uint32_t j = 0; j < k; j++) s += (double)picked[j];
            const float sum = fmaxf((float)s, 6.103515625e-05f);
            for (uint32_t j = 0; j < k; j++) weights[j] = __fdiv_rn(picked[j], sum);
        } else {
            for (uint32_t j = 0; j < k; j++) s += (double)weights[j];
            const float sum = fmaxf((float)s, 6.103515625e-05f);
            for (uint32_t j = 0; j < k; j++) weights[j] = __fdiv_rn(weights[j], sum);
        }
    }
}
