//! Each dequantizer against blocks built here from the format definitions.
//!
//! For every type the test picks quant values, scales and minimums, packs
//! them into bytes following the block layout of ggml (written out below,
//! element by element), and computes the expected value of every element
//! from the format's formula — the code under test only decodes. A second
//! test compares random blocks with the values of the Python `gguf` package
//! (tests/golden/gguf_reference.json, scripts/golden/gguf_dequant.py).

use half::f16;
use pagoda_gguf::dequant::dequantize_into;
use pagoda_gguf::GgmlType;

/// A small deterministic generator (xorshift64*).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u32) -> u32 {
        (self.next() >> 33) as u32 % n
    }
    /// A scale exactly representable in f16: k / 2^e.
    fn scale(&mut self) -> f32 {
        let k = self.below(15) as f32 + 1.0;
        let e = self.below(6) + 4;
        let s = k / (1u32 << e) as f32;
        if self.below(4) == 0 {
            -s
        } else {
            s
        }
    }
}

fn h(x: f32) -> [u8; 2] {
    let v = f16::from_f32(x);
    assert_eq!(v.to_f32(), x, "test scales must be exact in f16");
    v.to_le_bytes()
}

fn decode(t: GgmlType, block: &[u8]) -> Vec<f32> {
    assert_eq!(block.len(), t.type_size());
    let mut out = vec![f32::NAN; t.block_size()];
    dequantize_into(t, block, &mut out).unwrap();
    out
}

fn assert_close(t: GgmlType, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-6 * w.abs().max(1.0),
            "{t} element {i}: got {g}, expected {w}"
        );
    }
}

#[test]
fn q4_0_and_q4_1() {
    let mut r = Rng(1);
    for _ in 0..20 {
        let (d, m) = (r.scale(), r.scale());
        let q: Vec<u8> = (0..32).map(|_| r.below(16) as u8).collect();
        // Byte j: element j in the low nibble, element j + 16 in the high one.
        let qs: Vec<u8> = (0..16).map(|j| q[j] | (q[j + 16] << 4)).collect();
        let b0 = [&h(d)[..], &qs].concat();
        let want0: Vec<f32> = q.iter().map(|&v| (v as f32 - 8.0) * d).collect();
        assert_close(GgmlType::Q4_0, &decode(GgmlType::Q4_0, &b0), &want0);
        let b1 = [&h(d)[..], &h(m), &qs].concat();
        let want1: Vec<f32> = q.iter().map(|&v| v as f32 * d + m).collect();
        assert_close(GgmlType::Q4_1, &decode(GgmlType::Q4_1, &b1), &want1);
    }
}

/// ggml's `kvalues_iq4nl`, written out here from `ggml-common.h`.
const KVALUES: [f32; 16] = [
    -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0,
    89.0, 113.0,
];

#[test]
fn iq4_nl_and_iq4_xs() {
    let mut r = Rng(11);
    for _ in 0..20 {
        let d = r.scale();
        let q: Vec<u8> = (0..32).map(|_| r.below(16) as u8).collect();
        let qs: Vec<u8> = (0..16).map(|j| q[j] | (q[j + 16] << 4)).collect();
        let b = [&h(d)[..], &qs].concat();
        let want: Vec<f32> = q.iter().map(|&v| d * KVALUES[v as usize]).collect();
        assert_close(GgmlType::IQ4_NL, &decode(GgmlType::IQ4_NL, &b), &want);

        // IQ4_XS: eight sub-blocks of 32 with 6-bit scales (stored + 32):
        // low 4 bits two per byte in scales_l, high 2 bits in scales_h.
        let sc: Vec<u32> = (0..8).map(|_| r.below(64)).collect();
        let scales_h: u16 = (0..8).map(|i| ((sc[i] >> 4) as u16) << (2 * i)).sum();
        let scales_l: Vec<u8> = (0..4)
            .map(|i| ((sc[2 * i] & 15) | ((sc[2 * i + 1] & 15) << 4)) as u8)
            .collect();
        let q: Vec<u8> = (0..256).map(|_| r.below(16) as u8).collect();
        let qs: Vec<u8> = (0..128)
            .map(|i| {
                let (ib, j) = (i / 16, i % 16);
                q[32 * ib + j] | (q[32 * ib + j + 16] << 4)
            })
            .collect();
        let b = [&h(d)[..], &scales_h.to_le_bytes(), &scales_l, &qs].concat();
        let want: Vec<f32> = (0..256)
            .map(|i| d * (sc[i / 32] as f32 - 32.0) * KVALUES[q[i] as usize])
            .collect();
        assert_close(GgmlType::IQ4_XS, &decode(GgmlType::IQ4_XS, &b), &want);
    }
}

#[test]
fn q5_0_and_q5_1() {
    let mut r = Rng(2);
    for _ in 0..20 {
        let (d, m) = (r.scale(), r.scale());
        let q: Vec<u32> = (0..32).map(|_| r.below(32)).collect();
        let qs: Vec<u8> = (0..16)
            .map(|j| ((q[j] & 15) | ((q[j + 16] & 15) << 4)) as u8)
            .collect();
        // qh bit i is the fifth bit of element i.
        let qh: u32 = (0..32).map(|i| (q[i] >> 4) << i).sum();
        let b0 = [&h(d)[..], &qh.to_le_bytes(), &qs].concat();
        let want0: Vec<f32> = q.iter().map(|&v| (v as f32 - 16.0) * d).collect();
        assert_close(GgmlType::Q5_0, &decode(GgmlType::Q5_0, &b0), &want0);
        let b1 = [&h(d)[..], &h(m), &qh.to_le_bytes(), &qs].concat();
        let want1: Vec<f32> = q.iter().map(|&v| v as f32 * d + m).collect();
        assert_close(GgmlType::Q5_1, &decode(GgmlType::Q5_1, &b1), &want1);
    }
}

#[test]
fn q8_0() {
    let mut r = Rng(3);
    let d = r.scale();
    let q: Vec<i8> = (0..32)
        .map(|i| {
            if i == 0 {
                -128
            } else {
                r.below(256) as u8 as i8
            }
        })
        .collect();
    let b = [&h(d)[..], &q.iter().map(|&v| v as u8).collect::<Vec<_>>()].concat();
    let want: Vec<f32> = q.iter().map(|&v| v as f32 * d).collect();
    assert_close(GgmlType::Q8_0, &decode(GgmlType::Q8_0, &b), &want);
}

/// Packs eight 6-bit scales and mins the Q4_K/Q5_K way: pairs 0..4 in the
/// low 6 bits of bytes 0..4 (scales) and 4..8 (mins); pairs 4..8 split into a
/// low nibble in bytes 8..12 (scale low, min high) and 2 top bits stored in
/// the top bits of bytes 0..4 (scales) and 4..8 (mins).
fn pack_k4_scales(sc: &[u32; 8], mn: &[u32; 8]) -> [u8; 12] {
    let mut b = [0u8; 12];
    for s in 0..4 {
        b[s] = (sc[s] | ((sc[s + 4] >> 4) << 6)) as u8;
        b[s + 4] = (mn[s] | ((mn[s + 4] >> 4) << 6)) as u8;
        b[s + 8] = ((sc[s + 4] & 15) | ((mn[s + 4] & 15) << 4)) as u8;
    }
    b
}

#[test]
fn q4_k_and_q5_k() {
    let mut r = Rng(4);
    for _ in 0..10 {
        let (d, dmin) = (r.scale(), r.scale());
        let sc: [u32; 8] = std::array::from_fn(|_| r.below(64));
        let mn: [u32; 8] = std::array::from_fn(|_| r.below(64));
        let q: Vec<u32> = (0..256).map(|_| r.below(32)).collect();
        // Element i lies in sub-block s = i / 32; sub-blocks 2g and 2g+1 share
        // the 32 bytes of group g, as low and high nibbles; for Q5_K bit s of
        // qh[i % 32] is the fifth bit.
        let mut qs = [0u8; 128];
        let mut qh = [0u8; 32];
        for (i, &v) in q.iter().enumerate() {
            let (s, l) = (i / 32, i % 32);
            qs[32 * (s / 2) + l] |= ((v & 15) << (4 * (s % 2))) as u8;
            qh[l] |= ((v >> 4) << s) as u8;
        }
        let scales = pack_k4_scales(&sc, &mn);
        let b4 = [&h(d)[..], &h(dmin), &scales, &qs].concat();
        let want4: Vec<f32> = (0..256)
            .map(|i| d * sc[i / 32] as f32 * (q[i] & 15) as f32 - dmin * mn[i / 32] as f32)
            .collect();
        assert_close(GgmlType::Q4_K, &decode(GgmlType::Q4_K, &b4), &want4);
        let b5 = [&h(d)[..], &h(dmin), &scales, &qh, &qs].concat();
        let want5: Vec<f32> = (0..256)
            .map(|i| d * sc[i / 32] as f32 * q[i] as f32 - dmin * mn[i / 32] as f32)
            .collect();
        assert_close(GgmlType::Q5_K, &decode(GgmlType::Q5_K, &b5), &want5);
    }
}

#[test]
fn q6_k() {
    let mut r = Rng(5);
    for _ in 0..10 {
        let d = r.scale();
        let sc: Vec<i8> = (0..16).map(|_| r.below(256) as u8 as i8).collect();
        let q: Vec<u32> = (0..256).map(|_| r.below(64)).collect();
        // Element i: half hf = i / 128, quarter k = (i % 128) / 32, l = i % 32.
        // Low 4 bits: quarters 0/1 in the low nibbles of ql[64hf + l] /
        // ql[64hf + 32 + l], quarters 2/3 in their high nibbles; high 2 bits
        // at bits 2k of qh[32hf + l]; scale sc[i / 16].
        let mut ql = [0u8; 128];
        let mut qh = [0u8; 64];
        for (i, &v) in q.iter().enumerate() {
            let (hf, k, l) = (i / 128, (i % 128) / 32, i % 32);
            ql[64 * hf + 32 * (k % 2) + l] |= ((v & 15) << (4 * (k / 2))) as u8;
            qh[32 * hf + l] |= ((v >> 4) << (2 * k)) as u8;
        }
        let scb: Vec<u8> = sc.iter().map(|&s| s as u8).collect();
        let b = [&ql[..], &qh, &scb, &h(d)].concat();
        let want: Vec<f32> = (0..256)
            .map(|i| d * sc[i / 16] as f32 * (q[i] as f32 - 32.0))
            .collect();
        assert_close(GgmlType::Q6_K, &decode(GgmlType::Q6_K, &b), &want);
    }
}

#[test]
fn q2_k() {
    let mut r = Rng(6);
    for _ in 0..10 {
        let (d, dmin) = (r.scale(), r.scale());
        let sc: Vec<u32> = (0..16).map(|_| r.below(16)).collect();
        let mn: Vec<u32> = (0..16).map(|_| r.below(16)).collect();
        let q: Vec<u32> = (0..256).map(|_| r.below(4)).collect();
        // Scale byte s: scale in the low nibble, min in the high one, for
        // elements 16s..16s+16. Element i: half hf = i / 128, plane
        // j = (i % 128) / 32 at bits 2j of qs[32hf + i % 32].
        let scales: Vec<u8> = (0..16).map(|s| (sc[s] | (mn[s] << 4)) as u8).collect();
        let mut qs = [0u8; 64];
        for (i, &v) in q.iter().enumerate() {
            qs[32 * (i / 128) + i % 32] |= (v << (2 * ((i % 128) / 32))) as u8;
        }
        let b = [&scales[..], &qs, &h(d), &h(dmin)].concat();
        let want: Vec<f32> = (0..256)
            .map(|i| d * sc[i / 16] as f32 * q[i] as f32 - dmin * mn[i / 16] as f32)
            .collect();
        assert_close(GgmlType::Q2_K, &decode(GgmlType::Q2_K, &b), &want);
    }
}

#[test]
fn q3_k() {
    let mut r = Rng(7);
    for _ in 0..10 {
        let d = r.scale();
        let sc: Vec<u32> = (0..16).map(|_| r.below(64)).collect();
        let v: Vec<i32> = (0..256).map(|_| r.below(8) as i32 - 4).collect();
        // Value v = low2 - 4 * (1 - hbit). Element i: half hf, plane j as for
        // Q2_K; the high bit is bit 4hf + j of hmask[i % 32].
        let mut hmask = [0u8; 32];
        let mut qs = [0u8; 64];
        for (i, &x) in v.iter().enumerate() {
            let (hf, j, k) = (i / 128, (i % 128) / 32, i % 32);
            let (low, hbit) = (((x + 4) & 3) as u8, ((x + 4) >> 2) as u8);
            qs[32 * hf + k] |= low << (2 * j);
            hmask[k] |= hbit << (4 * hf + j);
        }
        // 6-bit scales: low nibbles of scales 0..8 / 8..16 in the low / high
        // nibbles of bytes 0..8; top 2 bits of scale s at bits 2(s/4) of
        // byte 8 + s%4.
        let mut scales = [0u8; 12];
        for (s, &x) in sc.iter().enumerate() {
            scales[s % 8] |= ((x & 15) << (4 * (s / 8))) as u8;
            scales[8 + s % 4] |= ((x >> 4) << (2 * (s / 4))) as u8;
        }
        let b = [&hmask[..], &qs, &scales, &h(d)].concat();
        let want: Vec<f32> = (0..256)
            .map(|i| d * (sc[i / 16] as f32 - 32.0) * v[i] as f32)
            .collect();
        assert_close(GgmlType::Q3_K, &decode(GgmlType::Q3_K, &b), &want);
    }
}

#[test]
fn plain_types_decode_little_endian() {
    let xs = [1.5f32, -2.25, 0.0, 49152.0];
    let bytes: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = [0f32; 4];
    dequantize_into(GgmlType::F32, &bytes, &mut out).unwrap();
    assert_eq!(out, xs);
    let bytes: Vec<u8> = xs
        .iter()
        .flat_map(|&x| f16::from_f32(x).to_le_bytes())
        .collect();
    dequantize_into(GgmlType::F16, &bytes, &mut out).unwrap();
    assert_eq!(out, xs);
    // bf16 is the top half of an f32.
    let bytes: Vec<u8> = xs
        .iter()
        .flat_map(|x| {
            let b = x.to_le_bytes();
            [b[2], b[3]]
        })
        .collect();
    dequantize_into(GgmlType::BF16, &bytes, &mut out).unwrap();
    assert_eq!(out, xs);
    assert_eq!(
        dequantize_into(GgmlType::IQ2_XXS, &[0; 66], &mut [0f32; 256]),
        Err("IQ2_XXS")
    );
}

#[test]
fn many_blocks_in_parallel_match_block_by_block() {
    // More blocks than one rayon task holds, with a ragged last task.
    let t = GgmlType::Q4_K;
    let n_blocks = 300;
    let mut r = Rng(8);
    let mut data = Vec::new();
    for _ in 0..n_blocks {
        data.extend_from_slice(&h(r.scale()));
        data.extend_from_slice(&h(r.scale()));
        data.extend((0..140).map(|_| r.below(256) as u8));
    }
    let mut all = vec![0f32; n_blocks * 256];
    dequantize_into(t, &data, &mut all).unwrap();
    for (b, chunk) in data.chunks_exact(144).enumerate() {
        assert_eq!(
            &all[256 * b..256 * (b + 1)],
            &decode(t, chunk)[..],
            "block {b}"
        );
    }
}

#[test]
fn random_blocks_match_python_gguf() {
    let golden: serde_json::Value =
        serde_json::from_str(include_str!("golden/gguf_reference.json")).unwrap();
    let blocks = golden["blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), 12);
    for b in blocks {
        let name = b["type"].as_str().unwrap();
        let t = (0..64)
            .filter_map(GgmlType::from_id)
            .find(|t| t.name() == name)
            .unwrap();
        let hex = b["hex"].as_str().unwrap();
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let want: Vec<f32> = b["values"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let mut got = vec![0f32; want.len()];
        dequantize_into(t, &bytes, &mut got).unwrap();
        assert_close(t, &got, &want);
    }
}
