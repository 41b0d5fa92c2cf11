// Kernels the core conformance suite launches on every backend. Each kernel here
// has a Rust twin in crates/backend-cpu/src/kernels/ and a HIP twin in kernels-hip/.
// Arguments: buffers first in declaration order, then scalars, as core passes them.

// dst[i] = value
extern "C" __global__ void fill_u32(unsigned int* dst, unsigned int n, unsigned int value) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = value;
}

// dst[i] = src[i] + addend
extern "C" __global__ void add_u32(const unsigned int* src, unsigned int* dst, unsigned int n,
                                   unsigned int addend) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = src[i] + addend;
}

// flags[slot] = 1 if any table entry differs from `expected` (a reader that saw a stale
// table). One launch per reader, as in DESIGN.md's experiment.
extern "C" __global__ void check_table(const int* table, unsigned int* flags, unsigned int n,
                                       int expected, unsigned int slot) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && table[i] != expected) flags[slot] = 1u;
}

// Keeps a stream busy for about `ns` nanoseconds, so ordering bugs have time to show.
extern "C" __global__ void busy_wait(unsigned int* sink, unsigned long long ns) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    unsigned long long now = start;
    while (now - start < ns) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    }
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] += 1u;
}
