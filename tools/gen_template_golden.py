#!/usr/bin/env python3
"""Regenerates tests/golden/templates/: every chat template in tests/fixtures/templates
rendered by Python jinja2 with Hugging Face transformers' settings, for a fixed set of
conversations.

The environment mirrors transformers' `_compile_jinja_template` / `render_jinja_template`:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the
loopcontrols extension and the `{% generation %}` tag of its AssistantTracker, `tojson` replaced by json.dumps(ensure_ascii=False, indent=None,
separators=None, sort_keys=False), `raise_exception` raising TemplateError, and
`strftime_now`; the context is messages, tools (None when absent), documents (None),
add_generation_prompt and the special tokens. strftime_now uses a fixed date (in
cases.json) so the goldens are stable; strata's test passes the same date.

Output: cases.json (the conversations) and one <template>.json per template mapping
each case to {"output": text} or {"raises": message}. The templates stored in GGUF files
(tokenizer.chat_template of the test vocabularies, and of SmolLM2 when present) get
gguf-<file>.json.

Usage: tools/gen_template_golden.py   (needs jinja2 >= 3.1)
"""

import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "tests" / "fixtures" / "templates"
OUT = REPO / "tests" / "golden" / "templates"

NOW = "2025-01-15T10:30:00"
BOS = "<BOS>"
EOS = "<EOS>"

SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
USER1 = {"role": "user", "content": "Hello, how are you?"}
ASSISTANT1 = {"role": "assistant", "content": "I'm fine, thanks! How can I help?"}
USER2 = {"role": "user", "content": "Write a haiku about \"rust\" & <tags>."}
UNICODE_USER = {"role": "user", "content": "Ünïcödé: 日本語, emoji 😀, quotes ‘’ and tab\tend"}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "City name, e.g. Paris"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                    "days": {"type": "integer", "minimum": 1, "default": 1},
                },
                "required": ["location"],
            },
        },
    }
]
TOOL_CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {
            "id": "call12345",
            "type": "function",
            "function": {"name": "get_weather", "arguments": {"location": "Paris", "unit": "celsius"}},
        }
    ],
}
TOOL_RESPONSE = {
    "role": "tool",
    "tool_call_id": "call12345",
    "name": "get_weather",
    "content": "{\"temperature\": 18.5, \"condition\": \"sunny\"}",
}
TOOL_USER = {"role": "user", "content": "What's the weather in Paris?"}
TOOL_ANSWER = {"role": "assistant", "content": "It is 18.5 °C and sunny in Paris."}

CASES = {
    "single": {"messages": [USER1], "add_generation_prompt": False},
    "single_gen": {"messages": [USER1], "add_generation_prompt": True},
    "multi": {"messages": [SYSTEM, USER1, ASSISTANT1, USER2], "add_generation_prompt": False},
    "multi_gen": {"messages": [SYSTEM, USER1, ASSISTANT1, USER2], "add_generation_prompt": True},
    "nosys_multi_gen": {"messages": [USER1, ASSISTANT1, USER2], "add_generation_prompt": True},
    "unicode_gen": {"messages": [SYSTEM, UNICODE_USER], "add_generation_prompt": True},
    "parts_gen": {
        "messages": [SYSTEM, {"role": "user", "content": [{"type": "text", "text": "Describe the weather."}]}],
        "add_generation_prompt": True,
    },
    "reasoning_gen": {
        "messages": [
            USER1,
            {"role": "assistant", "content": "Fine, thanks.", "reasoning_content": "The user greets me."},
            USER2,
        ],
        "add_generation_prompt": True,
    },
    "tools_gen": {"messages": [TOOL_USER], "tools": TOOLS, "add_generation_prompt": True, "needs_tools": True},
    "tool_call": {
        "messages": [SYSTEM, TOOL_USER, TOOL_CALL, TOOL_RESPONSE, TOOL_ANSWER],
        "tools": TOOLS,
        "add_generation_prompt": False,
        "needs_tools": True,
    },
    "tool_call_gen": {
        "messages": [TOOL_USER, TOOL_CALL, TOOL_RESPONSE],
        "tools": TOOLS,
        "add_generation_prompt": True,
        "needs_tools": True,
    },
}


class GenerationTag(jinja2.ext.Extension):
    """transformers' AssistantTracker: `{% generation %}...{% endgeneration %}` marks
    assistant text; outside of assistant-mask rendering it renders its body as is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromisoformat(NOW).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def uses_tools(source: str) -> bool:
    return "tools" in source or "tool_calls" in source


def render(env, source: str, case: dict) -> dict:
    try:
        template = env.from_string(source)
        out = template.render(
            messages=case["messages"],
            tools=case.get("tools"),
            documents=None,
            add_generation_prompt=case["add_generation_prompt"],
            bos_token=BOS,
            eos_token=EOS,
        )
        return {"output": out}
    except Exception as e:  # the golden records that Python refused, and why
        return {"raises": f"{type(e).__name__}: {e}"}


def gguf_templates() -> list[tuple[str, str]]:
    """The chat templates stored in GGUF files: the test vocabularies that have one,
    and SmolLM2 when it is on this machine. Named gguf-<file>."""
    import os

    import gguf

    paths = sorted((REPO / "tests" / "fixtures" / "vocab").glob("*.gguf"))
    model_dir = Path(os.environ.get("STRATA_MODEL_DIR", Path.home() / ".cache/strata/models"))
    smollm2 = Path(os.environ.get("STRATA_SMOLLM2", model_dir / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    if smollm2.exists():
        paths.append(smollm2)
    found = []
    for path in paths:
        field = gguf.GGUFReader(path).fields.get("tokenizer.chat_template")
        if field is not None:
            found.append(("gguf-" + path.stem, bytes(field.parts[-1]).decode("utf-8")))
    return found


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "cases.json").write_text(
        json.dumps({"now": NOW, "bos_token": BOS, "eos_token": EOS, "cases": CASES}, ensure_ascii=False, indent=1)
        + "\n",
        encoding="utf-8",
    )
    env = make_env()
    sources = [(p.stem, p.read_text(encoding="utf-8")) for p in sorted(TEMPLATES.glob("*.jinja"))]
    for stem, source in sources + gguf_templates():
        results = {}
        for name, case in CASES.items():
            if case.get("needs_tools") and not uses_tools(source):
                continue
            results[name] = render(env, source, case)
        dest = OUT / (stem + ".json")
        dest.write_text(json.dumps(results, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        raised = sum(1 for r in results.values() if "raises" in r)
        print(f"{stem}: {len(results)} cases, {raised} raise")


if __name__ == "__main__":
    main()
