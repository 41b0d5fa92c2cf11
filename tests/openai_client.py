#!/usr/bin/env python3
"""The official `openai` Python client (pinned: pip install openai==3.51.0) against a
running `strata serve`: the issue's oracle for the wire format. Exits non-zero on the
first mismatch.

    strata serve -m SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 --parallel 2 &
    python3 tests/openai_client.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY]

or let it start the server on a free port (parking on disk only, so a follow-up must come
back from a file), run the checks, stop it with SIGTERM and check that it exits 0 and
leaves no parked file behind (as ci/test.sh does):

    python3 tests/openai_client.py --serve target/debug/strata --model MODEL.gguf

With --serve, the greedy chat answer is also compared with `strata run`'s for the same
messages.
"""

import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

import openai

SYSTEM = "You are a helpful assistant."
QUESTION = "What is the capital of France?"
MAX_TOKENS = 16
CTX = 1024
PARALLEL = 2


def start_server(binary: str, model: str, api_key: str, backend: str, park_dir: str):
    """`strata serve` on a free port; returns (process, base url, log lines) once /health
    is 200."""
    cmd = [binary, "serve", "-m", model, "--backend", backend, "--port", "0", "--ctx", str(CTX),
           "--api-key", api_key, "--parallel", str(PARALLEL), "--park-mib", "0", "--park-dir", park_dir]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    base = None
    deadline = time.time() + 300
    while base is None and time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            raise RuntimeError(f"strata serve exited early ({proc.wait()})")
        sys.stderr.write(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            base = m.group(1)
    if base is None:
        raise RuntimeError("strata serve did not say where it listens")

    def drain():  # keep reading its log so it never blocks on a full pipe
        for line in proc.stderr:
            log.append(line)
            sys.stderr.write(line)

    threading.Thread(target=drain, daemon=True).start()
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, base + "/v1", log
        except Exception:
            time.sleep(0.5)
    raise RuntimeError("strata serve never became healthy")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--serve", help="a strata binary to start (with --model) for the checks")
    ap.add_argument("--model", help="the GGUF model for --serve")
    ap.add_argument("--backend", default="cpu", help="the backend for --serve")
    args = ap.parse_args()
    args.log = None
    args.park_dir = None
    if not args.serve:
        check(args)
        return 0
    if args.api_key == "none":
        args.api_key = "ci-key"
    with tempfile.TemporaryDirectory(prefix="strata-park-") as park_dir:
        args.park_dir = park_dir
        proc, args.base_url, args.log = start_server(args.serve, args.model, args.api_key, args.backend, park_dir)
        try:
            check(args)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
        assert code == 0, f"strata serve exited {code} after SIGTERM"
        left = os.listdir(park_dir)
        assert not left, f"parked files left after shutdown: {left}"
    print("strata serve stopped cleanly on SIGTERM and removed its parked files")
    return 0


def metrics(args) -> dict:
    req = urllib.request.Request(args.base_url.removesuffix("/v1") + "/metrics",
                                 headers={"Authorization": f"Bearer {args.api_key}"})
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.split()
            out[name] = float(value)
    return out


def strata_run(args) -> str:
    """`strata run`'s greedy answer to the same messages: the CLI's own path through the
    template, tokenizer and engine."""
    cmd = [args.serve, "run", "-m", args.model, "--backend", args.backend, "--ctx", str(CTX),
           "--temp", "0", "-n", str(MAX_TOKENS), "--system", SYSTEM, "-p", QUESTION]
    return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout


def check(args) -> None:
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=600)

    models = client.models.list()
    names = [m.id for m in models.data]
    assert len(names) == 1, names
    model = names[0]

    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion", whole
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    assert whole.choices[0].logprobs is None
    if args.serve:
        cli = strata_run(args)
        assert cli == text, f"strata run said {cli!r}, the server {text!r}"
        print("chat: greedy answer equals `strata run`'s")

    check_streaming(client, model, messages, whole)
    check_logprobs(client, model, messages, whole)
    check_limits_and_stops(client, model, messages, whole)
    check_seeds(client, model, messages)
    check_completions(client, model)
    check_resume(args, client, model, messages, whole)
    check_errors(args, client, model, messages)
    check_load(args, model, messages, whole)
    print(f"openai client: all checks passed against {args.base_url} ({model})")


def check_streaming(client, model, messages, whole) -> None:
    pieces, usage, finish, chunks = [], None, None, 0
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        chunks += 1
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    text = whole.choices[0].message.content
    assert "".join(pieces) == text, ("".join(pieces), text)
    assert len(pieces) > 1, "not streamed piece by piece"
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    print(f"streaming: {len(pieces)} deltas add up to the non-streamed answer")


def check_logprobs(client, model, messages, whole) -> None:
    text = whole.choices[0].message.content
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8,
                                       logprobs=True, top_logprobs=3)
    got = r.choices[0].message.content
    assert text.startswith(got), (got, text)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
    assert "".join(e.token for e in content) == got
    for e in content:
        assert e.logprob <= 0.0
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        top = e.top_logprobs
        assert len(top) == 3
        assert all(top[i].logprob >= top[i + 1].logprob for i in range(2))
        # Greedy: the chosen token is the most likely one.
        assert top[0].token == e.token and abs(top[0].logprob - e.logprob) < 1e-6, (e, top)
    # Streamed: the same entries, spread over the chunks.
    streamed = []
    for chunk in client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=8,
                                                logprobs=True, top_logprobs=3, stream=True):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    print("logprobs: chat entries consistent (greedy token is the top one), streamed equal")


def check_limits_and_stops(client, model, messages, whole) -> None:
    text = whole.choices[0].message.content
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_completion_tokens=4)
    assert r.usage.completion_tokens == 4 and r.choices[0].finish_reason == "length", r
    assert text.startswith(r.choices[0].message.content)
    words = text.split()
    assert len(words) >= 3, text
    stop = words[2]
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=MAX_TOKENS,
                                       stop=[stop, "\u00a7never\u00a7"])
    assert r.choices[0].message.content == text[:text.index(stop)], (r.choices[0].message.content, stop, text)
    assert r.choices[0].finish_reason == "stop"
    print(f"max_completion_tokens and stop strings ({stop!r}) cut the greedy answer where expected")


def check_seeds(client, model, messages) -> None:
    def draw(seed):
        r = client.chat.completions.create(model=model, messages=messages, temperature=1.0, top_p=1.0, seed=seed,
                                           max_tokens=10, extra_body={"top_k": 0, "min_p": 0.0})
        return r.choices[0].message.content
    a, b = draw(1234), draw(1234)
    assert a == b, (a, b)
    others = {draw(s) for s in (1, 2, 3)}
    assert len(others | {a}) > 1, "different seeds all gave the same sample"
    r = client.chat.completions.create(model=model, messages=messages, temperature=0.7, presence_penalty=0.5,
                                       frequency_penalty=0.5, seed=7, max_tokens=6)
    assert r.choices[0].message.content is not None
    print("seeds: the same seed reproduces, different seeds differ")


def check_completions(client, model) -> None:
    prompt = "The capital of France is"
    comp = client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, stop=["\n\n"],
                                     logprobs=2)
    assert comp.object == "text_completion" and comp.choices[0].text is not None
    lp = comp.choices[0].logprobs
    assert len(lp.tokens) == comp.usage.completion_tokens == len(lp.token_logprobs) == len(lp.text_offset)
    assert all(len(t) == 2 for t in lp.top_logprobs)
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    text_pieces = []
    for chunk in client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0, stop=["\n\n"],
                                           stream=True):
        text_pieces.extend(c.text for c in chunk.choices)
    assert "".join(text_pieces) == comp.choices[0].text, ("".join(text_pieces), comp.choices[0].text)
    print("completions: streamed equals whole, logprobs in the legacy shape")


def check_resume(args, client, model, messages, whole) -> None:
    """Turn 2 of the conversation after other requests took every context: it comes back
    from the parked turn 1 (on disk when the test started the server) and answers exactly
    as a request that reads its whole prompt."""
    text = whole.choices[0].message.content
    for i in range(PARALLEL + 1):
        client.completions.create(model=model, prompt=f"Unrelated request number {i}: zebras", max_tokens=1,
                                  temperature=0)
    before = metrics(args)
    follow = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "And of Italy?"}]
    resumed = client.chat.completions.create(model=model, messages=follow, temperature=0, max_tokens=MAX_TOKENS)
    after = metrics(args)
    reused = after["strata_resumed_tokens_total"] - before["strata_resumed_tokens_total"]
    assert reused >= whole.usage.prompt_tokens, f"reused only {reused} tokens"
    if args.park_dir:
        assert after["strata_resumes_disk_total"] > before["strata_resumes_disk_total"], "not resumed from disk"
        deadline = time.time() + 10
        while not any("reused" in line and "(disk)" in line for line in args.log):
            assert time.time() < deadline, "no resume log line"
            time.sleep(0.2)
    fresh = client.chat.completions.create(model=model, messages=follow, temperature=0, max_tokens=MAX_TOKENS,
                                           extra_body={"cache_prompt": False})
    assert resumed.choices[0].message.content == fresh.choices[0].message.content, (
        resumed.choices[0].message.content, fresh.choices[0].message.content)
    assert resumed.usage.prompt_tokens == fresh.usage.prompt_tokens
    print(f"resume: turn 2 reused {int(reused)} parked tokens and answered as a fresh read")


def raw(args, method, path, body=b"", headers=None, auth=True):
    u = urllib.parse.urlparse(args.base_url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    h = {"Content-Type": "application/json"}
    if auth:
        h["Authorization"] = f"Bearer {args.api_key}"
    h.update(headers or {})
    try:
        try:
            conn.request(method, path, body=body, headers=h)
        except (BrokenPipeError, ConnectionResetError):
            pass  # a server may answer (413) before reading a huge body: read that answer
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def check_errors(args, client, model, messages) -> None:
    # Typed exceptions through the client.
    for bad, exc in [
        (dict(model="no-such-model", messages=messages), openai.BadRequestError),
        (dict(model=model, messages=[]), openai.BadRequestError),
        (dict(model=model, messages=messages, max_tokens=0), openai.BadRequestError),
        (dict(model=model, messages=messages, temperature=7), openai.BadRequestError),
    ]:
        try:
            client.chat.completions.create(**bad)
        except exc as e:
            assert e.status_code == 400 and isinstance(e.body, dict) and "message" in e.body, e.body
        else:
            raise AssertionError(f"no error for {bad}")
    # Raw hostile requests: each must get exactly its 4xx with an OpenAI error body.
    ok = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}

    def chat(**kv):
        b = dict(ok)
        for k, v in kv.items():
            if v is None:
                b.pop(k, None)
            else:
                b[k] = v
        return json.dumps(b).encode()

    long_prompt = "word " * (CTX + 200)
    cases = [
        ("broken JSON", "/v1/chat/completions", b'{"model": ', 400),
        ("not an object", "/v1/chat/completions", b"[1, 2]", 400),
        ("empty body", "/v1/chat/completions", b"", 400),
        ("huge body", "/v1/chat/completions", b'{"x": "' + b"a" * (5 << 20) + b'"}', 413),
        ("negative max_tokens", "/v1/chat/completions", chat(max_tokens=-5), 400),
        ("max_tokens a string", "/v1/chat/completions", chat(max_tokens="ten"), 400),
        ("max_tokens over the context", "/v1/chat/completions", chat(max_tokens=10 ** 6), 400),
        ("unknown field", "/v1/chat/completions", chat(temprature=0.5), 400),
        ("prompt over the context", "/v1/chat/completions",
         chat(messages=[{"role": "user", "content": long_prompt}]), 400),
        ("empty messages", "/v1/chat/completions", chat(messages=[]), 400),
        ("messages a string", "/v1/chat/completions", chat(messages="hi"), 400),
        ("unknown role", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]), 400),
        ("content a number", "/v1/chat/completions", chat(messages=[{"role": "user", "content": 5}]), 400),
        ("top_p 0", "/v1/chat/completions", chat(top_p=0), 400),
        ("temperature NaN-ish string", "/v1/chat/completions", chat(temperature="NaN"), 400),
        ("top_logprobs without logprobs", "/v1/chat/completions", chat(top_logprobs=2), 400),
        ("top_logprobs 50", "/v1/chat/completions", chat(logprobs=True, top_logprobs=50), 400),
        ("logprobs an int in chat", "/v1/chat/completions", chat(logprobs=3), 400),
        ("n 3", "/v1/chat/completions", chat(n=3), 400),
        ("tools", "/v1/chat/completions", chat(tools=[{"type": "function", "function": {"name": "f"}}]), 400),
        ("stop a number", "/v1/chat/completions", chat(stop=42), 400),
        ("seed a string", "/v1/chat/completions", chat(seed="abc"), 400),
        ("unknown model", "/v1/chat/completions", chat(model="gpt-4o"), 400),
        ("prompt an object", "/v1/completions", json.dumps({"model": model, "prompt": {"a": 1}}).encode(), 400),
        ("token id out of the vocabulary", "/v1/completions",
         json.dumps({"model": model, "prompt": [10 ** 9]}).encode(), 400),
        ("messages sent to completions", "/v1/completions",
         json.dumps({"model": model, "prompt": "x", "messages": []}).encode(), 400),
        ("completions prompt over the context", "/v1/completions",
         json.dumps({"model": model, "prompt": long_prompt}).encode(), 400),
    ]
    for what, path, body, status in cases:
        got, reply = raw(args, "POST", path, body)
        assert got == status, f"{what}: {got} {reply[:300]!r}"
        err = json.loads(reply)["error"]
        assert isinstance(err["message"], str) and isinstance(err["type"], str), (what, err)
    n = len(cases)
    if args.api_key != "none":
        for what, headers in [("no key", {}), ("wrong key", {"Authorization": "Bearer wrong"}),
                              ("not bearer", {"Authorization": f"Basic {args.api_key}"})]:
            got, reply = raw(args, "POST", "/v1/chat/completions", chat(), headers=headers, auth=False)
            assert got == 401, f"{what}: {got} {reply!r}"
            assert json.loads(reply)["error"]["code"] == "invalid_api_key"
            n += 1
        wrong = openai.OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0)
        try:
            wrong.models.list()
        except openai.AuthenticationError:
            pass
        else:
            raise AssertionError("a wrong key was accepted")
    got, _ = raw(args, "GET", "/v1/nothing")
    assert got == 404
    got, _ = raw(args, "GET", "/v1/chat/completions")
    assert got == 405
    got, reply = raw(args, "GET", "/health", auth=False)
    assert got == 200, reply
    r = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=2)
    assert r.choices[0].message.content
    print(f"errors: {n} hostile requests got their 4xx with an OpenAI error body; still healthy and serving")


def check_load(args, model, messages, whole) -> None:
    """16 streaming clients at once, all greedy on the same messages, each must get the
    whole answer; one more client leaves after its first piece and must be cancelled."""
    text = whole.choices[0].message.content
    before = metrics(args)
    results, errors = [None] * 16, []

    def client_thread(i):
        try:
            c = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=900)
            pieces, finish = [], None
            for chunk in c.chat.completions.create(model=model, messages=messages, temperature=0,
                                                   max_tokens=MAX_TOKENS, stream=True):
                for ch in chunk.choices:
                    if ch.delta.content:
                        pieces.append(ch.delta.content)
                    if ch.finish_reason:
                        finish = ch.finish_reason
            results[i] = ("".join(pieces), finish)
        except Exception as e:  # reported below
            errors.append(f"client {i}: {e!r}")

    leaver_max = 300

    def leaver():
        try:
            c = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=900)
            stream = c.completions.create(model=model, prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
                                          max_tokens=leaver_max, temperature=0, stream=True,
                                          extra_body={"ignore_eos": True})
            for chunk in stream:
                if any(ch.text for ch in chunk.choices):
                    break
            stream.close()
        except Exception as e:
            errors.append(f"leaver: {e!r}")

    threads = [threading.Thread(target=leaver)] + [threading.Thread(target=client_thread, args=(i,))
                                                   for i in range(16)]
    t0 = time.time()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    assert not errors, errors
    for i, r in enumerate(results):
        assert r == (text, whole.choices[0].finish_reason), f"client {i}: {r!r} != {text!r}"
    deadline = time.time() + 60
    while True:
        after = metrics(args)
        if after["strata_queue_depth"] == 0 or time.time() > deadline:
            break
        time.sleep(0.5)
    assert after["strata_queue_depth"] == 0, after
    assert after["strata_requests_cancelled_total"] > before["strata_requests_cancelled_total"], "leaver not cancelled"
    generated = after["strata_completion_tokens_total"] - before["strata_completion_tokens_total"]
    leaver_tokens = generated - 16 * whole.usage.completion_tokens
    assert leaver_tokens < leaver_max / 2, f"the client that left still got {leaver_tokens} tokens generated"
    print(f"load: 16 concurrent streams complete and equal in {took:.1f} s; the leaver was cancelled after "
          f"{int(leaver_tokens)} tokens")


if __name__ == "__main__":
    sys.exit(main())
