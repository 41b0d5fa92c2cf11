// The (token, slot) units of an expert product: what mul_mat_experts (for few tokens), its
// one-token variant and fused.cu's experts_gate_up share. Unit (slot, row group) computes
// `rows` rows of expert ids[slot] for the slot's activation row (x[slot] with x_per_slot,
// else x[slot / n_used]); a negative id gets NaN rows. for_each_cached_pair_unit is the
// same over the expert cache (experts.cu's mul_mat_experts_cached, fused.cu's
// experts_gate_up_cached).
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

// for_each_slot_unit over the expert cache: pair p's expert e = ids[p] has its matrices in
// slot s = table[e] of the cache; run(u, slot) gets u with x, y, r0 and act_key set and the
// slot's bytes (the caller adds its matrix's offset to set u.w). An id outside
// [0, n_expert) gets NaN rows; an expert without a slot is left alone (the CPU pool's).
template <class Run>
__device__ void for_each_cached_pair_unit(const uint8_t* slots, const int32_t* table,
                                          const float* x, const int32_t* ids, float* y,
                                          uint64_t pairs, uint32_t n_used, uint32_t x_per_slot,
                                          uint32_t n_expert, uint64_t slot_bytes, uint32_t rows,
                                          MmUnit& u, Run run) {
    const uint64_t groups = (u.m + rows - 1) / rows;
    for (uint64_t un = blockIdx.x; un < pairs * groups; un += gridDim.x) {
        const uint64_t p = un / groups;
        const uint32_t r0 = (uint32_t)(un % groups) * rows;
        const int32_t e = ids[p];
        if (e < 0 || (uint32_t)e >= n_expert) {
            for (uint32_t r = r0 + threadIdx.x; r < min(r0 + rows, u.m); r += blockDim.x)
                y[p * u.m + r] = nan_f32();
            continue;
        }
        const int32_t s = table[e];
        if (s < 0) continue;  // block-uniform: every thread of the block sees the same pair
        const uint64_t xrow = x_per_slot ? p : p / n_used;
        u.x = x + xrow * u.k;
        u.y = y + p * u.m;
        u.r0 = r0;
        u.act_key = xrow;
        run(u, slots + (uint64_t)s * slot_bytes);
    }
}

// ---- grouped units: the (token, slot) pairs of each routed expert --------------------------

// Above this many tokens mul_mat_experts groups (token, slot) pairs by expert
// (crates/model/src/ops.rs sizes the grid to match; any grid is correct).
#define MOE_GROUP_MIN_TOKENS 2
// Experts a grouped launch can tell apart (a shared-memory bitmap); ids beyond are
// treated like negative ones (NaN rows).
#define MOE_MAX_EXPERTS 4096

struct ExpertRanks {
    int distinct;    // experts routed to
    uint64_t count;  // ranks: the experts, in id order, then one for invalid ids if any
};

// Marks in `present` the experts `ids` route to (every thread of the block calls it).
__device__ __forceinline__ ExpertRanks expert_ranks(const int32_t* ids, uint64_t slots,
                                                    uint32_t* present) {
    for (uint32_t i = threadIdx.x; i < MOE_MAX_EXPERTS / 32; i += blockDim.x) present[i] = 0;
    __syncthreads();
    bool invalid = false;
    for (uint64_t s = threadIdx.x; s < slots; s += blockDim.x) {
        const int32_t e = ids[s];
        if (e < 0 || e >= MOE_MAX_EXPERTS) invalid = true;
        else atomicOr(&present[e >> 5], 1u << (e & 31));
    }
    const bool any_invalid = __syncthreads_or(invalid);
    ExpertRanks r;
    r.distinct = 0;
    for (int i = 0; i < MOE_MAX_EXPERTS / 32; i++) r.distinct += __popc(present[i]);
    r.count = (uint64_t)r.distinct + (any_invalid ? 1 : 0);
    return r;
}

// The expert of `rank` (the rank-th set bit of `present`), or -1 for the invalid ids.
__device__ __forceinline__ int expert_of_rank(const uint32_t* present, const ExpertRanks& r,
                                              int rank) {
    if (rank >= r.distinct) return -1;
    int seen = 0;
    for (int i = 0; i < MOE_MAX_EXPERTS / 32; i++) {
        const int c = __popc(present[i]);
        if (seen + c > rank) {
            uint32_t bits = present[i];
            for (int skip = rank - seen; skip > 0; skip--) bits &= bits - 1;
            return i * 32 + __ffs(bits) - 1;
        }
        seen += c;
    }
    return -1;
}

// Warp 0 collects the next up to `cap` pairs routed to expert e (e < 0: the invalid ids)
// from slot s0 on, in slot order, 32 slots per step with a ballot: tile_x[i] = the pair's
// activation row, tile_y[i] = its slot; *tile_n = how many, *tile_next = where the next
// walk starts (slots when done). The caller syncs the block before and after.
__device__ __forceinline__ void collect_expert_pairs(const int32_t* ids, uint64_t slots, int e,
                                                     uint32_t n_used, uint32_t x_per_slot,
                                                     int cap, uint64_t s0, uint32_t* tile_x,
                                                     uint32_t* tile_y, int* tile_n,
                                                     uint64_t* tile_next) {
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    int n = 0;
    uint64_t s = s0;
    while (s < slots && n < cap) {
        const uint64_t idx = s + lane;
        bool match = false;
        if (idx < slots) {
            const int32_t id = ids[idx];
            match = e >= 0 ? id == e : (id < 0 || id >= MOE_MAX_EXPERTS);
        }
        const unsigned bal = __ballot_sync(FULL_MASK, match);
        const int found = __popc(bal), take = min(found, cap - n);
        const int pos = __popc(bal & ((1u << lane) - 1u));
        if (match && pos < take) {
            tile_x[n + pos] = (uint32_t)(x_per_slot ? idx : idx / n_used);
            tile_y[n + pos] = (uint32_t)idx;
        }
        n += take;
        if (take < found) {
            // The tile is full: the next walk starts at the first match left.
            unsigned rest = bal;
            for (int q = 0; q < take; q++) rest &= rest - 1u;
            s += (uint64_t)(__ffs(rest) - 1);
            break;
        }
        s += 32;
    }
    if (lane == 0) {
        *tile_n = n;
        *tile_next = s < slots ? s : slots;
    }
}

// Appends to `list` (through the shared `count`) the slots in [w0, w1) routed to expert e
// (e < 0: the invalid ids), in no set order. Every thread of the block calls it; the caller
// syncs before reading the list.
__device__ __forceinline__ void list_expert_slots(const int32_t* ids, uint64_t w0, uint64_t w1,
                                                  int e, uint32_t* list, int* count) {
    for (uint64_t s = w0 + threadIdx.x; s < w1; s += blockDim.x) {
        const int32_t id = ids[s];
        if (e >= 0 ? id == e : (id < 0 || id >= MOE_MAX_EXPERTS))
            list[atomicAdd(count, 1)] = (uint32_t)s;
    }
}

// A grouped unit's gathered rows: the pairs of the current tile (activation row, slot).
struct ExpertTiles {
    uint32_t x[MM_TOKENS], y[MM_TOKENS];
    int n;
    uint64_t next;
};

// Expert e's pairs (e < 0: the invalid ids) through weight rows u.r0.. of u.w, a tile of up
// to MM_TOKENS pairs at a time in slot order, each tile quantising its own rows; `valid`
// false: NaN rows for them instead. `u` has its shape fields, x, y and r0 set, and its
// gathered rows pointing at `t`. Every thread of the block calls it (`t` is shared).
__device__ __forceinline__ void expert_pair_tiles(MmShared& sh, uint32_t type, MmUnit& u,
                                                  ExpertTiles& t, const int32_t* ids,
                                                  uint64_t slots, int e, bool valid,
                                                  uint32_t n_used, uint32_t x_per_slot,
                                                  uint32_t rows, uint64_t& staged) {
    uint64_t s0 = 0;
    while (true) {
        __syncthreads();  // the previous tile is done with t
        collect_expert_pairs(ids, slots, e, n_used, x_per_slot, MM_TOKENS, s0, t.x, t.y, &t.n,
                             &t.next);
        __syncthreads();
        const int n = t.n;
        s0 = t.next;
        if (n == 0) break;
        if (!valid) {
            for (int i = 0; i < n; i++)
                for (uint32_t r = u.r0 + threadIdx.x; r < min(u.r0 + rows, u.m); r += blockDim.x)
                    u.y[(uint64_t)t.y[i] * u.m + r] = nan_f32();
        } else {
            u.tn = n;
            u.act_key = 0;
            staged = ~(uint64_t)0;  // each tile quantises its own rows
            mm_unit(sh, type, u, staged);
        }
        if (s0 >= slots) break;
    }
}
