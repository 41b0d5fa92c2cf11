#!/usr/bin/env bash
# Speculative decoding on SmolLM2-135M Q4_1, CPU: `--spec 0` against `--spec K` on the same
# prompts, runs alternating (a shared machine drifts), greedy outputs compared byte for byte;
# medians of the runs. Then llama.cpp's own prompt-lookup speculative decoding as anchor
# (llama-server --spec-type ngram-simple; llama-lookup/llama-speculative are not built here)
# on the same prompts, plain and speculative requests alternating.
#   ci/bench-spec.sh          REPS (default 3), K (4), N_1K (tokens for rewrite_1k, 1024),
#                             WORKLOADS (default "rewrite_function repeat_function rewrite_1k"),
#                             LLAMA_BIN (folder of llama-server; LLAMA=0 skips the anchor),
#                             LLAMA_REPS (anchor runs per workload, default REPS),
#                             LLAMA_DRAFT (a draft GGUF: adds llama.cpp's draft-model mode,
#                             --spec-type draft-simple, up to K drafts, to the anchor)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-3}; k=${K:-4}; n1k=${N_1K:-1024}
workloads=${WORKLOADS:-"rewrite_function repeat_function rewrite_1k"}
# STRATA (a built binary: no cargo build), MODEL (no fetch), STRATA_ARGS (e.g. "--backend
# cuda") and LLAMA_ARGS (e.g. "-ngl 99") let the same script run on a GPU machine.
if [ -n "${STRATA:-}" ]; then
  strata=$STRATA
else
  cargo build --release -q -p strata-cli
  strata=${CARGO_TARGET_DIR:-target}/release/strata
fi
model=${MODEL:-$(ci/fetch-models.sh)}
read -r -a strata_args <<<"${STRATA_ARGS:-}"
read -r -a llama_args <<<"${LLAMA_ARGS:-}"
# LLAMA_DRAFT_ARGS: the draft model's placement, e.g. "-ngld 99" on a GPU machine.
read -r -a llama_draft_args <<<"${LLAMA_DRAFT_ARGS:-}"
fixtures=tests/fixtures/spec
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)

# Per workload: strata run flags and tokens to generate (rewrite_function and rewrite_1k are
# chat prompts; repeat_function is raw text the model keeps repeating).
args() {
  case $1 in
    repeat_function) echo "--raw -n 128" ;;
    rewrite_1k) echo "-n $n1k" ;;
    *) echo "-n 128" ;;
  esac
}
div() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.6f\n", a / b }'; }  # no bc on every machine
median() { sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }

printf '| workload | runs | --spec 0 tok/s | --spec %s tok/s | speed-up (per run) | windows | accepted/window | acceptance | row cost |\n' "$k"
printf '|---|---|---|---|---|---|---|---|---|\n'
for w in $workloads; do
  : >"$out/ratios"
  for r in $(seq "$reps"); do
    for s in 0 "$k"; do
      # shellcheck disable=SC2046
      $strata run -m "$model" "${strata_args[@]}" --temp 0 --ignore-eos $(args "$w") --spec "$s" \
        -f "$fixtures/$w.txt" >"$out/$w.$s.$r.txt" 2>"$out/$w.$s.$r.log"
      grep -o 'generated [0-9]* tokens in [0-9.]* s ([0-9.]* tokens/s)' "$out/$w.$s.$r.log" |
        sed 's/.*(\([0-9.]*\) tokens.*/\1/' >"$out/$w.$s.$r.tps"
    done
    cmp -s "$out/$w.0.$r.txt" "$out/$w.$k.$r.txt" ||
      { echo "$w run $r: --spec $k output differs from --spec 0" >&2; exit 1; }
    div "$(cat "$out/$w.$k.$r.tps")" "$(cat "$out/$w.0.$r.tps")" >>"$out/ratios"
  done
  base=$(cat "$out/$w.0."*.tps | median)
  spec=$(cat "$out/$w.$k."*.tps | median)
  ratio=$(median <"$out/ratios")
  per_run=$(xargs printf '%.2f ' <"$out/ratios")
  # A spec statistic over the runs: min-max.
  stat() { grep -ho "$1" "$out/$w.$k."*.log | grep -o '[0-9][0-9.]*' | sort -g | sed -n '1p;$p' |
           paste -sd- -; }
  printf '| %s | %s | %.1f | %.1f | %.2fx (%s) | %s | %s | %s%% | %s |\n' "$w" "$reps" "$base" "$spec" \
    "$ratio" "${per_run% }" "$(stat '[0-9]* windows')" "$(stat '[0-9.]* accepted tokens')" \
    "$(stat '[0-9.]*% (' | tr -d '%(')" "$(stat 'costs [0-9.]*' | sed 's/costs //')"
done

# llama.cpp's anchor: llama-server with and without n-gram drafts (a 3-token match, up to 4
# drafts, the closest to strata's --spec 4), the same prompts (chat ones through the chat
# endpoint), temperature 0, ignore_eos, no prompt cache; tokens/s from its own timings.
llama_bin=${LLAMA_BIN:-/work/oracle/llama.cpp/build/bin}
if [ "${LLAMA:-1}" != 0 ] && [ -x "$llama_bin/llama-server" ]; then
  port=${PORT:-18391}
  serve() {
    "$llama_bin/llama-server" -m "$model" -t "$(nproc)" -c 4096 -np 1 --port "$port" \
      "${llama_args[@]}" "$@" \
      >"$out/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf "localhost:$port/health" >/dev/null && return; sleep 0.5; done
    echo "llama-server did not start" >&2; exit 1
  }
  ask() {  # workload -> predicted tokens/s
    local w=$1 n=128 body
    [ "$w" = rewrite_1k ] && n=$n1k
    if [ "$w" = repeat_function ]; then
      body=$(python3 -c 'import json,sys; print(json.dumps({"prompt": open(sys.argv[1]).read(), "n_predict": int(sys.argv[2]), "temperature": 0, "ignore_eos": True, "cache_prompt": False}))' "$fixtures/$w.txt" "$n")
      curl -sf "localhost:$port/completion" -d "$body"
    else
      body=$(python3 -c 'import json,sys; print(json.dumps({"messages": [{"role": "user", "content": open(sys.argv[1]).read()}], "max_tokens": int(sys.argv[2]), "temperature": 0, "ignore_eos": True, "cache_prompt": False}))' "$fixtures/$w.txt" "$n")
      curl -sf "localhost:$port/v1/chat/completions" -d "$body"
    fi | python3 -c 'import json,sys; t=json.load(sys.stdin)["timings"]; print(round(t["predicted_per_second"],2), t.get("draft_n",0), t.get("draft_n_accepted",0))'
  }
  draft=${LLAMA_DRAFT:-}
  printf '\nllama.cpp anchor (llama-server, ngram-simple size-n 3 size-m %s%s):\n\n' "$k" \
    "${draft:+; draft-model mode: draft-simple, -md $(basename "$draft"), up to $k drafts}"
  if [ -n "$draft" ]; then
    printf '| workload | plain tok/s | ngram-simple tok/s | speed-up | drafts accepted | draft-model tok/s | speed-up | drafts accepted |\n|---|---|---|---|---|---|---|---|\n'
  else
    printf '| workload | plain tok/s | ngram-simple tok/s | speed-up | drafts accepted |\n|---|---|---|---|---|\n'
  fi
  for w in $workloads; do
    : >"$out/l.plain"; : >"$out/l.spec"; : >"$out/l.draft"
    for r in $(seq "${LLAMA_REPS:-$reps}"); do
      serve; ask "$w" >>"$out/l.plain"; kill "$pid"; wait "$pid" 2>/dev/null || true
      serve --spec-type ngram-simple --spec-ngram-simple-size-n 3 --spec-ngram-simple-size-m "$k"
      ask "$w" >>"$out/l.spec"; kill "$pid"; wait "$pid" 2>/dev/null || true
      if [ -n "$draft" ]; then
        serve --spec-type draft-simple -md "$draft" --spec-draft-n-max "$k" "${llama_draft_args[@]}"
        ask "$w" >>"$out/l.draft"; kill "$pid"; wait "$pid" 2>/dev/null || true
      fi
    done
    lp=$(cut -d' ' -f1 "$out/l.plain" | median); ls=$(cut -d' ' -f1 "$out/l.spec" | median)
    row=$(printf '| %s | %s | %s | %.2fx | %s |' "$w" "$lp" "$ls" "$(div "$ls" "$lp")" \
      "$(awk '{d+=$2; a+=$3} END {print a "/" d}' "$out/l.spec")")
    if [ -n "$draft" ]; then
      ld=$(cut -d' ' -f1 "$out/l.draft" | median)
      row+=$(printf ' %s | %.2fx | %s |' "$ld" "$(div "$ld" "$lp")" \
        "$(awk '{d+=$2; a+=$3} END {print a "/" d}' "$out/l.draft")")
    fi
    echo "$row"
  done
fi
printf '\n(%s threads; load average before: %s, after: %s)\n' "$(nproc)" "$load_before" \
  "$(cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || true)"
