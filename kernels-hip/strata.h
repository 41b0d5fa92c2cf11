// Helpers shared by the kernels-hip/ modules (`#include "strata.h"`).
//
// Wavefront size: 64 lanes on GCN/CDNA (gfx9xx: MI100, MI200, MI300), 32 on RDNA
// (gfx10xx, gfx11xx, gfx12xx, whose default is wave32). Nothing here assumes either:
// cross-lane loops run over `warpSize`, which newer ROCm no longer makes a compile-time
// constant (and which deprecates __AMDGCN_WAVEFRONT_SIZE), so sizes that must be known
// at compile time use the smallest wavefront, STRATA_MIN_WAVE, as the bound.
#pragma once

#define STRATA_MIN_WAVE 32
#define STRATA_MAX_BLOCK 1024
// Entries a per-wave scratch array needs for any block of up to STRATA_MAX_BLOCK threads.
#define STRATA_MAX_WAVES_PER_BLOCK (STRATA_MAX_BLOCK / STRATA_MIN_WAVE)

// The rate of wall_clock64(), in kHz. The backend defines it from the device
// (hipDeviceAttributeWallClockRate where the runtime has it); 100 MHz otherwise, the
// rate of every AMD GPU's constant-rate counter so far.
#ifndef STRATA_WALL_CLOCK_KHZ
#define STRATA_WALL_CLOCK_KHZ 100000ull
#endif

// This thread's lane within its wavefront, and its wavefront within a 1-D block.
__device__ inline unsigned int strata_lane() { return threadIdx.x % warpSize; }
__device__ inline unsigned int strata_wave() { return threadIdx.x / warpSize; }

// Sum / max of `v` over the lanes of this wavefront; every lane gets the result.
__device__ inline float strata_wave_sum(float v) {
    for (int offset = warpSize / 2; offset > 0; offset >>= 1) v += __shfl_xor(v, offset, warpSize);
    return v;
}
__device__ inline float strata_wave_max(float v) {
    for (int offset = warpSize / 2; offset > 0; offset >>= 1)
        v = fmaxf(v, __shfl_xor(v, offset, warpSize));
    return v;
}

// Sum / max of `v` over a 1-D block; every thread gets the result. `scratch` is a
// __shared__ float[STRATA_MAX_WAVES_PER_BLOCK]. Every thread of the block must call
// (it synchronises the block). A block has at most 1024 / 32 = 32 wavefronts, never more
// than one wavefront has lanes, so the second step fits in one wavefront.
__device__ inline float strata_block_sum(float v, float* scratch) {
    const unsigned int n_waves = (blockDim.x + warpSize - 1) / warpSize;
    v = strata_wave_sum(v);
    __syncthreads();  // an earlier call's readers are done with `scratch`
    if (strata_lane() == 0) scratch[strata_wave()] = v;
    __syncthreads();
    v = strata_lane() < n_waves ? scratch[strata_lane()] : 0.0f;
    return strata_wave_sum(v);
}
__device__ inline float strata_block_max(float v, float* scratch) {
    const unsigned int n_waves = (blockDim.x + warpSize - 1) / warpSize;
    v = strata_wave_max(v);
    __syncthreads();
    if (strata_lane() == 0) scratch[strata_wave()] = v;
    __syncthreads();
    v = strata_lane() < n_waves ? scratch[strata_lane()] : -__builtin_huge_valf();
    return strata_wave_max(v);
}
