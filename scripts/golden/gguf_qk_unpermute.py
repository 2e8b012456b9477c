#!/usr/bin/env python3
"""Reference values for pagoda-model's GGUF loader: layer 0's q_proj and
k_proj of SmolLM2-135M-Instruct as Hugging Face transformers loads them from
the Q4_1 GGUF (transformers dequantizes and undoes llama.cpp's Q/K row
permutation), plus a few config values.

Writes crates/pagoda-model/tests/golden/smollm2_gguf_qk.json.
Run with /work/refenv/bin/python scripts/golden/gguf_qk_unpermute.py from the repo root.
"""
import json
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

root = Path(__file__).resolve().parents[2]
out = root / "crates" / "pagoda-model" / "tests" / "golden" / "smollm2_gguf_qk.json"

model = AutoModelForCausalLM.from_pretrained(
    str(root / "models"), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf", torch_dtype=torch.float32
)
cfg = model.config
attn = model.model.layers[0].self_attn
cols = [0, 1, 2, 63, 64, 100, 575]
result = {
    "config": {
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": cfg.vocab_size,
        "rope_theta": (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rms_norm_eps": cfg.rms_norm_eps,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    },
    "cols": cols,
}
for name, w, rows in [
    ("model.layers.0.self_attn.q_proj.weight", attn.q_proj.weight, [0, 1, 2, 31, 32, 33, 63, 64, 65, 100, 127, 128, 300, 575]),
    ("model.layers.0.self_attn.k_proj.weight", attn.k_proj.weight, [0, 1, 31, 32, 33, 63, 64, 100, 191]),
]:
    w = w.detach().to(torch.float32)
    result[name] = {
        "shape": list(w.shape),
        "rows": rows,
        "values": [[float(w[r, c]) for c in cols] for r in rows],
        "row_sums": [float(w[r].double().sum()) for r in rows],
    }
out.write_text(json.dumps(result, indent=1) + "\n")
print(out, file=sys.stderr)
