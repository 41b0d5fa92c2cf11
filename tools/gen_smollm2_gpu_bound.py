#!/usr/bin/env python3
"""How far llama.cpp's own SmolLM2 logits move between its own configurations:
the oracle for the SmolLM2 bounds of crates/backend-cuda/tests/model_logits.rs.

That test feeds SmolLM2-135M-Instruct Q4_1 fixed token ids (a 40-token prompt in
batches of 16 then 4 single-token decode steps; a 100-token prompt in one pass)
through strata's CPU backend (llama.cpp's CPU logits bit for bit) and its CUDA
backend, and bounds max |Δlogit| / max |logit| per position. The GPU sums its
products in another order and quantises activations with ggml-cuda's rounding,
which SmolLM2 amplifies over its 30 layers. This script measures the same
metrics between llama.cpp runs on the same tokens whose configurations differ
only in summation order or rounding (`PAIRS`), and between the reference and
deliberately wrong runs (`CONTROLS`: what a bug looks like in these metrics).

Usage (llama-cpp-python 0.3.36 installed, or LLAMA_CPP_LIB_PATH set):
  python3 tools/gen_smollm2_gpu_bound.py \\
      [--model ~/.cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf] \\
      [--generic-lib DIR] [--cache DIR] \\
      [-o tests/golden/models/smollm2_llama_cpp_movement.json]
(about 10 minutes on 2 cores; `--cache` keeps each run's logits for a rerun).

`--generic-lib` is a copy of llama-cpp-python's lib directory whose
libggml-cpu.so is replaced by one built from the same source with no SIMD
(`GENERIC_CMAKE`; `ninja ggml-cpu`):
ggml's generic dot products (another summation order) and generic Q8 quantiser
(x * (1/d) rounded half away from zero, as ggml-cuda's), the closest CPU analogue
of strata's GPU. Each configuration runs in its own process (the library is
chosen at import).
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "tests" / "golden" / "models" / "smollm2_llama_cpp_movement.json"
DEFAULT_MODEL = Path.home() / ".cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf"

# model_logits.rs: PROMPT, DECODE_STEPS, LONG_PROMPT, the context and batch sizes.
PROMPT, DECODE_STEPS, LONG_PROMPT, N_CTX, BATCH = 40, 4, 100, 256, 16
GGML_TYPE_F32 = 0
GENERIC_CMAKE = ("cmake -G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON "
                 "-DGGML_NATIVE=OFF -DGGML_AVX=OFF -DGGML_AVX2=OFF -DGGML_FMA=OFF -DGGML_F16C=OFF "
                 "-DGGML_SSE42=OFF -DGGML_BMI2=OFF -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF")

# The reference: llama.cpp's CPU build as strata's CPU backend reproduces it.
REF = dict(lib="native", threads=2, batch=None, flash_attn=False, kv_f32=False,
           extra_bufts=True, rope_freq_base=0.0, rms_eps=None)
# Same arithmetic up to summation order / rounding: (name, what differs, overrides).
PAIRS = [
    ("threads_1", "1 thread instead of 2", dict(threads=1)),
    ("batch_1", "every token in its own forward pass (n_batch = n_ubatch = 1)", dict(batch=1)),
    ("flash_attn", "flash attention on (online softmax, f16 V accumulation)",
     dict(flash_attn=True)),
    ("kv_f32", "K/V cache in f32 instead of f16", dict(kv_f32=True)),
    ("no_repack", "no extra buffer types (weight repacking off)", dict(extra_bufts=False)),
    ("generic_simd", "libggml-cpu without SIMD: generic dot products and Q8 quantiser",
     dict(lib="generic")),
]
# Wrong models, to show what a bug does to the same metrics.
CONTROLS = [
    ("rope_base_1e4", "rope frequency base 1e4 instead of SmolLM2's 1e5",
     dict(rope_freq_base=10000.0)),
    ("rms_eps_1e-6", "RMS norm epsilon 1e-6 instead of 1e-5", dict(rms_eps=1e-6)),
]


def sequences(vocab):
    """The token ids of model_logits.rs's `compare`."""
    prompt = [(i * 7919 + 13) % vocab for i in range(PROMPT)]
    nxt = [(i * 104_729 + 5) % vocab for i in range(DECODE_STEPS)]
    long = [(i * 6151 + 29) % vocab for i in range(LONG_PROMPT)]
    return prompt, nxt, long


# ------------------------------------------------------------------ one configuration

def run_config(model, cfg, out_npz):
    """In this process: both sequences under `cfg`; saves their logits to out_npz."""
    import llama_cpp

    if not cfg["extra_bufts"]:
        default = llama_cpp.llama_model_default_params

        def no_extra():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_cpp.llama_model_default_params = no_extra
    kv = {}
    if cfg["rms_eps"] is not None:
        kv["llama.attention.layer_norm_rms_epsilon"] = float(cfg["rms_eps"])

    def make(batch):
        extra = dict(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32) if cfg["kv_f32"] else {}
        return llama_cpp.Llama(
            model_path=str(model), n_ctx=N_CTX, n_batch=batch, n_ubatch=batch,
            n_threads=cfg["threads"], n_threads_batch=cfg["threads"], logits_all=True,
            flash_attn=cfg["flash_attn"], rope_freq_base=cfg["rope_freq_base"],
            kv_overrides=kv or None, seed=0, verbose=False, **extra)

    llm = make(cfg["batch"] or BATCH)
    prompt, nxt, long = sequences(llm.n_vocab())
    llm.reset()
    llm.eval(prompt)  # in chunks of n_batch, as Context::eval_all
    for t in nxt:
        llm.eval([t])
    a = np.array(llm.scores[: PROMPT + DECODE_STEPS], dtype=np.float32)
    del llm
    llm = make(cfg["batch"] or LONG_PROMPT)
    llm.reset()
    llm.eval(long)
    b = np.array(llm.scores[:LONG_PROMPT], dtype=np.float32)
    info = llama_cpp.llama_print_system_info().decode()
    np.savez(out_npz, decode=a, one_pass=b, system_info=np.array(info))


# ------------------------------------------------------------------ metrics

def judge(c, g):
    """model_logits.rs's `judge`: per position max |Δ| / max |c| (c the reference)."""
    c64, g64 = c.astype(np.float64), g.astype(np.float64)
    scale = np.maximum(np.abs(c64).max(axis=1), 1e-6)
    d = np.where(np.isfinite(g64), np.abs(c64 - g64), np.inf)
    errs = d.max(axis=1) / scale
    s = np.sort(errs)
    top = int((c.argmax(axis=1) == g.argmax(axis=1)).sum())
    over = np.nonzero(errs > 1e-5)[0]
    return dict(
        positions=len(errs),
        median=float(s[len(s) // 2]),
        max=float(s[-1]),
        max_at=int(np.argmax(errs)),
        position0=float(errs[0]),
        first_above_1e5=int(over[0]) if len(over) else None,
        above_1e3=int((errs > 1e-3).sum()),
        same_top1=top,
        max_abs_delta=float(d.max()),
        per_position=[float(f"{e:.3g}") for e in errs],
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    ap.add_argument("--generic-lib", type=Path)
    ap.add_argument("-o", "--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--cache", type=Path, help="keep each configuration's logits here "
                    "(a rerun reuses them)")
    ap.add_argument("--run-one", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run_one:
        run_config(args.model, json.loads(args.run_one[0]), args.run_one[1])
        return

    tmp = args.cache or Path(tempfile.mkdtemp(prefix="smollm2-movement-"))
    tmp.mkdir(parents=True, exist_ok=True)

    def logits(name, cfg):
        env = dict(os.environ)
        if cfg["lib"] == "generic":
            if not args.generic_lib:
                return None
            env["LLAMA_CPP_LIB_PATH"] = str(args.generic_lib)
        out = tmp / f"{name}.npz"
        if not out.exists():
            subprocess.run([sys.executable, __file__, "--model", str(args.model),
                            "--run-one", json.dumps(cfg), str(out)], check=True, env=env)
        z = np.load(out)
        return z["decode"], z["one_pass"], str(z["system_info"])

    ref = logits("ref", REF)
    again = logits("ref_again", REF)
    result = dict(
        tool="tools/gen_smollm2_gpu_bound.py",
        oracle="llama.cpp (llama-cpp-python 0.3.36, vendor/llama.cpp 0c1e570), CPU",
        system_info=ref[2],
        model=args.model.name,
        sha256=hashlib.sha256(args.model.read_bytes()).hexdigest(),
        sequences=dict(
            decode=f"{PROMPT} prompt tokens (i*7919+13) % vocab in batches of {BATCH}, "
                   f"then {DECODE_STEPS} decode tokens (i*104729+5) % vocab",
            one_pass=f"{LONG_PROMPT} prompt tokens (i*6151+29) % vocab in one batch"),
        metric="per position max|Δlogit| / max|reference logit| (model_logits.rs judge)",
        reference=REF,
        repeat_identical=bool((ref[0] == again[0]).all() and (ref[1] == again[1]).all()),
        pairs={}, controls={})
    for group, table in (("pairs", PAIRS), ("controls", CONTROLS)):
        for name, what, over in table:
            cfg = {**REF, **over}
            got = logits(name, cfg)
            if got is None:
                print(f"{name}: skipped (no --generic-lib)")
                continue
            entry = dict(what=what, config=over,
                         decode=judge(ref[0], got[0]), one_pass=judge(ref[1], got[1]))
            if cfg["lib"] == "generic":
                entry["system_info"] = got[2]
                entry["build"] = GENERIC_CMAKE
            result[group][name] = entry
            for seq in ("decode", "one_pass"):
                m = entry[seq]
                print(f"{name:14} {seq:8}: median {m['median']:.3e} max {m['max']:.3e} "
                      f"(pos {m['max_at']}) pos0 {m['position0']:.3e} "
                      f"top1 {m['same_top1']}/{m['positions']}")
    # Bugs that need no rerun: the output head one row off, every position one late.
    for name, what, f in (
        ("head_row_off_by_one", "logit of token t taken from output row t+1",
         lambda x: np.roll(x, -1, axis=1)),
        ("position_off_by_one", "each position given the previous position's logits",
         lambda x: np.concatenate([x[:1], x[:-1]])),
    ):
        entry = dict(what=what, decode=judge(ref[0], f(ref[0])),
                     one_pass=judge(ref[1], f(ref[1])))
        result["controls"][name] = entry
        for seq in ("decode", "one_pass"):
            m = entry[seq]
            print(f"{name:14} {seq:8}: median {m['median']:.3e} max {m['max']:.3e} "
                  f"pos0 {m['position0']:.3e} top1 {m['same_top1']}/{m['positions']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(result, indent=1)
    # Lists of numbers on one line each (per_position), not one number a line.
    text = re.sub(r"\[\s+([-+0-9.e,\s]+?)\s+\]", lambda m: "[" + " ".join(m[1].split()) + "]", text)
    args.out.write_text(text + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
