#!/usr/bin/env python3
"""Regenerates tests/golden/tokenizer/*.json: token ids from llama.cpp's llama-tokenize.

For every vocabulary (the llama.cpp test vocabularies in tests/fixtures/vocab and the
SmolLM2 model) and every text below (hand-picked cases plus seeded random strings),
llama-tokenize is run twice: as a user would (BOS/EOS per the model, special tokens
parsed) and raw (--no-bos --no-parse-special). The text goes through a file with
--no-escape so it reaches the tokenizer byte for byte.

Usage: tools/gen_tokenizer_golden.py [--llama-tokenize PATH] [--smollm2 PATH]
"""

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VOCABS = REPO / "tests" / "fixtures" / "vocab"
OUT = REPO / "tests" / "golden" / "tokenizer"

CURATED = [
    "",
    " ",
    "\n",
    "Hello world",
    " Hello world",
    "Hello, y'all! How're you? I'M fine; they'LL see. We'd've",
    "The quick brown fox jumps over the lazy dog.\n\nSecond paragraph.",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tlet x: Vec<u8> = vec![1, 2, 3];\n\tprintln!(\"{x:?}\");\n}\r\n",
    "    leading spaces and trailing spaces    ",
    "tabs\t\tand\t \tmixed \t whitespace\n \n  \n",
    "line\r\nwindows\r\n\r\nends\rold mac",
    "123 4567 89012 3.14159 1,000,000 0x1F 1e-9",
    "emoji: 😀 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✅",
    "中文测试：你好，世界！这是一个句子。",
    "日本語のテキスト、カタカナとひらがな。",
    "한국어 텍스트입니다.",
    "Привет, мир! Ελληνικά κείμενα.",
    "مرحبا بالعالم ١٢٣",
    "हिन्दी पाठ में मात्राएँ हैं। ५६७",
    "ภาษาไทยไม่มีช่องว่าง",
    "Café naïve résumé coöperate e\u0301 a\u0300\u0301",
    "ﬁ ligature, ＦＵＬＬＷＩＤＴＨ １２３ ！？",
    "non\u00a0breaking\u3000ideographic\u2028line\u2029para\u200bzero",
    "math: ∑ ∫ √2 ≤ ≥ ≠ ∞ € £ ¥ © ® ™ § ¶",
    "quotes: ‘single’ “double” «guillemets» — dash – en … ellipsis",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<s>[INST] hello [/INST]</s>",
    "text<|endoftext|>more text<|endoftext|>",
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|><|im_start|>double and <|im_sta partial <|im_end|x",
    "<|user|>\n  question <|end|>\n<|assistant|>",
    "!!!!!!?????......,,,,;;;;::::''''\"\"\"\"````",
    "a" * 300,
    " " * 50 + "x" + "\n" * 20 + "y",
    "https://example.com/path?query=1&b=2#frag user@example.org",
    "<html><body class=\"x\">&amp; &lt;tag&gt;</body></html>",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "C++ std::vector<int> v; v.push_back(42); // comment /* block */",
    "\u00ff\u00fe\u00f8\u00f6\u00e0 latin-1 bytes ø ö ú ÿ",
    "private use \ue000\ue001 replacement \ufffd control \x01\x1f\x7f",
]

# Characters the random strings are drawn from: every script and category above.
POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
    + list(" " * 12 + "\n" * 4 + "\t\r")
    + list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
    + ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re"]
    + list("éñüßøåçÀÉÎ\u0301\u0308ΩαβγЖжЯ中文字日本語カナひらがな한국어العربيةहिन्दी५٣ไทย")
    + list("😀👍🏽\u200d❤️✅🇫🇷€£©∑√≤…—–‘’“”«»\u00a0\u3000\u2028\u200b\ufffd\ue000ＡＢ１２！")
    + ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<s>", "</s>", "<|eot_id|>", "<|end|>", "<unk>"]
)


# One name per pre-tokenizer definition strata supports (crates/model/src/tokenizer/
# pre_table.rs); each is checked on the gpt-2 vocabulary with its `pre` replaced.
PRE_NAMES = [
    "default", "minicpm5", "llama3", "deepseek-llm", "deepseek-coder", "deepseek-v3", "spark2_5",
    "youtu", "falcon", "mpt", "starcoder", "gpt-2", "trillion", "jais-2", "smollm", "qwen2",
    "stablelm2", "qwen35", "dbrx", "poro-chat", "bloom", "chatglm-bpe", "glm4", "viking", "tekken",
    "exaone-moe", "chameleon", "gpt-4o", "granite-embed-multi-97m", "bailingmoe", "seed-coder",
    "ufakzeka", "laguna", "afmoe", "tiny_aya", "kimi-k2", "superbpe",
]

# Extra texts for the regexes that look at letter case, marks and digit runs.
PRE_TEXTS = [
    "HelloWORLD camelCase snake_case XMLHttpRequest iPhone McDonald's O'Neil",
    "ΑΒΓαβγ ЖжЯя ÀÉÎõü ǅǈ ᾈᾉ",  # upper, lower and title case letters
    "नमस्ते दुनिया क्षत्रिय ক্ষ తెలుగు",  # combining marks
    "1234567 12 123 1234 12,345.678 ١٢٣٤ ５６７ abc12345def x1y234 v2.0.10",
    "I'M HE'S WE'LL THEY'D YOU'VE it'S 'tis",
    "<sentinel:12> IMGIMGABCDZ IMGIMGABZ tab\tnl\n   four    spaces",
    "漢字かなカナ한글 mixed漢字text",
    "a" + " " * 600 + "b" + "\n" * 3 + "   \t  \r\n  x",
]


def write_with_pre(src: Path, pre: str, dest: Path) -> None:
    """A copy of the vocabulary-only GGUF `src` with tokenizer.ggml.pre set to `pre`."""
    import gguf

    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(dest), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = pre if key == "tokenizer.ggml.pre" else field.contents()
        sub = field.types[1] if len(field.types) > 1 else None
        writer.add_key_value(key, value, field.types[0], sub)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def generate_pre(tool: str, name: str, texts: list[str]) -> None:
    src = VOCABS / "ggml-vocab-gpt-2.gguf"
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / f"gpt-2-pre-{name}.gguf"
        write_with_pre(src, name, model)
        cases = [
            {"text": t, "add_special": False, "parse_special": False, "ids": tokenize(tool, model, t, True)}
            for t in texts
        ]
    dest = OUT / f"pre-{name}.json"
    header = {
        "source": "llama.cpp llama-tokenize --ids --no-escape --no-bos --no-parse-special",
        "vocab": f"tests/fixtures/vocab/ggml-vocab-gpt-2.gguf with tokenizer.ggml.pre = {name}",
        "pre": name,
        "cases": cases,
    }
    dest.write_text(dump(header), encoding="utf-8")
    print(f"{dest.relative_to(REPO)}: {len(cases)} cases", file=sys.stderr)


def random_texts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(POOL) for _ in range(rng.randint(1, 40))) for _ in range(count)]


def tokenize(tool: str, model: Path, text: str, raw: bool) -> list[int]:
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [tool, "-m", str(model), "-f", path, "--ids", "--no-escape", "--log-disable"]
        if raw:
            cmd += ["--no-bos", "--no-parse-special"]
        out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode()
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def dump(header: dict) -> str:
    """JSON with one case (and one piece) per line: readable diffs, small files."""
    lines = ["{"]
    for key, value in header.items():
        if key == "cases":
            lines.append(' "cases": [')
            cases = [json.dumps(c, ensure_ascii=False, separators=(",", ":")) for c in value]
            lines.append(",\n".join("  " + c for c in cases))
            lines.append(" ],")
        elif key == "pieces":
            lines.append(' "pieces": {')
            items = [f"  {json.dumps(k)}:{json.dumps(v)}" for k, v in value.items()]
            lines.append(",\n".join(items))
            lines.append(" },")
        else:
            lines.append(f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)},")
    lines[-1] = lines[-1].rstrip(",")
    lines.append("}")
    return "\n".join(lines) + "\n"


def pieces(tool: str, model: Path, text: str) -> dict[str, str]:
    """Token id -> piece (hex of its bytes) as llama-tokenize prints them
    (common_token_to_piece with special tokens shown), for every token of `text`."""
    ids = tokenize(tool, model, text, raw=False)
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [tool, "-m", str(model), "-f", path, "--no-escape", "--log-disable"]
        out = subprocess.run(cmd, capture_output=True, check=True).stdout
    finally:
        os.unlink(path)
    # The output is, for each id in order, b"%6d -> '" + piece + b"'\n"; pieces may hold
    # newlines, so cut at the next token's prefix rather than at line ends.
    result = {}
    pos = 0
    for i, tid in enumerate(ids):
        prefix = f"{tid:6d} -> '".encode()
        assert out.startswith(prefix, pos), (tid, out[pos : pos + 40])
        start = pos + len(prefix)
        if i + 1 < len(ids):
            end = out.index(b"'\n" + f"{ids[i + 1]:6d} -> '".encode(), start)
        else:
            end = out.rindex(b"'\n")
        result[str(tid)] = out[start:end].hex()
        pos = end + 2
    return result


def generate(tool: str, model: Path, name: str, texts: list[str]) -> None:
    cases = []
    for text in texts:
        for raw in (False, True):
            cases.append(
                {
                    "text": text,
                    "add_special": not raw,
                    "parse_special": not raw,
                    "ids": tokenize(tool, model, text, raw),
                }
            )
    dest = OUT / f"{name}.json"
    header = {
        "source": "llama.cpp llama-tokenize --ids --no-escape (raw: --no-bos --no-parse-special)",
        "vocab": str(model.relative_to(REPO)) if model.is_relative_to(REPO) else model.name,
        "cases": cases,
        "pieces_source": "llama-tokenize without --ids (common_token_to_piece, special tokens shown), hex",
        "pieces": pieces(tool, model, "\n".join(texts)),
    }
    dest.write_text(dump(header), encoding="utf-8")
    print(f"{dest.relative_to(REPO)}: {len(cases)} cases", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama-tokenize", default="/work/oracle/llama.cpp/build/bin/llama-tokenize")
    default_model = Path(os.environ.get("STRATA_MODEL_DIR", Path.home() / ".cache/strata/models"))
    ap.add_argument("--smollm2", default=str(default_model / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--only", help="regenerate only the goldens whose name starts with this")
    ap.add_argument("--reformat", action="store_true", help="only rewrite the existing goldens in the current layout")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.reformat:
        for path in sorted(OUT.glob("*.json")):
            path.write_text(dump(json.loads(path.read_text(encoding="utf-8"))), encoding="utf-8")
        return

    jobs = [("smollm2", Path(args.smollm2), CURATED + random_texts(2024, 120))]
    for i, vocab in enumerate(sorted(VOCABS.glob("ggml-vocab-*.gguf"))):
        name = vocab.name.removeprefix("ggml-vocab-").removesuffix(".gguf")
        jobs.append((f"vocab-{name}", vocab, CURATED + random_texts(100 + i, 40)))
    for name, model, texts in jobs:
        if args.only and not name.startswith(args.only):
            continue
        generate(args.llama_tokenize, model, name, texts)
    for i, pre in enumerate(PRE_NAMES):
        if args.only and not f"pre-{pre}".startswith(args.only):
            continue
        generate_pre(args.llama_tokenize, pre, CURATED + PRE_TEXTS + random_texts(500 + i, 20))


if __name__ == "__main__":
    main()
