#!/usr/bin/env bash
# strata's expert cache + CPU pool against llama.cpp's --n-cpu-moe on one NVIDIA GPU (issue 7):
# the synthetic Qwen3-30B-A3B-shaped Q4_K file (48 layers x 128 experts, 8 active) with
# Zipf-skewed routing (`strata synth --router-skew $SKEW`, default 1.0), at cache sizes of
# 25% and 50% of the 6,144 experts and 0 (all on the CPU pool), against llama.cpp with
# --n-cpu-moe 34 / 22 / 48 (the layers whose experts stay on the CPU). The issue compares
# at equal VRAM: strata holds 648 MiB of prefill staging (two sets of one layer's experts,
# for the layer-by-layer streaming of long prompts) besides its cache, which is what two
# more layers of experts cost llama.cpp, so 36 -> 34 and 24 -> 22 put the two within 5%
# (H200, session 7: 25%: 5699 MiB at 36 vs strata's 6295; 50%: 9581 at 24 vs 10183). The
# 0-cache point keeps all 48 layers' experts on the CPU, as the issue asks. The strata
# cache is filled from a profile recorded with `strata profile` on random prompts.
#
#   STRATA=target/release/strata LLAMA_BIN=/path/to/llama.cpp/build/bin ci/bench-offload.sh
#
# Env: MODEL_DIR (default /tmp/strata-bench), OUT (default $MODEL_DIR/out-offload), REPS
# (default 3), THREADS (CPU threads for both engines, default: physical cores), SKEW,
# CONFIGS (the "slots n-cpu-moe" pairs to run, default "1536:34 3072:22 0:48"), STRATA_ARGS
# (more strata flags, e.g. "--stream-experts auto" or "--pin-file off").
# Each run's peak device memory (nvidia-smi's memory.used polled every 100 ms, less what was
# in use before the run) is reported for both engines: the issue matches them within 5%.
set -euo pipefail
STRATA=${STRATA:-target/release/strata}
LLAMA_BIN=${LLAMA_BIN:?set LLAMA_BIN to llama.cpp CUDA build/bin}
MODEL_DIR=${MODEL_DIR:-/tmp/strata-bench}
OUT=${OUT:-$MODEL_DIR/out-offload}
REPS=${REPS:-3}
SKEW=${SKEW:-1.0}
THREADS=${THREADS:-$(lscpu -p=core | grep -v '^#' | sort -u | wc -l)}
mkdir -p "$MODEL_DIR" "$OUT"
f="$MODEL_DIR/qwen3-30b-a3b-shape-Q4_K-skew$SKEW.gguf"
if [ ! -f "$f" ]; then
  echo "== synthesising $f" >&2
  "$STRATA" synth --arch qwen3moe --layers 48 --hidden 2048 --heads 32 --kv-heads 4 \
    --head-dim 128 --experts 128 --experts-used 8 --expert-ffn 768 --vocab 151936 \
    --quant Q4_K --router-skew "$SKEW" --seed 1 -o "$f" >&2
fi
prompts="$OUT/prompts.txt"
python3 -c "
import random
random.seed(7)
words = 'the of and to in is was for on that with as by at from his her it an are were which this'.split()
for _ in range(16):
    print(' '.join(random.choice(words) for _ in range(200)))
" > "$prompts"
echo "== strata profile" >&2
"$STRATA" profile -m "$f" --backend cuda --raw --prompts "$prompts" -n 32 \
  --cpu-threads "$THREADS" -o "$OUT/profile.json" >&2
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# peak_vram FILE CMD...: runs CMD (stdout/stderr as the caller redirects), writes its peak
# device memory in MiB above the idle level to FILE.
peak_vram() {
  local file=$1; shift
  local idle
  idle=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > "$file.samples" &
  local poller=$!
  local rc=0
  "$@" || rc=$?
  kill "$poller" 2>/dev/null; wait "$poller" 2>/dev/null || true
  sort -n "$file.samples" | tail -1 | awk -v idle="$idle" '{print $1 - idle}' > "$file"
  return $rc
}
CONFIGS=${CONFIGS:-1536:34 3072:22 0:48}
for cfg in $CONFIGS; do
  slots=${cfg%%:*} ncpu=${cfg##*:}
  echo "== strata --expert-cache $slots" >&2
  peak_vram "$OUT/vram-strata-$slots.txt" \
    "$STRATA" bench -m "$f" --backend cuda --expert-cache "$slots" --profile "$OUT/profile.json" \
    --cpu-threads "$THREADS" -p 512 -n 64 -r "$REPS" ${STRATA_ARGS:-} --json \
    > "$OUT/strata-$slots.json" 2> "$OUT/strata-$slots.log"
  grep "expert cache hit rate" "$OUT/strata-$slots.log" | tail -1 >&2 || true
  echo "== llama.cpp --n-cpu-moe $ncpu" >&2
  peak_vram "$OUT/vram-llama-$ncpu.txt" \
    "$LLAMA_BIN/llama-bench" -m "$f" -ngl 99 -fa 1 --n-cpu-moe "$ncpu" -t "$THREADS" \
    -p 512 -n 64 -r "$REPS" -o json > "$OUT/llama-$ncpu.json"
done
python3 - "$OUT" "$CONFIGS" <<'PY'
import json, re, sys
out = sys.argv[1]
configs = [tuple(int(x) for x in c.split(":")) for c in sys.argv[2].split()]
print("| strata cache | llama.cpp --n-cpu-moe | test | llama.cpp tok/s | strata tok/s | ratio | decode hit rate | peak VRAM MiB llama.cpp / strata |")
print("|---:|---:|---|---:|---:|---:|---|---|")
for slots, ncpu in configs:
    s = json.load(open(f"{out}/strata-{slots}.json"))
    l = json.load(open(f"{out}/llama-{ncpu}.json"))
    log = open(f"{out}/strata-{slots}.log").read()
    m = re.findall(r"hit rate ([0-9.]+%)", log)
    hit = m[-1] if m else "?"
    def vram(name):
        try:
            return open(f"{out}/vram-{name}.txt").read().strip()
        except OSError:
            return "?"
    mem = f"{vram(f'llama-{ncpu}')} / {vram(f'strata-{slots}')}"
    def lc(p, n):
        return next((r["avg_ts"] for r in l if r["n_prompt"] == p and r["n_gen"] == n), float("nan"))
    for test, ours, theirs in [("pp512", s["prefill_tokens_per_s"], lc(512, 0)),
                               ("tg64", s["decode_tokens_per_s"], lc(0, 64))]:
        print(f"| {slots} | {ncpu} | {test} | {theirs:.1f} | {ours:.1f} | {ours / theirs:.2f}x | {hit} | {mem} |")
PY
