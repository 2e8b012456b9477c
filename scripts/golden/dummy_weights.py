"""Deterministic dummy weights: the NumPy twin of crates/pagoda-model/src/loader/dummy.rs.

Both sides must produce bit-identical float32 values for a tensor name and shape:
  seed = FNV-1a 64 of the name's UTF-8 bytes
  z = seed + (i + 1) * 0x9E3779B97F4A7C15            (wrapping u64, i = row-major index)
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
  z = (z ^ (z >> 27)) * 0x94D049BB133111EB
  z = z ^ (z >> 31)
  u = (z >> 40) / 2**24 (float32, exact);  r = 2u - 1 (float32, exact)
  rank >= 2: r * float32(sqrt(3 / cols))   (cols = last dim, sqrt in float64)
  1-D with "norm" in the name and ending ".weight": 1 + 0.1 r (float32)
  other 1-D: 0.1 r (float32)

Check against the Rust constants:  /work/refenv/bin/python scripts/golden/dummy_weights.py
"""

import math
import sys

import numpy as np

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
MASK = (1 << 64) - 1


def fnv1a64(name: str) -> int:
    h = FNV_OFFSET
    for b in name.encode("utf-8"):
        h = ((h ^ b) * FNV_PRIME) & MASK
    return h


def uniform(seed: int, idx: np.ndarray) -> np.ndarray:
    """r in [-1, 1) (float32) for the uint64 element indices `idx`."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (idx.astype(np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    u = (z >> np.uint64(40)).astype(np.float32) / np.float32(16777216.0)
    return np.float32(2.0) * u - np.float32(1.0)


def dummy_values(name: str, shape) -> np.ndarray:
    """The dummy tensor `name` of `shape`, float32, row-major."""
    shape = tuple(int(s) for s in shape)
    numel = int(np.prod(shape, dtype=np.int64)) if shape else 1
    r = uniform(fnv1a64(name), np.arange(numel, dtype=np.uint64))
    if len(shape) >= 2:
        a = np.float32(math.sqrt(3.0 / max(shape[-1], 1)))
        v = r * a
    elif "norm" in name and name.endswith(".weight"):
        v = np.float32(1.0) + np.float32(0.1) * r
    else:
        v = np.float32(0.1) * r
    return v.astype(np.float32).reshape(shape)


# (name, shape, flat index, expected float32 bits): the table NUMPY_VALUES in
# crates/pagoda-model/src/loader/dummy_tests.rs, which the Rust side asserts too.
CHECKS = [
    ("model.embed_tokens.weight", (512, 64), 0, 0xBD644827),
    ("model.embed_tokens.weight", (512, 64), 1, 0xBD9F9C14),
    ("model.embed_tokens.weight", (512, 64), 63, 0x3D6B0E87),
    ("model.embed_tokens.weight", (512, 64), 64, 0xBE4996A1),
    ("model.embed_tokens.weight", (512, 64), 32767, 0xBE5A3A28),
    ("model.layers.0.input_layernorm.weight", (64,), 0, 0x3F7C9717),
    ("model.layers.0.input_layernorm.weight", (64,), 5, 0x3F705CA8),
    ("model.layers.0.input_layernorm.weight", (64,), 63, 0x3F8A33B5),
    ("model.layers.1.self_attn.q_proj.bias", (64,), 0, 0xBCEE6700),
    ("model.layers.1.self_attn.q_proj.bias", (64,), 7, 0x3D2DB0DA),
    ("model.layers.0.mlp.down_proj.weight", (64, 128), 0, 0xBCA52B18),
    ("model.layers.0.mlp.down_proj.weight", (64, 128), 8191, 0x3E0E8223),
    ("model.decoder.final_layer_norm.bias", (64,), 3, 0x3D4283D7),
    ("model.layers.0.self_attn.q_norm.weight", (32,), 31, 0x3F7FFF0D),
    ("lm_head.weight", (300, 512), 65535, 0xBC2F6A0A),
    ("lm_head.weight", (300, 512), 65536, 0xBB0AC542),
    ("lm_head.weight", (300, 512), 153599, 0xBD038042),
]

# fnv1a64 reference vectors (the first two are the published FNV-1a 64 ones).
FNV_CHECKS = [("", 0xCBF29CE484222325), ("a", 0xAF63DC4C8601EC8C), ("model.embed_tokens.weight", 0xA88FD795D5C6D156)]

# uniform(fnv1a64("model.embed_tokens.weight"), idx) bits at large indices.
UNIFORM_CHECKS = [(123456789, 0x3F1499B4), (155582463, 0x3F7BC5D8)]


def _self_check() -> int:
    bad = 0
    for name, shape, idx, bits in CHECKS:
        got = dummy_values(name, shape).reshape(-1)[idx]
        got_bits = int(np.array(got, dtype=np.float32).view(np.uint32))
        if got_bits != bits:
            print(f"MISMATCH {name} {shape} [{idx}]: {got!r} bits {got_bits:#010x} != {bits:#010x}")
            bad += 1
    for text, h in FNV_CHECKS:
        if fnv1a64(text) != h:
            print(f"MISMATCH fnv1a64({text!r}) = {fnv1a64(text):#x} != {h:#x}")
            bad += 1
    seed = fnv1a64("model.embed_tokens.weight")
    for idx, b in UNIFORM_CHECKS:
        got = int(uniform(seed, np.array([idx], dtype=np.uint64)).view(np.uint32)[0])
        if got != b:
            print(f"MISMATCH uniform[{idx}] bits {got:#010x} != {b:#010x}")
            bad += 1
    total = len(CHECKS) + len(FNV_CHECKS) + len(UNIFORM_CHECKS)
    print(f"dummy_weights: {total - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(_self_check())
