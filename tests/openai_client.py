#!/usr/bin/env python3
"""The official `openai` Python client (pinned: pip install openai==3.51.0) against a
running `strata serve`: the issue's oracle for the wire format. Exits non-zero on the
first mismatch.

    strata serve -m SmolLM2-135M-Instruct.Q4_1.gguf --port 8080 &
    python3 tests/openai_client.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY]

or let it start the server on a free port, run the checks, stop it with SIGTERM and
check that it exits 0 (as ci/test.sh does):

    python3 tests/openai_client.py --serve target/debug/strata --model MODEL.gguf
"""

import argparse
import re
import signal
import subprocess
import sys
import time
import urllib.request

import openai


def start_server(binary: str, model: str, api_key: str, backend: str):
    """`strata serve` on a free port; returns (process, base url) once /health is 200."""
    cmd = [binary, "serve", "-m", model, "--backend", backend, "--port", "0", "--ctx", "1024", "--api-key", api_key]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    base = None
    deadline = time.time() + 120
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
    # Keep draining its log so it never blocks on a full pipe.
    import threading
    threading.Thread(target=lambda: [sys.stderr.write(l) for l in proc.stderr], daemon=True).start()
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                if r.status == 200:
                    return proc, base + "/v1"
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
    if args.serve:
        if args.api_key == "none":
            args.api_key = "ci-key"
        proc, args.base_url = start_server(args.serve, args.model, args.api_key, args.backend)
        try:
            check(args)
        finally:
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=60)
        assert code == 0, f"strata serve exited {code} after SIGTERM"
        print("strata serve stopped cleanly on SIGTERM")
        return 0
    check(args)
    return 0


def check(args) -> None:
    client = openai.OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)

    models = client.models.list()
    names = [m.id for m in models.data]
    assert len(names) == 1, names
    model = names[0]

    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    whole = client.chat.completions.create(model=model, messages=messages, temperature=0, max_tokens=16)
    text = whole.choices[0].message.content
    assert whole.object == "chat.completion", whole
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].finish_reason in ("stop", "length"), whole.choices[0].finish_reason
    assert whole.usage.completion_tokens > 0 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    pieces, usage, finish = [], None, None
    stream = client.chat.completions.create(
        model=model, messages=messages, temperature=0, max_tokens=16, stream=True,
        stream_options={"include_usage": True},
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.content:
                pieces.append(c.delta.content)
            if c.finish_reason:
                finish = c.finish_reason
    assert "".join(pieces) == text, ("".join(pieces), text)
    assert finish == whole.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == whole.usage.completion_tokens

    # Follow-up (resumes the parked conversation on the server).
    follow = messages + [{"role": "assistant", "content": text}, {"role": "user", "content": "And Italy?"}]
    again = client.chat.completions.create(model=model, messages=follow, temperature=0, max_tokens=8)
    assert again.choices[0].message.content is not None

    comp = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stop=["\n\n"])
    assert comp.object == "text_completion" and comp.choices[0].text is not None

    text_pieces = []
    for chunk in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stop=["\n\n"], stream=True):
        text_pieces.extend(c.text for c in chunk.choices)
    assert "".join(text_pieces) == comp.choices[0].text, ("".join(text_pieces), comp.choices[0].text)

    # Errors come back as the client's typed exceptions.
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
    if args.api_key != "none":
        wrong = openai.OpenAI(base_url=args.base_url, api_key="wrong", max_retries=0)
        try:
            wrong.models.list()
        except openai.AuthenticationError:
            pass
        else:
            raise AssertionError("a wrong key was accepted")

    print(f"openai client: all checks passed against {args.base_url} ({model})")


if __name__ == "__main__":
    sys.exit(main())
