#!/usr/bin/env python3
"""One line per JSON result of a pagoda/transformers benchmark log.

Usage: summarize.py NAME < LOG (reads the lines that start with '{')."""
import json
import sys

name = sys.argv[1]
found = False
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    try:
        d = json.loads(line)
    except json.JSONDecodeError:
        continue
    found = True
    if "tg_tok_per_s" in d:
        tg = d["tg_tok_per_s"]
        print(f"{name}: pp{d['prompt_tokens']} {d['pp_tok_per_s']:.0f} tok/s, tg{d['gen_tokens']} "
              f"{tg:.1f} tok/s ({1000 / max(tg, 1e-9):.2f} ms/token) on {d['backend']}")
    elif "ms_per_step_median" in d:
        print(f"{name}: batch {d['batch']} ctx {d['context']}: {d['ms_per_step_median']:.3f} ms/step "
              f"(min {d['ms_per_step_min']:.3f}), {d['tok_per_s']:.0f} tok/s, graphs {d['graphs']}")
    elif "mean_ttft_ms" in d:
        print(f"{name}: {d['completed']} done / {d['failed']} failed, {d['output_tok_per_s']:.0f} output tok/s, "
              f"TTFT p50 {d['p50_ttft_ms']} ms, ITL p50 {d['p50_itl_ms']} ms")
    elif "engine" in d:
        print(f"{name}: {d['engine']} on {d['gpu']}: {d['output_tokens']} tokens in {d['seconds']:.1f}s = "
              f"{d['output_tok_per_s']:.0f} output tok/s")
    elif "num_seqs" in d:
        print(f"{name}: {d.get('num_seqs')} seqs, {d.get('input_tokens')} in / {d.get('output_tokens')} out "
              f"in {d.get('seconds', 0):.2f}s: {d.get('output_tok_per_s', 0):.0f} output tok/s, "
              f"{d.get('total_tok_per_s', 0):.0f} total tok/s, {d.get('preemptions')} preemptions")
if not found:
    print(f"{name}: no JSON result")
