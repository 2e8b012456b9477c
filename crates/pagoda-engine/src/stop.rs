//! Stop strings, matched on the generated text across token boundaries.
//!
//! The matcher keeps no state besides the text itself: after each delta it
//! searches only the tail that could contain a new match (the delta plus the
//! longest stop string), so a request costs O(delta + longest stop) per token.

/// Where a stop string was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StopMatch {
    /// Byte offset in the text where the stop string starts; the text is cut here.
    pub at: usize,
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
    stops
        .iter()
        .filter_map(|s| tail.find(s.as_str()).map(|i| from + i))
        .min()
        .map(|at| StopMatch { at })
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
        assert_eq!(find_stop(&text, 6, &s), Some(StopMatch { at: 6 }));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        let s = stops(&["cd", "b"]);
        assert_eq!(find_stop("abcd", 4, &s), Some(StopMatch { at: 1 }));
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
