//! How a model's layers share the paged KV cache: KV cache groups over one
//! pool of pages (vLLM's hybrid KV cache manager).
//!
//! Layers are grouped by the window they attend over (`None`: full
//! attention). With one kind of layer (every dense model, Mistral's uniform
//! window) there is one group of every layer and layer `l` owns cache `l`:
//! the layout pagoda always had. With a mix (Gemma 2/3's local and global
//! layers) the layers of each kind are cut, in layer order, into groups of
//! at most `G` layers; a page holds one block of `G` layer slots, and layer
//! `l` stores its K/V in slot cache `slot[l]` at the page ids of its group's
//! block table. Pages are never shared between groups, so layers of
//! different groups that share a slot cache never meet; each group has its
//! own block table per sequence, and a windowed group releases the pages its
//! window has passed. The cost of a group with fewer than `G` layers is its
//! empty slots, so `G` divides the number of full-attention layers (their
//! pages are held for the whole context: no empty slots there) and is the
//! largest such size whose slot count is within 1/8 of the fewest slots any
//! such size gives (fewer groups: fewer block tables per step).
//!
//! Guarantees: `slot[l] < num_slots`, `group[l] < windows.len()`, no two
//! layers of one group share a slot, and every layer of group `g` attends
//! over `windows[g]`.

use crate::ModelConfig;

/// The KV cache groups of a model and where each layer's K/V lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvLayout {
    /// Each group's window, group 0 first (`None`: full attention).
    pub windows: Vec<Option<usize>>,
    /// Per layer: its group.
    pub group: Vec<usize>,
    /// Per layer: the slot cache holding its K/V.
    pub slot: Vec<usize>,
    /// Slot caches to allocate (layer slots per page).
    pub num_slots: usize,
}

impl KvLayout {
    /// One group of `num_layers` layers with window `window`; layer `l` in
    /// slot `l`.
    pub fn single(num_layers: usize, window: Option<usize>) -> Self {
        KvLayout {
            windows: vec![window],
            group: vec![0; num_layers],
            slot: (0..num_layers).collect(),
            num_slots: num_layers,
        }
    }

    /// The layout of a model whose layer `l` attends over `layer_windows[l]`.
    pub fn from_layer_windows(layer_windows: &[Option<usize>]) -> Self {
        // Kinds in order: full attention first, then by window.
        let mut kinds: Vec<Option<usize>> = layer_windows.to_vec();
        kinds.sort();
        kinds.dedup();
        if kinds.len() <= 1 {
            return Self::single(layer_windows.len(), kinds.first().copied().flatten());
        }
        let counts: Vec<usize> = kinds
            .iter()
            .map(|k| layer_windows.iter().filter(|w| *w == k).count())
            .collect();
        let slots_for = |g: usize| counts.iter().map(|c| c.div_ceil(g) * g).sum::<usize>();
        let max_g = counts.iter().copied().max().unwrap_or(1);
        // Full-attention pages are held for the whole context: no empty
        // slots there (sizes dividing their count; kinds[0] is None if any).
        let full = if kinds[0].is_none() { counts[0] } else { 0 };
        let sizes = || (1..=max_g).filter(move |g| full.is_multiple_of(*g));
        let fewest = sizes().map(slots_for).min().unwrap_or(0);
        let size = sizes()
            .filter(|&g| slots_for(g) * 8 <= fewest * 9)
            .max()
            .unwrap_or(1);
        let mut layout = KvLayout {
            windows: Vec::new(),
            group: vec![0; layer_windows.len()],
            slot: vec![0; layer_windows.len()],
            num_slots: size,
        };
        for kind in kinds {
            let mut in_group = size;
            for (l, w) in layer_windows.iter().enumerate() {
                if *w != kind {
                    continue;
                }
                if in_group == size {
                    layout.windows.push(kind);
                    in_group = 0;
                }
                layout.group[l] = layout.windows.len() - 1;
                layout.slot[l] = in_group;
                in_group += 1;
            }
        }
        layout
    }

    /// The layout of `cfg`'s attention layers: by their windows where the
    /// window's passed blocks may be released (`release`), else one group
    /// keeping every position (the layout with no release at all).
    pub fn for_config(cfg: &ModelConfig, release: bool) -> Self {
        if !release {
            return Self::single(cfg.num_hidden_layers, None);
        }
        Self::from_layer_windows(&cfg.layer_windows())
    }

    pub fn num_groups(&self) -> usize {
        self.windows.len()
    }

    pub fn num_layers(&self) -> usize {
        self.group.len()
    }

    /// Layers of group `g`.
    pub fn group_layers(&self, g: usize) -> usize {
        self.group.iter().filter(|&&x| x == g).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(l: &KvLayout) {
        for g in 0..l.num_groups() {
            let mut slots: Vec<_> = (0..l.num_layers())
                .filter(|&i| l.group[i] == g)
                .map(|i| l.slot[i])
                .collect();
            let n = slots.len();
            slots.sort();
            slots.dedup();
            assert_eq!(slots.len(), n, "a slot twice in group {g}");
            assert!(slots.iter().all(|&s| s < l.num_slots));
        }
    }

    #[test]
    fn uniform_models_keep_one_group_and_layer_per_slot() {
        for w in [None, Some(4096)] {
            let l = KvLayout::from_layer_windows(&[w; 32]);
            assert_eq!(l, KvLayout::single(32, w));
            assert_eq!(l.slot, (0..32).collect::<Vec<_>>());
        }
    }

    #[test]
    fn gemma3_1b_has_one_global_group_and_six_local_ones() {
        // 26 layers, every sixth global.
        let windows: Vec<_> = (0..26)
            .map(|i| if i % 6 == 5 { None } else { Some(512) })
            .collect();
        let l = KvLayout::from_layer_windows(&windows);
        check(&l);
        assert_eq!(l.num_slots, 4);
        assert_eq!(l.windows[0], None);
        assert_eq!(l.windows.len(), 1 + 6);
        assert!(l.windows[1..].iter().all(|&w| w == Some(512)));
        assert_eq!(l.group_layers(0), 4);
        for (i, w) in windows.iter().enumerate() {
            assert_eq!(l.windows[l.group[i]], *w);
        }
    }

    #[test]
    fn gemma3_27b_and_gemma2_shapes() {
        let w27: Vec<_> = (0..62)
            .map(|i| if i % 6 == 5 { None } else { Some(1024) })
            .collect();
        let l = KvLayout::from_layer_windows(&w27);
        check(&l);
        // 10 global layers: groups of 5 (none empty), 52 local in 11.
        assert_eq!(l.num_slots, 5);
        assert_eq!(l.num_groups(), 2 + 11);
        assert_eq!(l.group_layers(0) + l.group_layers(1), 10);
        // Gemma 2 alternates: equal halves, one group each.
        let w2: Vec<_> = (0..26)
            .map(|i| if i % 2 == 1 { None } else { Some(4096) })
            .collect();
        let l = KvLayout::from_layer_windows(&w2);
        check(&l);
        assert_eq!((l.num_slots, l.num_groups()), (13, 2));
    }
}
