//! `pagoda chat` and `pagoda generate` on a pseudo-terminal (see `pty`),
//! with the default model and greedy sampling: answers stream (their bytes
//! come in many reads, before the answer ends), a second turn's rendered
//! prompt holds the first turn, `/reset` forgets it, Ctrl-C during an
//! answer stops it and the next question is answered, Ctrl-C at the prompt,
//! `/exit` and Ctrl-D leave with status 0; `generate` streams on a terminal
//! and prints the same text as through a pipe. A model without a chat
//! template is refused with a pointer to --chat-template; piped input is
//! read line by line to its end.
//!
//! Cost: each test starts the binary on the 135M model (a second or two to
//! load) and generates at most a few hundred tokens.

#[allow(dead_code)]
mod common;
mod pty;

use common::{default_model, fails_with_one_line, find, gguf_string, pagoda, Temp};
use pty::PtyProcess;
use std::time::Duration;

const PROMPT: &str = ">>> ";
/// Generous: the tests share a few cores with other builds.
const WAIT: Duration = Duration::from_secs(240);
const END_OF_PROMPT: &str = "--- end of prompt\r\n";

/// Greedy chat on the default model with its weights dequantized to f16:
/// the answers checked here ("Paris") are the dequantized model's, which
/// follows transformers; the default kept blocks (8-bit activations, as
/// llama.cpp) tip that near-tie the other way (see the README).
fn chat(extra: &[&str]) -> PtyProcess {
    let model = default_model();
    let mut args = vec![
        "chat",
        "--model",
        model.to_str().unwrap(),
        "--temperature",
        "0",
        "--weight-dtype",
        "f16",
    ];
    args.extend_from_slice(extra);
    PtyProcess::spawn(env!("CARGO_BIN_EXE_pagoda"), &args, true)
}

/// One turn with --verbose-prompt: types `question`, waits for the answer
/// and the next prompt; returns (rendered prompt, answer text, reads that
/// brought the answer, offset of the next prompt).
fn turn(p: &mut PtyProcess, question: &str, from: usize) -> (String, String, usize, usize) {
    p.send(&format!("{question}\n"));
    let prompt_at = p.wait_for("--- prompt\r\n", from, WAIT);
    let answer_at = p.wait_for(END_OF_PROMPT, prompt_at, WAIT) + END_OF_PROMPT.len();
    let next = p.wait_for(PROMPT, answer_at, WAIT);
    let rendered = p.text(prompt_at, answer_at);
    let answer = p.text(answer_at, next);
    // The answer's own text: up to the newline printed after it.
    let own = answer.split('\n').next().unwrap_or("").len();
    (
        rendered,
        answer,
        p.reads_over(answer_at, answer_at + own),
        next,
    )
}

#[test]
fn turns_stream_see_each_other_reset_and_exit() {
    let mut p = chat(&["--max-tokens", "48", "--verbose-prompt"]);
    let at = p.wait_for(PROMPT, 0, WAIT);

    let q1 = "Tell me about the ocean.";
    let (rendered1, answer1, reads, at) = turn(&mut p, q1, at);
    assert!(rendered1.contains(q1), "{rendered1}");
    let first_line = answer1.lines().next().unwrap_or("").trim().to_string();
    assert!(first_line.len() >= 20, "a short answer: {answer1:?}");
    // 48 tokens printed as they come: many reads, not one at the end.
    assert!(reads >= 4, "the answer came in {reads} reads: {answer1:?}");

    let q2 = "Say that again in one sentence.";
    let (rendered2, answer2, _, at) = turn(&mut p, q2, at);
    assert!(!answer2.trim().is_empty());
    // The second turn's prompt holds the first question and answer.
    let q1_at = rendered2
        .find(q1)
        .expect("the first question is in the second prompt");
    let a1_at = rendered2
        .find(&first_line[..20])
        .expect("the first answer is in the second prompt");
    let q2_at = rendered2.find(q2).unwrap();
    assert!(q1_at < a1_at && a1_at < q2_at, "{rendered2}");

    p.send("/reset\n");
    let at = p.wait_for("(conversation cleared)", at, WAIT);
    let at = p.wait_for(PROMPT, at, WAIT);
    let q3 = "What is the capital of France?";
    let (rendered3, answer3, _, at) = turn(&mut p, q3, at);
    assert!(!answer3.trim().is_empty());
    assert!(
        rendered3.contains(q3) && !rendered3.contains(q1) && !rendered3.contains(q2),
        "{rendered3}"
    );

    p.send("/history\n");
    let end = p.wait_for(PROMPT, at + 1, WAIT);
    let history = p.text(at, end);
    assert!(
        history.contains(&format!("[user] {q3}")) && !history.contains(q1),
        "{history}"
    );

    p.send("/exit\n");
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "{status}");
}

#[test]
fn ctrl_c_stops_an_answer_then_leaves_at_the_prompt() {
    let mut p = chat(&["--max-tokens", "400"]);
    let at = p.wait_for(PROMPT, 0, WAIT);
    let q1 = "Write a very long story about a dragon and a knight.";
    p.send(&format!("{q1}\n"));
    // The echoed question, then the first bytes of the answer.
    let answer_at = p.wait_for(&format!("{q1}\r\n"), at, WAIT) + q1.len() + 2;
    p.wait_for_bytes(answer_at, 16, WAIT);
    p.send("\x03");
    let stopped = p.wait_for("(stopped)", answer_at, WAIT);
    let at = p.wait_for(PROMPT, stopped, WAIT);

    let q2 = "What is the capital of France?";
    p.send(&format!("{q2}\n"));
    let answer_at = p.wait_for(&format!("{q2}\r\n"), at, WAIT) + q2.len() + 2;
    let next = p.wait_for(PROMPT, answer_at, WAIT);
    let answer = p.text(answer_at, next);
    assert!(answer.contains("Paris"), "{answer:?}");
    assert!(!answer.contains("(stopped)"), "{answer:?}");

    // At the prompt, Ctrl-C leaves.
    p.send("\x03");
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "{status}");
}

#[test]
fn end_of_input_leaves() {
    let mut p = chat(&[]);
    p.wait_for(PROMPT, 0, WAIT);
    // Ctrl-D on an empty line: end of input.
    p.send("\x04");
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "{status}");
}

#[test]
fn generate_streams_on_a_terminal_and_prints_what_a_pipe_gets() {
    let model = default_model();
    let args = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--temperature",
        "0",
        "--max-tokens",
        "48",
        "--prompt",
        "The ocean is",
    ];
    let piped = pagoda(&args);
    assert!(
        piped.status.success(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    let piped = String::from_utf8(piped.stdout).unwrap();
    assert!(piped.len() > 40, "{piped:?}");

    let mut p = PtyProcess::spawn(env!("CARGO_BIN_EXE_pagoda"), &args, false);
    let status = p.wait_exit(WAIT);
    assert!(status.success(), "{status}");
    // The reader may still be draining the terminal.
    p.wait_for_bytes(0, piped.replace('\n', "\r\n").len(), WAIT);
    let shown = p.text(0, p.len());
    assert_eq!(shown, piped);
    let reads = p.reads_over(0, p.len());
    assert!(reads >= 4, "the text came in {reads} reads");
}

#[test]
fn a_model_without_a_chat_template_is_refused() {
    let mut bytes = std::fs::read(default_model()).unwrap();
    // Rename the template's key (same length), so the file has none.
    let key = gguf_string("tokenizer.chat_template");
    let at = find(&bytes, &key);
    let renamed = gguf_string("tokenizer.chat_templatX");
    bytes[at..at + renamed.len()].copy_from_slice(&renamed);
    let f = Temp::file("no-template.gguf", &bytes);
    drop(bytes);
    fails_with_one_line(
        &["chat", "--model", f.path()],
        &["no chat template", "--chat-template"],
    );
}

#[test]
fn chat_reads_piped_input_to_its_end() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let model = default_model();
    let mut child = Command::new(env!("CARGO_BIN_EXE_pagoda"))
        .args([
            "chat",
            "--model",
            model.to_str().unwrap(),
            "--temperature",
            "0",
            "--weight-dtype",
            "f16",
        ])
        .args(["--max-tokens", "32"])
        .env_remove("RUST_LOG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(b"What is the capital of France?\n/history\n")
        .unwrap();
    // The end of input leaves.
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("Paris"), "{stdout}");
    assert!(
        stdout.contains("[user] What is the capital of France?\n[assistant] "),
        "{stdout}"
    );
}
