//! Property tests of the radix prefix cache against a naive model: the list of
//! stored sequences (longest common prefix by brute force) and a simulated KV
//! cache whose slots record which prefix they were computed for. With KV
//! cache groups (one page per group for each block index, block-granular,
//! windowed groups' pages possibly released before the insert), every
//! group's pages are checked the same way, tagged with their group.

use pagoda_core::block_pool::{BlockId, BlockPool};
use pagoda_core::radix_cache::{NodeId, RadixCache};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    Insert(Vec<u32>),
    Match(Vec<u32>),
    Lock(Vec<u32>),
    Unlock(usize),
    Evict(usize),
}

fn tokens() -> impl Strategy<Value = Vec<u32>> {
    prop::collection::vec(0u32..3, 0..20)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => tokens().prop_map(Op::Insert),
        3 => tokens().prop_map(Op::Match),
        1 => tokens().prop_map(Op::Lock),
        1 => any::<usize>().prop_map(Op::Unlock),
        1 => (1usize..8).prop_map(Op::Evict),
    ]
}

/// Identifies the K/V of the last token of `prefix` (it depends on the whole prefix).
fn kv_of(prefix: &[u32]) -> u64 {
    prefix.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &t| {
        (h ^ (t as u64 + 1)).wrapping_mul(0x100_0000_01b3)
    })
}

/// The simulated K/V of `prefix`'s last position in KV cache group `g`.
fn group_kv_of(g: usize, prefix: &[u32]) -> u64 {
    kv_of(prefix) ^ (g as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
}

struct Model {
    tree: RadixCache,
    /// KV cache groups past group 0.
    extra: usize,
    pool: BlockPool,
    /// Simulated KV: one entry per slot.
    kv: Vec<Option<u64>>,
    stored: Vec<Vec<u32>>,
    evicted: bool,
    locked: Vec<(NodeId, Vec<u32>)>,
}

impl Model {
    fn bs(&self) -> usize {
        self.pool.block_size()
    }

    fn slot(&self, b: BlockId, off: usize) -> usize {
        b.index() * self.bs() + off
    }

    fn insert(&mut self, seq: &[u32]) {
        let bs = self.bs();
        let n = seq.len().div_ceil(bs);
        // Each extra group released a leading run of its pages (a window
        // passed them) before the insert: those are NULL.
        let holes: Vec<usize> = (0..self.extra)
            .map(|g| (kv_of(seq) >> (8 * g)) as usize % (n + 1))
            .collect();
        let need = n + holes.iter().map(|h| n - h).sum::<usize>();
        if self.pool.num_free() < need {
            self.tree.evict(&mut self.pool, need).unwrap();
            self.evicted = true;
            if self.pool.num_free() < need {
                return;
            }
        }
        let blocks: Vec<_> = (0..n).map(|_| self.pool.allocate().unwrap()).collect();
        let groups: Vec<Vec<BlockId>> = holes
            .iter()
            .map(|&h| {
                (0..n)
                    .map(|i| {
                        if i < h {
                            BlockId::NULL
                        } else {
                            self.pool.allocate().unwrap()
                        }
                    })
                    .collect()
            })
            .collect();
        let tables = std::iter::once(&blocks).chain(&groups);
        for (g, table) in tables.enumerate() {
            for p in 0..seq.len() {
                let b = table[p / bs];
                if !b.is_null() {
                    let s = self.slot(b, p % bs);
                    self.kv[s] = Some(group_kv_of(g, &seq[..=p]));
                }
            }
        }
        let group_refs: Vec<&[BlockId]> = groups.iter().map(|g| &g[..]).collect();
        self.tree
            .insert_groups(&mut self.pool, NodeId::ROOT, seq, &blocks, &group_refs)
            .unwrap();
        for b in blocks.into_iter().chain(groups.into_iter().flatten()) {
            if !b.is_null() {
                self.pool.decref(b).unwrap();
            }
        }
        self.stored.push(seq.to_vec());
    }

    fn check_match(&mut self, q: &[u32]) -> (NodeId, usize) {
        let m = self.tree.match_prefix(q);
        let naive = self
            .stored
            .iter()
            .map(|s| s.iter().zip(q).take_while(|(a, b)| a == b).count())
            .max()
            .unwrap_or(0);
        let bs = self.bs();
        // With groups, reuse is block-granular and only whole blocks are stored.
        let naive = if self.extra > 0 {
            let stored_whole = self
                .stored
                .iter()
                .map(|s| {
                    let whole = s.len() / bs * bs;
                    s[..whole].iter().zip(q).take_while(|(a, b)| a == b).count()
                })
                .max()
                .unwrap_or(0);
            stored_whole / bs * bs
        } else {
            naive
        };
        if self.evicted {
            assert!(m.num_tokens <= naive);
        } else {
            assert_eq!(m.num_tokens, naive, "match_prefix vs naive LCP");
        }
        assert_eq!(m.blocks.len(), m.num_tokens / bs);
        assert_eq!(m.partial_block.is_some(), !m.num_tokens.is_multiple_of(bs));
        assert_eq!(m.group_blocks.len(), self.extra);
        for (g, pages) in m.group_blocks.iter().enumerate() {
            assert_eq!(pages.len(), m.blocks.len());
            for p in 0..m.num_tokens {
                let b = pages[p / bs];
                if !b.is_null() {
                    assert!(self.pool.ref_count(b) > 0, "matched page is held");
                    assert_eq!(
                        self.kv[self.slot(b, p % bs)],
                        Some(group_kv_of(g + 1, &q[..=p])),
                        "K/V of position {p} in group {}",
                        g + 1
                    );
                }
            }
        }
        assert_eq!(self.tree.node_end(m.node), Some(m.num_tokens));
        for p in 0..m.num_tokens {
            let b = m.blocks.get(p / bs).copied().or(m.partial_block).unwrap();
            assert!(
                self.pool.ref_count(b) > 0,
                "matched block is held by the tree"
            );
            assert_eq!(
                self.kv[self.slot(b, p % bs)],
                Some(kv_of(&q[..=p])),
                "K/V of position {p}"
            );
        }
        (m.node, m.num_tokens)
    }

    fn check(&self) {
        let refs = self.tree.check_invariants(&self.pool).unwrap();
        self.pool.check_invariants().unwrap();
        for b in 0..self.pool.num_blocks() as u32 {
            let b = BlockId(b);
            assert_eq!(
                self.pool.ref_count(b),
                refs.get(&b).copied().unwrap_or(0),
                "block {b}"
            );
        }
        for (node, toks) in &self.locked {
            assert_eq!(
                self.tree.node_tokens(*node).as_ref(),
                Some(toks),
                "locked node kept"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn radix_cache_agrees_with_naive_model(bs in 1usize..6, num_blocks in 8usize..48,
                                           ops in prop::collection::vec(op(), 1..60)) {
        run_model(bs, num_blocks, 0, ops)?;
    }

    /// KV cache groups: every group's pages (with holes) against the model.
    #[test]
    fn grouped_radix_cache_agrees_with_naive_model(bs in 1usize..6, num_blocks in 8usize..96,
                                                   extra in 1usize..3,
                                                   ops in prop::collection::vec(op(), 1..60)) {
        run_model(bs, num_blocks, extra, ops)?;
    }
}

fn run_model(
    bs: usize,
    num_blocks: usize,
    extra: usize,
    ops: Vec<Op>,
) -> Result<(), TestCaseError> {
    let mut m = Model {
        extra,
        tree: RadixCache::with_groups(bs, 1 + extra),
        pool: BlockPool::new(num_blocks, bs),
        kv: vec![None; num_blocks * bs],
        stored: Vec::new(),
        evicted: false,
        locked: Vec::new(),
    };
    for op in ops {
        match op {
            Op::Insert(seq) => m.insert(&seq),
            Op::Match(q) => {
                m.check_match(&q);
            }
            Op::Lock(q) => {
                let (node, len) = m.check_match(&q);
                m.tree.inc_lock_ref(node).unwrap();
                m.locked.push((node, q[..len].to_vec()));
            }
            Op::Unlock(i) => {
                if !m.locked.is_empty() {
                    let (node, _) = m.locked.swap_remove(i % m.locked.len());
                    m.tree.dec_lock_ref(node).unwrap();
                }
            }
            Op::Evict(k) => {
                let target = m.pool.num_free() + k;
                m.tree.evict(&mut m.pool, target).unwrap();
                m.evicted = true;
            }
        }
        m.check();
    }
    for (node, _) in std::mem::take(&mut m.locked) {
        m.tree.dec_lock_ref(node).unwrap();
    }
    m.tree.flush(&mut m.pool).unwrap();
    prop_assert_eq!(m.pool.num_free(), num_blocks);
    prop_assert_eq!(m.tree.num_tokens(), 0);
    m.check();
    Ok(())
}
