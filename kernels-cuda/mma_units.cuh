// The units of model.cu's tensor-core kernels (mul_mat_mma, mul_mat_experts_mma): a
// dense product's (row tile, token tile) units, and the grouped expert product's units
// per (routed expert, row tiles), over mma.cuh's staging and tiles.
#pragma once

#include "common.cuh"
#include "matmul.cuh"
#include "slot_units.cuh"
#include "mma.cuh"

template <class F>
__device__ void mma_dense_units(uint8_t* smem, const uint8_t* w, const float* x, float* y,
                                uint32_t m, uint32_t k, uint32_t n, int tokens) {
    const uint64_t row_bytes = (uint64_t)(k / F::QK) * F::BYTES;
    const MmaLayout l = mma_layout(row_bytes, k, tokens);
    MmaAct act = mma_act(smem, l);
    const uint32_t row_tiles = (m + MMA_ROWS - 1) / MMA_ROWS;
    const uint64_t units = (uint64_t)row_tiles * ((n + tokens - 1) / tokens);
    MmUnit u = {};
    u.x_stride = k;
    u.k = k;
    for (uint64_t un = blockIdx.x; un < units; un += gridDim.x) {
        const uint32_t r0 = (uint32_t)(un % row_tiles) * MMA_ROWS;
        const uint64_t t0 = (un / row_tiles) * (uint64_t)tokens;
        __syncthreads();  // the previous unit is done with the shared memory
        mma_stage_weights(smem, w, row_bytes, r0, m, l);
        u.x = x + t0 * k;
        u.tn = (int)min((uint64_t)tokens, n - t0);
        mma_quantise<F>(act, u, l);
        __syncthreads();
        mma_tile<F>(smem, w, row_bytes, act, l, tokens, u.tn, r0, m, y + t0 * m, m, nullptr);
    }
}

// One unit per (routed expert, group of MMA_GROUP row tiles of 64): the block lists the
// expert's pairs (every thread scanning the ids, so the list costs a few loads per thread;
// the order the list takes does not matter, each pair's rows are computed alone), then
// stages each row tile once and runs the listed pairs through it in tiles of `tokens`.
// Slots are listed in windows of `list_cap`; invalid ids get NaN rows, as mul_mat_experts.
#define MMA_GROUP 1  // 4 measured slower (fewer, longer units): pp512 1102 -> 657 tokens/s
// Most slots listed at once (the window's matches, 4 bytes each, after mma_layout's;
// crates/backend-cuda/src/kernels.rs sizes the shared memory for it).
#ifndef MMA_LIST_MAX
#define MMA_LIST_MAX 8192
#endif

template <class F>
__device__ void mma_expert_units(uint8_t* smem, const uint32_t* present, const ExpertRanks& ranks,
                                 const uint8_t* w, const float* x, const int32_t* ids, float* y,
                                 uint32_t m, uint32_t k, uint64_t slots, uint32_t n_used,
                                 uint32_t x_per_slot, uint64_t expert_bytes, int tokens,
                                 uint32_t list_cap, uint32_t* tile_x, uint32_t* tile_y,
                                 int* count) {
    const uint64_t row_bytes = (uint64_t)(k / F::QK) * F::BYTES;
    const MmaLayout l = mma_layout(row_bytes, k, tokens);
    MmaAct act = mma_act(smem, l);
    uint32_t* list = (uint32_t*)(smem + l.bytes);
    const uint32_t row_tiles = (m + MMA_ROWS - 1) / MMA_ROWS;
    const uint32_t groups = (row_tiles + MMA_GROUP - 1) / MMA_GROUP;
    MmUnit u = {};
    u.x = x;
    u.x_stride = k;
    u.k = k;
    u.x_rows = tile_x;
    for (uint64_t un = blockIdx.x; un < ranks.count * groups; un += gridDim.x) {
        const int e = expert_of_rank(present, ranks, (int)(un / groups));
        const uint32_t rt0 = (uint32_t)(un % groups) * MMA_GROUP;
        const uint32_t rt1 = min(rt0 + MMA_GROUP, row_tiles);
        const uint8_t* we = w + (uint64_t)(e < 0 ? 0 : e) * expert_bytes;
        for (uint64_t w0 = 0; w0 < slots; w0 += list_cap) {
            __syncthreads();  // the last window is done with the list
            if (threadIdx.x == 0) *count = 0;
            __syncthreads();
            const uint64_t w1 = min(slots, w0 + list_cap);
            list_expert_slots(ids, w0, w1, e, list, count);
            __syncthreads();
            const int n = *count;
            if (n == 0) continue;
            for (uint32_t rt = rt0; rt < rt1; rt++) {
                const uint32_t r0 = rt * MMA_ROWS, rows = min((uint32_t)MMA_ROWS, m - r0);
                if (e < 0) {
                    for (uint32_t i = threadIdx.x; i < (uint32_t)n * rows; i += blockDim.x)
                        y[(uint64_t)list[i / rows] * m + r0 + i % rows] = nan_f32();
                    continue;
                }
                __syncthreads();  // the last tile is done with the staged rows
                mma_stage_weights(smem, we, row_bytes, r0, m, l);
                for (int i0 = 0; i0 < n; i0 += tokens) {
                    const int tn = min(tokens, n - i0);
                    __syncthreads();  // the last tile is done with tile_x/tile_y and the quants
                    if ((int)threadIdx.x < tn) {
                        const uint32_t slot = list[i0 + threadIdx.x];
                        tile_x[threadIdx.x] = x_per_slot ? slot : slot / n_used;
                        tile_y[threadIdx.x] = slot;
                    }
                    __syncthreads();
                    u.tn = tn;
                    mma_quantise<F>(act, u, l);
                    __syncthreads();
                    mma_tile<F>(smem, we, row_bytes, act, l, tokens, tn, r0, m, y, m, tile_y);
                }
            }
        }
    }
}

