#!/usr/bin/env python3
"""Regenerate tests/golden/quant/iq_grids.json: the IQ lookup tables as the
`gguf` Python package (0.19) has them, for crates/quant/tests/iq_grids.rs.

strata's tables (crates/quant/src/iq_tables.rs) were copied from llama.cpp's
ggml-common.h; gguf keeps its own independent copies (hex-packed grids in
gguf/quants.py). For each table this records its size, a handful of entries
(first, last and a few spread between) and an FNV-1a 64-bit hash of every
entry's bytes in order, so a single wrong byte anywhere fails the test.

Usage: python3 tools/gen_iq_grid_golden.py [--out FILE]
"""

import argparse
import json
import os

import numpy as np
from gguf import quants

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3


def fnv1a64(data: bytes) -> int:
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def grid_rows(cls):
    """The grid as rows of unsigned bytes (one row per entry)."""
    cls.init_grid()
    g = np.asarray(cls.grid).reshape(cls.grid_shape)
    assert np.all(g == np.round(g)) and g.min() >= 0 and g.max() < 256
    return g.astype(np.uint8)


def table(rows):
    """JSON record: entry count, bytes per entry, sampled entries, full hash."""
    rows = np.asarray(rows)
    count = rows.shape[0]
    picks = sorted({0, 1, 2, count // 7, count // 3, count // 2, (2 * count) // 3, count - 2, count - 1})
    return {
        "count": int(count),
        "entry_bytes": int(rows.shape[1]),
        "samples": {str(i): [int(v) for v in rows[i]] for i in picks},
        "fnv1a64": f"{fnv1a64(rows.astype(np.uint8).tobytes()):016x}",
    }


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "golden", "quant", "iq_grids.json"))
    args = ap.parse_args()

    ksigns = np.frombuffer(quants.IQ2_XXS.ksigns, dtype=np.uint8).reshape(-1, 1)
    kvalues_iq4nl = np.array(quants.IQ4_NL.kvalues, dtype=np.int8).view(np.uint8).reshape(-1, 1)
    kvalues_mxfp4 = np.array(quants.MXFP4.kvalues, dtype=np.int8).view(np.uint8).reshape(-1, 1)
    out = {
        "generator": "tools/gen_iq_grid_golden.py",
        "oracle": "gguf 0.19 (gguf/quants.py)",
        "hash": "FNV-1a 64 over every entry's bytes in order; i8 tables as two's complement",
        "tables": {
            "iq2xxs_grid": table(grid_rows(quants.IQ2_XXS)),
            "iq2xs_grid": table(grid_rows(quants.IQ2_XS)),
            "iq2s_grid": table(grid_rows(quants.IQ2_S)),
            "iq3xxs_grid": table(grid_rows(quants.IQ3_XXS)),
            "iq3s_grid": table(grid_rows(quants.IQ3_S)),
            "ksigns_iq2xs": table(ksigns),
            "kvalues_iq4nl": table(kvalues_iq4nl),
            "kvalues_mxfp4": table(kvalues_mxfp4),
        },
    }
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    for name, t in out["tables"].items():
        print(f"{name:14} {t['count']:5} x {t['entry_bytes']}  fnv1a64={t['fnv1a64']}")


if __name__ == "__main__":
    main()
