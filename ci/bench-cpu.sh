#!/usr/bin/env bash
# CPU inference speed, strata against llama.cpp's llama-bench in the same run, same machine,
# all cores: SmolLM2-135M Q4_1 and a synthetic qwen3moe Q4_K file.
#   ci/bench-cpu.sh                 (LLAMA_BIN=folder of llama-bench, else ci/llama-cpp.sh builds it)
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${THREADS:-$(nproc)}
pp=${PP:-512}; tg=${TG:-128}
llama_bin=${LLAMA_BIN:-$(ci/llama-cpp.sh)}
cargo build --release -q -p strata-cli
strata=${CARGO_TARGET_DIR:-target}/release/strata
smollm2=$(ci/fetch-models.sh)
moe=${TMPDIR:-/tmp}/strata-bench-qwen3moe-q4k.gguf
[ -s "$moe" ] || $strata synth --arch qwen3moe --layers 8 --hidden 1024 --heads 16 --kv-heads 4 \
  --experts 32 --experts-used 4 --expert-ffn 512 --quant Q4_K --seed 7 -o "$moe" >&2
printf '| model | engine | pp%s tok/s | tg%s tok/s |\n|---|---|---|---|\n' "$pp" "$tg"
for m in "$smollm2" "$moe"; do
  name=$(basename "$m")
  l=$("$llama_bin/llama-bench" -m "$m" -p "$pp" -n "$tg" -t "$threads" -r 2 -o json 2>/dev/null)
  lpp=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round([x["avg_ts"] for x in d if x["n_prompt"]>0][0],1))' "$l")
  ltg=$(python3 -c 'import json,sys; d=json.loads(sys.argv[1]); print(round([x["avg_ts"] for x in d if x["n_gen"]>0][0],1))' "$l")
  s=$(STRATA_CPU_THREADS=$threads $strata bench -m "$m" -p "$pp" -n "$tg" -r 2 --json 2>/dev/null)
  spp=$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["prefill_tokens_per_s"],1))' "$s")
  stg=$(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["decode_tokens_per_s"],1))' "$s")
  printf '| %s | llama.cpp | %s | %s |\n' "$name" "$lpp" "$ltg"
  printf '| %s | strata | %s (%.2fx) | %s (%.2fx) |\n' "$name" "$spp" "$(python3 -c "print($spp/$lpp)")" "$stg" "$(python3 -c "print($stg/$ltg)")"
done
