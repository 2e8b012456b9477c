//! The API key check: `Authorization: Bearer <key>` (the scheme in any case,
//! as RFC 9110 says), compared in time that depends only on the configured
//! key's length, never on where the given key first differs.

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// 401 unless the request carries the configured key (no key: open).
pub async fn require_api_key(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.config.api_key {
        if !bearer_token(req.headers()).is_some_and(|given| key_matches(given, key)) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// The token of an `Authorization: Bearer <token>` header, if any.
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let (scheme, token) = value.split_once([' ', '\t'])?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Whether `given` equals `key`, looking at every byte of `key` whatever
/// `given` is (a wrong length is folded into the same accumulator).
pub fn key_matches(given: &str, key: &str) -> bool {
    let (given, key) = (given.as_bytes(), key.as_bytes());
    let mut diff = u8::from(given.len() != key.len());
    for (i, &k) in key.iter().enumerate() {
        let g = given.get(i).copied().unwrap_or(!k);
        diff |= std::hint::black_box(g ^ k);
    }
    diff == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(auth: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).unwrap());
        h
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive_and_the_token_trimmed() {
        for auth in ["Bearer k1", "bearer k1", "BEARER  k1 ", "BeArEr\tk1"] {
            assert_eq!(bearer_token(&headers(auth)), Some("k1"), "{auth}");
        }
        for auth in ["Basic k1", "Bearer", "Bearer   ", "Bearerk1", "k1"] {
            assert_eq!(bearer_token(&headers(auth)), None, "{auth}");
        }
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn keys_match_only_when_equal() {
        assert!(key_matches("sekrit", "sekrit"));
        for given in ["", "sekri", "sekrit2", "Sekrit", "sekriT", "tirkes"] {
            assert!(!key_matches(given, "sekrit"), "{given}");
        }
        // A prefix of the key padded with what `!k` would give is still wrong.
        assert!(!key_matches("\u{0}", ""));
    }
}
