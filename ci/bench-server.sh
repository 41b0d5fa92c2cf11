#!/usr/bin/env bash
# The server benchmark (issue 10): strata serve against llama.cpp's llama-server on the same
# model and machine, both with 4 slots and an 8192-token context per slot.
#  1. Load: 1, 4 and 16 concurrent streaming chat clients (distinct prompts, 32 tokens each,
#     ignore_eos, greedy): median and worst time to first token, total tokens/s.
#  2. Follow-up turn of a ~7.5K-token conversation after other requests took every slot:
#     time to first token resuming the parked conversation vs reading it again
#     (`cache_prompt: false`); for strata also with parking on disk only (its re-read is the
#     same work as with host parking, so it is not repeated).
#
#   ci/bench-server.sh [MODEL.gguf]
#   env: STRATA_BIN (default: target/release/strata, built if missing), LLAMA_BIN (default:
#        /work/oracle/llama.cpp/build/bin/llama-server), THREADS (default 2), PARTS (default
#        "load llama-followup strata-host strata-disk": which measurements to run)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-${STRATA_SMOLLM2:-${STRATA_MODEL_DIR:-$HOME/.cache/strata/models}/SmolLM2-135M-Instruct.Q4_1.gguf}}"
LLAMA_BIN="${LLAMA_BIN:-/work/oracle/llama.cpp/build/bin/llama-server}"
THREADS="${THREADS:-2}"
if [ -z "${STRATA_BIN:-}" ]; then
  cargo build -q --release -p strata-cli
  STRATA_BIN="${CARGO_TARGET_DIR:-target}/release/strata"
fi
[ -f "$MODEL" ] || { echo "no model at $MODEL" >&2; exit 1; }
[ -x "$LLAMA_BIN" ] || { echo "no llama-server at $LLAMA_BIN (set LLAMA_BIN)" >&2; exit 1; }
WORK="$(mktemp -d)"
PIDS=()
cleanup() {
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_healthy() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $1 never became healthy" >&2; return 1
}

cat > "$WORK/client.py" <<'EOF'
"""Streaming chat clients against an OpenAI-compatible server (standard library only)."""
import http.client, json, os, statistics, sys, threading, time

port, name, phase = int(sys.argv[1]), sys.argv[2], sys.argv[3]
COLORS = ["red", "blue", "green", "yellow", "purple", "orange", "black", "white"]
ANIMALS = ["fox", "owl", "whale", "horse", "otter", "crane", "lynx", "heron", "bison", "gecko"]
PLACES = ["river", "market", "harbour", "forest", "library", "station", "garden", "quarry"]


def chat(messages, max_tokens, **extra):
    """One streamed chat: (time to first token, completion tokens, text, prompt tokens)."""
    body = {"model": "smollm2", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, **extra}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200, (r.status, r.read()[:300])
    ttft, pieces, usage = None, [], None
    for line in r:
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        obj = json.loads(data)
        if obj.get("usage"):
            usage = obj["usage"]
        for ch in obj.get("choices", []):
            c = (ch.get("delta") or {}).get("content")
            if c:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                pieces.append(c)
    conn.close()
    n = usage["completion_tokens"] if usage else len(pieces)
    p = usage["prompt_tokens"] if usage else 0
    return ttft, n, "".join(pieces), p


def load(n_clients):
    results = [None] * n_clients

    def run(i):
        msg = [{"role": "user", "content": f"Write a short story about a {COLORS[i % 8]} {ANIMALS[i % 10]} "
                                           f"number {i} who lives near a {PLACES[i % 8]}."}]
        results[i] = chat(msg, 32, ignore_eos=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n_clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    ttfts = [r[0] for r in results]
    tokens = sum(r[1] for r in results)
    print(f"| {name} | {n_clients} | {statistics.median(ttfts) * 1000:.0f} | {max(ttfts) * 1000:.0f} | "
          f"{tokens / wall:.1f} |", flush=True)


def followup(label):
    lines = [f"Entry {i}: the {COLORS[i % 8]} {ANIMALS[i % 10]} walked to the {PLACES[(i * 3) % 8]} and counted "
             f"{i * 7 + 3} stones." for i in range(325)]
    turn1 = [{"role": "system", "content": "You answer questions about the log below."},
             {"role": "user", "content": "\n".join(lines) + "\n\nWhich animal walked to the quarry first?"}]
    _, _, answer, p1 = chat(turn1, 32)
    # Four other requests at once take every slot, so the conversation is no longer resident
    # and must come back from where it was parked.
    others = [threading.Thread(target=chat, args=([{"role": "user", "content": f"Unrelated question {i}: "
                                                    f"name a colour."}], 16), kwargs={"ignore_eos": True})
              for i in range(4)]
    for t in others:
        t.start()
    for t in others:
        t.join()
    turn2 = turn1 + [{"role": "assistant", "content": answer},
                     {"role": "user", "content": "And which one counted the most stones?"}]
    warm, _, warm_text, p2 = chat(turn2, 8)
    if os.environ.get("REREAD", "1") == "0":
        # The re-read is the same work as in the run before; not repeated (minutes on a CPU).
        print(f"| {name} | {label} | {p1} / {p2} | {warm * 1000:.0f} | (as above) | | reply {warm_text!r} |",
              flush=True)
        return
    cold, _, cold_text, _ = chat(turn2, 8, cache_prompt=False)
    same = "same reply" if warm_text == cold_text else "REPLIES DIFFER"
    print(f"| {name} | {label} | {p1} / {p2} | {warm * 1000:.0f} | {cold * 1000:.0f} | {cold / warm:.1f}x | {same} |",
          flush=True)


chat([{"role": "user", "content": "Warm up."}], 4)
if phase == "load":
    for n in (1, 4, 16):
        load(n)
else:
    followup(phase)
EOF

run_strata() {  # label, extra flags...; sets PORT
  local label="$1"; shift
  PORT="$(free_port)"
  "$STRATA_BIN" serve -m "$MODEL" --backend cpu --port "$PORT" --ctx 8192 --parallel 4 --alias smollm2 \
    "$@" >"$WORK/strata-$label.out" 2>"$WORK/strata-$label.log" &
  PIDS+=($!)
  wait_healthy "$PORT"
}
stop_last() { local p="${PIDS[-1]}"; kill -TERM "$p"; wait "$p" || true; unset 'PIDS[-1]'; }

echo "model: $MODEL"
echo "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "strata: $STRATA_BIN (CPU backend, STRATA_CPU_THREADS=${STRATA_CPU_THREADS:-default})"
echo "llama-server: $LLAMA_BIN -t $THREADS -np 4 -c 32768 (8192 per slot)"
echo
want() { [[ " ${PARTS:-load llama-followup strata-host strata-disk} " == *" $1 "* ]]; }
if want load; then
  echo "| server | clients | median TTFT ms | worst TTFT ms | total tokens/s |"
  echo "|---|---:|---:|---:|---:|"
  run_strata load
  python3 "$WORK/client.py" "$PORT" strata load
  stop_last
fi
if want load || want llama-followup; then
  PORT="$(free_port)"
  "$LLAMA_BIN" -m "$MODEL" --port "$PORT" -t "$THREADS" -np 4 -c 32768 >"$WORK/llama.log" 2>&1 &
  PIDS+=($!)
  wait_healthy "$PORT"
  want load && python3 "$WORK/client.py" "$PORT" llama-server load
fi
echo
echo "| server | follow-up resumes from | prompt tokens turn 1 / 2 | TTFT resumed ms | TTFT re-read ms | speed-up | check |"
echo "|---|---|---:|---:|---:|---:|---|"
if want load || want llama-followup; then
  want llama-followup && python3 "$WORK/client.py" "$PORT" llama-server "its prompt cache"
  stop_last
fi
if want strata-host; then
  run_strata host
  python3 "$WORK/client.py" "$PORT" strata "parked in host RAM"
  grep -h "resumed a conversation (host)" "$WORK"/strata-host.log | tail -1 >&2 || true
  stop_last
fi
if want strata-disk; then
  mkdir -p "$WORK/park"
  run_strata disk --park-mib 0 --park-dir "$WORK/park"
  REREAD=0 python3 "$WORK/client.py" "$PORT" strata "parked on disk"
  grep -h "resumed a conversation (disk)" "$WORK"/strata-disk.log | tail -1 >&2 || true
  stop_last
fi
