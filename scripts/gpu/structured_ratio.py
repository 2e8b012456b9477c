#!/usr/bin/env python3
"""The structured-output cost from a structured-bench log.

Usage: structured_ratio.py < LOG. The log holds sections '== round R NAME'
(NAME a schema: the constrained run, or NAME-lengths-plain: the replay of
its realized lengths unconstrained), each followed by the bench's JSON
line. Prints, per schema, every round's constrained and replayed output
tok/s, their ratio and the per-step mask time (median, p99), then the
median ratio over the rounds."""
import json
import statistics
import sys

runs = {}  # (round, name) -> result
section = None
for line in sys.stdin:
    if line.startswith("== round "):
        parts = line.split()
        section = (parts[2], parts[3])
    elif line.startswith("{") and section:
        try:
            runs[section] = json.loads(line)
        except json.JSONDecodeError:
            pass
        section = None

schemas = sorted({n for (_, n) in runs if not n.endswith("-lengths-plain") and n != "plain"})
if not schemas:
    sys.exit("no constrained runs in the log")
for schema in schemas:
    ratios = []
    for rnd in sorted({r for (r, n) in runs if n == schema}):
        c, p = runs.get((rnd, schema)), runs.get((rnd, schema + "-lengths-plain"))
        if not c or not p:
            continue
        ratio = c["output_tok_per_s"] / p["output_tok_per_s"]
        ratios.append(ratio)
        mask = (f"mask ms/step median {c.get('mask_ms_median') or 0:.3f} "
                f"p99 {c.get('mask_ms_p99') or 0:.3f}")
        print(f"{schema} round {rnd}: {c['output_tok_per_s']:.1f} vs {p['output_tok_per_s']:.1f} "
              f"output tok/s = {ratio:.3f}; {c['output_tokens']} tokens; {mask}")
    if ratios:
        print(f"{schema}: median ratio {statistics.median(ratios):.3f} over {len(ratios)} rounds")
