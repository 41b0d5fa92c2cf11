#include <atomic>
// A tiny SIMT emulator: runs CUDA kernels of kernels-cuda/ on the CPU, one std::thread per
// GPU thread, blocks one after another. __syncthreads is a block barrier, warp shuffles
// exchange through a per-warp buffer between two warp barriers.
#pragma once
#define STRATA_HOST_CHECK 1
#define STRATA_EMULATOR 1
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>
#include <chrono>

#define __device__
#define __global__
#define __shared__ static
#define __constant__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
struct uint4 { unsigned int x, y, z, w; };
struct float4 { float x, y, z, w; };
struct float2 { float x, y; };
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) { return {x, y, z, w}; }
static inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }
struct Dim { unsigned int x = 1, y = 1, z = 1; };
static thread_local Dim threadIdx, blockIdx;
static Dim blockDim, gridDim;

struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    int n = 0, count = 0;
    long gen = 0;
    void init(int k) { n = k; count = 0; }
    void wait(const char* what) {
        std::unique_lock<std::mutex> l(m);
        long g = gen;
        if (++count == n) { count = 0; gen++; cv.notify_all(); return; }
        if (!cv.wait_for(l, std::chrono::seconds(20), [&] { return gen != g; })) {
            fprintf(stderr, "DEADLOCK at %s (thread %u block %u)\n", what, threadIdx.x, blockIdx.x);
            std::_Exit(9);
        }
    }
};
static Barrier block_bar;
static Barrier warp_bar[32];
static uint64_t warp_slot[32][32];

static inline void __syncthreads() { block_bar.wait("__syncthreads"); }
static inline void __syncwarp() { warp_bar[threadIdx.x >> 5].wait("__syncwarp"); }
template <class T> static inline T __shfl_xor_sync(unsigned, T v, int o) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    warp_slot[w][l] = bits;
    warp_bar[w].wait("shfl");
    uint64_t got = warp_slot[w][l ^ o];
    warp_bar[w].wait("shfl2");
    T r;
    memcpy(&r, &got, sizeof(T));
    return r;
}
template <class T> static inline T __shfl_sync(unsigned, T v, int src) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    warp_slot[w][l] = bits;
    warp_bar[w].wait("shfl_idx");
    uint64_t got = warp_slot[w][src & 31];
    warp_bar[w].wait("shfl_idx2");
    T r;
    memcpy(&r, &got, sizeof(T));
    return r;
}
static inline unsigned __ballot_sync(unsigned, bool p) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_slot[w][l] = p ? 1 : 0;
    warp_bar[w].wait("ballot");
    unsigned r = 0;
    for (int i = 0; i < 32; i++)
        if (32 * w + i < (int)blockDim.x && warp_slot[w][i]) r |= 1u << i;
    warp_bar[w].wait("ballot2");
    return r;
}
// redux.sync (sm_80+): every lane of the warp gets the max / min of the lanes' values.
static inline unsigned emu_reduce_u32(unsigned v, bool want_max) {
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    warp_slot[w][l] = v;
    warp_bar[w].wait("redux");
    unsigned r = want_max ? 0u : ~0u;
    for (int i = 0; i < 32; i++)
        if (32 * w + i < (int)blockDim.x) {
            const unsigned x = (unsigned)warp_slot[w][i];
            r = want_max ? (x > r ? x : r) : (x < r ? x : r);
        }
    warp_bar[w].wait("redux2");
    return r;
}
static inline unsigned __reduce_max_sync(unsigned, unsigned v) { return emu_reduce_u32(v, true); }
static inline unsigned __reduce_min_sync(unsigned, unsigned v) { return emu_reduce_u32(v, false); }
static std::atomic<int> block_or_acc{0};
static inline int __syncthreads_or(int p) {
    if (p) block_or_acc.fetch_or(1);
    block_bar.wait("__syncthreads_or");
    int r = block_or_acc.load();
    block_bar.wait("__syncthreads_or2");
    if (threadIdx.x == 0) block_or_acc.store(0);
    block_bar.wait("__syncthreads_or3");
    return r;
}
static inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
static inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <class T> static inline T __ldcg(const T* p) { return *p; }
static inline int __popc(unsigned x) { return __builtin_popcount(x); }
static inline int __ffs(unsigned x) { return __builtin_ffs((int)x); }
static inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
static inline int __ffsll(long long x) { return __builtin_ffsll(x); }
static inline float __uint_as_float(unsigned int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __float_as_uint(float f) { unsigned int u; memcpy(&u, &f, 4); return u; }
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned int __vsub4(unsigned int a, unsigned int b) {
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (((a >> (8 * i)) - (b >> (8 * i))) & 0xffu) << (8 * i);
    return r;
}
static inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
    unsigned long long v = (unsigned long long)x | ((unsigned long long)y << 32);
    unsigned int r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned int)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}
static inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(signed char)(a >> (8 * i)) * (int)(signed char)(b >> (8 * i));
    return c;
}
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline float __fsub_rn(float a, float b) { return a - b; }
static inline float __fdiv_rn(float a, float b) { return a / b; }
static inline float __fsqrt_rn(float a) { return std::sqrt(a); }
static inline int __float2int_rn(float a) { return (int)std::nearbyint(a); }
template <class T> static inline T __ldg(const T* p) { return *p; }
static inline unsigned int __brev(unsigned int x) {
    unsigned int r = 0;
    for (int i = 0; i < 32; i++) r |= ((x >> i) & 1u) << (31 - i);
    return r;
}
// Dynamic shared memory (mma.cuh's MMA_SMEM): one buffer, its size set per launch by the test.
alignas(16) static uint8_t emu_dynamic_smem[232448];
static uint32_t emu_dynamic_smem_bytes = 0;
using std::max;
using std::min;

template <class F>
static void launch(unsigned grid, unsigned block, F kernel) {
    gridDim.x = grid;
    blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        block_bar.init(block);
        for (unsigned w = 0; w < (block + 31) / 32; w++) warp_bar[w].init(std::min(32u, block - 32 * w));
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; t++)
            ts.emplace_back([=] { threadIdx.x = t; blockIdx.x = b; kernel(); });
        for (auto& t : ts) t.join();
    }
}
static unsigned ops_grid(uint64_t items) { return (unsigned)std::max<uint64_t>(1, (items + 255) / 256); }
