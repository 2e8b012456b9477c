#!/usr/bin/env python3
"""transformers' continuous batching (generate_batch over a paged cache) on a
Qwen3 model of the given config with random bf16 weights: the peer figure the
pagoda bench is compared with on the same GPU.

Workload: N prompts of random token ids, lengths uniform in [min_in, max_in]
(seeded), exactly `new` tokens each (min_new_tokens = max_new_tokens, so an
early EOS cannot shorten the run). Prints one JSON line with the output
tokens, seconds and output tok/s.

Usage: hf_generate_batch.py CONFIG.json [--num-seqs 256] [--min-input 100]
       [--max-input 1024] [--new 256] [--attn paged|sdpa]
"""
import argparse
import json
import random
import sys
import time

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.generation import GenerationConfig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--num-seqs", type=int, default=256)
    ap.add_argument("--min-input", type=int, default=100)
    ap.add_argument("--max-input", type=int, default=1024)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--attn", default="paged|sdpa")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    torch.manual_seed(a.seed)
    cfg = AutoConfig.from_pretrained(a.config)
    model = None
    errors = []
    for attn in [a.attn, "sdpa_paged", "paged_attention"]:
        try:
            model = AutoModelForCausalLM.from_config(
                cfg, attn_implementation=attn, dtype=torch.bfloat16
            ).to("cuda").eval()
            a.attn = attn
            break
        except Exception as e:  # try the next spelling of the paged backend
            errors.append(f"{attn}: {e}")
    if model is None:
        sys.exit("no paged attention implementation accepted: " + "; ".join(errors))

    rng = random.Random(a.seed)
    vocab = cfg.vocab_size
    prompts = [
        [rng.randrange(vocab) for _ in range(rng.randint(a.min_input, a.max_input))]
        for _ in range(a.num_seqs)
    ]
    gen = GenerationConfig(
        max_new_tokens=a.new,
        min_new_tokens=a.new,
        do_sample=False,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=0,
    )
    # A short warm-up run outside the timing (kernels, graphs, allocator).
    with torch.no_grad():
        model.generate_batch(inputs=prompts[:4], generation_config=GenerationConfig(
            max_new_tokens=8, min_new_tokens=8, do_sample=False,
            eos_token_id=cfg.eos_token_id, pad_token_id=0), progress_bar=False)
        torch.cuda.synchronize()
        t = time.perf_counter()
        out = model.generate_batch(inputs=prompts, generation_config=gen, progress_bar=False)
        torch.cuda.synchronize()
        secs = time.perf_counter() - t
    produced = 0
    for r in out.values():
        toks = getattr(r, "generated_tokens", None)
        produced += len(toks) if toks is not None else a.new
    print(json.dumps({
        "engine": f"transformers {transformers.__version__} generate_batch ({a.attn})",
        "gpu": torch.cuda.get_device_name(0),
        "num_seqs": a.num_seqs,
        "input_tokens": sum(map(len, prompts)),
        "output_tokens": produced,
        "seconds": secs,
        "output_tok_per_s": produced / secs,
    }))


if __name__ == "__main__":
    main()
