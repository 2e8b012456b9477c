//! Stop strings, matched on the generated text across token boundaries,
//! with vLLM's options: `min_tokens` (stop strings are looked for only once
//! more than that many tokens were generated) and
//! `include_stop_str_in_output` (the text is cut after the stop string
//! instead of before it, and nothing needs holding back from a stream).
//!
//! The matcher keeps no state besides the text itself: after each delta it
//! searches only the tail that could contain a new match (the delta plus the
//! longest stop string), and only matches that end inside the delta count, so
//! a request costs O(delta + longest stop) per token.

/// Where a stop string was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset in the text where the stop string starts.
    pub at: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// A request's stop-string options.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StopOptions {
    pub min_tokens: usize,
    pub include_stop_str: bool,
}

impl StopOptions {
    /// Whether stop strings are looked for after the `num_output_tokens`-th
    /// token (vLLM: once more than `min_tokens` were generated).
    pub fn checks_stop_strings(&self, num_output_tokens: usize) -> bool {
        num_output_tokens > self.min_tokens
    }

    /// Where the text ends after match `m`.
    pub fn cut_at(&self, m: StopMatch) -> usize {
        if self.include_stop_str {
            m.at + m.len
        } else {
            m.at
        }
    }

    /// Bytes at the end of `text` to hold back from a stream.
    pub fn held_back(&self, text: &str, stops: &[String]) -> usize {
        if self.include_stop_str {
            0
        } else {
            held_back_len(text, stops)
        }
    }
}

/// Looks for any of `stops` in `text` that ends inside the last `delta_len`
/// bytes (earlier matches were already found on earlier calls).
pub fn find_stop(text: &str, delta_len: usize, stops: &[String]) -> Option<StopMatch> {
    let longest = stops.iter().map(|s| s.len()).max()?;
    let mut from = text.len().saturating_sub(delta_len + longest);
    while !text.is_char_boundary(from) {
        from -= 1;
    }
    let tail = &text[from..];
    let delta_start = text.len().saturating_sub(delta_len);
    stops
        .iter()
        .filter_map(|s| {
            tail.match_indices(s.as_str())
                .map(|(i, _)| from + i)
                .find(|&at| at + s.len() > delta_start)
                .map(|at| (at, s.len()))
        })
        .min()
        .map(|(at, len)| StopMatch { at, len })
}

/// Bytes at the end of `text` that must be held back from a stream because
/// they could be the start of a stop string completed by later tokens.
pub fn held_back_len(text: &str, stops: &[String]) -> usize {
    let mut held = 0;
    for s in stops {
        for k in (1..s.len()).rev() {
            if k > held && s.is_char_boundary(k) && text.ends_with(&s[..k]) {
                held = k;
                break;
            }
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stops(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finds_stop_spanning_two_deltas() {
        let s = stops(&["\n\nUser:"]);
        let mut text = String::from("Hello.\n\nUs");
        assert_eq!(find_stop(&text, 4, &s), None);
        text.push_str("er: hi");
        assert_eq!(find_stop(&text, 6, &s), Some(StopMatch { at: 6, len: 7 }));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let s = stops(&["cd", "b"]);
        assert_eq!(find_stop("abcd", 4, &s), Some(StopMatch { at: 1, len: 1 }));
    }

    #[test]
    fn only_matches_ending_in_the_delta_count() {
        let s = stops(&["ab"]);
        assert_eq!(find_stop("xabyz", 2, &s), None, "ended before the delta");
        assert_eq!(
            find_stop("xabyab", 2, &s),
            Some(StopMatch { at: 4, len: 2 })
        );
        assert_eq!(find_stop("xab", 1, &s), Some(StopMatch { at: 1, len: 2 }));
    }

    #[test]
    fn options_gate_and_place_the_cut() {
        let o = StopOptions {
            min_tokens: 2,
            include_stop_str: true,
        };
        assert!(!o.checks_stop_strings(2) && o.checks_stop_strings(3));
        assert_eq!(o.cut_at(StopMatch { at: 3, len: 2 }), 5);
        assert_eq!(o.held_back("abc ST", &stops(&["STOP"])), 0);
        let o = StopOptions::default();
        assert!(o.checks_stop_strings(1));
        assert_eq!(o.cut_at(StopMatch { at: 3, len: 2 }), 3);
        assert_eq!(o.held_back("abc ST", &stops(&["STOP"])), 2);
    }

    #[test]
    fn holds_back_possible_stop_prefix_only() {
        let s = stops(&["STOP"]);
        assert_eq!(held_back_len("abc ST", &s), 2);
        assert_eq!(held_back_len("abc S", &s), 1);
        assert_eq!(held_back_len("abc", &s), 0);
        assert_eq!(held_back_len("é", &stops(&["éa"])), 2);
    }
}
