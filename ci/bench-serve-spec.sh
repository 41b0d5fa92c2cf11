#!/usr/bin/env bash
# Speculative decoding through `strata serve` (issue 9), CPU: two servers on SmolLM2-135M
# Q4_1, `--spec 0` and `--spec K`, one slot each, get the same greedy chat request
# (tests/fixtures/spec/rewrite_1k.txt as the user message, max_tokens N, cache_prompt false so
# every run reads the prompt) in turn, REPS times each (only one server works at a time).
# Answers are compared byte for byte. Per run: end-to-end tokens/s (completion tokens over
# the request's wall time, prefill included) and decode tokens/s with the request's windows
# and acceptance (the server's end-of-request log line).
#   ci/bench-serve-spec.sh      env: REPS (default 3), K (4), N (512), STRATA_BIN (default:
#                               target/release/strata, built), MODEL (default: fetched)
set -euo pipefail
cd "$(dirname "$0")/.."
reps=${REPS:-3}; k=${K:-4}; n=${N:-512}
if [ -z "${STRATA_BIN:-}" ]; then
  cargo build -q --release -p strata-cli
  STRATA_BIN="${CARGO_TARGET_DIR:-target}/release/strata"
fi
model=${MODEL:-$(ci/fetch-models.sh)}
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
declare -A port
for s in 0 "$k"; do
  port[$s]=$(free_port)
  "$STRATA_BIN" serve -m "$model" --backend cpu --port "${port[$s]}" --parallel 1 --alias smollm2 --spec "$s" \
    2>"$work/serve.$s.log" &
  pids+=($!)
done
for s in 0 "$k"; do
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:${port[$s]}/health" >/dev/null 2>&1 && break
    sleep 0.5
  done
done
for r in $(seq "$reps"); do
  for s in 0 "$k"; do
    python3 - "${port[$s]}" "$n" tests/fixtures/spec/rewrite_1k.txt "$work/out.$s.$r.txt" <<'EOF'
import json, sys, time, urllib.request
port, n, prompt, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
body = {"model": "smollm2", "messages": [{"role": "user", "content": open(prompt).read()}],
        "temperature": 0, "max_tokens": n, "cache_prompt": False}
req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions",
                             json.dumps(body).encode(), {"Content-Type": "application/json"})
t = time.perf_counter()
v = json.load(urllib.request.urlopen(req))
dt = time.perf_counter() - t
open(out, "w").write(v["choices"][0]["message"]["content"])
u = v["usage"]
print(f"{u['completion_tokens']} tokens in {dt:.2f} s: {u['completion_tokens'] / dt:.1f} tokens/s end to end", end="")
EOF
    echo " | --spec $s run $r | $(grep 'request done' "$work/serve.$s.log" | tail -1 | sed 's/.*request done: //')"
  done
  cmp -s "$work/out.0.$r.txt" "$work/out.$k.$r.txt" ||
    { echo "run $r: --spec $k answer differs from --spec 0" >&2; exit 1; }
done
echo "answers identical; load after: $(cut -d' ' -f1-3 /proc/loadavg)"
