// Sampling helpers (module `sample` of crates/core/kernels.txt): what the engine would
// otherwise do on the host with logits rows it downloaded. The CPU twin is
// crates/backend-cpu/src/kernels/sample.rs; HIP has none (the engine downloads the rows).
// Arguments: buffers first in declaration order, then scalars, as core passes them.

#include "common.cuh"

// A value and its index as one u64 whose unsigned order is argmax_row's order (kernel.rs):
// the value's bits mapped so that unsigned order is float order (-0 taken as +0, so they
// tie), above the index's complement (a tie goes to the lower index). A NaN is 0, below
// every number's key (-inf's is 0x007fffff << 32): it wins only a row of NaNs, whose key 0
// reads back as index 0. Integer operations only, so subnormals compare as on the host.
__device__ __forceinline__ uint64_t argmax_key(float v, uint32_t i) {
    uint32_t b = __float_as_uint(v);
    const uint32_t mag = b & 0x7fffffffu;
    if (mag > 0x7f800000u) return 0;
    if (mag == 0) b = 0;
    b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
    return ((uint64_t)b << 32) | (uint64_t)(0xffffffffu - i);
}

__device__ __forceinline__ uint64_t key_max(uint64_t a, uint64_t b) { return a > b ? a : b; }

__device__ __forceinline__ uint32_t argmax_key_index(uint64_t key) {
    return key == 0 ? 0u : 0xffffffffu - (uint32_t)key;
}

// The block's largest key, in every thread; the block must be whole warps. Ends with a
// barrier, so the shared array may be reused at once.
__device__ __forceinline__ uint64_t argmax_block_max(uint64_t key) {
    __shared__ uint64_t warp_max[32];
    for (int o = 16; o > 0; o >>= 1) key = key_max(key, __shfl_xor_sync(FULL_MASK, key, o));
    const uint32_t warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    if ((threadIdx.x & 31) == 0) warp_max[warp] = key;
    __syncthreads();
    key = 0;
    for (uint32_t w = 0; w < nwarps; w++) key = key_max(key, warp_max[w]);
    __syncthreads();
    return key;
}

// ids[r] = the lowest index of row r's largest value (argmax_row). Row r is taken in
// n_split pieces of ceil(n_cols / n_split) values, one launch unit each (r * n_split + s),
// in a grid-stride loop over the units: a unit's block writes its key to partial[unit],
// then takes a ticket from done[r]; the row's last unit (its ticket n_split - 1) sets the
// ticket back to 0, reads the row's keys past L1 and writes ids[r]. The maximum of the
// keys does not depend on the order they are combined in, so the answer is the same for
// every split and launch shape. One piece (n_split 1) writes ids[r] at once. Blocks of any
// multiple of 32 threads up to 1024; other blocks write 0xffffffff (no token id).
extern "C" __global__ void __launch_bounds__(1024)
    argmax_rows(const float* x, uint32_t* ids, uint64_t* partial, uint32_t* done,
                uint32_t n_rows, uint32_t n_cols, uint32_t n_split) {
    pdl_begin();
    if ((blockDim.x & 31) != 0 || n_split == 0) {
        for (uint64_t r = global_thread(); r < n_rows; r += global_threads()) ids[r] = 0xffffffffu;
        return;
    }
    __shared__ uint32_t ticket;
    const uint32_t piece = (uint32_t)(((uint64_t)n_cols + n_split - 1) / n_split);
    const uint64_t units = (uint64_t)n_rows * n_split;
    for (uint64_t u = blockIdx.x; u < units; u += gridDim.x) {
        const uint64_t r = u / n_split;
        const uint64_t start = (u % n_split) * piece;
        const uint32_t lo = start < n_cols ? (uint32_t)start : n_cols;
        const uint32_t hi = n_cols - lo < piece ? n_cols : lo + piece;
        const float* row = x + r * n_cols;
        uint64_t key = 0;
#pragma unroll 8
        for (uint32_t i = lo + threadIdx.x; i < hi; i += blockDim.x)
            key = key_max(key, argmax_key(row[i], i));
        key = argmax_block_max(key);
        if (n_split == 1) {
            if (threadIdx.x == 0) ids[r] = argmax_key_index(key);
            continue;
        }
        // Fences on both sides of the ticket make every unit's key visible to the last.
        if (threadIdx.x == 0) partial[u] = key;
        __threadfence();
        __syncthreads();
        if (threadIdx.x == 0) {
            ticket = atomicAdd(done + r, 1u);
            if (ticket == n_split - 1) done[r] = 0;
        }
        __syncthreads();
        const bool last = ticket == n_split - 1;
        __syncthreads();  // ticket is rewritten by the next unit
        if (!last) continue;
        __threadfence();
        key = 0;
        for (uint32_t s = threadIdx.x; s < n_split; s += blockDim.x)
            key = key_max(key, __ldcg(partial + r * n_split + s));
        key = argmax_block_max(key);
        if (threadIdx.x == 0) ids[r] = argmax_key_index(key);
    }
}
