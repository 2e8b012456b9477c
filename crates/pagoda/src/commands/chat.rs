//! `pagoda chat`: a conversation on the terminal. Each line read is a user
//! message; the whole history (with `--system`) is rendered through the
//! model's chat template, and the answer's text is printed as the engine
//! produces it (the engine's UTF-8-safe deltas, flushed every step) and then
//! kept in the history. `/reset`, `/history`, `/help`, `/exit`; end of input
//! leaves; Ctrl-C stops a streaming answer (its request aborted in the
//! engine, the partial answer kept in the history) or, at the prompt, leaves.
//!
//! The engine runs on this thread, one request at a time: between steps the
//! loop checks for Ctrl-C, so an answer stops within one step.

use super::interrupt::CtrlC;
use super::{open, run_on_device, CacheArgs, EngineTask, ModelArgs, SamplingArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use pagoda_core::{FinishReason, SamplingParams};
use pagoda_engine::{EngineRequest, LlmEngine};
use pagoda_kernels::Backend;
use pagoda_model::tokenizer::{ChatMessage, ChatTemplate, MessageContent, Tokenizer};
use std::io::{BufRead, Write};
use std::sync::Arc;

/// Shown after the options in `pagoda chat --help`.
pub const KEYS_HELP: &str = "\
In the chat:
  /reset     forget the conversation (the --system message stays)
  /history   print the conversation so far
  /help      list these commands
  /exit      leave (so do Ctrl-D and end of input)
  Ctrl-C     while an answer streams: stop it and return to the prompt; the
             partial answer stays in the conversation, as it was printed
  Ctrl-C     at the prompt: leave";

/// What the prompt looks like.
const PROMPT: &str = ">>> ";

#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Most tokens per answer (an answer also ends at the context length).
    #[arg(long, default_value_t = 1024, value_name = "N")]
    pub max_tokens: usize,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    /// A system message at the start of the conversation.
    #[arg(long, value_name = "PROMPT")]
    pub system: Option<String>,
    /// Print the rendered prompt (the whole conversation through the chat
    /// template) to stderr before each answer.
    #[arg(long)]
    pub verbose_prompt: bool,
}

pub fn run(args: ChatArgs) -> Result<()> {
    let params = args.sampling.params(args.max_tokens)?;
    args.cache.check_kv_cache_memory()?;
    let files = open(&args.model, false)?;
    let Some(tokenizer) = files.tokenizer.clone() else {
        bail!("the model has no tokenizer, so it cannot chat");
    };
    if tokenizer.chat_template().is_none() {
        bail!("the model has no chat template; give one with --chat-template FILE (a Jinja file)");
    }
    run_on_device(
        files,
        &args.model,
        &args.cache,
        false,
        Chat {
            tokenizer,
            params,
            conversation: Conversation::new(args.system),
            verbose_prompt: args.verbose_prompt,
        },
    )
}

/// The messages so far.
struct Conversation {
    system: Option<String>,
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn new(system: Option<String>) -> Self {
        Conversation {
            system,
            turns: Vec::new(),
        }
    }

    fn messages(&self) -> Vec<ChatMessage> {
        let system = self.system.iter().map(|s| ChatMessage::new("system", s));
        system.chain(self.turns.iter().cloned()).collect()
    }

    fn print(&self, out: &mut impl Write) -> std::io::Result<()> {
        for m in self.messages() {
            let text = match &m.content {
                Some(MessageContent::Text(t)) => t.as_str(),
                _ => "",
            };
            writeln!(out, "[{}] {text}", m.role)?;
        }
        Ok(())
    }
}

/// A line typed at the prompt.
#[derive(Debug, PartialEq, Eq)]
enum Input<'a> {
    Message(&'a str),
    Exit,
    Reset,
    History,
    Help,
    Unknown(&'a str),
    Empty,
}

fn parse_input(line: &str) -> Input<'_> {
    let text = line.trim_end_matches(['\n', '\r']);
    match text.trim() {
        "" => Input::Empty,
        "/exit" | "/quit" | "/bye" => Input::Exit,
        "/reset" | "/clear" => Input::Reset,
        "/history" => Input::History,
        "/help" | "/?" => Input::Help,
        t if t.starts_with('/') && !t.contains(char::is_whitespace) => Input::Unknown(t),
        _ => Input::Message(text),
    }
}

/// The interactive loop, on whichever backend the engine was built for.
struct Chat {
    tokenizer: Arc<Tokenizer>,
    params: SamplingParams,
    conversation: Conversation,
    verbose_prompt: bool,
}

impl EngineTask for Chat {
    type Output = ();

    fn run<B: Backend>(mut self, mut engine: LlmEngine<B>) -> Result<()> {
        let Some(template) = self.tokenizer.chat_template() else {
            bail!("the model has no chat template; give one with --chat-template FILE");
        };
        let max_model_len = engine.scheduler_config().max_model_len;
        let ctrl_c = CtrlC::install()?;
        eprintln!(
            "pagoda chat (context {max_model_len} tokens): /help lists commands, \
             Ctrl-C stops an answer, /exit or Ctrl-D leaves"
        );
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            ctrl_c.at_prompt();
            // Writes to stdout return their errors (a closed pipe ends the
            // chat with an error, never a panic).
            let mut out = std::io::stdout();
            write!(out, "{PROMPT}")?;
            out.flush()?;
            line.clear();
            match stdin.lock().read_line(&mut line) {
                Ok(0) => {
                    // End of input: leave on a fresh line.
                    writeln!(out)?;
                    return Ok(());
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    eprintln!("error: the input line is not UTF-8");
                    continue;
                }
                Err(e) => return Err(e).context("reading the input"),
            }
            match parse_input(&line) {
                Input::Empty => continue,
                Input::Exit => return Ok(()),
                Input::Reset => {
                    self.conversation.turns.clear();
                    eprintln!("(conversation cleared)");
                    continue;
                }
                Input::History => {
                    self.conversation.print(&mut std::io::stdout().lock())?;
                    continue;
                }
                Input::Help => {
                    eprintln!("{KEYS_HELP}");
                    continue;
                }
                Input::Unknown(c) => {
                    eprintln!("unknown command {c}; /help lists the commands");
                    continue;
                }
                Input::Message(text) => {
                    self.conversation.turns.push(ChatMessage::new("user", text));
                }
            }
            match self.answer(&mut engine, template, &ctrl_c, max_model_len)? {
                Some(text) => self
                    .conversation
                    .turns
                    .push(ChatMessage::new("assistant", text)),
                None => {
                    // Not answered: the question leaves the conversation too.
                    self.conversation.turns.pop();
                }
            }
        }
    }
}

impl Chat {
    /// Renders the conversation, streams the answer to stdout and returns
    /// its text (partial when stopped); `None` when the prompt could not be
    /// made or was refused (the cause printed). Errs only when a step fails
    /// or stdout cannot be written.
    fn answer<B: Backend>(
        &self,
        engine: &mut LlmEngine<B>,
        template: &ChatTemplate,
        ctrl_c: &CtrlC,
        max_model_len: usize,
    ) -> Result<Option<String>> {
        let prompt = match template.apply(&self.conversation.messages(), true) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("error: the chat template cannot render the conversation: {e}");
                return Ok(None);
            }
        };
        if self.verbose_prompt {
            eprintln!("--- prompt\n{prompt}\n--- end of prompt");
        }
        // The template already wrote any BOS it wants.
        let ids = match self.tokenizer.encode(&prompt, false) {
            Ok(ids) => ids,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(None);
            }
        };
        let request = EngineRequest {
            prompt_token_ids: ids,
            params: self.params.clone(),
            logprobs: None,
        };
        let id = match engine.add_request(request) {
            Ok(id) => id,
            Err(e) => {
                eprintln!("error: {e}; /reset starts a new conversation");
                return Ok(None);
            }
        };
        ctrl_c.answering();
        let mut out = std::io::stdout();
        let mut text = String::new();
        let (reason, used) = 'steps: loop {
            if ctrl_c.pressed() {
                engine.abort(id)?;
                break (FinishReason::Abort, 0);
            }
            let outputs = match engine.step() {
                Ok(o) => o,
                Err(e) => {
                    let _ = engine.abort(id);
                    return Err(e).context("the answer failed");
                }
            };
            for o in outputs.iter().filter(|o| o.request_id == id) {
                out.write_all(o.text_delta.as_bytes())?;
                text.push_str(&o.text_delta);
                if let Some(reason) = o.finish_reason {
                    break 'steps (reason, o.num_prompt_tokens + o.num_output_tokens);
                }
            }
            out.flush()?;
            if !engine.has_unfinished_requests() {
                bail!("the engine dropped the answer's request");
            }
        };
        writeln!(out)?;
        out.flush()?;
        match reason {
            FinishReason::Abort => eprintln!("(stopped)"),
            FinishReason::Length if used >= max_model_len => {
                eprintln!("(the context is full: /reset starts a new conversation)")
            }
            FinishReason::Length => eprintln!("(cut at --max-tokens {})", self.params.max_tokens),
            FinishReason::Stop => {}
        }
        writeln!(out)?;
        Ok(Some(text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_become_messages_or_commands() {
        assert_eq!(parse_input("hello there\n"), Input::Message("hello there"));
        assert_eq!(
            parse_input("  indented \r\n"),
            Input::Message("  indented ")
        );
        assert_eq!(parse_input("\n"), Input::Empty);
        assert_eq!(parse_input("   \n"), Input::Empty);
        assert_eq!(parse_input("/exit\n"), Input::Exit);
        assert_eq!(parse_input(" /reset \n"), Input::Reset);
        assert_eq!(parse_input("/history"), Input::History);
        assert_eq!(parse_input("/nope\n"), Input::Unknown("/nope"));
        // A message may start with a slash when it has words after it.
        assert_eq!(
            parse_input("/usr/bin is what?\n"),
            Input::Message("/usr/bin is what?")
        );
    }

    #[test]
    fn the_system_message_leads_and_survives_a_reset() {
        let mut c = Conversation::new(Some("be brief".into()));
        c.turns.push(ChatMessage::new("user", "hi"));
        c.turns.push(ChatMessage::new("assistant", "hello"));
        let roles: Vec<String> = c.messages().into_iter().map(|m| m.role).collect();
        assert_eq!(roles, ["system", "user", "assistant"]);
        let mut printed = Vec::new();
        c.print(&mut printed).unwrap();
        assert_eq!(
            String::from_utf8(printed).unwrap(),
            "[system] be brief\n[user] hi\n[assistant] hello\n"
        );
        c.turns.clear();
        assert_eq!(c.messages().len(), 1);
    }
}
