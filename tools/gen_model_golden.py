#!/usr/bin/env python3
"""Regenerate tests/golden/models/ with llama.cpp, the oracle for strata's
forward pass, through llama.cpp's Python API (llama-cpp-python 0.3.36 bound
to the already built shared libraries; nothing is compiled).

  smollm2.json      SmolLM2-135M-Instruct Q4_1: for 6 prompts, the prompt token
                    ids llama.cpp used, its 64 greedy token ids, and the top-20
                    (token id, raw logit) at the first 16 generated positions.
  synth/index.json  for each synthetic architecture x weight format: the
                    `strata synth` spec, the file's sha256, size, tensor list and
                    hyper-parameter metadata as the `gguf` package reads them,
                    the dequantised RMS of each weight format against its target,
                    a fixed token sequence and the name of its logits file.
  synth/*.f32       llama.cpp's logits at every position of that sequence:
                    little-endian float32, row-major [n_tokens][n_vocab].

The formats are described in tests/golden/models/README.md.

Usage:
  python3 tools/gen_model_golden.py --strata target/debug/strata \\
      [--llama-lib /work/oracle/llama.cpp/build/bin] \\
      [--sdist /work/oracle/llama_cpp_python-0.3.36.tar.gz] \\
      [--smollm2 ~/.cache/strata/models/SmolLM2-135M-Instruct.Q4_1.gguf]

`--strata` is any program that accepts `synth --spec SPEC.json -o OUT.gguf`.
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "golden" / "models"
SDIST_DIR = Path("/tmp/strata-llama-cpp-python")

N_THREADS = 2
N_CTX = 512

# ------------------------------------------------------------------ SmolLM2

SMOLLM2_PROMPTS = [
    ("plain", "The capital of France is"),
    (
        "chat",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nWhat is the tallest mountain in the world?<|im_end|>\n"
        "<|im_start|>assistant\n",
    ),
    ("code", 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n'),
    ("french", "Il était une fois, dans un petit village français, une jeune fille qui"),
    ("story", "Once upon a time, in a land far away, there lived a"),
    ("math", "Question: What is 12 + 35?\nAnswer:"),
]
N_GENERATE = 64
N_TOP_POSITIONS = 16
TOP_K = 20

# ------------------------------------------------------------------ synthetic models

QUANTS = ["F16", "Q8_0", "Q4_K", "Q6_K", "IQ2_XS", "IQ4_XS", "MXFP4"]

# One shape per architecture (small, so tests stay fast); every field of the
# spec is given so a test re-creates the identical file from it.
BASE = dict(
    vocab=512,
    context_length=4096,
    rms_eps=1e-6,
    tie_embeddings=False,
    head_dim=None,
    ffn=768,
    experts=8,
    experts_used=2,
    expert_ffn=256,
    shared_ffn=512,
    router_skew=0.0,
    rope_freq_base=10000.0,
)
ARCH_SHAPES = {
    # Dense, SmolLM2-like: GQA, LM head tied to the embedding.
    "llama": dict(arch="llama", layers=2, hidden=256, heads=4, kv_heads=2, ffn=512,
                  experts=0, experts_used=0, tie_embeddings=True, seed=11),
    # Mixtral-style: llama with experts.
    "llama-moe": dict(arch="llama", layers=2, hidden=256, heads=8, kv_heads=2,
                      experts=8, experts_used=2, expert_ffn=256, seed=12,
                      rope_freq_base=1000000.0),
    # Qwen3-style: head_dim != hidden/heads, narrow experts (their down
    # projection takes llama-quantize's fallback type), a skewed router.
    "qwen3moe": dict(arch="qwen3moe", layers=3, hidden=256, heads=4, kv_heads=2, head_dim=128,
                     experts=16, experts_used=4, expert_ffn=128, router_skew=1.0, seed=13,
                     rope_freq_base=1000000.0),
    # Qwen1.5-MoE-style: q/k/v biases, gated shared expert.
    "qwen2moe": dict(arch="qwen2moe", layers=2, hidden=256, heads=4, kv_heads=2,
                     experts=8, experts_used=4, expert_ffn=256, shared_ffn=512, seed=14,
                     rope_freq_base=1000000.0),
    # OLMoE: q/k norms over the whole projection, kv_heads = heads.
    "olmoe": dict(arch="olmoe", layers=2, hidden=256, heads=4, kv_heads=4,
                  experts=8, experts_used=2, expert_ffn=256, router_skew=0.5, seed=15,
                  rms_eps=1e-5),
}
# The sequence every synthetic model is run on: specials (BOS 1, EOS 2), byte
# tokens (3..258) and merged tokens, in an order no tokenizer would produce.
SYNTH_TOKENS = [1, 75, 104, 3, 300, 258, 411, 2, 259, 35, 510, 120]


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ------------------------------------------------------------------ llama.cpp binding

def load_llama_cpp(sdist: Path, lib_dir: Path):
    """Unpacks the sdist's `llama_cpp` package under /tmp and imports it, bound
    to the prebuilt libraries in lib_dir (LLAMA_CPP_LIB_PATH)."""
    pkg = SDIST_DIR / "llama_cpp"
    if not pkg.exists():
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as tar:
            for m in tar.getmembers():
                parts = Path(m.name).parts
                if len(parts) > 2 and parts[1] == "llama_cpp":
                    m.name = str(Path(*parts[1:]))
                    tar.extract(m, SDIST_DIR, filter="data")
    # llama_cpp imports diskcache for an optional disk cache we do not use.
    stub = SDIST_DIR / "stubs"
    stub.mkdir(exist_ok=True)
    (stub / "diskcache.py").write_text("class Cache:\n    pass\n")
    os.environ["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
    sys.path[:0] = [str(SDIST_DIR), str(stub)]
    import llama_cpp  # noqa: E402

    return llama_cpp


def open_model(llama_cpp, path: Path):
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=N_CTX,
        n_batch=N_CTX,
        n_threads=N_THREADS,
        n_threads_batch=N_THREADS,
        logits_all=True,
        seed=0,
        verbose=False,
    )


def eval_logits(llm, tokens):
    """Evaluates `tokens` from an empty context in one batch; logits [n, vocab]."""
    llm.reset()
    llm.eval(tokens)
    return np.array(llm.scores[: len(tokens)], dtype=np.float32)


# ------------------------------------------------------------------ SmolLM2 golden

def smollm2_golden(llama_cpp, path: Path):
    llm = open_model(llama_cpp, path)
    eog = [t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(llm._model.vocab, t)]
    cases = []
    for name, prompt in SMOLLM2_PROMPTS:
        # As llama-completion tokenizes a prompt: add the vocabulary's default
        # specials (none for SmolLM2: add_bos_token is false), parse specials.
        prompt_tokens = llm.tokenize(prompt.encode("utf-8"), add_bos=True, special=True)
        llm.reset()
        llm.eval(prompt_tokens)
        generated, top = [], []
        for i in range(N_GENERATE):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            tok = int(np.argmax(logits))
            if i < N_TOP_POSITIONS:
                order = np.argsort(-logits, kind="stable")[:TOP_K]
                top.append([[int(t), float(logits[t])] for t in order])
            generated.append(tok)
            if i + 1 < N_GENERATE:
                llm.eval([tok])
        first_eog = next((i for i, t in enumerate(generated) if t in eog), None)
        text = llm.detokenize(generated).decode("utf-8", errors="replace")
        print(f"smollm2 {name}: {len(prompt_tokens)} prompt tokens -> {text[:60]!r}")
        cases.append(dict(
            name=name,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            generated=generated,
            first_eog_index=first_eog,
            generated_text=text,
            top_logits=top,
        ))
    return dict(
        model=path.name,
        sha256=sha256(path),
        n_ctx=N_CTX,
        n_threads=N_THREADS,
        eog_tokens=eog,
        n_generate=N_GENERATE,
        top_k=TOP_K,
        n_top_positions=N_TOP_POSITIONS,
        cases=cases,
    )


# ------------------------------------------------------------------ synthetic golden

def gguf_summary(path: Path):
    """Tensor list, hyper-parameters and per-format dequantised RMS, as the
    `gguf` package (0.19) reads the file."""
    import gguf
    from gguf.quants import dequantize

    r = gguf.GGUFReader(str(path))
    tensors, rms = [], {}
    # token_embd has RMS 1, or 2/sqrt(hidden) when it doubles as the LM head.
    tied = all(t.name != "output.weight" for t in r.tensors)
    for t in r.tensors:
        dims = [int(d) for d in t.shape]
        tensors.append(dict(name=t.name, dims=dims, type=t.tensor_type.name))
        is_matrix = len(dims) >= 2 and "gate_inp" not in t.name
        if is_matrix:
            x = dequantize(t.data, t.tensor_type).astype(np.float64)
            target = 1.0 / np.sqrt(dims[0])
            if t.name == "token_embd.weight":
                target = 2.0 * target if tied else 1.0
            ratio = float(np.sqrt(np.mean(x * x)) / target)
            if not np.isfinite(x).all():
                raise SystemExit(f"{path}: {t.name} dequantises to non-finite values")
            lo, hi = rms.get(t.tensor_type.name, (ratio, ratio))
            rms[t.tensor_type.name] = (min(lo, ratio), max(hi, ratio))
    metadata = {}
    for k, f in r.fields.items():
        if k.startswith("GGUF.") or k.startswith("tokenizer.") or k == "strata.synth.spec":
            continue
        v = f.contents()
        if isinstance(v, list):
            continue
        metadata[k] = v
    for name, (lo, hi) in rms.items():
        if not (0.9 < lo and hi < 1.1):
            raise SystemExit(f"{path}: {name} weights have RMS/target {lo:.3f}..{hi:.3f}")
    return tensors, metadata, {k: [round(lo, 4), round(hi, 4)] for k, (lo, hi) in sorted(rms.items())}


def synth_golden(llama_cpp, strata: str, out_dir: Path):
    out_dir.mkdir(parents=True, exist_ok=True)
    models = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for shape_name, shape in ARCH_SHAPES.items():
            for quant in QUANTS:
                name = f"{shape_name}-{quant}"
                spec = dict(BASE, **shape, quant=quant)
                spec_path = tmp / f"{name}.json"
                spec_path.write_text(json.dumps(spec))
                gguf_path = tmp / f"{name}.gguf"
                subprocess.run([*strata.split(), "synth", "--spec", str(spec_path), "-o", str(gguf_path)],
                               check=True, stdout=subprocess.DEVNULL)
                tensors, metadata, rms = gguf_summary(gguf_path)
                llm = open_model(llama_cpp, gguf_path)
                logits = eval_logits(llm, SYNTH_TOKENS)
                del llm
                if not np.isfinite(logits).all():
                    raise SystemExit(f"{name}: llama.cpp produced non-finite logits")
                logits_file = f"{name}.f32"
                logits.astype("<f4").tofile(out_dir / logits_file)
                std = float(logits.std())
                print(f"{name}: {gguf_path.stat().st_size} bytes, logits std {std:.3f}, "
                      f"argmax {logits.argmax(-1).tolist()}")
                models.append(dict(
                    name=name,
                    spec=spec,
                    sha256=sha256(gguf_path),
                    file_bytes=gguf_path.stat().st_size,
                    tokens=SYNTH_TOKENS,
                    logits_file=logits_file,
                    logits_shape=list(logits.shape),
                    argmax=logits.argmax(-1).tolist(),
                    logits_std=std,
                    weight_rms_over_target=rms,
                    metadata=metadata,
                    tensors=tensors,
                ))
    return models


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--strata", default=str(ROOT / "target" / "debug" / "strata"),
                    help="program run as `<strata> synth --spec F -o OUT`")
    ap.add_argument("--llama-lib", default="/work/oracle/llama.cpp/build/bin")
    ap.add_argument("--sdist", default="/work/oracle/llama_cpp_python-0.3.36.tar.gz")
    default_model_dir = Path(os.environ.get("STRATA_MODEL_DIR", Path.home() / ".cache" / "strata" / "models"))
    ap.add_argument("--smollm2", default=os.environ.get(
        "STRATA_SMOLLM2", str(default_model_dir / "SmolLM2-135M-Instruct.Q4_1.gguf")))
    ap.add_argument("--skip-smollm2", action="store_true")
    ap.add_argument("--skip-synth", action="store_true")
    args = ap.parse_args()

    llama_cpp = load_llama_cpp(Path(args.sdist), Path(args.llama_lib))
    oracle = dict(
        llama_cpp_python=llama_cpp.__version__,
        llama_lib=args.llama_lib,
        system_info=llama_cpp.llama_print_system_info().decode(),
    )
    OUT.mkdir(parents=True, exist_ok=True)
    if not args.skip_smollm2:
        g = smollm2_golden(llama_cpp, Path(args.smollm2))
        g["oracle"] = oracle
        (OUT / "smollm2.json").write_text(json.dumps(g, indent=1, ensure_ascii=False) + "\n")
    if not args.skip_synth:
        models = synth_golden(llama_cpp, args.strata, OUT / "synth")
        index = dict(oracle=oracle, n_ctx=N_CTX, n_threads=N_THREADS, models=models)
        (OUT / "synth" / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    print(f"tests/golden/models: {total} bytes")


if __name__ == "__main__":
    main()
