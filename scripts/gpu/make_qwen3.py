#!/usr/bin/env python3
"""Builds a small random Qwen3 with transformers and writes PyTorch's reference
outputs for crates/pagoda-engine/tests/cuda_qwen3_torch.rs.

The model (torch.manual_seed(0), random init, bfloat16) is saved with
save_pretrained to OUT_DIR (default /tmp/qwen3-small). The reference is computed
in float32 from those saved bf16 weights, on the GPU when there is one, and
written to OUT_DIR/reference.json: for 8 prompts of random token ids, the last
prompt position's logits and 16 greedy tokens, each with its relative top-1
margin ((top1 - top2) / max |logit|); and, as a yardstick, the relative error
(L2/max-abs) of PyTorch's own bf16 prompt logits against the f32 ones.
"""
import json
import os
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

OUT_DIR = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("PAGODA_QWEN3_DIR", "/tmp/qwen3-small")
NEW_TOKENS = 16
PROMPT_LENS = [1, 7, 19, 33, 64, 100, 130, 250]


def rel_margin(logits):
    top = torch.topk(logits, 2).values
    return float((top[0] - top[1]) / logits.abs().max().clamp_min(1e-6))


def write_tokenizer(out_dir, vocab_size):
    """A byte-level BPE tokenizer.json covering every id of the model (the
    first 256 are the bytes; the rest are two-byte strings no merge
    produces), so `pagoda serve` can serve the directory over text APIs."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    i = len(vocab)
    for a in alphabet:
        for b in alphabet:
            if i >= vocab_size:
                break
            vocab.setdefault(a + b, i)
            i = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.save(os.path.join(out_dir, "tokenizer.json"))


def main():
    t0 = time.time()
    torch.manual_seed(0)
    cfg = Qwen3Config(
        vocab_size=4096,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=64,
        max_position_embeddings=2048,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        # Wider than the default 0.02 so logits spread and greedy picks are
        # rarely near-ties.
        initializer_range=0.05,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    os.makedirs(OUT_DIR, exist_ok=True)
    model.save_pretrained(OUT_DIR)
    write_tokenizer(OUT_DIR, cfg.vocab_size)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = Qwen3ForCausalLM.from_pretrained(OUT_DIR, dtype=torch.float32).to(device).eval()
    # PyTorch's own bf16 run: how far bf16 arithmetic alone moves the logits.
    ref_bf16 = Qwen3ForCausalLM.from_pretrained(OUT_DIR, dtype=torch.bfloat16).to(device).eval()
    bf16_errors = []
    gen = torch.Generator().manual_seed(1)
    prompts = []
    for n in PROMPT_LENS:
        ids = torch.randint(3, cfg.vocab_size, (n,), generator=gen).tolist()
        with torch.no_grad():
            x = torch.tensor([ids], device=device)
            out = ref(input_ids=x, use_cache=True)
            logits = out.logits[0, -1].float()
            past = out.past_key_values
            prompt_logits = logits.cpu().tolist()
            low = ref_bf16(input_ids=x).logits[0, -1].float()
            bf16_l2 = float((low - logits).norm() / logits.norm())
            bf16_errors.append(
                "%.2e/%.2e"
                % (
                    float((low - logits).norm() / logits.norm()),
                    float((low - logits).abs().max() / logits.abs().max()),
                )
            )
            tokens, margins = [], []
            for _ in range(NEW_TOKENS):
                tok = int(torch.argmax(logits))
                tokens.append(tok)
                margins.append(rel_margin(logits))
                out = ref(input_ids=torch.tensor([[tok]], device=device), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1].float()
        prompts.append(
            {
                "prompt_ids": ids,
                "prompt_logits": prompt_logits,
                "output_ids": tokens,
                "margins": margins,
                "torch_bf16_l2": bf16_l2,
            }
        )
    with open(os.path.join(OUT_DIR, "reference.json"), "w") as f:
        json.dump(
            {
                "torch": torch.__version__,
                "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                "config": cfg.to_dict(),
                "prompts": prompts,
                "torch_bf16_prompt_errors": " ".join(bf16_errors),
            },
            f,
        )
    print(
        f"make_qwen3: saved {OUT_DIR} and reference.json ({len(prompts)} prompts, "
        f"{NEW_TOKENS} steps, min margin {min(min(p['margins']) for p in prompts):.3e}) "
        f"in {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
