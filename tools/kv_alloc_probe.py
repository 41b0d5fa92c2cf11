#!/usr/bin/env python3
"""What a K/V grow's allocations and frees cost on this GPU, measured with the CUDA driver
API itself (ctypes on libcuda: no build, no toolkit), to tell which design removes issue
8's grow stall. The default shape is the bench's grow of the Qwen3-30B-A3B-shaped file:
48 layers x (K, V) = 96 buffers, 4096 -> 8192 cells of f16 rows of 512 values, so each
new buffer is 8 MiB and each old one 4 MiB. Each way is timed as a grow would do it:

  per-layer   96 cuMemAlloc of the new size, then 96 cuMemFree of the old
              (what strata does now: KvCache::with_format, then dropping the old K/V)
  one-buffer  2 cuMemAlloc of 48 new buffers' bytes, 2 cuMemFree of the old
              (one K and one V buffer for every layer, per-layer views)
  vmm         per buffer cuMemCreate of the added bytes + cuMemMap at the end of its
              reserved range + cuMemSetAccess; the trim: cuMemUnmap + cuMemRelease
              (growing in place: no row copy, no new addresses)
  pool        96 cuMemAllocFromPoolAsync from the device's pool, kept warm (release
              threshold: keep everything), then 96 cuMemFreeAsync; one stream sync each
              batch (and the allocations again with a sync after each one)

and, for the rest of the breakdown: one cuMemFree while a 2 GiB copy runs on another
stream (does a free wait for the device?), cuMemGetInfo, cuEventRecord and cuEventQuery
(core's collection records and queries an event per deferred buffer, every collection).

    python3 tools/kv_alloc_probe.py [--buffers 96] [--old-mib 4] [--new-mib 8] [--reps 5]

One line per measurement, the median over the repetitions, in ms.
"""
import argparse
import ctypes as C
import statistics
import sys
import time

MIB = 1 << 20


def load():
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            return C.CDLL(name)
        except OSError:
            pass
    sys.exit("kv_alloc_probe: no libcuda here (run it on the GPU machine)")


cu = load()
u32, i32, u64, sz, vp = C.c_uint, C.c_int, C.c_uint64, C.c_size_t, C.c_void_p


def fn(name, *args):
    f = getattr(cu, name)
    f.argtypes = list(args)
    f.restype = i32
    return f


cuGetErrorName = fn("cuGetErrorName", i32, C.POINTER(C.c_char_p))


def check(r, what):
    if r != 0:
        s = C.c_char_p()
        cuGetErrorName(r, C.byref(s))
        raise RuntimeError(f"{what}: {s.value.decode() if s.value else r}")


class Location(C.Structure):
    _fields_ = [("type", i32), ("id", i32)]


class AllocFlags(C.Structure):
    _fields_ = [
        ("compressionType", C.c_ubyte),
        ("gpuDirectRDMACapable", C.c_ubyte),
        ("usage", C.c_ushort),
        ("reserved", C.c_ubyte * 4),
    ]


class Prop(C.Structure):
    _fields_ = [
        ("type", i32),
        ("requestedHandleTypes", i32),
        ("location", Location),
        ("win32HandleMetaData", vp),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(C.Structure):
    _fields_ = [("location", Location), ("flags", i32)]


cuInit = fn("cuInit", u32)
cuDeviceGet = fn("cuDeviceGet", C.POINTER(i32), i32)
cuDevicePrimaryCtxRetain = fn("cuDevicePrimaryCtxRetain", C.POINTER(vp), i32)
cuCtxSetCurrent = fn("cuCtxSetCurrent", vp)
cuCtxSynchronize = fn("cuCtxSynchronize")
cuMemAlloc = fn("cuMemAlloc_v2", C.POINTER(u64), sz)
cuMemFree = fn("cuMemFree_v2", u64)
cuMemGetInfo = fn("cuMemGetInfo_v2", C.POINTER(sz), C.POINTER(sz))
cuStreamCreate = fn("cuStreamCreate", C.POINTER(vp), u32)
cuStreamSynchronize = fn("cuStreamSynchronize", vp)
cuMemcpyDtoDAsync = fn("cuMemcpyDtoDAsync_v2", u64, u64, sz, vp)
cuEventCreate = fn("cuEventCreate", C.POINTER(vp), u32)
cuEventRecord = fn("cuEventRecord", vp, vp)
cuEventQuery = fn("cuEventQuery", vp)
cuEventDestroy = fn("cuEventDestroy_v2", vp)
cuMemGetAllocationGranularity = fn(
    "cuMemGetAllocationGranularity", C.POINTER(sz), C.POINTER(Prop), i32
)
cuMemAddressReserve = fn("cuMemAddressReserve", C.POINTER(u64), sz, sz, u64, C.c_ulonglong)
cuMemAddressFree = fn("cuMemAddressFree", u64, sz)
cuMemCreate = fn("cuMemCreate", C.POINTER(u64), sz, C.POINTER(Prop), C.c_ulonglong)
cuMemRelease = fn("cuMemRelease", u64)
cuMemMap = fn("cuMemMap", u64, sz, sz, u64, C.c_ulonglong)
cuMemUnmap = fn("cuMemUnmap", u64, sz)
cuMemSetAccess = fn("cuMemSetAccess", u64, sz, C.POINTER(AccessDesc), sz)
cuDeviceGetDefaultMemPool = fn("cuDeviceGetDefaultMemPool", C.POINTER(vp), i32)
cuMemPoolSetAttribute = fn("cuMemPoolSetAttribute", vp, i32, vp)
cuMemAllocFromPoolAsync = fn("cuMemAllocFromPoolAsync", C.POINTER(u64), sz, vp, vp)
cuMemFreeAsync = fn("cuMemFreeAsync", u64, vp)

CU_STREAM_NON_BLOCKING = 1
CU_EVENT_DISABLE_TIMING = 2
CU_MEM_ALLOCATION_TYPE_PINNED = 1
CU_MEM_LOCATION_TYPE_DEVICE = 1
CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 3
CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0
CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4


def ms(f):
    t = time.perf_counter()
    f()
    return 1e3 * (time.perf_counter() - t)


def alloc(n):
    p = u64()
    check(cuMemAlloc(C.byref(p), n), f"cuMemAlloc({n})")
    return p.value


def free(p):
    check(cuMemFree(p), "cuMemFree")


def per_layer(nbuf, old, new):
    olds = [alloc(old) for _ in range(nbuf)]
    news = []
    ta = ms(lambda: news.extend(alloc(new) for _ in range(nbuf)))
    tf = ms(lambda: [free(p) for p in olds])
    for p in news:
        free(p)
    return ta, tf


def one_buffer(nbuf, old, new):
    half = nbuf // 2
    olds = [alloc(old * half) for _ in range(2)]
    news = []
    ta = ms(lambda: news.extend(alloc(new * half) for _ in range(2)))
    tf = ms(lambda: [free(p) for p in olds])
    for p in news:
        free(p)
    return ta, tf


def vmm_setup(dev):
    prop = Prop()
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = dev
    gran = sz()
    check(
        cuMemGetAllocationGranularity(
            C.byref(gran), C.byref(prop), CU_MEM_ALLOC_GRANULARITY_MINIMUM
        ),
        "cuMemGetAllocationGranularity",
    )
    access = AccessDesc()
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE
    access.location.id = dev
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    return prop, gran.value, access


def vmm(nbuf, old, new, dev):
    prop, gran, access = vmm_setup(dev)
    up = lambda n: (n + gran - 1) // gran * gran  # noqa: E731
    old_b, add_b = up(old), up(new - old)
    reserve = 4 * up(new)  # a range per buffer, as for --max-context
    bases, handles = [], []
    for _ in range(nbuf):  # the context's first K/V: reserved and backed once, not timed
        b, h = u64(), u64()
        check(cuMemAddressReserve(C.byref(b), reserve, 0, 0, 0), "cuMemAddressReserve")
        check(cuMemCreate(C.byref(h), old_b, C.byref(prop), 0), "cuMemCreate")
        check(cuMemMap(b.value, old_b, 0, h.value, 0), "cuMemMap")
        check(cuMemSetAccess(b.value, old_b, C.byref(access), 1), "cuMemSetAccess")
        bases.append(b.value)
        handles.append(h.value)
    added = []

    def grow():
        for b in bases:
            h = u64()
            check(cuMemCreate(C.byref(h), add_b, C.byref(prop), 0), "cuMemCreate")
            check(cuMemMap(b + old_b, add_b, 0, h.value, 0), "cuMemMap")
            check(cuMemSetAccess(b + old_b, add_b, C.byref(access), 1), "cuMemSetAccess")
            added.append(h.value)

    def trim():
        for b, h in zip(bases, added):
            check(cuMemUnmap(b + old_b, add_b), "cuMemUnmap")
            check(cuMemRelease(h), "cuMemRelease")

    tg, tt = ms(grow), ms(trim)
    for b, h in zip(bases, handles):
        check(cuMemUnmap(b, old_b), "cuMemUnmap")
        check(cuMemRelease(h), "cuMemRelease")
        check(cuMemAddressFree(b, reserve), "cuMemAddressFree")
    return tg, tt, gran


def pool(nbuf, old, new, dev, stream):
    mp = vp()
    check(cuDeviceGetDefaultMemPool(C.byref(mp), dev), "cuDeviceGetDefaultMemPool")
    keep = C.c_uint64(2**64 - 1)
    check(
        cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, C.cast(C.pointer(keep), vp)),
        "cuMemPoolSetAttribute",
    )

    def get(n, k, sync_each=False):
        out = []
        for _ in range(k):
            p = u64()
            check(cuMemAllocFromPoolAsync(C.byref(p), n, mp, stream), "cuMemAllocFromPoolAsync")
            out.append(p.value)
            if sync_each:
                check(cuStreamSynchronize(stream), "cuStreamSynchronize")
        check(cuStreamSynchronize(stream), "cuStreamSynchronize")
        return out

    def put(ps):
        for p in ps:
            check(cuMemFreeAsync(p, stream), "cuMemFreeAsync")
        check(cuStreamSynchronize(stream), "cuStreamSynchronize")

    put(get(new, nbuf) + get(old, nbuf))  # warm: the pool holds both sizes' memory
    olds = get(old, nbuf)
    news = []
    ta = ms(lambda: news.extend(get(new, nbuf)))
    tf = ms(lambda: put(olds))
    put(news)
    # A backend whose alloc has no stream: each allocation waited for on its own.
    each = []
    te = ms(lambda: each.extend(get(new, nbuf, sync_each=True)))
    put(each)
    return ta, tf, te


def free_while_busy(old, stream):
    big = 2 << 30
    a, b = alloc(big), alloc(big)
    victim, spare = alloc(old), alloc(old)
    check(cuCtxSynchronize(), "cuCtxSynchronize")
    idle = ms(lambda: free(spare))
    copy = ms(
        lambda: (
            check(cuMemcpyDtoDAsync(b, a, big, stream), "copy"),
            check(cuStreamSynchronize(stream), "sync"),
        )
    )
    check(cuMemcpyDtoDAsync(b, a, big, stream), "copy")
    busy = ms(lambda: free(victim))
    check(cuStreamSynchronize(stream), "sync")
    free(a)
    free(b)
    return idle, copy, busy


def events(nbuf, stream):
    evs = []
    for _ in range(nbuf):
        e = vp()
        check(cuEventCreate(C.byref(e), CU_EVENT_DISABLE_TIMING), "cuEventCreate")
        evs.append(e)
    rec = ms(lambda: [check(cuEventRecord(e, stream), "cuEventRecord") for e in evs])
    check(cuStreamSynchronize(stream), "sync")
    # One query per pending buffer per collection, nbuf deferred frees in a row.
    n = nbuf * (nbuf + 1) // 2
    q = ms(lambda: [cuEventQuery(evs[i % nbuf]) for i in range(n)])
    for e in evs:
        cuEventDestroy(e)
    return rec, q, n


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--buffers", type=int, default=96)
    ap.add_argument("--old-mib", type=float, default=4.0)
    ap.add_argument("--new-mib", type=float, default=8.0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()
    nbuf, old, new = a.buffers, int(a.old_mib * MIB), int(a.new_mib * MIB)
    check(cuInit(0), "cuInit")
    dev, ctx, stream = i32(), vp(), vp()
    check(cuDeviceGet(C.byref(dev), a.device), "cuDeviceGet")
    check(cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    check(cuStreamCreate(C.byref(stream), CU_STREAM_NON_BLOCKING), "cuStreamCreate")
    freeb, total = sz(), sz()
    check(cuMemGetInfo(C.byref(freeb), C.byref(total)), "cuMemGetInfo")
    print(
        f"device {a.device}: {freeb.value / 2**30:.1f} of {total.value / 2**30:.1f} GiB free; "
        f"{nbuf} buffers, {a.old_mib:g} -> {a.new_mib:g} MiB each; median of {a.reps} (ms)"
    )

    def med(f):
        runs = [f() for _ in range(a.reps)]
        return [statistics.median(col) for col in zip(*runs)]

    ta, tf = med(lambda: per_layer(nbuf, old, new))
    print(f"per-layer:  alloc {ta:.2f}  free {tf:.2f}  (sum {ta + tf:.2f})")
    ta, tf = med(lambda: one_buffer(nbuf, old, new))
    print(f"one-buffer: alloc {ta:.2f}  free {tf:.2f}  (sum {ta + tf:.2f})")
    try:
        tg, tt, gran = med(lambda: vmm(nbuf, old, new, dev.value))
        print(f"vmm:        grow {tg:.2f}  trim {tt:.2f}  (granularity {gran / MIB:g} MiB)")
    except RuntimeError as e:
        print(f"vmm:        not measured ({e})")
    try:
        ta, tf, te = med(lambda: pool(nbuf, old, new, dev.value, stream))
        print(
            f"pool:       alloc {ta:.2f}  free {tf:.2f}  (sum {ta + tf:.2f}, warm pool; "
            f"alloc {te:.2f} with a stream sync after each)"
        )
    except RuntimeError as e:
        print(f"pool:       not measured ({e})")
    idle, copy, busy = med(lambda: free_while_busy(old, stream))
    print(
        f"cuMemFree:  {idle:.3f} on an idle device, {busy:.3f} while a {copy:.2f} ms copy "
        f"runs on another stream"
    )
    q = med(lambda: [ms(lambda: [cuMemGetInfo(C.byref(freeb), C.byref(total)) for _ in range(100)])])
    print(f"cuMemGetInfo: {q[0] / 100 * 1e3:.1f} us a call")
    rec, qs, n = med(lambda: events(nbuf, stream))
    print(f"events:     {nbuf} cuEventRecord {rec:.3f}, {int(n)} cuEventQuery {qs:.3f}")


if __name__ == "__main__":
    main()
