#!/usr/bin/env bash
# Regenerates tests/golden/perplexity/smollm2.json: llama-perplexity's running perplexity
# after each chunk of tests/golden/perplexity/text.txt on SmolLM2-135M-Instruct Q4_1, at
# the chunk sizes the tests use, with an f16 K/V and without flash attention (the
# attention strata's CPU backend reproduces bit for bit), one sequence per batch (-b = -c).
# For reference it also records the q8_0-K/V values (-ctk/-ctv q8_0 need flash attention
# in llama.cpp) and the f16 ones with flash attention.
#
#   tools/gen_perplexity_golden.sh [LLAMA_BIN_DIR] [MODEL]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-/work/oracle/llama.cpp/build/bin}
model=${2:-${STRATA_SMOLLM2:-${STRATA_MODEL_DIR:-$HOME/.cache/strata/models}/SmolLM2-135M-Instruct.Q4_1.gguf}}
text=$root/tests/golden/perplexity/text.txt
out=$root/tests/golden/perplexity/smollm2.json

# Prints the running values "[1]x,[2]y,..." of one llama-perplexity run as a JSON list.
running() {
    "$bin/llama-perplexity" -m "$model" -f "$text" -t 2 --no-warmup "$@" 2>&1 |
        grep -o '\[[0-9]*\][0-9.]*' | sed 's/.*\]//' | paste -sd, | sed 's/^/[/; s/$/]/'
}

{
    echo '{'
    echo "  \"model\": \"$(basename "$model")\","
    echo "  \"text\": \"text.txt\","
    echo "  \"llama_cpp\": \"$("$bin/llama-perplexity" --version 2>&1 | grep -m1 '^version' || echo unknown)\","
    first=1
    for ctx in 128 256; do
        [ $first = 1 ] || echo ','
        first=0
        printf '  "ctx%s": {\n' "$ctx"
        printf '    "f16": %s,\n' "$(running -c $ctx -b $ctx -fa off)"
        printf '    "f16_flash_attn": %s,\n' "$(running -c $ctx -b $ctx -fa on)"
        printf '    "q8_0_flash_attn": %s\n' "$(running -c $ctx -b $ctx -fa on -ctk q8_0 -ctv q8_0)"
        printf '  }'
    done
    echo
    echo '}'
} > "$out"
cat "$out"
