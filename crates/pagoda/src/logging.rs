//! Where logs go and how they look: stderr, filtered by `RUST_LOG` (default:
//! warnings, plus info lines of the server and engine for `serve`), as plain
//! text or JSON lines (`--log-format json`, one object per event).
//!
//! Plain text carries ANSI colours only when stderr is a terminal and
//! `NO_COLOR` is unset, so logs redirected to a file or a collector hold no
//! escape codes.

use clap::ValueEnum;
use std::io::IsTerminal;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields).
    Json,
}

/// Whether text logs get ANSI colours.
pub fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber on stderr; `default_filter` applies when
/// `RUST_LOG` is unset or invalid.
pub fn init(format: LogFormat, default_filter: &str) {
    let colour = use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let _ = tracing::subscriber::set_global_default(subscriber(
        format,
        colour,
        filter,
        std::io::stderr,
    ));
}

/// The subscriber for `format`, writing to `writer`.
pub fn subscriber<W>(
    format: LogFormat,
    colour: bool,
    filter: EnvFilter,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(colour).finish()),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .finish(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(format: LogFormat, colour: bool) -> String {
        let out = Capture::default();
        let writer = out.clone();
        let sub = subscriber(format, colour, EnvFilter::new("info"), move || {
            writer.clone()
        });
        tracing::subscriber::with_default(sub, || {
            tracing::info!(id = "cmpl-1", status = 200u16, "request finished");
        });
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(use_colour(true, None));
        assert!(!use_colour(false, None));
        assert!(!use_colour(true, Some("1".as_ref())));
        assert!(use_colour(true, Some("".as_ref())));
    }

    #[test]
    fn plain_text_has_no_escape_codes_and_json_is_one_object_per_line() {
        let text = capture(LogFormat::Text, false);
        assert!(text.contains("request finished"), "{text}");
        assert!(
            text.contains("id=\"cmpl-1\"") || text.contains("id=cmpl-1"),
            "{text}"
        );
        assert!(!text.contains('\x1b'), "{text:?}");
        assert!(capture(LogFormat::Text, true).contains('\x1b'));

        let json = capture(LogFormat::Json, false);
        let lines: Vec<&str> = json.lines().collect();
        assert_eq!(lines.len(), 1, "{json}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["message"], "request finished");
        assert_eq!(v["id"], "cmpl-1");
        assert_eq!(v["status"], 200);
        assert_eq!(v["level"], "INFO");
    }
}
