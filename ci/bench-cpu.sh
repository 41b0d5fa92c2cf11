#!/usr/bin/env bash
# CPU inference speed, strata against llama.cpp's llama-bench in the same run, same machine,
# all cores: SmolLM2-135M Q4_1 and a synthetic qwen3moe Q4_K file. Also strata's peak RSS
# for a prefill + decode run against the issue's budget (model file + f16 K/V + 10%).
#   ci/bench-cpu.sh                 (LLAMA_BIN=folder of llama-bench, else ci/llama-cpp.sh builds it)
#   THREADS, PP, TG, REPS (default: nproc, 512, 128, 2)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-$(nproc)}
pp=${PP:-512}; tg=${TG:-128}; reps=${REPS:-2}
llama_bin=${LLAMA_BIN:-$(ci/llama-cpp.sh)}
cargo build --release -q -p strata-cli
strata=${CARGO_TARGET_DIR:-target}/release/strata
smollm2=$(ci/fetch-models.sh)
moe=${TMPDIR:-/tmp}/strata-bench-qwen3moe-q4k.gguf
[ -s "$moe" ] || $strata synth --arch qwen3moe --layers 8 --hidden 1024 --heads 16 --kv-heads 4 \
  --experts 32 --experts-used 4 --expert-ffn 512 --quant Q4_K --seed 7 -o "$moe" >&2
json() { python3 -c "import json,sys; print($1)" "$2"; }
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)
printf '| model | engine | pp%s tok/s | tg%s tok/s | peak RSS MB (budget) |\n|---|---|---|---|---|\n' "$pp" "$tg"
for m in "$smollm2" "$moe"; do
  name=$(basename "$m")
  l=$("$llama_bin/llama-bench" -m "$m" -p "$pp" -n "$tg" -t "$threads" -r "$reps" -o json 2>/dev/null)
  lpp=$(json 'round([x["avg_ts"] for x in json.loads(sys.argv[1]) if x["n_prompt"]>0][0],1)' "$l")
  ltg=$(json 'round([x["avg_ts"] for x in json.loads(sys.argv[1]) if x["n_gen"]>0][0],1)' "$l")
  # As llama-bench measures: prefill of pp tokens, and decode of tg tokens from an empty
  # context, as two runs (one strata bench run would decode after its prompt).
  sp=$(STRATA_CPU_THREADS=$threads $strata bench -m "$m" -p "$pp" -n 0 -r "$reps" --json 2>/dev/null)
  sg=$(STRATA_CPU_THREADS=$threads $strata bench -m "$m" -p 0 -n "$tg" -r "$reps" --json 2>/dev/null)
  spp=$(json 'round(json.loads(sys.argv[1])["prefill_tokens_per_s"],1)' "$sp")
  stg=$(json 'round(json.loads(sys.argv[1])["decode_tokens_per_s"],1)' "$sg")
  # Peak RSS of one run doing both (its context holds pp + tg positions).
  rss_log=$(mktemp)
  STRATA_CPU_THREADS=$threads /usr/bin/time -f '%M' -o "$rss_log" \
    $strata bench -m "$m" -p "$pp" -n "$tg" -r 1 --json >/dev/null 2>&1
  rss_kib=$(tail -n 1 "$rss_log"); rm -f "$rss_log"
  # %M is in KiB (1024 bytes) and the budget in MB (10^6 bytes): one unit for both.
  rss_mb=$(python3 -c "print(round($rss_kib * 1024 / 1e6, 1))")
  # Budget: the file, f16 K and V of every layer at the bench's context (pp + tg), +10%
  # (shape from `strata info`; head size = embedding / heads, as in both bench models).
  budget=$($strata info "$m" 2>/dev/null | python3 -c '
import os, re, sys
info = dict(re.split(r"\s{2,}", l.strip(), maxsplit=1) for l in sys.stdin if re.match(r"^\S.*\s{2,}\S", l))
n = lambda k: int(info[k].split()[0])
kv = n("layers") * 2 * int(sys.argv[2]) * n("kv heads") * n("embedding") // n("heads") * 2
print(round((os.path.getsize(sys.argv[1]) + kv) * 1.1 / 1e6, 1))' "$m" "$((pp + tg))")
  printf '| %s | llama.cpp | %s | %s | |\n' "$name" "$lpp" "$ltg"
  printf '| %s | strata | %s (%.2fx) | %s (%.2fx) | %s (%s) |\n' "$name" \
    "$spp" "$(python3 -c "print($spp/$lpp)")" "$stg" "$(python3 -c "print($stg/$ltg)")" \
    "$rss_mb" "$budget"
done
# Other processes on the same cores change both engines' figures (llama.cpp's OpenMP threads
# most): say how busy the machine was.
printf '\n(%s threads; load average before: %s, after: %s)\n' "$threads" "$load_before" \
  "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)"
