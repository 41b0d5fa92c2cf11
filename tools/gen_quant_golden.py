#!/usr/bin/env python3
"""Regenerate tests/golden/quant/: oracle outputs for strata-quant's tests.

For every weight format strata reads (floats, legacy, K, IQ, MXFP4) this draws
random *valid* blocks (random bytes, with the f16 scale fields replaced by
finite, modest values and MXFP4's E8M0 exponent kept in a sane range) and
records what two oracles nobody in this project wrote say about them:

* `gguf.quants.dequantize` (the `gguf` Python package, 0.19): the dequantised
  values, bit for bit.  The same blocks are also run through llama.cpp's own
  `dequantize_row_*` (libggml-base) and the script refuses to write anything if
  the two oracles disagree.
* llama.cpp's CPU library (libggml-cpu, through `ggml_get_type_traits_cpu`):
  a random f32 activation row quantised to the format's `vec_dot_type` by
  ggml's reference quantiser (`quantize_row_q8_0_ref`, `_q8_1_ref`,
  `_q8_K_ref`, or its f16/bf16 conversion), and the dot product of the weight
  row with it, both by the CPU's optimised `vec_dot` and by the `_generic` C
  version.

Files per format NAME (all little-endian):
  NAME.blocks   the raw blocks (one row of n_blocks blocks)
  NAME.deq      the dequantised row, f32
  NAME.act      the f32 activation row (same length)
  NAME.actq     that row quantised by ggml to the vec_dot_type
  NAME.actq_x86 (Q8_0 and Q8_1 only) the same row quantised by the CPU
                library's own `from_float`, which is what llama.cpp's mul_mat
                runs: on x86 with AVX it scales by 127/amax and rounds to
                nearest even, unlike the reference (1/d, roundf), so a few
                bytes differ. Written only when the library was built for x86.
and manifest.json with shapes, the vec_dot_type and the dot products.

Usage: python3 tools/gen_quant_golden.py [--lib-dir DIR] [--out DIR]
The llama.cpp libraries default to /work/oracle/llama.cpp/build/bin.
"""

import argparse
import ctypes
import json
import os
import platform
import sys

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

SEED = 20240611

# name, and the offsets of its f16 scale fields inside a block
FORMATS = {
    "F32": [],
    "F16": [],
    "BF16": [],
    "Q4_0": [0],
    "Q4_1": [0, 2],
    "Q5_0": [0],
    "Q5_1": [0, 2],
    "Q8_0": [0],
    "Q2_K": [80, 82],
    "Q3_K": [108],
    "Q4_K": [0, 2],
    "Q5_K": [0, 2],
    "Q6_K": [208],
    "IQ2_XXS": [0],
    "IQ2_XS": [0],
    "IQ2_S": [0],
    "IQ3_XXS": [0],
    "IQ3_S": [0],
    "IQ4_NL": [0],
    "IQ4_XS": [0],
    "MXFP4": [],
}

N_BLOCKS = 16  # blocks per quantised format (one row)
N_FLOAT = 256  # values per float format

# ggml_type ids of the activation formats, and their (block size, bytes per
# block) as ggml-common.h has them.  gguf's table says 40 bytes for Q8_1 (an
# older layout with f32 d and s); ggml's block_q8_1 has two f16s: 36.
ACT_NAMES = {0: "F32", 1: "F16", 8: "Q8_0", 9: "Q8_1", 15: "Q8_K", 30: "BF16"}
ACT_SIZES = {0: (1, 4), 1: (1, 2), 8: (32, 34), 9: (32, 36), 15: (256, 292), 30: (1, 2)}


class TypeTraitsCpu(ctypes.Structure):
    _fields_ = [
        ("from_float", ctypes.c_void_p),
        ("vec_dot", ctypes.c_void_p),
        ("vec_dot_type", ctypes.c_int),
        ("nrows", ctypes.c_int64),
    ]


VEC_DOT = ctypes.CFUNCTYPE(
    None, ctypes.c_int, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t,
    ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
)
FROM_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)


class Ggml:
    def __init__(self, lib_dir):
        flags = getattr(os, "RTLD_GLOBAL", 0)
        self.base = ctypes.CDLL(os.path.join(lib_dir, "libggml-base.so"), mode=flags)
        self.cpu = ctypes.CDLL(os.path.join(lib_dir, "libggml-cpu.so"), mode=flags)
        self.cpu.ggml_cpu_init()
        self.cpu.ggml_get_type_traits_cpu.restype = ctypes.POINTER(TypeTraitsCpu)

    def traits(self, type_id):
        return self.cpu.ggml_get_type_traits_cpu(type_id).contents

    def sym(self, lib, name):
        try:
            return getattr(lib, name)
        except AttributeError:
            return None

    def dequantize(self, name, blocks, n):
        """llama.cpp's dequantize_row_<name>, or None where it has none by that name."""
        if name in ("F32", "F16", "BF16"):
            return None
        fn = self.sym(self.base, "dequantize_row_" + name.lower())
        if fn is None:
            return None
        out = np.zeros(n, dtype=np.float32)
        buf = np.ascontiguousarray(blocks)
        fn(buf.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        return out

    def quantize_act(self, act_id, x):
        """Quantise f32 row x as ggml's reference quantiser for act_id does."""
        n = x.size
        block, tsize = ACT_SIZES[act_id]
        out = np.zeros(n // block * tsize, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        ref = {8: "quantize_row_q8_0_ref", 9: "quantize_row_q8_1_ref", 15: "quantize_row_q8_K_ref"}
        if act_id in ref:
            fn = getattr(self.base, ref[act_id])
            fn(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), ctypes.c_int64(n))
        elif act_id == 0:
            out[:] = x.view(np.uint8)
        else:
            from_float = FROM_FLOAT(self.traits(act_id).from_float)
            from_float(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), n)
        return out

    def quantize_act_cpu(self, act_id, x):
        """Quantise f32 row x with the CPU library's from_float for act_id."""
        block, tsize = ACT_SIZES[act_id]
        out = np.zeros(x.size // block * tsize, dtype=np.uint8)
        x = np.ascontiguousarray(x, dtype=np.float32)
        from_float = FROM_FLOAT(self.traits(act_id).from_float)
        from_float(x.ctypes.data_as(ctypes.c_void_p), out.ctypes.data_as(ctypes.c_void_p), x.size)
        return out

    def vec_dot(self, type_id, n, row, act, generic_name):
        """(optimised, generic) dot products; generic is None for the float types."""
        s = ctypes.c_float(0)
        row = np.ascontiguousarray(row)
        act = np.ascontiguousarray(act)
        fast = VEC_DOT(self.traits(type_id).vec_dot)
        fast(n, ctypes.byref(s), 0, row.ctypes.data_as(ctypes.c_void_p), 0,
             act.ctypes.data_as(ctypes.c_void_p), 0, 1)
        fast_v = s.value
        gen_v = None
        fn = self.sym(self.cpu, generic_name)
        if fn is not None:
            s2 = ctypes.c_float(0)
            fn(ctypes.c_int(n), ctypes.byref(s2), ctypes.c_size_t(0), row.ctypes.data_as(ctypes.c_void_p),
               ctypes.c_size_t(0), act.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(0), ctypes.c_int(1))
            gen_v = s2.value
        return fast_v, gen_v


def random_scales(rng, count):
    """Finite f16 scales: signed, magnitudes 1e-4..1e-1, plus a subnormal and a zero."""
    mag = 10.0 ** rng.uniform(-4, -1, size=count)
    sign = rng.choice([-1.0, 1.0], size=count)
    vals = (mag * sign).astype(np.float16)
    if count > 4:
        vals[1] = np.float16(3e-6)  # an f16 subnormal
        vals[2] = np.float16(0.0)
    return vals


def make_blocks(rng, name):
    block, tsize = GGML_QUANT_SIZES[T[name]]
    if name == "F32":
        return (rng.standard_normal(N_FLOAT) * 0.5).astype(np.float32).view(np.uint8).copy()
    if name == "F16":
        return (rng.standard_normal(N_FLOAT) * 0.5).astype(np.float16).view(np.uint8).copy()
    if name == "BF16":
        f = (rng.standard_normal(N_FLOAT) * 0.5).astype(np.float32)
        return (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).copy()
    blocks = rng.integers(0, 256, size=(N_BLOCKS, tsize), dtype=np.uint8)
    for off in FORMATS[name]:
        blocks[:, off:off + 2] = random_scales(rng, N_BLOCKS).view(np.uint8).reshape(N_BLOCKS, 2)
    if name == "MXFP4":
        # E8M0 exponent: 2^(e-127) for the doubled e2m1 values; keep it modest,
        # plus the two special-cased tiny ones (e < 2).
        blocks[:, 0] = rng.integers(117, 133, size=N_BLOCKS)
        blocks[1, 0] = 0
        blocks[2, 0] = 1
    return blocks.reshape(-1)


def generic_name(name, act_id):
    """ggml's name for the plain-C dot product, e.g. ggml_vec_dot_q4_K_q8_K_generic."""
    def ggml_case(n):
        n = n.lower()
        return n[:-2] + "_K" if n.endswith("_k") else n
    return f"ggml_vec_dot_{ggml_case(name)}_{ggml_case(ACT_NAMES[act_id])}_generic"


def dequantize_act(act_id, actq):
    """The values an activation row holds: the floats, or d·q per block."""
    if act_id == 0:
        return actq.view(np.float32)
    if act_id == 1:
        return actq.view(np.float16).astype(np.float32)
    if act_id == 30:
        return (actq.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    block, tsize = ACT_SIZES[act_id]
    b = actq.reshape(-1, tsize)
    if act_id == 15:  # Q8_K: f32 d, 256 i8, 16 i16 bsums
        d, q = b[:, :4].copy().view(np.float32), b[:, 4:4 + block]
    else:  # Q8_0: f16 d, 32 i8; Q8_1: f16 d, f16 s, 32 i8
        d, q = b[:, :2].copy().view(np.float16).astype(np.float32), b[:, tsize - block:]
    return (d * q.view(np.int8).astype(np.float32)).reshape(-1)


def main():
    ap = argparse.ArgumentParser()
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--lib-dir", default=os.environ.get("GGML_LIB_DIR", "/work/oracle/llama.cpp/build/bin"))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "quant"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    ggml = Ggml(args.lib_dir)
    rng = np.random.default_rng(SEED)
    manifest = {
        "generator": "tools/gen_quant_golden.py",
        "oracles": "gguf.quants.dequantize (gguf 0.19); llama.cpp libggml-base/libggml-cpu",
        "seed": SEED,
        "formats": [],
    }

    for name in FORMATS:
        qt = T[name]
        block, tsize = GGML_QUANT_SIZES[qt]
        raw = make_blocks(rng, name)
        n = raw.size // tsize * block

        deq = quants.dequantize(raw, qt).astype(np.float32).reshape(-1)
        assert deq.size == n and np.all(np.isfinite(deq)), name
        ref = ggml.dequantize(name, raw, n)
        if ref is not None and not np.array_equal(deq.view(np.uint32), ref.view(np.uint32)):
            bad = np.nonzero(deq.view(np.uint32) != ref.view(np.uint32))[0]
            sys.exit(f"{name}: gguf and llama.cpp disagree at {bad[:8]}")

        traits = ggml.traits(qt.value)
        act_id = traits.vec_dot_type
        x = (rng.standard_normal(n) * 1.5).astype(np.float32)
        x[: min(n, 32)] = 0.0  # a block of zeros: the d = 0 path
        if n >= 64:
            # Exact ties: with amax = 127, d = 1 and x·id is exactly ±k.5, where
            # Q8_0/Q8_1 round away from zero (roundf) and Q8_K to even (nearest_int).
            x[32:64] = 0.0
            x[32:38] = [127.0, 2.5, -3.5, 0.5, -0.5, 1.5]
        actq = ggml.quantize_act(act_id, x)
        fast, generic = ggml.vec_dot(qt.value, n, raw, actq, generic_name(name, act_id))

        # f64 dot over what the kernels really multiply: dequantised weights ×
        # the dequantised activation.
        xa = dequantize_act(act_id, actq)
        f64 = float(np.dot(deq.astype(np.float64), xa.astype(np.float64)))
        sum_abs = float(np.sum(np.abs(deq.astype(np.float64) * xa.astype(np.float64))))

        files = [("blocks", raw), ("deq", deq), ("act", x), ("actq", actq)]
        if act_id in (8, 9) and platform.machine() in ("x86_64", "AMD64"):
            files.append(("actq_x86", ggml.quantize_act_cpu(act_id, x)))
        for suffix, data in files:
            with open(os.path.join(args.out, f"{name}.{suffix}"), "wb") as f:
                f.write(np.ascontiguousarray(data).view(np.uint8).tobytes())
        manifest["formats"].append({
            "name": name,
            "id": qt.value,
            "block_size": block,
            "type_size": tsize,
            "n": n,
            "act": ACT_NAMES[act_id],
            "ggml_vec_dot": fast,
            "ggml_vec_dot_generic": generic,
            # The generic C dot product as built by the oracle script is not
            # always right (Q5_0's returns 7680 for 32 × (-16·1) here, a
            # vectoriser miscompile); tests use the optimised one.
            "generic_agrees": generic is None or abs(generic - fast) <= 1e-4 * max(sum_abs, 1e-30),
            "f64_dot": f64,
            "sum_abs_products": sum_abs,
        })
        print(f"{name:8} n={n:5} act={ACT_NAMES[act_id]:5} dot={fast:+.6e} generic={generic} f64={f64:+.6e}")

    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
