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

// ---- 32-lane groups ------------------------------------------------------------------
// The kernels of model.hip work in groups of STRATA_GROUP = 32 consecutive lanes: the unit
// kernels-cuda/ calls a warp, and the width of their data (a 32-value quant block, a
// 32-sub-block staging step, ggml's 16-lane vectors two at a time). A group is never
// assumed to be a wavefront: wave32 hardware runs one group per wavefront, wave64 two, so
// a block of any multiple of 32 threads works on both, and the results do not depend on
// the wavefront size (every sum is formed in the same order on both). Cross-lane
// operations stay inside the group: shuffles with width 32, and group_sync() for lanes
// that exchange data through shared memory.
#define STRATA_GROUP 32

// This thread's lane in its group, its group in a 1-D block, and the groups of the block.
__device__ inline int group_lane() { return (int)(threadIdx.x % STRATA_GROUP); }
__device__ inline int group_id() { return (int)(threadIdx.x / STRATA_GROUP); }
__device__ inline int groups_per_block() { return (int)(blockDim.x / STRATA_GROUP); }

// Whether the block is made of whole groups, each inside one wavefront.
__device__ inline bool whole_groups() {
    return blockDim.x % STRATA_GROUP == 0 && warpSize % STRATA_GROUP == 0;
}

// `v` of lane (this lane ^ o) of the group.
template <class T>
__device__ inline T group_shfl_xor(T v, int o) {
    return __shfl_xor(v, o, STRATA_GROUP);
}

// Orders the group's shared-memory writes before its lanes' later reads. The lanes of a
// wavefront execute together, so a compiler barrier with wavefront-scope fences is enough
// (HIP has no __syncwarp in every ROCm).
__device__ inline void group_sync() {
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
}
