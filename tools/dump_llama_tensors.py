#!/usr/bin/env python3
"""Dump every f32/f16 tensor llama.cpp's CPU backend computes for a prompt (and
optional single-token decode steps) as raw little-endian f32 files, for
`cargo run -p strata-engine --example op_diff` to compare op by op.

Runs llama.cpp through llama-cpp-python 0.3.36 bound to the prebuilt libraries
(as tools/gen_model_golden.py does), flash attention off, n_ctx = n_batch 512,
2 threads, with a graph callback (`cb_eval`) that copies each tensor as it is
computed. Files: OUT/s{step}_{name}.f32, step 0 the prompt, step s the s-th
decode; a name seen twice in a step gets `_1`, `_2` (llama.cpp names the
reshape and the rope output of Q and K like the projection: `Qcur-3_2` is the
roped Q of layer 3); views are skipped; OUT/s{step}_LOGITS.f32 holds the logits.

Usage: python3 tools/dump_llama_tensors.py MODEL.gguf OUT '[prompt ids]' ['[decode ids]']
"""

import ctypes
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_model_golden as g  # noqa: E402


class Tensor(ctypes.Structure):
    # struct ggml_tensor (ggml.h): GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64,
    # GGML_MAX_SRC 10, GGML_MAX_NAME 64.
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p),
                ("ne", ctypes.c_int64 * 4), ("nb", ctypes.c_size_t * 4),
                ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10),
                ("view_src", ctypes.c_void_p), ("view_offs", ctypes.c_size_t),
                ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64),
                ("extra", ctypes.c_void_p), ("padding", ctypes.c_char * 8)]


def main():
    model, out = sys.argv[1], Path(sys.argv[2])
    prompt = json.loads(sys.argv[3])
    decode = json.loads(sys.argv[4]) if len(sys.argv) > 4 else []
    out.mkdir(parents=True, exist_ok=True)
    llama_cpp = g.load_llama_cpp(Path("/work/oracle/llama_cpp_python-0.3.36.tar.gz"),
                                 Path("/work/oracle/llama.cpp/build/bin"))
    step, seen = [0], set()

    def callback(ptr, ask, _user):
        if ask:
            return True
        t = Tensor.from_address(ptr)
        name = t.name.decode()
        if t.type not in (0, 1) or "(" in name:  # f32/f16 only; no views
            return True
        size = 4 if t.type == 0 else 2
        ne, nb = list(t.ne), list(t.nb)
        span = sum((ne[i] - 1) * nb[i] for i in range(4)) + size
        raw = bytes((ctypes.c_char * span).from_address(t.data))
        a = np.ndarray(tuple(reversed(ne)), dtype=np.float32 if size == 4 else np.float16,
                       buffer=raw, strides=tuple(reversed(nb)))
        key, i = f"s{step[0]}_{name}", 1
        while key in seen:
            key, i = f"s{step[0]}_{name}_{i}", i + 1
        seen.add(key)
        np.ascontiguousarray(a, dtype=np.float32).tofile(out / f"{key}.f32")
        return True

    cb = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(callback)
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_batch=512, n_threads=2,
                          n_threads_batch=2, seed=0, verbose=False)
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = 2
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.cb_eval = ctypes.cast(cb, type(cp.cb_eval))
    ctx = llama_cpp.llama_init_from_model(llm._model.model, cp)

    def run(tokens, pos0):
        b = llama_cpp.llama_batch_init(len(tokens), 0, 1)
        b.n_tokens = len(tokens)
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = tok, pos0 + i, 1, 1
            b.seq_id[i][0] = 0
        assert llama_cpp.llama_decode(ctx, b) == 0
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits(ctx), shape=(len(tokens), llm.n_vocab()))
        logits.astype(np.float32).tofile(out / f"s{step[0]}_LOGITS.f32")
        llama_cpp.llama_batch_free(b)

    run(prompt, 0)
    for i, tok in enumerate(decode):
        step[0] += 1
        run([tok], len(prompt) + i)
    print(f"{len(seen)} tensors in {out}")


if __name__ == "__main__":
    main()
