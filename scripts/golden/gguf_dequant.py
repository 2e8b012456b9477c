#!/usr/bin/env python3
"""Reference values for pagoda-gguf's reader and dequantizers, from the `gguf`
Python package (llama.cpp's own reader).

Writes crates/pagoda-gguf/tests/golden/gguf_reference.json with
- `smollm2`: metadata values, the tensor count, and for several tensors their
  type, shape (outermost first) and dequantized values at fixed flat indices
  of models/SmolLM2-135M-Instruct.Q4_1.gguf;
- `blocks`: for each quantization type (IQ4_NL and IQ4_XS too), two random blocks (hex) with sane f16
  scales and the values gguf's dequantizer gives for them.

Run with /work/refenv/bin/python scripts/golden/gguf_dequant.py from the repo root.
"""
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES

root = Path(__file__).resolve().parents[2]
model = root / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
out = root / "crates" / "pagoda-gguf" / "tests" / "golden" / "gguf_reference.json"

r = gguf.GGUFReader(str(model))
meta = {
    k: r.fields[k].contents()
    for k in [
        "general.architecture",
        "llama.block_count",
        "llama.embedding_length",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.model",
    ]
}
meta["tokens_len"] = len(r.fields["tokenizer.ggml.tokens"].data)
meta["token_100"] = r.fields["tokenizer.ggml.tokens"].contents(100)
meta["merges_len"] = len(r.fields["tokenizer.ggml.merges"].data)
meta["merge_0"] = r.fields["tokenizer.ggml.merges"].contents(0)

rng = np.random.default_rng(1234)
tensors = []
by_name = {t.name: t for t in r.tensors}
for name in [
    "token_embd.weight",
    "blk.0.attn_q.weight",
    "blk.0.attn_k.weight",
    "blk.0.ffn_down.weight",
    "blk.29.ffn_gate.weight",
    "blk.0.attn_norm.weight",
    "output_norm.weight",
]:
    t = by_name[name]
    x = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
    shape = [int(d) for d in reversed(t.shape)]
    flat = x.reshape(-1)
    idx = sorted({0, 1, 31, 32, 33, flat.size - 1} | set(int(i) for i in rng.integers(0, flat.size, 24)))
    tensors.append(
        {
            "name": name,
            "type": t.tensor_type.name,
            "shape": shape,
            "indices": idx,
            "values": [float(flat[i]) for i in idx],
            "sum": float(flat.astype(np.float64).sum()),
        }
    )

blocks = []
# New types go last, so the blocks drawn before them stay the same.
for qt in [T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K,
           T.IQ4_NL, T.IQ4_XS]:
    block_size, type_size = GGML_QUANT_SIZES[qt]
    raw = rng.integers(0, 256, size=(2, type_size), dtype=np.uint8)
    # f16 scale fields: offsets within the block (see ggml-common.h layouts).
    f16_fields = {
        T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
        T.Q2_K: [type_size - 4, type_size - 2], T.Q3_K: [type_size - 2],
        T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [type_size - 2],
        T.IQ4_NL: [0], T.IQ4_XS: [0],
    }[qt]
    for b in range(2):
        for off in f16_fields:
            v = np.float16(rng.uniform(-0.05, 0.05))
            raw[b, off:off + 2] = np.frombuffer(v.tobytes(), dtype=np.uint8)
    vals = gguf.quants.dequantize(raw.reshape(-1), qt).astype(np.float32).reshape(-1)
    assert vals.size == 2 * block_size
    blocks.append({"type": qt.name, "hex": raw.tobytes().hex(), "values": [float(v) for v in vals]})

out.write_text(json.dumps({"smollm2": {"metadata": meta, "tensor_count": len(r.tensors), "tensors": tensors}, "blocks": blocks}, indent=1) + "\n")
print(out, out.stat().st_size, file=sys.stderr)
