#!/usr/bin/env python3
"""Checks that the CPU-only and the `--features cuda` builds of pagoda run
the same CPU code, with figures that do not depend on the machine's load.

1. Machine code (always): disassembles both binaries (objdump), normalizes
   addresses and symbol hashes, and checks that every function of the CPU
   path in the CPU-only binary (pagoda_kernels::cpu::*, and pagoda_model /
   pagoda_engine code, whose generic functions the CUDA build also has
   for its own backend) has an identical twin of the same name in the CUDA
   binary. A differing SIMD kernel (KERNELS below: the block dot products,
   the vector math, decode attention) fails the check (exit 1); other
   differing functions (code generation units partitioned differently, so
   inlining differs) are listed.
2. --instructions (needs valgrind): instructions per decoded token of each
   binary under cachegrind, single thread, from two runs of `bench single`
   that differ only in --gen-tokens (16 and 48: 64 more decode steps, a
   warm-up and a measured pass of 32 each). Fails above 2% apart. Valgrind
   hides AVX-512, so this counts the AVX2 path; the VNNI kernels are
   covered by step 1. Minutes per binary.
3. --rounds N: N alternating single-thread runs of each binary; prints the
   CPU time of each run (user + system, from wait4: no preemption, unlike
   wall time) and its tg tok/s, min and median.

Usage: scripts/cpu/compare-builds.py [--cpu BIN --cuda BIN] [--instructions]
                                     [--rounds N] [--model GGUF]
Without --cpu/--cuda it builds both (`cargo build --release -p pagoda`
with and without `--features cuda`) and copies them to a temporary folder.
"""
import argparse
import collections
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Functions of the CPU path, by demangled name.
CPU_PATH = re.compile(r"^(<)?(pagoda_kernels::cpu::|pagoda_model::arch::|pagoda_engine::runner::)")
# The SIMD kernels: these must be identical.
KERNELS = re.compile(
    r"^pagoda_kernels::cpu::(quant::x86::|quant::kgemm::x86::|quant::widen::|quant::act::|math::|attention::decode::)"
)
HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
PADDING = ("int3", "nop", "data16", "xchg   %ax,%ax", "cs nop")


def normalize(ins):
    """One instruction without addresses, symbol hashes or LLVM suffixes."""
    if "(%rip)" in ins:
        # Data and GOT references: the displacement and objdump's guess at
        # the nearest symbol both move with the layout.
        ins = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "REL(%rip)", ins.split("#")[0])
    ins = re.sub(r"\b[0-9a-f]+ <", "<", ins)
    ins = re.sub(r"::h[0-9a-f]{16}", "", ins)
    ins = re.sub(r"\.llvm\.[0-9]+", "", ins)
    return ins.strip()


def functions(binary):
    """{name: [normalized body, ...]} of the CPU-path functions of `binary`."""
    proc = subprocess.Popen(
        ["objdump", "-d", "--no-show-raw-insn", "-C", binary], stdout=subprocess.PIPE, text=True
    )
    out = collections.defaultdict(list)
    cur = None
    for line in proc.stdout:
        m = HEADER.match(line)
        if m:
            name = re.sub(r"::h[0-9a-f]{16}$", "", m.group(1))
            cur = [] if CPU_PATH.search(name) else None
            if cur is not None:
                out[name].append(cur)
            continue
        if cur is None:
            continue
        parts = line.rstrip("\n").split("\t", 1)
        if len(parts) == 2 and parts[0].strip().endswith(":"):
            cur.append(normalize(parts[1]))
    if proc.wait() != 0:
        sys.exit(f"objdump failed on {binary}")
    bodies = {}
    for name, lists in out.items():
        for body in lists:
            while body and body[-1].startswith(PADDING):
                body.pop()
        bodies[name] = ["\n".join(b) for b in lists]
    return bodies


def compare_code(cpu_bin, cuda_bin):
    """Step 1; returns the differing kernels."""
    a, b = functions(cpu_bin), functions(cuda_bin)
    same, differ = 0, []
    for name in sorted(a):
        twins = set(b.get(name, []))
        if all(body in twins for body in a[name]):
            same += 1
        else:
            sizes_a = [x.count("\n") + 1 for x in a[name]]
            sizes_b = [x.count("\n") + 1 for x in b.get(name, [])]
            differ.append((name, sizes_a, sizes_b))
    kernels = [d for d in differ if KERNELS.search(d[0])]
    n_kernels = sum(1 for n in a if KERNELS.search(n))
    print(f"machine code: {same} of {len(a)} CPU-path functions identical in both builds; "
          f"SIMD kernels: {n_kernels - len(kernels)} of {n_kernels} identical")
    for name, sa, sb in differ:
        tag = "KERNEL" if KERNELS.search(name) else "differs"
        print(f"  {tag}: {name} (instructions: cpu-only {sa}, cuda {sb})")
    return kernels


def bench_args(model, gen, threads=1, repeats=1):
    return ["bench", "single", "--model", model, "--threads", str(threads),
            "--kv-cache-memory", "256MiB", "--prompt-tokens", "8" if repeats == 1 else "16",
            "--gen-tokens", str(gen), "--repeats", str(repeats)]


def instructions(binary, model, gen, tmp):
    """Instructions of one `bench single` run under cachegrind."""
    out = os.path.join(tmp, f"cg.{os.path.basename(binary)}.{gen}")
    subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no",
                    f"--cachegrind-out-file={out}", binary, *bench_args(model, gen)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for line in open(out):
        if line.startswith("summary:"):
            return int(line.split()[1])
    sys.exit(f"no summary in {out}")


def cpu_seconds(binary, args):
    """(user + system seconds, tg tok/s) of one run."""
    proc = subprocess.Popen([binary, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True)
    stdout = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        sys.exit(f"{binary} failed")
    m = re.search(r'"tg_tok_per_s":([0-9.eE+-]+)', stdout)
    return usage.ru_utime + usage.ru_stime, float(m.group(1)) if m else float("nan")


def build(tmp):
    """Both binaries, copied to `tmp` (each build replaces target/release/pagoda)."""
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    paths = {}
    for tag, extra in (("cpu", []), ("cuda", ["--features", "cuda"])):
        subprocess.run(["cargo", "build", "--release", "-p", "pagoda", *extra], cwd=ROOT, check=True)
        paths[tag] = os.path.join(tmp, f"pagoda-{tag}")
        shutil.copy2(os.path.join(target, "release", "pagoda"), paths[tag])
    return paths["cpu"], paths["cuda"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", help="the CPU-only binary")
    p.add_argument("--cuda", help="the --features cuda binary")
    p.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--instructions", action="store_true", help="count instructions per token (valgrind)")
    p.add_argument("--rounds", type=int, default=0, help="alternating timed runs of each binary")
    a = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="pagoda-builds-")
    try:
        if bool(a.cpu) != bool(a.cuda):
            sys.exit("give both --cpu and --cuda, or neither")
        cpu_bin, cuda_bin = (a.cpu, a.cuda) if a.cpu else build(tmp)
        failed = bool(compare_code(cpu_bin, cuda_bin))
        if a.instructions:
            per_token = {}
            for tag, binary in (("cpu-only", cpu_bin), ("cuda", cuda_bin)):
                short, long_ = (instructions(binary, a.model, g, tmp) for g in (16, 48))
                per_token[tag] = (long_ - short) / 64
                print(f"instructions: {tag}: {short:,} (gen 16), {long_:,} (gen 48), "
                      f"{per_token[tag]:,.0f} per decoded token")
            ratio = per_token["cuda"] / per_token["cpu-only"]
            print(f"instructions per token, cuda / cpu-only: {ratio:.4f}")
            failed |= abs(ratio - 1) > 0.02
        if a.rounds:
            runs = collections.defaultdict(list)
            args = bench_args(a.model, 128, repeats=3)
            for r in range(a.rounds):
                for tag, binary in (("cpu-only", cpu_bin), ("cuda", cuda_bin)):
                    s, tg = cpu_seconds(binary, args)
                    runs[tag].append((s, tg))
                    print(f"round {r + 1} {tag}: {s:.3f} CPU s, tg {tg:.1f} tok/s "
                          f"(load {os.getloadavg()[0]:.1f})", flush=True)
            for tag, v in runs.items():
                cpu_s = [x[0] for x in v]
                tg = [x[1] for x in v]
                print(f"{tag}: CPU s min {min(cpu_s):.3f} median {statistics.median(cpu_s):.3f}; "
                      f"tg tok/s max {max(tg):.1f} median {statistics.median(tg):.1f}")
        print("FAIL" if failed else "OK: both builds run the same CPU kernels")
        return 1 if failed else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
