#!/usr/bin/env python3
"""Compiles pagoda's CUDA kernels with NVRTC on a machine without a GPU.

Catches compile errors and prints ptxas's resource report (registers, shared
memory, stack frames, spills) per kernel, for sm_90 by default. It needs only
libnvrtc: `pip install "nvidia-cuda-nvrtc==13.0.*"` into any virtualenv and
pass its lib directory with --nvrtc-dir (or set NVRTC_DIR).

Usage: scripts/check-kernels.py [--arch sm_90] [--nvrtc-dir DIR] [--grep NAME]
"""
import argparse
import ctypes
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUDA_DIR = os.path.join(ROOT, "crates/pagoda-kernels/src/cuda")


def sources():
    text = open(os.path.join(CUDA_DIR, "compile.rs")).read()
    names = re.findall(r'include_str!\("kernels/([^"]+)"\)', text)
    kernels = re.findall(r'^\s+"([a-z0-9_]+)",$', text.split("KERNELS")[1].split("];")[0], re.M)
    src = ""
    for n in names:
        src += f'#line 1 "{n}"\n' + open(os.path.join(CUDA_DIR, "kernels", n)).read() + "\n"
    return src, kernels


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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--nvrtc-dir", default=os.environ.get("NVRTC_DIR"))
    ap.add_argument("--grep", default=None, help="only report kernels whose name contains this")
    a = ap.parse_args()
    lib = find_nvrtc(a.nvrtc_dir)
    src, kernels = sources()
    prog = ctypes.c_void_p()
    r = lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"pagoda_kernels.cu", 0, None, None)
    assert r == 0, r
    opts = [f"--gpu-architecture={a.arch}", "--std=c++17", "--ptxas-options=-v"]
    arr = (ctypes.c_char_p * len(opts))(*[o.encode() for o in opts])
    r = lib.nvrtcCompileProgram(prog, len(opts), arr)
    size = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetProgramLog(prog, log)
    log = log.value.decode(errors="replace")
    if r != 0:
        print(log)
        sys.exit(f"compile failed (nvrtc error {r})")
    size = ctypes.c_size_t()
    lib.nvrtcGetCUBINSize(prog, ctypes.byref(size))
    cubin = ctypes.create_string_buffer(size.value)
    lib.nvrtcGetCUBIN(prog, cubin)
    missing = [k for k in kernels if k.encode() + b"\0" not in cubin.raw]
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
    if missing:
        sys.exit(f"kernels listed in compile.rs but missing from the module: {missing}")
    print(f"ok: {len(kernels)} kernels compiled for {a.arch} ({size.value} bytes of CUBIN)")


if __name__ == "__main__":
    main()
