//! Environment knobs: variables that choose between kernels or paths for
//! comparison and tuning (`PAGODA_SMALL_LINEAR=cublas`, ...). Each takes
//! one of a fixed list of names (trimmed, any case; unset or empty is the
//! default); any other value is an error naming the variable and its
//! names, so a mistyped knob never runs the default unnoticed.

use crate::{KernelError, Result};

/// The value of knob `name`: the one of `choices` its value names,
/// `default` when unset or empty, an error otherwise.
pub fn choice<T: Copy>(name: &str, choices: &[(&str, T)], default: T) -> Result<T> {
    match std::env::var(name) {
        Ok(v) => parse(name, Some(&v), choices, default),
        Err(std::env::VarError::NotPresent) => Ok(default),
        Err(e) => Err(KernelError::Unsupported(format!("{name}: {e}"))),
    }
}

/// [`choice`] on `value` as the variable's value.
pub fn parse<T: Copy>(
    name: &str,
    value: Option<&str>,
    choices: &[(&str, T)],
    default: T,
) -> Result<T> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(default);
    };
    choices
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(v))
        .map(|&(_, t)| t)
        .ok_or_else(|| {
            let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
            KernelError::Unsupported(format!(
                "{name}={v:?} (expected one of {})",
                names.join(", ")
            ))
        })
}

/// The names of an on/off knob: `on`, `1`, `true`; `off`, `0`, `false`;
/// and `auto` for `default`.
pub const fn on_off_names(default: bool) -> [(&'static str, bool); 7] {
    [
        ("auto", default),
        ("on", true),
        ("1", true),
        ("true", true),
        ("off", false),
        ("0", false),
        ("false", false),
    ]
}

/// An on/off knob: [`choice`] over [`on_off_names`].
pub fn on_off(name: &str, default: bool) -> Result<bool> {
    choice(name, &on_off_names(default), default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_any_case_and_defaults_when_unset_or_empty() {
        let c = [("tiled", 1), ("grouped", 2)];
        assert_eq!(parse("K", None, &c, 0).unwrap(), 0);
        assert_eq!(parse("K", Some("  "), &c, 0).unwrap(), 0);
        assert_eq!(parse("K", Some(" Tiled "), &c, 0).unwrap(), 1);
        assert_eq!(parse("K", Some("GROUPED"), &c, 0).unwrap(), 2);
        assert!(!parse("K", Some("off"), &on_off_names(true), true).unwrap());
        assert!(parse("K", Some("1"), &on_off_names(false), false).unwrap());
    }

    #[test]
    fn any_other_value_is_an_error_naming_the_choices() {
        let e = parse(
            "PAGODA_X",
            Some("tilde"),
            &[("tiled", 1), ("grouped", 2)],
            0,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("PAGODA_X=\"tilde\""), "{e}");
        assert!(e.contains("tiled, grouped"), "{e}");
    }
}
