#!/usr/bin/env python3
"""Regenerate tests/golden/gguf/ with the `gguf` Python package (0.19), the
oracle for strata-gguf.

  writer_all_types.gguf   written by gguf.GGUFWriter: every metadata type
                          (scalars, arrays of each type, nested arrays,
                          non-UTF-8 strings), custom alignment 64, tensors of
                          several ggml types. strata's GgufWriter must produce
                          the same bytes from the same content
                          (crates/gguf/tests/golden.rs builds it).
  writer_all_types.json   what gguf.GGUFReader reads back from that file.
  real_files.json         what gguf.GGUFReader reads from each
                          tests/fixtures/vocab/*.gguf and from SmolLM2
                          (when present): metadata with arrays summarised by
                          length, first elements and an FNV-1a hash, and the
                          tensor index with a hash of each small tensor's data.

Usage: python3 tools/gen_gguf_golden.py [--smollm2 PATH]
"""

import argparse
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGUFValueType as VT, GGMLQuantizationType as QT

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "golden" / "gguf"
FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
# Tensors up to this size get a data hash in real_files.json.
HASH_LIMIT = 1 << 20


def fnv1a(data: bytes, h: int = FNV_OFFSET) -> int:
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def fnv1a_np(data: np.ndarray) -> int:
    """FNV-1a of a byte array (vectorised per 8 KiB chunk would not be exact, so loop)."""
    return fnv1a(data.tobytes())


def pattern_bytes(n: int, k: int) -> bytes:
    """Tensor k's data: a fixed pattern both this script and the Rust test compute."""
    return bytes(((i * 31 + k * 7 + 3) % 251) for i in range(n))


# ---------------------------------------------------------------- writer golden

def build_writer_golden():
    path = OUT / "writer_all_types.gguf"
    w = gguf.GGUFWriter(str(path), arch="strata-test")  # adds general.architecture first
    w.add_custom_alignment(64)
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -32768)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 3.14159)
    w.add_bool("t.bool_true", True)
    w.add_bool("t.bool_false", False)
    w.add_string("t.string", "héllo ✓ 🦀")
    w.add_key_value("t.empty_string", "", VT.STRING)  # add_string() skips empty strings
    w.add_key_value("t.non_utf8_string", b"ok\xff\xfe\x80", VT.STRING)
    w.add_uint64("t.u64", 18_446_744_073_709_551_615)
    w.add_int64("t.i64", -9_223_372_036_854_775_808)
    w.add_float64("t.f64", -2.5e-300)
    w.add_key_value("t.arr_u8", [0, 1, 255], VT.ARRAY, sub_type=VT.UINT8)
    w.add_key_value("t.arr_i8", [-128, 0, 127], VT.ARRAY, sub_type=VT.INT8)
    w.add_key_value("t.arr_u16", [0, 65535], VT.ARRAY, sub_type=VT.UINT16)
    w.add_key_value("t.arr_i16", [-32768, 32767], VT.ARRAY, sub_type=VT.INT16)
    w.add_key_value("t.arr_u32", [1, 2, 4_294_967_295], VT.ARRAY, sub_type=VT.UINT32)
    w.add_array("t.arr_i32", [-1, 0, 1, 2_147_483_647])
    w.add_key_value("t.arr_u64", [0, 18_446_744_073_709_551_615], VT.ARRAY, sub_type=VT.UINT64)
    w.add_key_value("t.arr_i64", [-9_223_372_036_854_775_808, 5], VT.ARRAY, sub_type=VT.INT64)
    w.add_array("t.arr_f32", [0.5, -1.25, 1e30, float("inf")])
    w.add_key_value("t.arr_f64", [0.1, -1e300, 2.0], VT.ARRAY, sub_type=VT.FLOAT64)
    w.add_array("t.arr_bool", [True, False, True])
    w.add_array("t.arr_string", ["a", "", "ünï", b"\xc3\x28raw"])
    w.add_array("t.arr_nested_i32", [[1, 2, 3], [4, 5]])
    w.add_array("t.arr_nested_mixed", [["x", "yz"], [1.5], [True, False]])
    w.add_array("t.arr_nested_deep", [[[7]], [[8, 9], [10]]])
    # bytes inside an array of arrays become u8 arrays
    w.add_key_value("t.arr_nested_u8", [b"\x01\x02", b"\x03"], VT.ARRAY, sub_type=VT.ARRAY)
    w.add_string("t.last", "end")

    for k, (name, ty, np_shape) in enumerate(WRITER_TENSORS):
        block, type_size = gguf.GGML_QUANT_SIZES[ty]
        n_elems = int(np.prod(np_shape))
        n_bytes = n_elems // block * type_size
        data = np.frombuffer(pattern_bytes(n_bytes, k), dtype=np.uint8)
        byte_shape = list(np_shape[:-1]) + [np_shape[-1] // block * type_size]
        data = data.reshape(byte_shape)
        w.add_tensor(name, data, raw_dtype=ty)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    summary = summarize(path, full_arrays=True, hash_all=True)
    (OUT / "writer_all_types.json").write_text(json.dumps(summary, indent=1) + "\n")


# name, ggml type, numpy shape (outermost first; ggml dims are the reverse).
# Keep in step with WRITER_TENSORS in crates/gguf/tests/golden.rs.
WRITER_TENSORS = [
    ("f32.weight", QT.F32, [3, 5]),
    ("f16.weight", QT.F16, [2, 4]),
    ("bf16.weight", QT.BF16, [3, 4]),
    ("q8_0.weight", QT.Q8_0, [2, 64]),
    ("q4_1.weight", QT.Q4_1, [2, 3, 32]),
    ("q4_k.weight", QT.Q4_K, [1, 256]),
    ("iq2_xs.weight", QT.IQ2_XS, [256]),
    ("mxfp4.weight", QT.MXFP4, [64]),
    ("i32.tensor", QT.I32, [7]),
    ("f32.4d", QT.F32, [2, 1, 3, 2]),
]


# ---------------------------------------------------------------- reader summaries

def raw_string(field, idx) -> bytes:
    return bytes(field.parts[idx])


def json_string(b: bytes):
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"hex": b.hex()}


def json_number(v):
    v = v.item() if hasattr(v, "item") else v
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    return v


def summarize_field(field, full_arrays):
    types = [t.name for t in field.types]
    main = field.types[0]
    if main == VT.STRING:
        return {"types": types, "value": json_string(raw_string(field, field.data[0]))}
    if main != VT.ARRAY:
        return {"types": types, "value": json_number(field.parts[field.data[0]][0])}
    # Arrays: gguf-py flattens nested arrays; `data` indexes the leaf values.
    leaf = field.types[-1]
    out = {"types": types, "len": len(field.data)}
    if leaf == VT.STRING:
        values = [raw_string(field, i) for i in field.data]
        h = FNV_OFFSET
        for b in values:
            h = fnv1a(len(b).to_bytes(8, "little") + b, h)
        out["fnv1a"] = f"{h:016x}"
        shown = values if full_arrays else values[:3] + values[-2:]
        out["first" if not full_arrays else "values"] = [json_string(b) for b in shown]
    else:
        parts = [field.parts[i] for i in field.data]
        h = FNV_OFFSET
        for p in parts:
            h = fnv1a(p.tobytes(), h)
        out["fnv1a"] = f"{h:016x}"
        values = [json_number(p[0]) for p in parts]
        if full_arrays:
            out["values"] = values
        else:
            out["first"] = values[:3] + values[-2:]
    return out


def summarize(path, full_arrays=False, hash_all=False):
    r = gguf.GGUFReader(str(path))
    kv = []
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue
        entry = {"key": key}
        entry.update(summarize_field(field, full_arrays))
        kv.append(entry)
    tensors = []
    for t in r.tensors:
        entry = {
            "name": t.name,
            "dims": [int(d) for d in t.shape],
            "type": int(t.tensor_type),
            "offset": int(t.data_offset),
            "n_bytes": int(t.n_bytes),
        }
        if hash_all or t.n_bytes <= HASH_LIMIT:
            raw = np.asarray(r.data[t.data_offset : t.data_offset + t.n_bytes])
            entry["fnv1a"] = f"{fnv1a_np(raw):016x}"
        tensors.append(entry)
    return {
        "file": path.name,
        "version": int(r.fields["GGUF.version"].parts[0][0]),
        "alignment": int(r.alignment),
        "data_offset": int(r.data_offset),
        "file_len": os.path.getsize(path),
        "kv": kv,
        "tensors": tensors,
    }


def main():
    ap = argparse.ArgumentParser()
    default_model = Path(os.environ.get("STRATA_MODEL_DIR", Path.home() / ".cache/strata/models"))
    ap.add_argument("--smollm2", default=str(default_model / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    build_writer_golden()
    files = sorted((ROOT / "tests/fixtures/vocab").glob("*.gguf"))
    summaries = [summarize(p) for p in files]
    model = Path(args.smollm2)
    if model.is_file():
        summaries.append(summarize(model))
    else:
        print(f"warning: {model} not found, real_files.json will lack SmolLM2", file=sys.stderr)
    (OUT / "real_files.json").write_text(json.dumps(summaries, indent=1) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
