//! `generate`'s text output: one block per prompt, in prompt order. The
//! batch form ([`write_block`]) prints finished outputs; [`InOrder`] prints
//! the same bytes while the batch is generated (a terminal watching it):
//! the first unfinished prompt's text as it comes, later prompts' text once
//! every block before theirs is out.

use std::io::{self, Write};

/// Opens prompt `prompt`'s block (a header only when the batch has several).
fn write_header(out: &mut impl Write, prompt: &str, several: bool) -> io::Result<()> {
    if several {
        writeln!(out, "--- {prompt}")?;
    }
    Ok(())
}

/// Closes a block.
fn write_footer(out: &mut impl Write, several: bool) -> io::Result<()> {
    out.write_all(if several { b"\n\n" } else { b"\n" })
}

/// One finished block: the text alone for a single prompt, under a
/// `--- PROMPT` header and followed by a blank line for several.
pub fn write_block(
    out: &mut impl Write,
    prompt: &str,
    text: &str,
    several: bool,
) -> io::Result<()> {
    write_header(out, prompt, several)?;
    out.write_all(text.as_bytes())?;
    write_footer(out, several)
}

/// Prints a batch's blocks in prompt order as their text arrives.
pub struct InOrder<'a, W: Write> {
    out: W,
    prompts: &'a [String],
    /// Text received per prompt, and whether it is complete.
    texts: Vec<String>,
    done: Vec<bool>,
    /// The block being printed, and how much of its text is out.
    head: usize,
    written: usize,
    header_written: bool,
}

impl<'a, W: Write> InOrder<'a, W> {
    pub fn new(out: W, prompts: &'a [String]) -> Self {
        InOrder {
            out,
            prompts,
            texts: vec![String::new(); prompts.len()],
            done: vec![false; prompts.len()],
            head: 0,
            written: 0,
            header_written: false,
        }
    }

    /// Text `delta` of prompt `i`, its last when `finished`; prints what
    /// can be printed and flushes.
    pub fn push(&mut self, i: usize, delta: &str, finished: bool) -> io::Result<()> {
        let (Some(text), Some(done)) = (self.texts.get_mut(i), self.done.get_mut(i)) else {
            return Ok(());
        };
        text.push_str(delta);
        *done |= finished;
        let several = self.prompts.len() > 1;
        while self.head < self.prompts.len() {
            let h = self.head;
            if !self.header_written {
                write_header(&mut self.out, &self.prompts[h], several)?;
                self.header_written = true;
            }
            self.out
                .write_all(&self.texts[h].as_bytes()[self.written..])?;
            self.written = self.texts[h].len();
            if !self.done[h] {
                break;
            }
            write_footer(&mut self.out, several)?;
            self.head += 1;
            self.written = 0;
            self.header_written = false;
        }
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every order of arrival prints exactly what the batch form prints.
    #[test]
    fn streamed_blocks_match_the_batch_form() {
        for n in 1..=3 {
            let prompts: Vec<String> = (0..n).map(|i| format!("p{i}")).collect();
            let texts: Vec<Vec<&str>> =
                vec![vec!["Héllo", " wor", "ld"], vec!["a", ""], vec!["", "xyz"]];
            let mut batch = Vec::new();
            for i in 0..n {
                write_block(&mut batch, &prompts[i], &texts[i].concat(), n > 1).unwrap();
            }
            // Rounds of one delta per prompt, starting with prompt `first`.
            for first in 0..n {
                let mut streamed = Vec::new();
                let mut p = InOrder::new(&mut streamed, &prompts);
                for round in 0..3 {
                    for k in 0..n {
                        let i = (first + k) % n;
                        let deltas = &texts[i];
                        if round < deltas.len() {
                            p.push(i, deltas[round], round + 1 == deltas.len()).unwrap();
                        }
                    }
                }
                assert_eq!(
                    String::from_utf8(streamed).unwrap(),
                    String::from_utf8(batch.clone()).unwrap(),
                    "n {n}, first {first}"
                );
            }
        }
    }
}
