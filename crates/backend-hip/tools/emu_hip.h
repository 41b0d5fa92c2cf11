// The HIP names kernels-hip/ uses beyond CUDA's, on tools/cuda_emulate's SIMT emulator
// (emu.h: one host thread per GPU thread, a barrier per 32-lane warp). The emulator's warp
// is a kernels-hip group (32 lanes, shuffles of width 32); warpSize is a variable, set by
// -DSTRATA_EMU_WAVE=32 or 64, as it is a run-time value in newer ROCm. Used by emulate.sh.
#pragma once
#include "emu.h"

static int warpSize = STRATA_EMU_WAVE;

// Every shuffle in kernels-hip/ stays inside a 32-lane group; anything else is a bug here.
template <class T>
static inline T __shfl_xor(T v, int o, int width) {
    if (width != 32) {
        fprintf(stderr, "__shfl_xor of width %d: kernels-hip shuffles within 32 lanes\n", width);
        std::_Exit(8);
    }
    return __shfl_xor_sync(0u, v, o);
}

// group_sync(): the lanes of a wavefront run together on the GPU; here, a group barrier.
#define __builtin_amdgcn_wave_barrier() __syncwarp()
#define __builtin_amdgcn_fence(order, scope) ((void)0)
