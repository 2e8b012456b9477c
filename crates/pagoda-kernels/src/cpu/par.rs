//! Row loops that go parallel only when it pays.
//!
//! Handing an op to the thread pool costs microseconds (a wake-up and a
//! wait), more than the whole op for one decode row. So an op whose output has
//! at most [`SEQ_MAX`] elements runs on the calling thread
//! ([`super::CpuBackend`] skips the pool for it), and these loops split work
//! across threads only when they run inside a pool and the output is larger.

use rayon::prelude::*;

/// Largest output (in elements) an elementwise op computes on the calling thread.
pub const SEQ_MAX: usize = 1 << 14;

/// Whether a loop over `len` output elements should fork.
pub fn parallel(len: usize) -> bool {
    len > SEQ_MAX && rayon::current_thread_index().is_some()
}

/// `f(i, chunk_i)` for each `chunk`-element chunk of `out`.
pub fn chunks<F>(out: &mut [f32], chunk: usize, f: F)
where
    F: Fn(usize, &mut [f32]) + Sync + Send,
{
    if chunk == 0 {
        return;
    }
    if parallel(out.len()) {
        out.par_chunks_mut(chunk)
            .enumerate()
            .for_each(|(i, c)| f(i, c));
    } else {
        out.chunks_mut(chunk).enumerate().for_each(|(i, c)| f(i, c));
    }
}

/// `f(i, a_i, b_i)` for each `chunk`-element chunk of `a` and of `b` (equal lengths).
pub fn chunks2<F>(a: &mut [f32], b: &mut [f32], chunk: usize, f: F)
where
    F: Fn(usize, &mut [f32], &mut [f32]) + Sync + Send,
{
    if chunk == 0 {
        return;
    }
    if parallel(a.len()) {
        a.par_chunks_mut(chunk)
            .zip(b.par_chunks_mut(chunk))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    } else {
        a.chunks_mut(chunk)
            .zip(b.chunks_mut(chunk))
            .enumerate()
            .for_each(|(i, (x, y))| f(i, x, y));
    }
}
