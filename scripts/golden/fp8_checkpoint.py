"""A tiny FP8 checkpoint in the compressed-tensors format, and PyTorch's logits for it.

Rerun (from the repository root, CPU only, a few seconds):

    /work/refenv/bin/python scripts/golden/fp8_checkpoint.py

Writes tests/golden/tiny-qwen3-fp8/: the tiny Qwen3 of tests/golden/tiny-qwen3
with pagoda's dummy weights, its dense linear layers (q/k/v/o_proj,
gate/up/down_proj) stored as llm-compressor's FP8 scheme does: `weight` in
float8_e4m3fn and `weight_scale` [out, 1] float32, one scale per output channel
(amax / 448); embeddings, norms and lm_head stay float32. config.json carries the
compressed-tensors quantization_config (dynamic per-token FP8 activations).

golden.json holds, for the prompts of tiny-qwen3's golden.json, the last-prompt
logits of the same model computed by PyTorch in float32 with the FP8 arithmetic
simulated: every quantized Linear uses the dequantized weight (code * scale) and
sees its input quantize-dequantized per token (scale = amax / 448, round to
nearest even through torch's float8_e4m3fn cast).
"""
import json
import os
import shutil
import sys

import torch
import transformers as T
from safetensors.torch import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402

SRC = "tests/golden/tiny-qwen3"
OUT = "tests/golden/tiny-qwen3-fp8"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


def quantize(t, dim):
    """Codes and scales of `t` with one scale per slice along `dim` (amax / 448)."""
    amax = t.abs().amax(dim=dim, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    codes = (t / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return codes, scale


def main():
    models.setup_torch()
    cfg = T.AutoConfig.from_pretrained(SRC)
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    models.fill_dummy(model)

    tensors = {}
    for name, p in model.state_dict().items():
        if any(f".{l}." in name for l in LINEARS) and name.endswith(".weight"):
            codes, scale = quantize(p.detach(), 1)
            tensors[name] = codes.contiguous()
            tensors[name[: -len("weight")] + "weight_scale"] = scale.float().contiguous()
            with torch.no_grad():
                p.copy_(codes.float() * scale)
        else:
            tensors[name] = p.detach().contiguous()

    def quant_input(module, args):
        (x,) = args
        codes, scale = quantize(x, -1)
        return (codes.float() * scale,)

    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and name.split(".")[-1] in LINEARS:
            m.register_forward_pre_hook(quant_input)

    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    save_file(tensors, os.path.join(OUT, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(SRC, "config.json")) as f:
        config = json.load(f)
    scheme = {"num_bits": 8, "type": "float", "symmetric": True}
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": dict(scheme, strategy="channel", dynamic=False),
                "input_activations": dict(scheme, strategy="token", dynamic=True),
                "output_activations": None,
            }
        },
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
    }
    with open(os.path.join(OUT, "config.json"), "w") as f:
        json.dump(config, f, indent=2, sort_keys=True)
        f.write("\n")
    shutil.copy(os.path.join(SRC, "generation_config.json"), OUT)

    with open(os.path.join(SRC, "golden.json")) as f:
        src_golden = json.load(f)
    prompts = []
    with torch.no_grad():
        for p in src_golden["prompts"]:
            ids = p["prompt_ids"]
            logits = model(torch.tensor([ids])).logits[0, -1]
            prompts.append({"prompt_ids": ids, "last_logits": models.r6list(logits.tolist())})
    models.write_json(os.path.join(OUT, "golden.json"), {"versions": models.versions(), "prompts": prompts})


if __name__ == "__main__":
    main()
