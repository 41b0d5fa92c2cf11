#!/usr/bin/env bash
# strata against llama.cpp on one NVIDIA GPU, everything resident (issue 6), in one command:
# the same synthetic Qwen3-30B-A3B-shaped file (48 layers, hidden 2048, 32 query / 4 K/V
# heads of 128, 128 experts, 8 active, expert FFN 768, vocab 151936) for both engines,
# prefill pp512 and pp4096, decode tg128, flash attention on for llama.cpp, -ngl 99.
#
#   STRATA=target/release/strata LLAMA_BIN=/path/to/llama.cpp/build/bin \
#     ci/bench-gpu.sh [QUANT ...]          (default: Q4_K IQ2_XS)
#
# Env: MODEL_DIR (where the synthetic files are written, default /tmp/strata-bench),
# OUT (JSON outputs, default $MODEL_DIR/out), PROFILE=1 (also an nsys per-kernel summary of
# 32 replayed strata decode steps), REPS (default 3). Prints a markdown table.
set -euo pipefail
STRATA=${STRATA:-target/release/strata}
LLAMA_BIN=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp CUDA build/bin}
MODEL_DIR=${MODEL_DIR:-/tmp/strata-bench}
OUT=${OUT:-$MODEL_DIR/out}
REPS=${REPS:-3}
mkdir -p "$MODEL_DIR" "$OUT"
quants=("$@")
[ ${#quants[@]} -eq 0 ] && quants=(Q4_K IQ2_XS)

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
rows=()
for q in "${quants[@]}"; do
  f="$MODEL_DIR/qwen3-30b-a3b-shape-$q.gguf"
  if [ ! -f "$f" ]; then
    echo "== synthesising $f" >&2
    "$STRATA" synth --arch qwen3moe --layers 48 --hidden 2048 --heads 32 --kv-heads 4 \
      --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 \
      --quant "$q" --seed 1 -o "$f" >&2
  fi
  echo "== strata $q" >&2
  "$STRATA" bench -m "$f" --backend cuda -p 512 -n 128 -r "$REPS" --roofline --json \
    > "$OUT/strata-$q-512.json"
  "$STRATA" bench -m "$f" --backend cuda -p 4096 -n 0 -r "$REPS" --json > "$OUT/strata-$q-4096.json"
  echo "== llama.cpp $q" >&2
  "$LLAMA_BIN/llama-bench" -m "$f" -ngl 99 -fa 1 -p 512,4096 -n 128 -r "$REPS" -o json \
    > "$OUT/llama-$q.json"
  if [ "${PROFILE:-0}" = 1 ] && command -v nsys >/dev/null; then
    echo "== nsys profile of strata decode, $q" >&2
    nsys profile -o "$OUT/strata-$q" --force-overwrite true -t cuda \
      "$STRATA" bench -m "$f" --backend cuda -p 0 -n 32 --json > /dev/null 2>&1 || true
    nsys stats --report cuda_gpu_kern_sum --format csv "$OUT/strata-$q.nsys-rep" \
      > "$OUT/strata-$q-kernels.csv" 2>/dev/null || true
  fi
  rows+=("$q")
done

python3 - "$OUT" "${rows[@]}" <<'EOF'
import json, sys
out, quants = sys.argv[1], sys.argv[2:]
print("| file | test | llama.cpp tok/s | strata tok/s | ratio |")
print("|---|---|---:|---:|---:|")
for q in quants:
    s512 = json.load(open(f"{out}/strata-{q}-512.json"))
    s4096 = json.load(open(f"{out}/strata-{q}-4096.json"))
    llama = json.load(open(f"{out}/llama-{q}.json"))
    def lc(p, n):
        for r in llama:
            if r["n_prompt"] == p and r["n_gen"] == n:
                return r["avg_ts"]
        return float("nan")
    for test, ours, theirs in [
        ("pp512", s512["prefill_tokens_per_s"], lc(512, 0)),
        ("pp4096", s4096["prefill_tokens_per_s"], lc(4096, 0)),
        ("tg128", s512["decode_tokens_per_s"], lc(0, 128)),
    ]:
        print(f"| {q} | {test} | {theirs:.1f} | {ours:.1f} | {ours / theirs:.2f}x |")
    bw = s512.get("device_copy_bytes_per_s")
    wb = s512["weight_bytes_per_token"]
    if bw:
        for name, tg in [("strata", s512["decode_tokens_per_s"]), ("llama.cpp", lc(0, 128))]:
            print(f"| {q} | {name} decode roofline | {wb / 1e9:.3f} GB/token at "
                  f"{bw / 1e9:.0f} GB/s copy bandwidth | {100 * tg * wb / bw:.1f}% | |")
EOF
