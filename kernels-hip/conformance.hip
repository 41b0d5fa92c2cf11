// Kernels the core conformance suite launches on every backend: the HIP twins of
// kernels-cuda/conformance.cu (same names, same arguments) and of the Rust kernels in
// crates/backend-cpu/src/kernels/.
// Arguments: buffers first in declaration order, then scalars, as core passes them.
#include "strata.h"

// dst[i] = value
extern "C" __global__ void fill_u32(unsigned int* dst, unsigned int n, unsigned int value) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = value;
}

// dst[i] = src[i] + addend
extern "C" __global__ void add_u32(const unsigned int* src, unsigned int* dst, unsigned int n,
                                   unsigned int addend) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + addend;
}

// flags[slot] = 1 if any table entry differs from `expected` (a reader that saw a stale
// table). One launch per reader, as in DESIGN.md's experiment.
extern "C" __global__ void check_table(const int* table, unsigned int* flags, unsigned int n,
                                       int expected, unsigned int slot) {
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && table[i] != expected) flags[slot] = 1u;
}

// Keeps a stream busy for about `ns` nanoseconds, so ordering bugs have time to show.
// wall_clock64() runs at a constant STRATA_WALL_CLOCK_KHZ whatever the shader clock
// (CUDA's twin reads %globaltimer); where a ROCm lacks it for the target (it returns a
// negative value), clock64() stands in, taken as 1 GHz: "about" is all this promises.
extern "C" __global__ void busy_wait(unsigned int* sink, unsigned long long ns) {
    const long long wall_start = wall_clock64();
    if (wall_start >= 0) {
        const unsigned long long ticks = ns * STRATA_WALL_CLOCK_KHZ / 1000000ull;
        while ((unsigned long long)(wall_clock64() - wall_start) < ticks) __builtin_amdgcn_s_sleep(1);
    } else {
        const long long start = clock64();
        while ((unsigned long long)(clock64() - start) < ns) __builtin_amdgcn_s_sleep(1);
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] += 1u;
}
