#!/usr/bin/env python3
"""Golden SentencePiece Unigram (GGUF `t5`) tokenizer data, from the sentencepiece library.

Trains a small Unigram model with the default nmt_nfkc normalization (a
precompiled charsmap), extra-whitespace removal, a dummy prefix and byte
fallback on a seeded corpus, and writes what a GGUF of that model carries
(tokens, scores, token types, tokenizer.ggml.precompiled_charsmap as base64)
with the ids sentencepiece itself gives for a fuzz corpus. Run from the
repository root:
    /work/refenv/bin/python scripts/golden/unigram_tokenizer.py
(needs `pip install sentencepiece protobuf`). The fuzz corpus (the fixed
strings, the combining-mark cases, 1,000 seeded random strings of words,
scripts, digits, whitespace runs and code) is encoded by sentencepiece's own
encoder. Writes
tests/golden/unigram_tokenizer.json.
"""
import base64
import io
import json
import os
import random
import sys

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

sys.path.insert(0, os.path.dirname(__file__))
from gemma_tokenizer import FIXED, random_string  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
OUT_JSON = os.path.join(ROOT, "tests", "golden", "unigram_tokenizer.json")
SEED = 11
N_RANDOM = 1000
# Combining marks and zero-width characters next to spaces and each other,
# where per-grapheme normalization differs from sentencepiece's.
EXTRA = [
    " \u0301x", "a \u0301", "\u200b\u0301", "x\u200b \u0301y", "\u3000\u0301", "\t\u0301\u0301",
    "e\u0301\u0301 \u00a0\u0301", "\ufeff\u0301a", "\u200d\u0301", "\u0301", "  \u0301  ",
    "ﬁ ﬀ ① ㈱ ｶ ｱﾞ", "Ｆｕｌｌ\u3000ｗｉｄｔｈ", "x\u00ad y",
]


def main():
    rng = random.Random(SEED)
    training = [random_string(rng) for _ in range(4000)] + FIXED
    training = [line for t in training for line in t.split("\n") if line.strip()]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training), model_writer=model, model_type="unigram",
        vocab_size=1500, byte_fallback=True, character_coverage=0.98, minloglevel=2,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    sp = spm.SentencePieceProcessor(model_proto=model.getvalue())
    # GGUF token types: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    kinds = {1: 1, 2: 2, 3: 3, 4: 4, 5: 5, 6: 6}
    tokens = [p.piece for p in proto.pieces]
    scores = [p.score for p in proto.pieces]
    types = [kinds[p.type] for p in proto.pieces]
    texts = FIXED + EXTRA + [random_string(rng) for _ in range(N_RANDOM)]
    cases = []
    for text in texts:
        ids = sp.encode(text)
        case = {"text": text, "ids": ids}
        decoded = sp.decode(ids)
        if decoded != text:
            case["decoded"] = decoded
        cases.append(case)
    ns = proto.normalizer_spec
    out = {
        "source": f"sentencepiece {spm.__version__} Unigram trained by scripts/golden/unigram_tokenizer.py, seed {SEED}",
        "tokens": tokens, "scores": scores, "token_types": types,
        "precompiled_charsmap": base64.b64encode(ns.precompiled_charsmap).decode(),
        "add_space_prefix": ns.add_dummy_prefix,
        "remove_extra_whitespaces": ns.remove_extra_whitespaces,
        "bos_token_id": sp.bos_id(), "eos_token_id": sp.eos_id(), "unknown_token_id": sp.unk_id(),
        "cases": cases,
    }
    with open(OUT_JSON, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {len(cases)} cases, {len(tokens)} pieces to {OUT_JSON} ({os.path.getsize(OUT_JSON)} bytes)")


if __name__ == "__main__":
    main()
