//! The pagoda command line: wiring only. Each subcommand lives in
//! `commands/`, parses its options with clap, and calls the engine.

mod commands;
mod logging;
mod progress;
mod startup;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// pagoda: an LLM inference engine.
#[derive(Parser)]
#[command(name = "pagoda", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr (text has colours only on a terminal).
    #[arg(long, global = true, value_enum, default_value_t = logging::LogFormat::Text)]
    log_format: logging::LogFormat,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text for one or more prompts, run together as one batch.
    Generate(commands::generate::GenerateArgs),
    /// Chat with the model on the terminal: answers stream as they are
    /// generated, the conversation goes through the model's chat template.
    #[command(after_help = commands::chat::KEYS_HELP)]
    Chat(commands::chat::ChatArgs),
    /// Measure speed: offline throughput (default) or `pagoda bench single`.
    Bench(Box<commands::bench::BenchArgs>),
    /// Describe a model: architecture, shapes, dtypes, vocabulary, parameters.
    Info(commands::info::InfoArgs),
    /// Serve the OpenAI-compatible HTTP API (completions, chat, metrics).
    Serve(commands::serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // `serve` logs each finished request and the engine's status by default.
    let default_filter = match cli.command {
        Command::Serve(_) => "warn,pagoda=info,pagoda_server=info,pagoda_engine=info",
        _ => "warn",
    };
    logging::init(cli.log_format, default_filter);
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Info(args) => commands::info::run(args),
        Command::Bench(args) => commands::bench::run(*args),
        Command::Serve(args) => commands::serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause the message before
/// it already ends with (errors such as "cannot read PATH: CAUSE" print their
/// source themselves).
fn error_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
