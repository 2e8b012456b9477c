"""Golden prompt logprobs (vLLM's `prompt_logprobs`) of the tiny Llama, by transformers.

Rerun (from the repository root; CPU only, float32, seconds):

    /work/refenv/bin/python scripts/golden/prompt_logprobs.py

Writes tests/golden/tiny-llama/prompt_logprobs.json: the tiny Llama of
tests/golden/tiny-llama/config.json with pagoda's dummy weights (fill_dummy), one
forward pass over each prompt (random token ids; eager attention), then a float32
log-softmax of the logits at every position: for each prompt token after the first,
its logprob and rank (1 + the number of tokens with a higher logit) given the tokens
before it, and the 5 most likely tokens with their logprobs. Floats are rounded to 6
significant digits.
"""

import os
import sys

import torch
import transformers as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import numpy as np  # noqa: E402

from models import GOLDEN, fill_dummy, r6, r6list, setup_torch, versions, write_json  # noqa: E402


def prompt_logprobs(model, ids, top_k=5):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    out = []
    for p in range(len(ids) - 1):
        t = ids[p + 1]
        top = torch.topk(lp[p], top_k)
        out.append(
            {
                "token": t,
                "logprob": r6(lp[p, t].item()),
                "rank": int((logits[p] > logits[p, t]).sum().item()) + 1,
                "top_ids": top.indices.tolist(),
                "top_logprobs": r6list(top.values.tolist()),
            }
        )
    return out


def main():
    setup_torch()
    cfg = T.AutoConfig.from_pretrained(os.path.join(GOLDEN, "tiny-llama"))
    model = T.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    model.eval()
    fill_dummy(model)
    rng = np.random.default_rng(7)
    cases = []
    for n in [23, 70]:
        ids = rng.integers(0, cfg.vocab_size, size=n).tolist()
        cases.append({"prompt_ids": ids, "entries": prompt_logprobs(model, ids)})
    write_json(
        os.path.join(GOLDEN, "tiny-llama", "prompt_logprobs.json"),
        {
            "note": "entries[k] is prompt token k+1 given tokens 0..=k: float32 log-softmax of "
            "one forward pass over the whole prompt; dummy weights",
            "versions": versions(),
            "cases": cases,
        },
    )


if __name__ == "__main__":
    main()
