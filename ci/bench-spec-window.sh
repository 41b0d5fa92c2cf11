#!/usr/bin/env bash
# What a verify window of K+1 positions costs against one decode step (issue 9), K = 1..8:
# `strata bench --spec-window-cost 1,2,...,8` (one process: the model loads once) decodes -n
# tokens greedily one per step, then again in windows of each size whose K drafts replay that
# output (so every draft is accepted, even with random weights), timing each step and window;
# the first capture of each graph is an untimed warm-up. Prints a markdown table. The issue's goal: a 5-position window (K = 4) costs at
# most 1.4x a step on the Qwen3-30B-A3B-shaped file with a cache of half its experts:
#
#   STRATA=target/release/strata BACKEND=cuda EXPERT_CACHE=3072 \
#     ci/bench-spec-window.sh /tmp/strata-bench/qwen3-30b-a3b-shape-Q4_K-skew1.0.gguf
#
# (48 layers x 128 experts = 6,144; ci/bench-offload.sh synthesises that file.)
# Env: STRATA (binary, default target/release/strata), BACKEND (default: strata's choice),
# EXPERT_CACHE (slots; unset: every expert on the device), N (tokens decoded, default 128),
# P (prompt tokens, default 64), REPS (repetitions pooled per K, default 3), KS (default
# "1 2 3 4 5 6 7 8"), EXTRA (more bench flags: --no-graphs, --profile FILE, --cpu-threads N).
set -euo pipefail
model=${1:?usage: ci/bench-spec-window.sh MODEL.gguf}
strata=${STRATA:-target/release/strata}
n=${N:-128}; p=${P:-64}; reps=${REPS:-3}; ks=${KS:-"1 2 3 4 5 6 7 8"}
flags=(-m "$model" -p "$p" -n "$n" -r "$reps" --json)
[ -n "${BACKEND:-}" ] && flags+=(--backend "$BACKEND")
[ -n "${EXPERT_CACHE:-}" ] && flags+=(--expert-cache "$EXPERT_CACHE")
# shellcheck disable=SC2206
[ -n "${EXTRA:-}" ] && flags+=($EXTRA)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
list=$(echo "$ks" | tr -s ' ' ',')
"$strata" bench "${flags[@]}" --spec-window-cost "$list" >"$out/costs.jsonl" 2>"$out/log" ||
  { echo "strata bench --spec-window-cost $list failed:" >&2; tail -5 "$out/log" >&2; exit 1; }
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
rows = [json.loads(l) for l in open(f"{out}/costs.jsonl") if l.strip()]
r = rows[0]
cache = "all experts on the device" if not r["expert_cache"] else "expert cache on"
print(f"{r['model']} ({r['architecture']}), {r['backend']} on {r['device']}, "
      f"graphs {'on' if r['graphs'] else 'off'}, {cache}; prompt {r['prompt_tokens']}, "
      f"{r['decode_tokens']} tokens decoded, {r['repetitions']} repetitions pooled per K\n")
hit = r["expert_cache"]
# Means as the issue asks; the ratios of the medians and of the minimums beside it (a shared
# machine adds outliers; contention only adds time).
head = ("| K | positions | step ms | window ms | ratio | ratio of medians | ratio of minimums "
        "| plain tok/s | window tok/s |")
rule = "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
if hit:
    head += " hit rate steps / windows |"
    rule += "---|"
print(head)
print(rule)
for r in rows:
    line = (f"| {r['spec_window_k']} | {r['window_positions']} | {r['step_ms']:.3f} | {r['window_ms']:.3f} | "
            f"{r['window_step_ratio']:.2f}x | "
            f"{r['window_ms_median'] / r['step_ms_median']:.2f}x | "
            f"{r['window_ms_min'] / r['step_ms_min']:.2f}x | {r['plain_tokens_per_s']:.1f} | "
            f"{r['window_tokens_per_s']:.1f} |")
    if hit:
        line += (f" {100 * r['plain_expert_hit_rate']:.1f}% / "
                 f"{100 * r['window_expert_hit_rate']:.1f}% |")
    print(line)
PY
# The expert cache's statistics (plain steps, then each window size), below the table.
if grep -q "strata bench:" "$out/log"; then
  echo
  grep "strata bench:" "$out/log" | sed 's/^strata bench: /    /'
fi
