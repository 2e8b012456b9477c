//! First-fit placement of byte ranges in an address space: the bookkeeping
//! behind the activation arena (see the CUDA backend's `pool`). Plain host data; it
//! never touches the device.
//!
//! Free ranges are kept in address order and coalesced on release, so the
//! space is one free range again once every range is back. Space above
//! `top` (the end of the highest live or free-listed range) is free
//! implicitly: an allocation that fits no free range takes it, up to
//! `limit`. `peak` is the highest `top` ever reached: run over an unlimited
//! space, it is the size of the arena that would have served the same
//! sequence of allocations and releases.
//!
//! Costs: `alloc` and `release` are O(free ranges) (a handful in practice:
//! a forward pass allocates and releases nearly as a stack).

use std::collections::BTreeMap;

/// First-fit ranges in `[0, limit)`.
#[derive(Debug, Clone)]
pub(crate) struct FirstFit {
    /// Free ranges below `top`: offset -> length, never adjacent.
    free: BTreeMap<usize, usize>,
    /// Everything at or above `top` is free.
    top: usize,
    limit: usize,
    peak: usize,
    /// Bytes currently handed out.
    live: usize,
}

impl FirstFit {
    /// An empty space of `limit` bytes (`usize::MAX`: unbounded, to measure).
    pub fn new(limit: usize) -> Self {
        FirstFit {
            free: BTreeMap::new(),
            top: 0,
            limit,
            peak: 0,
            live: 0,
        }
    }

    /// The offset of a fresh range of `len` bytes, or `None` if no free
    /// range and no room under `limit` holds it.
    pub fn alloc(&mut self, len: usize) -> Option<usize> {
        let fit = self
            .free
            .iter()
            .find(|&(_, &l)| l >= len)
            .map(|(&o, &l)| (o, l));
        let off = match fit {
            Some((o, l)) => {
                self.free.remove(&o);
                if l > len {
                    self.free.insert(o + len, l - len);
                }
                o
            }
            None => {
                // The last free range, if it ends at `top`, extends into the tail.
                let start = match self.free.last_key_value() {
                    Some((&o, &l)) if o + l == self.top => o,
                    _ => self.top,
                };
                let end = start.checked_add(len)?;
                if end > self.limit {
                    return None;
                }
                self.free.remove(&start);
                self.top = end;
                self.peak = self.peak.max(end);
                start
            }
        };
        self.live += len;
        Some(off)
    }

    /// Hands out exactly `[off, off + len)` if all of it is free (`false`
    /// and no change otherwise): how a range handed out, released, and
    /// known to be untouched since, is taken back.
    pub fn alloc_at(&mut self, off: usize, len: usize) -> bool {
        let end = match off.checked_add(len) {
            Some(e) if e <= self.limit => e,
            _ => return false,
        };
        // The free range holding `off`: a listed one (running on into the
        // tail when it ends at `top`), or the tail itself.
        let listed = self.free.range(..=off).next_back().map(|(&o, &l)| (o, l));
        let (start, stop, was_listed) = match listed {
            Some((o, l)) if o + l == self.top => (o, self.limit, true),
            Some((o, l)) if off < o + l => (o, o + l, true),
            _ if off >= self.top => (self.top, self.limit, false),
            _ => return false,
        };
        if end > stop {
            return false;
        }
        if was_listed {
            self.free.remove(&start);
        }
        if off > start {
            self.free.insert(start, off - start);
        }
        if stop == self.limit {
            self.top = end;
        } else if stop > end {
            self.free.insert(end, stop - end);
        }
        self.peak = self.peak.max(self.top);
        self.live += len;
        true
    }

    /// Gives back the range `[off, off + len)` handed out by [`Self::alloc`].
    pub fn release(&mut self, off: usize, len: usize) {
        self.live -= len;
        let (mut start, mut end) = (off, off + len);
        if let Some((&o, &l)) = self.free.range(..off).next_back() {
            if o + l == start {
                self.free.remove(&o);
                start = o;
            }
        }
        if let Some(&l) = self.free.get(&end) {
            self.free.remove(&end);
            end += l;
        }
        if end == self.top {
            self.top = start;
        } else {
            self.free.insert(start, end - start);
        }
    }

    /// The highest end of a range ever handed out.
    pub fn peak(&self) -> usize {
        self.peak
    }

    /// Bytes handed out and not yet released.
    pub fn live(&self) -> usize {
        self.live
    }

    /// Bytes the space may hold.
    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::FirstFit;
    use proptest::prelude::*;

    #[test]
    fn stack_order_reuses_space() {
        let mut a = FirstFit::new(usize::MAX);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(50).unwrap();
        assert_eq!((x, y), (0, 100));
        a.release(y, 50);
        a.release(x, 100);
        assert_eq!(a.alloc(150), Some(0));
        assert_eq!(a.peak(), 150);
    }

    #[test]
    fn holes_are_filled_first_and_the_limit_holds() {
        let mut a = FirstFit::new(300);
        let x = a.alloc(100).unwrap();
        let _y = a.alloc(100).unwrap();
        a.release(x, 100);
        assert_eq!(a.alloc(60), Some(0));
        assert_eq!(a.alloc(100), Some(200));
        assert_eq!(a.alloc(41), None, "40 bytes free at 60..100 only");
        assert_eq!(a.alloc(40), Some(60));
    }

    #[test]
    fn a_released_range_is_taken_back_exactly() {
        let mut a = FirstFit::new(1000);
        let x = a.alloc(100).unwrap();
        let y = a.alloc(200).unwrap();
        let z = a.alloc(50).unwrap();
        a.release(y, 200);
        assert!(a.alloc_at(y, 200), "free since released");
        assert!(!a.alloc_at(y, 200), "now in use");
        a.release(y, 200);
        a.release(z, 50);
        // Everything above 100 is free again: take a range across it.
        assert!(a.alloc_at(150, 400));
        assert_eq!(a.alloc(50), Some(100));
        assert!(!a.alloc_at(x, 1), "in use");
        assert!(!a.alloc_at(900, 101), "past the limit");
        assert!(a.alloc_at(900, 100), "the tail, leaving a gap below");
        assert_eq!(a.alloc(300), Some(550));
        assert_eq!(a.live(), 100 + 400 + 50 + 100 + 300);
    }

    proptest! {
        /// Random interleavings: live ranges never overlap, stay under the
        /// limit, and once all are released the space is empty again.
        #[test]
        fn ranges_never_overlap(ops in prop::collection::vec((0usize..6, 1usize..64), 1..200)) {
            let mut a = FirstFit::new(1024);
            let mut live: Vec<(usize, usize)> = Vec::new();
            for (op, len) in ops {
                if op < 4 {
                    if let Some(off) = a.alloc(len) {
                        prop_assert!(off + len <= 1024);
                        for &(o, l) in &live {
                            prop_assert!(off + len <= o || o + l <= off, "overlap");
                        }
                        live.push((off, len));
                    } else {
                        // Refused only when no gap could hold it.
                        let mut ends: Vec<(usize, usize)> = live.clone();
                        ends.sort();
                        let mut prev = 0;
                        for (o, l) in ends.iter().copied().chain([(1024, 0)]) {
                            prop_assert!(o - prev < len, "a gap of {} fits {}", o - prev, len);
                            prev = o + l;
                        }
                    }
                } else if !live.is_empty() {
                    let (o, l) = live.swap_remove(len % live.len());
                    a.release(o, l);
                }
                prop_assert_eq!(a.live(), live.iter().map(|r| r.1).sum::<usize>());
            }
            for (o, l) in live.drain(..) {
                a.release(o, l);
            }
            prop_assert_eq!(a.alloc(1024), Some(0));
        }
    }
}
