"""Golden reference for gemma-3-270m (Q4_K_M GGUF) with Hugging Face transformers.

Rerun (from the repository root; CPU only, float32, a few minutes):

    /work/refenv/bin/python scripts/golden/gemma3_270m.py [path/to/gemma-3-270m-q4_k_m.gguf]

The GGUF (not in the repository) is looked for at the argument, else
$PAGODA_GEMMA3_GGUF, else models/gemma-3-270m-q4_k_m.gguf (scripts/golden/gemma_tokenizer.py
says where to get it). transformers dequantizes it to float32 and undoes llama.cpp's
stored (1 + w) norm weights; the model config comes from the GGUF metadata
(sliding window 512, every 6th layer global, local rope base 10000, query scale 256).

Writes tests/golden/gemma3_270m.json: for each prompt (BOS added, as the GGUF asks)
the prompt ids, 20 greedy tokens (argmax with a KV cache, eager attention, EOS does
not stop decoding) with the top-5 ids and logits of every step and the smallest
top-1/top-2 margin; one prompt is longer than the 512-token window, one is in
Gemma's chat turn format (the GGUF carries no chat template).
"""

import os
import sys

import torch
import transformers as T

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import GOLDEN, ROOT, greedy, r6, setup_torch, versions, write_json  # noqa: E402

STEPS = 20


def gguf_path(argv):
    if len(argv) > 1:
        return argv[1]
    return os.environ.get("PAGODA_GEMMA3_GGUF") or os.path.join(ROOT, "models", "gemma-3-270m-q4_k_m.gguf")


def load_model(d, f):
    """transformers' GGUF loading (config from the metadata, tensors dequantized to
    float32 with the Gemma norm shift undone) without `from_pretrained`, which wants
    accelerate for GGUF files."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    cfg = T.AutoConfig.from_pretrained(d, gguf_file=f)
    cfg._attn_implementation = "eager"
    model = T.Gemma3ForCausalLM(cfg).to(torch.float32)
    parsed = load_gguf_checkpoint(os.path.join(d, f), return_tensors=True, model_to_load=model)
    state = {k: torch.as_tensor(v) for k, v in parsed["tensors"].items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert all(k == "lm_head.weight" for k in missing), missing
    model.tie_weights()
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()
    return model


def main(argv):
    setup_torch()
    path = os.path.abspath(gguf_path(argv))
    d, f = os.path.dirname(path), os.path.basename(path)
    tok = T.AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = load_model(d, f)
    cfg = model.config
    assert cfg.sliding_window == 512 and cfg.layer_types.count("full_attention") == 3, cfg

    story = (
        "The lighthouse keeper had kept a journal for forty years. Every evening he wrote down the "
        "weather, the ships that passed, and one thing he had learned that day. "
    )
    long_text = "".join(f"Day {i}: {story}" for i in range(1, 17)) + "On the last page he wrote:"
    # The GGUF carries no chat template; this is Gemma's turn format, written out.
    chat_text = (
        "<start_of_turn>user\nYou are a helpful assistant.\n\nWhat is the capital of France?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    texts = [
        "The capital of France is",
        "def fibonacci(n):",
        "Once upon a time, in a small village at the edge of a great forest,",
        chat_text,
        long_text,
    ]
    prompts = []
    for text in texts:
        ids = tok(text).input_ids
        toks, recs, _ = greedy(model, ids, STEPS)
        margin = min(r["top_logits"][0] - r["top_logits"][1] for r in recs)
        print(f"{len(ids)} prompt tokens, margin {margin:.4f}: {tok.decode(toks)!r}")
        prompts.append(
            {
                "prompt": text,
                "prompt_ids": ids,
                "output_ids": toks,
                "output_text": tok.decode(toks),
                "min_top2_margin": r6(margin),
                "steps": recs,
            }
        )
    assert len(prompts[-1]["prompt_ids"]) > 600, len(prompts[-1]["prompt_ids"])
    write_json(
        os.path.join(GOLDEN, "gemma3_270m.json"),
        {
            "model": "gemma-3-270m-q4_k_m.gguf",
            "note": "transformers GGUF loader, float32 CPU, eager attention; greedy argmax with a KV cache; "
            "EOS does not stop decoding; step s holds the top-5 of the distribution that picked output_ids[s]; "
            "prompt ids include the BOS the tokenizer adds",
            "versions": versions(),
            "bos_token_id": tok.bos_token_id,
            "eos_token_id": tok.eos_token_id,
            "prompts": prompts,
        },
    )


if __name__ == "__main__":
    main(sys.argv)
