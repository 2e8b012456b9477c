#!/usr/bin/env python3
"""Builds a random Qwen3 with transformers and writes PyTorch's reference
outputs for crates/pagoda-engine/tests/cuda_qwen3_torch.rs.

By default the model has Qwen3-0.6B's shape (28 layers, hidden 1024, 16
query heads, 8 KV heads, head_dim 128, intermediate 3072, vocabulary 151936,
tied embeddings; options change any of them), transformers' own
initialization (initializer_range 0.02 unless --init-range says otherwise)
under torch.manual_seed(0), and is saved in bfloat16 with save_pretrained to
OUT_DIR (default /tmp/qwen3-small). The reference is computed
in float32 from those saved bf16 weights, on the GPU when there is one, and
written to OUT_DIR/reference.json: for 8 prompts of random token ids, the last
prompt position's logits and 16 greedy tokens, each with its relative top-1
margin ((top1 - top2) / max |logit|); and, as a yardstick, the relative error
(L2/max-abs) of PyTorch's own bf16 prompt logits against the f32 ones.

With --arch qwen2 the model is a Qwen2 instead (q/k/v biases, no q/k norm,
head_dim hidden / heads); --qkv-bias-std S draws those biases from N(0, S)
(transformers initializes them to zero), so biases dominate the projections'
bf16 rounding. --prompt-lens and --new-tokens change the prompts and the
greedy steps. For a Qwen2 (or with --bf16-greedy) reference.json also
records how far PyTorch's own bf16 run follows the f32 greedy tokens, fed
the f32 tokens as the test feeds pagoda: per prompt, the steps before the
first step whose bf16 argmax differs from the f32 token where the f32
relative top-1 margin exceeds NEAR_TIE (smaller margins are near-ties and
excused), summed over prompts ("torch_bf16_greedy").
"""
import argparse
import json
import os
import time

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

NEW_TOKENS = 16
PROMPT_LENS = [1, 7, 19, 33, 64, 100, 130, 250]
# The test's near-tie margin (TOL of crates/pagoda-engine/tests/cuda_common).
NEAR_TIE = 1e-2
# Seed of the q/k/v biases' generator (apart from the weights' own seed).
BIAS_SEED = 2


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


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", nargs="?", default=os.environ.get("PAGODA_QWEN3_DIR", "/tmp/qwen3-small"))
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--intermediate", type=int, default=3072)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--arch", choices=["qwen3", "qwen2"], default="qwen3")
    ap.add_argument("--head-dim", type=int, default=None,
                    help="Qwen3 only (default 128); a Qwen2's is hidden / heads")
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--tie", action=argparse.BooleanOptionalAction, default=True,
                    help="tie the LM head to the embedding (as Qwen3-0.6B)")
    ap.add_argument("--init-range", type=float, default=0.02, help="std of the random weights")
    ap.add_argument("--qkv-bias-std", type=float, default=0.0,
                    help="Qwen2 only: std of the random q/k/v biases (default 0: transformers' zeros)")
    ap.add_argument("--prompt-lens", type=lambda s: [int(n) for n in s.split(",")], default=PROMPT_LENS,
                    help="comma-separated prompt lengths (default %s)" % ",".join(map(str, PROMPT_LENS)))
    ap.add_argument("--new-tokens", type=int, default=NEW_TOKENS, help="greedy steps per prompt")
    ap.add_argument("--bf16-greedy", action=argparse.BooleanOptionalAction, default=None,
                    help="record PyTorch bf16's greedy agreement with f32 (default: only for --arch qwen2)")
    args = ap.parse_args()
    if args.arch == "qwen3":
        if args.qkv_bias_std:
            ap.error("--qkv-bias-std needs --arch qwen2")
        args.head_dim = 128 if args.head_dim is None else args.head_dim
    elif args.head_dim is not None and args.head_dim * args.heads != args.hidden:
        ap.error("a Qwen2's head_dim is hidden / heads")
    if args.bf16_greedy is None:
        args.bf16_greedy = args.arch == "qwen2"
    if args.new_tokens < 1 or not args.prompt_lens or min(args.prompt_lens) < 1:
        ap.error("--new-tokens and every prompt length must be at least 1")
    return args


def bf16_greedy_agreement(model, device, ids, tokens, margins):
    """Steps, fed the f32 `tokens` after prompt `ids`, before `model`'s first
    greedy token that differs from the f32 one outside a near-tie."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=True)
        for step, (tok, margin) in enumerate(zip(tokens, margins)):
            if int(torch.argmax(out.logits[0, -1].float())) != tok and margin > NEAR_TIE:
                return step
            if step + 1 < len(tokens):
                x = torch.tensor([[tok]], device=device)
                out = model(input_ids=x, past_key_values=out.past_key_values, use_cache=True)
    return len(tokens)


def main():
    args = parse_args()
    # The reference is true f32: no TF32 in matmuls or convolutions.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    OUT_DIR = args.out_dir
    t0 = time.time()
    torch.manual_seed(0)
    Config, Model = (Qwen3Config, Qwen3ForCausalLM) if args.arch == "qwen3" else (Qwen2Config, Qwen2ForCausalLM)
    shape = {"head_dim": args.head_dim} if args.arch == "qwen3" else {}
    cfg = Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        **shape,
        max_position_embeddings=2048,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=args.tie,
        initializer_range=args.init_range,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    model = Model(cfg)
    if args.qkv_bias_std:
        gen = torch.Generator().manual_seed(BIAS_SEED)
        with torch.no_grad():
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.copy_(torch.randn(proj.bias.shape, generator=gen) * args.qkv_bias_std)
    model = model.to(torch.bfloat16)
    os.makedirs(OUT_DIR, exist_ok=True)
    model.save_pretrained(OUT_DIR)
    write_tokenizer(OUT_DIR, cfg.vocab_size)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    ref = Model.from_pretrained(OUT_DIR, dtype=torch.float32).to(device).eval()
    # PyTorch's own bf16 run: how far bf16 arithmetic alone moves the logits.
    ref_bf16 = Model.from_pretrained(OUT_DIR, dtype=torch.bfloat16).to(device).eval()
    bf16_errors = []
    gen = torch.Generator().manual_seed(1)
    prompts = []
    for n in args.prompt_lens:
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
            for _ in range(args.new_tokens):
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
        if args.bf16_greedy:
            prompts[-1]["torch_bf16_greedy_agree"] = bf16_greedy_agreement(ref_bf16, device, ids, tokens, margins)
    reference = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "config": cfg.to_dict(),
        "prompts": prompts,
        "torch_bf16_prompt_errors": " ".join(bf16_errors),
    }
    greedy = ""
    if args.bf16_greedy:
        agree = sum(p["torch_bf16_greedy_agree"] for p in prompts)
        steps = len(prompts) * args.new_tokens
        reference["qkv_bias_std"] = args.qkv_bias_std
        reference["torch_bf16_greedy"] = {"agree": agree, "steps": steps, "near_tie_margin": NEAR_TIE}
        greedy = f"; PyTorch bf16 follows f32 greedy for {agree} of {steps} steps before a non-near-tie difference"
    with open(os.path.join(OUT_DIR, "reference.json"), "w") as f:
        json.dump(reference, f)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    arch_note = "" if args.arch == "qwen3" else f"qwen2, q/k/v bias std {args.qkv_bias_std}, "
    print(
        f"make_qwen3: saved {OUT_DIR} and reference.json ({arch_note}{cfg.num_hidden_layers} layers, hidden "
        f"{cfg.hidden_size}, head_dim {head_dim}, init {cfg.initializer_range}; {len(prompts)} prompts, "
        f"{args.new_tokens} steps, min margin {min(min(p['margins']) for p in prompts):.3e}; "
        f"PyTorch bf16 vs f32 prompt logits (L2/max-abs): {' '.join(bf16_errors)}{greedy}) "
        f"in {time.time() - t0:.1f}s"
    )


if __name__ == "__main__":
    main()
