#!/usr/bin/env python3
"""vLLM offline throughput on several saved workloads in one process (one
start-up), for side-by-side phase figures with `pagoda bench --workload`.

Usage: vllm_phases.py MODEL_DIR WORKLOAD.jsonl... [--max-model-len N]
MODEL_DIR holds a Hugging Face config.json (dummy weights). Each workload is
the JSONL that `pagoda bench --save-workload` writes (prompt_token_ids,
max_tokens, temperature). Every run clears the prefix cache first and prints
one JSON line: the workload, its prompt and output tokens, seconds, and
output and total tokens per second.
"""
import argparse, json, os, time

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("workloads", nargs="+")
    ap.add_argument("--max-model-len", type=int, default=4096)
    a = ap.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    t0 = time.time()
    llm = LLM(a.model, max_model_len=a.max_model_len, dtype="bfloat16", load_format="dummy",
              skip_tokenizer_init=True, generation_config="vllm")
    startup = time.time() - t0
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4, detokenize=False))
    for path in a.workloads:
        reqs = [json.loads(l) for l in open(path) if l.strip()]
        prompts = [TokensPrompt(prompt_token_ids=r["prompt_token_ids"]) for r in reqs]
        params = [SamplingParams(temperature=r.get("temperature", 0.6), ignore_eos=True,
                                 max_tokens=r["max_tokens"], detokenize=False) for r in reqs]
        llm.reset_prefix_cache()
        t = time.time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t = time.time() - t
        inp = sum(len(r["prompt_token_ids"]) for r in reqs)
        out = sum(len(o.outputs[0].token_ids) for o in outs)
        print(json.dumps({"engine": "vllm", "workload": os.path.basename(path), "input_tokens": inp,
                          "output_tokens": out, "seconds": round(t, 3),
                          "output_tok_per_s": round(out / t, 1), "total_tok_per_s": round((inp + out) / t, 1),
                          "startup_s": round(startup, 1)}), flush=True)


if __name__ == "__main__":
    main()
