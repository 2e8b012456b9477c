#!/usr/bin/env python3
"""vLLM offline throughput on the nano-vllm workload, with random (dummy) weights and token-id
prompts, so no weights or tokenizer travel.

Usage: vllm_bench.py MODEL_DIR [--workload FILE] [--runs N] [--attention-backend NAME]
       [--kv-cache-dtype auto|fp8] [--quantization fp8]
MODEL_DIR holds a Hugging Face config.json. Without --workload: nano-vllm's bench.py draw
(Python random, seed 0, 256 prompts of U[100,1024] ids in [0,10000], max_tokens U[100,1024],
temperature 0.6, ignore_eos). With --workload: a JSONL file, one request a line:
{"prompt_token_ids": [...], "max_tokens": N, "temperature": T} (temperature optional, 0.6).
Each run clears the prefix cache first; prints one JSON line per run.
The peer bundle's bench_vllm.py with the KV cache dtype and quantization as options; vLLM
imports compressed-tensors for any quantized model, which the bundle lacks: unpack
scripts/gpu/vllm-extras.sh's extras.tar.gz beside it.
"""
import argparse, json, os, random, time

os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")  # flashinfer is not in the bundle
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")


def workload(path):
    if path:
        reqs = [json.loads(l) for l in open(path) if l.strip()]
        return [(r["prompt_token_ids"], r["max_tokens"], r.get("temperature", 0.6)) for r in reqs]
    random.seed(0)
    prompts = [[random.randint(0, 10000) for _ in range(random.randint(100, 1024))] for _ in range(256)]
    return [(p, random.randint(100, 1024), 0.6) for p in prompts]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--workload")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--attention-backend")
    ap.add_argument("--kv-cache-dtype", default="auto")
    ap.add_argument("--quantization")
    a = ap.parse_args()
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt
    extra = {"attention_backend": a.attention_backend} if a.attention_backend else {}
    if a.quantization:
        extra["quantization"] = a.quantization
    t0 = time.time()
    llm = LLM(a.model, max_model_len=a.max_model_len, dtype="bfloat16", load_format="dummy",
              skip_tokenizer_init=True, generation_config="vllm", kv_cache_dtype=a.kv_cache_dtype, **extra)
    startup = time.time() - t0
    reqs = workload(a.workload)
    prompts = [TokensPrompt(prompt_token_ids=p) for p, _, _ in reqs]
    params = [SamplingParams(temperature=t, ignore_eos=True, max_tokens=m, detokenize=False) for _, m, t in reqs]
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3])], SamplingParams(max_tokens=4, detokenize=False))
    for run in range(a.runs):
        llm.reset_prefix_cache()
        t = time.time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        t = time.time() - t
        out_tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        print(json.dumps({"engine": "vllm 0.26.0", "kv_cache_dtype": a.kv_cache_dtype, "quantization": a.quantization, "run": run, "num_seqs": len(reqs),
                          "input_tokens": sum(len(p) for p, _, _ in reqs), "output_tokens": out_tokens,
                          "seconds": round(t, 3), "output_tok_per_s": round(out_tokens / t, 1),
                          "startup_s": round(startup, 1)}), flush=True)


if __name__ == "__main__":
    main()
