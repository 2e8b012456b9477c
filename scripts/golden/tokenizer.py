#!/usr/bin/env python3
"""Golden tokenizer data for SmolLM2-135M-Instruct, from Hugging Face transformers.

Run with the reference venv from the repository root:
    /work/refenv/bin/python scripts/golden/tokenizer.py

Writes:
- tests/golden/smollm2_tokenizer.json: encodings (with and without special
  tokens), decodes (with and without skipping special tokens) and chat
  template renderings, all computed by transformers from the GGUF file.
- tests/golden/smollm2-tokenizer/: the same tokenizer saved in Hugging Face
  form (tokenizer.json, tokenizer_config.json, chat_template.jinja), to test
  directory loading.
"""
import json
import os
import sys
import shutil

from transformers import AutoTokenizer
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
GGUF_DIR = os.path.join(ROOT, "models")
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
OUT_JSON = os.path.join(ROOT, "tests", "golden", "smollm2_tokenizer.json")
OUT_DIR = os.path.join(ROOT, "tests", "golden", "smollm2-tokenizer")

TEXTS = [
    "The capital of France is",
    "Hello, world!",
    "  leading spaces and trailing spaces   ",
    "multiple    spaces\tand\ttabs",
    "line one\nline two\n\n\nline five\r\n",
    "Digits 0123456789 and 3.14159, 1,000,000 and 2024-06-01",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "Punctuation!?... (parentheses) [brackets] {braces} \"quotes\" 'single' -- em—dash",
    "Accents: café, naïve, résumé, Ångström, Straße",
    "CJK: 你好，世界。日本語のテキスト。한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 ❤️",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<repo_name>x",
    "I'm sure they'll say it's fine, we've DONE'T",
    "",
    " ",
    "\n",
    "Ünïcödé mixed with ASCII and 12 numbers; x = y ** 2 // 3",
]

CONVERSATIONS = [
    {"name": "system_user", "messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
    ]},
    {"name": "multi_turn", "messages": [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about cats."},
    ]},
    {"name": "no_system_unicode", "messages": [
        {"role": "user", "content": "Translate: 你好 😀"},
    ]},
    # Content parts: the engine flattens text parts (joined with "\n") before
    # rendering; the SmolLM2 template needs strings, so the reference renders
    # the flattened text.
    {"name": "content_parts", "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "First part."},
                                     {"type": "text", "text": "Second part."}]},
    ]},
]

# Small templates exercising the Jinja dialect transformers uses (its own
# renderer: trim_blocks, lstrip_blocks, loop controls, tojson, Python methods).
CUSTOM_TEMPLATES = [
    {"name": "python_methods", "template":
        "{% for m in messages %}{{ m['role'].upper() }}:{{ m['content'].strip() }}|"
        "{{ m['content'].startswith('  ') }}|{{ m['content'].split(',') | length }}|"
        "{{ m['content'].replace('a', 'A') }}\n{% endfor %}"},
    {"name": "loop_controls_and_blocks", "template":
        "{% for m in messages %}\n"
        "    {% if m.role == 'assistant' %}\n"
        "        {% continue %}\n"
        "    {% endif %}\n"
        "    {{ loop.index0 }}={{ m.content }}\n"
        "    {% if loop.index >= 3 %}{% break %}{% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}>>{% endif %}"},
    {"name": "tojson_and_tools", "template":
        "{% if tools %}{% for t in tools %}{{ t | tojson }}\n{% endfor %}{% endif %}"
        "{{ messages | tojson }}\n{{ tools[0] | tojson(indent=2) }}\n"
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + m.content | length %}{% endfor %}{{ ns.n }}"},
    {"name": "bos_eos_and_slices", "template":
        "{{ bos_token }}{% for m in messages[1:] %}{{ m.content[:5] }}{{ eos_token }}{% endfor %}"
        "{{ messages[-1]['content'] | trim | lower }}{{ messages | map(attribute='role') | join(',') }}"},
]

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather <now> & \"later\" for a city: é",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]


# Pre-tokenizer splits by the Python `regex` engine, for each
# tokenizer.ggml.pre family, as published in the models' tokenizer.json files
# and llama.cpp's llama-vocab.
GPT2_PAT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
QWEN2_PAT = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
SPLIT_TEXTS = [
    "Hello world, it's 2024!",
    "  x  =  12345678;\n\n\tdone\r\n",
    "I'M HERE'S You'Ve got 3.14159 and 1,000",
    "naïve 你好世界 😀😀 ...?! $100",
    "def f(a_b):\n    return [a_b**2]  # ok\n\n",
    "trailing spaces   ",
]


def splits(kind, text):
    import regex
    if kind == "gpt2":
        return regex.findall(GPT2_PAT, text)
    if kind == "gpt2_individual_digits":
        out = []
        for chunk in regex.findall(r"\p{N}|[^\p{N}]+", text):
            out.extend(regex.findall(GPT2_PAT, chunk))
        return out
    if kind == "llama3":
        return regex.findall(LLAMA3_PAT, text)
    if kind == "qwen2":
        return regex.findall(QWEN2_PAT, text)
    raise ValueError(kind)


def flatten(messages):
    out = []
    for m in messages:
        c = m["content"]
        if isinstance(c, list):
            c = "\n".join(p["text"] for p in c if p["type"] == "text")
        out.append({"role": m["role"], "content": c})
    return out


def main():
    tok = AutoTokenizer.from_pretrained(GGUF_DIR, gguf_file=GGUF_FILE)
    encodings = []
    for text in TEXTS:
        ids = tok.encode(text, add_special_tokens=False)
        encodings.append({
            "text": text,
            "ids": ids,
            "ids_with_special": tok.encode(text, add_special_tokens=True),
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    assert encodings[0]["ids"] == [504, 3575, 282, 4649, 314], encodings[0]["ids"]

    chats = []
    for conv in CONVERSATIONS:
        flat = flatten(conv["messages"])
        for agp in (False, True):
            chats.append({
                "name": conv["name"],
                "messages": conv["messages"],
                "add_generation_prompt": agp,
                "text": tok.apply_chat_template(flat, tokenize=False, add_generation_prompt=agp),
            })

    custom = []
    msgs = [
        {"role": "system", "content": "  a, b, c  "},
        {"role": "user", "content": "Hello, there"},
        {"role": "assistant", "content": "General Kenobi"},
        {"role": "user", "content": "  Bye now  "},
        {"role": "user", "content": "ignored after break"},
    ]
    for t in CUSTOM_TEMPLATES:
        rendered, _ = render_jinja_template(
            conversations=[msgs], tools=TOOLS, chat_template=t["template"],
            add_generation_prompt=True, bos_token=tok.bos_token, eos_token=tok.eos_token)
        custom.append({"name": t["name"], "template": t["template"], "text": rendered[0]})

    golden = {
        "source": "transformers " + __import__("transformers").__version__ + " AutoTokenizer from " + GGUF_FILE,
        "vocab_size": len(tok),
        "bos_token": tok.bos_token,
        "eos_token": tok.eos_token,
        "bos_token_id": tok.bos_token_id,
        "eos_token_id": tok.eos_token_id,
        "chat_template": tok.chat_template,
        "encodings": encodings,
        "chats": chats,
        "custom_templates": {"messages": msgs, "tools": TOOLS, "cases": custom},
        "pre_tokenizer_splits": {
            kind: [{"text": t, "pieces": splits(kind, t)} for t in SPLIT_TEXTS]
            for kind in ("gpt2", "gpt2_individual_digits", "llama3", "qwen2")
        },
    }
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")

    shutil.rmtree(OUT_DIR, ignore_errors=True)
    tok.save_pretrained(OUT_DIR)
    keep = {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    for name in os.listdir(OUT_DIR):
        if name not in keep:
            os.remove(os.path.join(OUT_DIR, name))
    size = sum(os.path.getsize(os.path.join(OUT_DIR, n)) for n in os.listdir(OUT_DIR))
    print(f"wrote {OUT_JSON} and {OUT_DIR} ({size} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
