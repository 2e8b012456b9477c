//! Property tests of the radix prefix cache against a naive model: the list of
//! stored sequences (longest common prefix by brute force) and a simulated KV
//! cache whose slots record which prefix they were computed for.

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

struct Model {
    tree: RadixCache,
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
        let need = seq.len().div_ceil(self.bs());
        if self.pool.num_free() < need {
            self.tree.evict(&mut self.pool, need).unwrap();
            self.evicted = true;
            if self.pool.num_free() < need {
                return;
            }
        }
        let blocks: Vec<_> = (0..need).map(|_| self.pool.allocate().unwrap()).collect();
        for p in 0..seq.len() {
            let s = self.slot(blocks[p / self.bs()], p % self.bs());
            self.kv[s] = Some(kv_of(&seq[..=p]));
        }
        self.tree
            .insert(&mut self.pool, NodeId::ROOT, seq, &blocks)
            .unwrap();
        for b in blocks {
            self.pool.decref(b).unwrap();
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
        if self.evicted {
            assert!(m.num_tokens <= naive);
        } else {
            assert_eq!(m.num_tokens, naive, "match_prefix vs naive LCP");
        }
        let bs = self.bs();
        assert_eq!(m.blocks.len(), m.num_tokens / bs);
        assert_eq!(m.partial_block.is_some(), !m.num_tokens.is_multiple_of(bs));
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
        let mut m = Model {
            tree: RadixCache::new(bs),
            pool: BlockPool::new(num_blocks, bs),
            kv: vec![None; num_blocks * bs],
            stored: Vec::new(),
            evicted: false,
            locked: Vec::new(),
        };
        for op in ops {
            match op {
                Op::Insert(seq) => m.insert(&seq),
                Op::Match(q) => { m.check_match(&q); }
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
    }
}
