// The (token, slot) units of an expert product: what mul_mat_experts (for few tokens), its
// one-token variant and fused.cu's experts_gate_up share. Unit (slot, row group) computes
// `rows` rows of expert ids[slot] for the slot's activation row (x[slot] with x_per_slot,
// else x[slot / n_used]); a negative id gets NaN rows.
#pragma once

#include "common.cuh"
#include "matmul.cuh"

// A unit of one activation row (tn = 1, no gathered rows) over `m` x `k` weights of
// `type`; the per-unit fields (w, x, y, r0, act_key) are left for the caller.
__device__ __forceinline__ MmUnit one_row_unit(uint32_t type, uint32_t m, uint32_t k) {
    MmUnit u = {};
    u.row_bytes = mm_row_bytes(type, k);
    u.x_stride = k;
    u.y_stride = m;
    u.tn = 1;
    u.m = m;
    u.k = k;
    return u;
}

// `u` comes with the shape fields set (row_bytes, strides, tn = 1, m, k, no gathered rows);
// each unit sets w, x, y, r0 and act_key, then calls run(u, e) for expert e.
template <class Run>
__device__ void for_each_slot_unit(const uint8_t* w, const float* x, const int32_t* ids, float* y,
                                   uint64_t slots, uint32_t n_used, uint32_t x_per_slot,
                                   uint64_t expert_bytes, uint32_t rows, MmUnit& u, Run run) {
    const uint64_t groups = (u.m + rows - 1) / rows;
    for (uint64_t un = blockIdx.x; un < slots * groups; un += gridDim.x) {
        const uint64_t slot = un / groups;
        const uint32_t r0 = (uint32_t)(un % groups) * rows;
        const int32_t e = ids[slot];
        if (e < 0) {
            for (uint32_t r = r0 + threadIdx.x; r < min(r0 + rows, u.m); r += blockDim.x)
                y[slot * u.m + r] = nan_f32();
            continue;
        }
        const uint64_t xrow = x_per_slot ? slot : slot / n_used;
        u.w = w + (uint64_t)e * expert_bytes;
        u.x = x + xrow * u.k;
        u.y = y + slot * u.m;
        u.r0 = r0;
        u.act_key = xrow;
        run(u, e);
    }
}
