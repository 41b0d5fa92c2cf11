// The RMS norm of one row by one block, shared by model.cu's rms_norm and fused.cu's
// add_rms_norm / combine_add_rms_norm so that all of them normalise alike.
//
// Squares of f32 summed in f64 (each square is exact in f64, so the order of the sum does
// not move the f32 result in practice): each thread its values i = tid, tid + blockDim, ...
// in that order, then the warps' sums, then the warps in order. A thread first loads all
// its values (up to ROW_VALS; a longer row re-reads the rest), so their loads are in
// flight together rather than one memory round trip per value.
#pragma once

#include "common.cuh"

#define ROW_VALS 16

// row_rms_scale with v already filled by the caller (v[k] = value(tid + k·blockDim), 0 past
// the row): for values whose loads the caller batches itself.
template <class Value>
__device__ __forceinline__ float row_rms_scale_filled(Value value, const float (&v)[ROW_VALS],
                                                      uint32_t dim, float eps, double* partial,
                                                      float* row_scale) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const uint32_t bd = blockDim.x;
    double sum = 0.0;
#pragma unroll
    for (int k = 0; k < ROW_VALS; k++)
        if (threadIdx.x + k * bd < dim) sum += (double)__fmul_rn(v[k], v[k]);
    for (uint32_t i = threadIdx.x + ROW_VALS * bd; i < dim; i += bd) {
        const float x = value(i);
        sum += (double)__fmul_rn(x, x);
    }
    sum = warp_sum_f64(sum);
    if (lane == 0) partial[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double total = 0.0;
        for (int i = 0; i < nwarps; i++) total += partial[i];
        const float mean = (float)(total / (double)dim);
        *row_scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    }
    __syncthreads();
    const float scale = *row_scale;
    __syncthreads();  // row_scale and partial are rewritten for the next row
    return scale;
}


// Fills v[k] = value(tid + k·blockDim) (0 past the row) and returns the row's scale
// 1 / sqrt(mean(x²) + eps). Called by every thread of the block.
template <class Value>
__device__ __forceinline__ float row_rms_scale(Value value, float (&v)[ROW_VALS], uint32_t dim,
                                               float eps, double* partial, float* row_scale) {
    const uint32_t bd = blockDim.x;
#pragma unroll
    for (int k = 0; k < ROW_VALS; k++) {
        const uint32_t i = threadIdx.x + k * bd;
        v[k] = i < dim ? value(i) : 0.0f;
    }
    return row_rms_scale_filled(value, v, dim, eps, partial, row_scale);
}

// y[i] = (x_i · scale) · w[i] for the row's values (v from row_rms_scale, value(i) past it),
// and out(i, x_i) for each (a fused op's other output; a no-op for rms_norm).
template <class Value, class Out>
__device__ __forceinline__ void row_rms_apply(Value value, Out out, const float (&v)[ROW_VALS],
                                              uint32_t dim, float scale, const float* w,
                                              float* y) {
    const uint32_t bd = blockDim.x;
#pragma unroll
    for (int k = 0; k < ROW_VALS; k++) {
        const uint32_t i = threadIdx.x + k * bd;
        if (i < dim) {
            out(i, v[k]);
            y[i] = __fmul_rn(__fmul_rn(v[k], scale), w[i]);
        }
    }
    for (uint32_t i = threadIdx.x + ROW_VALS * bd; i < dim; i += bd) {
        const float x = value(i);
        out(i, x);
        y[i] = __fmul_rn(__fmul_rn(x, scale), w[i]);
    }
}
