#!/usr/bin/env python3
"""PyTorch's own FP8 error on the Qwen3 comparison model, the yardstick of
crates/pagoda-engine/tests/cuda_fp8.rs.

Run on the GPU host after scripts/gpu/make_qwen3.py (same OUT_DIR, default
/tmp/qwen3-small). Loads the saved bf16 model, replaces every dense linear
layer of the decoder (q/k/v/o_proj, gate/up/down_proj; embeddings and the LM
head stay bf16) by pagoda's FP8 scheme computed with torch._scaled_mm: the
weight quantized to float8_e4m3fn with one scale per output channel (amax /
448), the input per token (dynamic, amax / 448), the GEMM with row-wise
scales and a bf16 output. For each prompt of reference.json it writes the
relative L2 error of the last-position logits against PyTorch's f32 ones
to OUT_DIR/fp8_reference.json ("torch_fp8_l2" per prompt).

Usage: python3 scripts/gpu/fp8_torch_error.py [OUT_DIR]
"""
import json
import os
import sys

import torch
from transformers import AutoModelForCausalLM

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def quantize(t):
    """Codes and f32 scales of `t` [rows, cols], one scale per row."""
    amax = t.float().abs().amax(dim=1, keepdim=True)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


class Fp8Linear(torch.nn.Module):
    def __init__(self, lin):
        super().__init__()
        w, s = quantize(lin.weight.data)
        self.w = w  # [out, in]
        self.sw = s.t().contiguous()  # [1, out]
        self.bias = lin.bias

    def forward(self, x):
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        xq, sx = quantize(x2)
        y = torch._scaled_mm(xq, self.w.t(), scale_a=sx, scale_b=self.sw, out_dtype=torch.bfloat16)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], y.shape[-1])


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "/tmp/qwen3-small"
    with open(os.path.join(out_dir, "reference.json")) as f:
        ref = json.load(f)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.bfloat16).to("cuda").eval()
    for name, m in list(model.named_modules()):
        for child, lin in list(m.named_children()):
            if child in LINEARS and isinstance(lin, torch.nn.Linear):
                setattr(m, child, Fp8Linear(lin))
    prompts = []
    with torch.no_grad():
        for p in ref["prompts"]:
            x = torch.tensor([p["prompt_ids"]], device="cuda")
            got = model(input_ids=x).logits[0, -1].float()
            want = torch.tensor(p["prompt_logits"], device="cuda")
            l2 = float((got - want).norm() / want.norm())
            prompts.append({"prompt_len": len(p["prompt_ids"]), "torch_fp8_l2": l2})
            print(f"prompt of {len(p['prompt_ids'])}: PyTorch fp8 logits error {l2:.3e} (relative L2)")
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "prompts": prompts}
    with open(os.path.join(out_dir, "fp8_reference.json"), "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
