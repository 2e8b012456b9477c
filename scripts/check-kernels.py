#!/usr/bin/env python3
"""Compiles pagoda's CUDA kernels with NVRTC on a machine without a GPU.

Compiles each compile unit of compile.rs (prelude.cuh, the unit's headers
and .cu files) as its own NVRTC program, as the backend does, catches
compile errors, checks that every kernel of KERNELS is in exactly one
unit's CUBIN, and prints ptxas's resource report (registers, shared memory,
stack frames, spills) per kernel, for sm_90 by default, and each unit's
compile time. Units compile on --jobs threads (NVRTC is thread-safe across
programs; ctypes releases the GIL during the call): --jobs 1 times them one
after another, the default runs them all at once, as a cold start does.
It needs only libnvrtc: `pip install "nvidia-cuda-nvrtc==13.0.*"` into any
virtualenv and pass its lib directory with --nvrtc-dir (or set NVRTC_DIR).

Usage: scripts/check-kernels.py [--arch sm_90] [--nvrtc-dir DIR] [--grep NAME]
                                [--jobs N] [--unit NAME]
"""
import argparse
import ctypes
import glob
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "crates/pagoda-kernels/src/cuda")


def units():
    """[(unit name, program source)] in compile.rs order, and KERNELS."""
    text = open(os.path.join(CUDA_DIR, "compile.rs")).read()
    kernels = re.findall(r'^\s+"([a-z0-9_]+)",$', text.split("const KERNELS")[1].split("];")[0], re.M)
    table = text.split("const UNITS")[1].split("\n];")[0]
    out = []
    for m in re.finditer(r'\(\s*"(\w+)",\s*&\[([^\]]*)\]', table):
        files = ["prelude.cuh"] + re.findall(r'"([^"]+)"', m.group(2))
        src = ""
        for n in files:
            src += f'#line 1 "{n}"\n' + open(os.path.join(CUDA_DIR, "kernels", n)).read() + "\n"
        out.append((m.group(1), src))
    if not out:
        sys.exit("no UNITS table found in compile.rs")
    return out, kernels


def find_nvrtc(d):
    cands = []
    if d:
        cands += glob.glob(os.path.join(d, "libnvrtc.so*"))
    cands += glob.glob(os.path.join(sys.prefix, "lib/python3*/site-packages/nvidia/cu13/lib/libnvrtc.so.13"))
    cands += ["libnvrtc.so.13", "libnvrtc.so"]
    for c in cands:
        if "builtins" in c or "alt" in c:
            continue
        # libnvrtc opens its builtins library by name: load it first from the
        # same directory so no LD_LIBRARY_PATH is needed.
        for b in glob.glob(os.path.join(os.path.dirname(c), "libnvrtc-builtins.so.*")):
            if "alt" not in b:
                try:
                    ctypes.CDLL(b, mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    pass
        try:
            return ctypes.CDLL(c)
        except OSError:
            pass
    sys.exit("cannot open libnvrtc; pip install 'nvidia-cuda-nvrtc==13.0.*' and pass --nvrtc-dir")


def compile_unit(lib, name, src, arch):
    """(nvrtc result, log, CUBIN bytes, seconds, CPU seconds) of one unit
    (the CPU seconds are the whole process's: the unit's own with --jobs 1)."""
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), f"pagoda_{name}.cu".encode(), 0, None, None)
    assert r == 0, r
    opts = [f"--gpu-architecture={arch}", "--std=c++17", "--ptxas-options=-v"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    t, c = time.perf_counter(), time.process_time()
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    dt, cpu = time.perf_counter() - t, time.process_time() - c
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    cubin = b""
    if r == 0:
        size = ctypes.c_size_t()
        lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value)
        lib.nvrtcGetCUBIN(prog, buf)
        cubin = buf.raw
    lib.nvrtcDestroyProgram(ctypes.byref(prog))
    return r, log, cubin, dt, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvrtc-dir", default=os.environ.get("NVRTC_DIR"))
    ap.add_argument("--grep", default=None, help="only report kernels whose name contains this")
    ap.add_argument("--jobs", type=int, default=0, help="units compiled at once (0: all)")
    ap.add_argument("--unit", default=None, help="compile only this unit")
    a = ap.parse_args()
    lib = find_nvrtc(a.nvrtc_dir)
    all_units, kernels = units()
    todo = [u for u in all_units if a.unit is None or u[0] == a.unit]
    if not todo:
        sys.exit(f"no unit {a.unit}; units: {[u[0] for u in all_units]}")
    jobs = a.jobs or len(todo)
    t, c = time.perf_counter(), time.process_time()
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        results = list(pool.map(lambda u: compile_unit(lib, u[0], u[1], a.arch), todo))
    wall, cpu = time.perf_counter() - t, time.process_time() - c
    failed = False
    holders = {k: [] for k in kernels}
    total_bytes = 0
    for (name, _), (r, log, cubin, dt, _) in zip(todo, results):
        if r != 0:
            print(f"unit {name}:\n{log}")
            failed = True
            continue
        total_bytes += len(cubin)
        for k in kernels:
            if f".text.{k}".encode() + b"\0" in cubin:
                holders[k].append(name)
        # ptxas reports "Compiling entry function 'X'" then "Used N registers, ...".
        current = None
        for line in log.splitlines():
            m = re.search(r"Compiling entry function '(\w+)'", line)
            if m:
                current = m.group(1)
            if current and (a.grep is None or a.grep in current):
                if "Used" in line or "spill" in line or "stack frame" in line:
                    print(f"{current}: {line.split('info    :')[-1].strip()}")
            if "warning" in line.lower():
                print(line)
    for (name, _), (r, _, cubin, dt, ucpu) in zip(todo, results):
        own = f", {ucpu:.2f} s CPU" if jobs == 1 else ""
        print(f"unit {name}: {dt:.2f} s{own}, {len(cubin)} bytes of CUBIN")
    print(f"{len(todo)} units on {jobs} threads: {wall:.2f} s wall ({cpu:.2f} s CPU), "
          f"{sum(x[3] for x in results):.2f} s summed, slowest {max(x[3] for x in results):.2f} s")
    if failed:
        sys.exit("compile failed")
    if a.unit is None:
        twice = {k: v for k, v in holders.items() if len(v) > 1}
        missing = [k for k, v in holders.items() if not v]
        if twice:
            sys.exit(f"kernels in more than one unit: {twice}")
        if missing:
            sys.exit(f"kernels listed in compile.rs but missing from every unit: {missing}")
    print(f"ok: {len(kernels)} kernels compiled for {a.arch} in {len(todo)} units "
          f"({total_bytes} bytes of CUBIN)")


if __name__ == "__main__":
    main()
