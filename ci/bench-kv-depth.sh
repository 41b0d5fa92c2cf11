#!/usr/bin/env bash
# Decode at depth with f16 and int8 K/V (issue 8): strata against llama.cpp on one NVIDIA
# GPU in one command, the same synthetic Qwen3-30B-A3B-shaped Q4_K file (ci/bench-gpu.sh
# writes it), N tokens decoded after D tokens of context. llama.cpp: flash attention on,
# -ctk/-ctv f16 or q8_0; strata: --kv f16 or int8.
#
#   STRATA=target/release/strata LLAMA_BIN=/path/to/llama.cpp/build/bin \
#     ci/bench-kv-depth.sh [MODEL]   (default $MODEL_DIR/qwen3-30b-a3b-shape-Q4_K.gguf)
#
# Env: DEPTHS (default "4096 32768"), KVS (default "f16 int8"), N (default 64), REPS
# (default 1), STRATA_ARGS / LLAMA_ARGS (e.g. an expert cache and --n-cpu-moe for the
# issue's 50% cache; default everything resident: -ngl 99), OUT, LLAMA=0 (strata alone, e.g.
# to re-measure strata after a change; the table then has no ratio). Prints a markdown table.
set -euo pipefail
STRATA=${STRATA:-target/release/strata}
[ "${LLAMA:-1}" = 0 ] || LLAMA_BIN=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp CUDA build/bin}
MODEL_DIR=${MODEL_DIR:-/tmp/strata-bench}
MODEL=${1:-$MODEL_DIR/qwen3-30b-a3b-shape-Q4_K.gguf}
OUT=${OUT:-$MODEL_DIR/out-depth}
DEPTHS=${DEPTHS:-4096 32768}
KVS=${KVS:-f16 int8}
N=${N:-64}
REPS=${REPS:-1}
mkdir -p "$OUT"
[ -f "$MODEL" ] || { echo "no model file $MODEL (ci/bench-gpu.sh synthesises it)" >&2; exit 1; }
max_depth=0
for d in $DEPTHS; do [ "$d" -gt "$max_depth" ] && max_depth=$d; done
for kv in $KVS; do
  case $kv in f16) lt=f16 ;; int8) lt=q8_0 ;; *) echo "unknown K/V type $kv" >&2; exit 1 ;; esac
  for d in $DEPTHS; do
    if [ "${LLAMA:-1}" != 0 ]; then
      echo "== $kv depth $d: llama.cpp" >&2
      # shellcheck disable=SC2086
      "$LLAMA_BIN/llama-bench" -m "$MODEL" -ngl 99 -fa 1 -p 0 -n "$N" -d "$d" -ctk "$lt" -ctv "$lt" \
        -r "$REPS" ${LLAMA_ARGS:-} -o json > "$OUT/llama-$kv-$d.json"
    fi
    echo "== $kv depth $d: strata" >&2
    # shellcheck disable=SC2086
    "$STRATA" bench -m "$MODEL" --backend cuda -p 0 -d "$d" -n "$N" -r "$REPS" --kv "$kv" \
      ${STRATA_ARGS:-} --json > "$OUT/strata-$kv-$d.json"
  done
done
python3 - "$OUT" "$KVS" "$DEPTHS" <<'PY'
import json, sys
out, kvs, depths = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
print("| K/V | depth | llama.cpp tok/s | strata tok/s | ratio |")
print("|---|---:|---:|---:|---:|")
for kv in kvs:
    for d in depths:
        st = json.load(open(f"{out}/strata-{kv}-{d}.json"))["decode_tokens_per_s"]
        name = "int8 (q8_0)" if kv == "int8" else kv
        try:
            llama = json.load(open(f"{out}/llama-{kv}-{d}.json"))
        except FileNotFoundError:  # LLAMA=0
            print(f"| {name} | {d} | - | {st:.1f} | - |")
            continue
        lt = [r["avg_ts"] for r in llama if r["n_gen"] > 0][0]
        print(f"| {name} | {d} | {lt:.1f} | {st:.1f} | {st / lt:.2f}x |")
PY
