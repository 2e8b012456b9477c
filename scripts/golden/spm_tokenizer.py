#!/usr/bin/env python3
"""Golden Llama-style SentencePiece BPE tokenizer data, from the sentencepiece library.

Trains a small BPE model with byte fallback and a dummy prefix (the shape of the
Llama 2 / Mistral / TinyLlama tokenizers) on a seeded corpus, and writes what a
GGUF of that model would carry (tokens, scores, token types) together with the
ids sentencepiece itself gives for a fuzz corpus. Run from the repository root:
    /work/refenv/bin/python scripts/golden/spm_tokenizer.py
(needs `pip install sentencepiece`). Writes tests/golden/spm_llama_tokenizer.json.
"""
import io
import json
import os
import random
import sys

import sentencepiece as spm

sys.path.insert(0, os.path.dirname(__file__))
from gemma_tokenizer import FIXED, random_string  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_JSON = os.path.join(ROOT, "tests", "golden", "spm_llama_tokenizer.json")
SEED = 7
N_RANDOM = 400


def main():
    rng = random.Random(SEED)
    training = [random_string(rng) for _ in range(4000)] + FIXED
    training = [line for t in training for line in t.split("\n") if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training), model_writer=model, model_type="bpe",
        vocab_size=1200, byte_fallback=True, add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=False, character_coverage=0.98,
        user_defined_symbols=["<|user|>"], normalization_rule_name="identity",
        allow_whitespace_only_pieces=True, minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        elif tokens[-1] == "<|user|>":
            types.append(4)
        else:
            types.append(1)
    texts = FIXED + [random_string(rng) for _ in range(N_RANDOM)]
    cases = []
    for text in texts:
        ids = sp.encode(text)
        case = {"text": text, "ids": ids}
        decoded = sp.decode(ids)
        if decoded != text:
            case["decoded"] = decoded
        cases.append(case)
    out = {
        "source": f"sentencepiece {spm.__version__} BPE trained by scripts/golden/spm_tokenizer.py, seed {SEED}",
        "tokens": tokens, "scores": scores, "token_types": types,
        "bos_token_id": sp.bos_id(), "eos_token_id": sp.eos_id(),
        "cases": cases,
    }
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases, {len(tokens)} pieces to {OUT_JSON} ({os.path.getsize(OUT_JSON)} bytes)")


if __name__ == "__main__":
    main()
