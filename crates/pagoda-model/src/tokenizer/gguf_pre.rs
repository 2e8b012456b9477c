//! `tokenizer.ggml.pre` -> the pre-tokenizer of a byte-level BPE GGUF.
//!
//! Every value llama.cpp knows is either mapped here to the split rules that
//! llama.cpp applies for it (a sequence of regexes, each splitting the pieces
//! the previous one left, matches and the text between them both kept), or
//! refused by name with the reason ([`GgufPreTokenizer::from_gguf_pre`]); an
//! unknown value is an error too. Nothing falls back silently.
//!
//! Besides the regexes, a value carries llama.cpp's per-value flags that change
//! ids: `ignore_merges` (a piece that is itself a vocabulary entry is one
//! token) and whether BOS is added when the file does not say.

use super::tok_err;
use crate::Result;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

/// GPT-2's split: contractions, letters, numbers, other symbols, spaces (a
/// space run keeps its last space for the following word).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's split: case-insensitive contractions, a letter run with one
/// leading non-letter, digits in groups of up to three, symbols with trailing
/// newlines, newline runs, spaces.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: as Llama 3's, but every digit on its own.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 3.5's split: Qwen2's with combining marks kept inside words.
const QWEN35: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Seed-Coder's split: Qwen2's, but symbol runs never take newlines.
const SEED_CODER: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Mistral's Tekken split: words split at case changes, single digits,
/// symbols with trailing newlines or slashes.
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o's (o200k) split: Tekken's word rule with contractions attached,
/// digits in groups of up to three.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek V3's word rule: one ASCII symbol before ASCII letters, letters
/// and marks with one leading non-letter, symbol runs, newlines, spaces.
const DEEPSEEK3_WORDS: &str = r"[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// BLOOM's split: a word with an optional leading space, up to whitespace or
/// the listed punctuation.
const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// The regex sequences, by family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback: punctuation runs, GPT-2's regex, digit runs,
    /// three-digit groups.
    Default,
    /// GPT-2's regex.
    Gpt2,
    /// Every digit split off first, then GPT-2's regex.
    Gpt2IndividualDigits,
    /// Llama 3's regex.
    Llama3,
    /// Qwen2's regex with NFC normalization (the Qwen tokenizers).
    Qwen2,
    /// Qwen2's regex, no normalization.
    Qwen2Regex,
    /// Qwen 3.5's regex with NFC normalization.
    Qwen35,
    /// Seed-Coder's regex.
    SeedCoder,
    /// Mistral's Tekken regex.
    Tekken,
    /// GPT-4o's regex.
    Gpt4o,
    /// Falcon: punctuation runs, GPT-2's regex, three-digit groups.
    Falcon,
    /// DeepSeek Coder: newlines, letter runs, punctuation runs, CJK, digits.
    DeepseekCoder,
    /// DeepSeek V3: digit groups of three, CJK/kana runs, its word rule.
    Deepseek3,
    /// BLOOM's word rule.
    Bloom,
    /// BLOOM's word rule, then every digit on its own (Viking).
    Viking,
}

impl PreTokenizerKind {
    /// The regexes, applied in order to the pieces the previous one left.
    fn regexes(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
            Self::Gpt2 => &[GPT2],
            Self::Gpt2IndividualDigits => &[r"\p{N}", GPT2],
            Self::Llama3 => &[LLAMA3],
            Self::Qwen2 | Self::Qwen2Regex => &[QWEN2],
            Self::Qwen35 => &[QWEN35],
            Self::SeedCoder => &[SEED_CODER],
            Self::Tekken => &[TEKKEN],
            Self::Gpt4o => &[GPT4O],
            Self::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
            Self::DeepseekCoder => &[
                r"[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                r"[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            Self::Deepseek3 => &[r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS],
            Self::Bloom => &[BLOOM],
            Self::Viking => &[BLOOM, r"\p{N}"],
        }
    }

    /// Whether the text is NFC-normalized before splitting.
    pub fn nfc(self) -> bool {
        matches!(self, Self::Qwen2 | Self::Qwen35)
    }

    /// The pre-tokenizer pipeline: the regex splits, then bytes -> byte-level chars.
    pub fn pre_tokenizer(self) -> Result<PreTokenizerWrapper> {
        let mut steps = Vec::with_capacity(self.regexes().len() + 1);
        for pattern in self.regexes() {
            let split = Split::new(
                SplitPattern::Regex(pattern.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| tok_err(format!("bad pre-tokenizer regex {pattern:?}: {e}")))?;
            steps.push(split.into());
        }
        steps.push(ByteLevel::new(false, true, false).into());
        Ok(Sequence::new(steps).into())
    }
}

/// What a `tokenizer.ggml.pre` value asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufPreTokenizer {
    pub kind: PreTokenizerKind,
    /// A pre-tokenized piece that is a vocabulary entry becomes that token
    /// without merging.
    pub ignore_merges: bool,
    /// Add BOS when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos_by_default: bool,
}

/// Values llama.cpp knows that are refused, with the reason.
const REFUSED: &[(&str, &str)] = &[
    ("deepseek-llm", "its letter-class regex is not implemented"),
    ("spark2_5", "its regex sequence is not implemented"),
    ("youtu", "its regex sequence is not implemented"),
    ("jais", "its tokenizer is not implemented"),
    ("jais-2", "its whitespace cascade is not implemented"),
    ("chameleon", "its image-token splits are not implemented"),
    (
        "tiny_aya",
        "its digit-grouping lookahead is not implemented",
    ),
    (
        "cohere2moe",
        "its digit-grouping lookahead is not implemented",
    ),
    ("kimi-k2", "it needs llama.cpp's custom Han splitter"),
    ("superbpe", "its digit-grouping split is not implemented"),
    ("afmoe", "it needs llama.cpp's custom digit grouping"),
    ("bailingmoe", "its regex is not implemented"),
    ("bailingmoe2", "its regex is not implemented"),
    ("llada-moe", "its regex is not implemented"),
    ("ufakzeka", "its regex is not implemented"),
    ("laguna", "its regex sequence is not implemented"),
    ("exaone-moe", "its regex is not implemented"),
    ("minicpm5", "its regex sequence is not implemented"),
    ("hunyuan-dense", "its normalization is not implemented"),
    ("joyai-llm", "its normalization is not implemented"),
    ("hy_v4", "its normalization is not implemented"),
    ("granite-embed-multi-97m", "its regex is not implemented"),
    ("gemma4", "it is SentencePiece-style BPE over raw UTF-8"),
    (
        "granite-embed-multi-311m",
        "it is SentencePiece-style BPE over raw UTF-8",
    ),
    ("sarvam-moe", "it is SentencePiece-style BPE over raw UTF-8"),
    (
        "whitespace",
        "embedding-model whitespace splitting is not implemented",
    ),
    ("jina-v1-en", "it needs a separator token appended"),
    ("jina-v2-code", "it needs a separator token appended"),
    ("roberta-bpe", "it needs a separator token appended"),
    ("glm4", "it drops BOS, which is not implemented"),
    ("chatglm-bpe", "it drops BOS, which is not implemented"),
];

impl GgufPreTokenizer {
    /// The pre-tokenizer for `tokenizer.ggml.pre` (absent: llama.cpp's
    /// `default`). A value refused or unknown is an error naming it.
    pub fn from_gguf_pre(pre: Option<&str>) -> Result<Self> {
        use PreTokenizerKind as K;
        let name = pre.unwrap_or("default");
        let plain = |kind| (kind, false, false);
        let (kind, ignore_merges, add_bos_by_default) = match name {
            "default" => plain(K::Default),
            "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "trillion"
            | "granite-docling" | "exaone4" => plain(K::Gpt2),
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => plain(K::Gpt2IndividualDigits),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => (K::Llama3, true, true),
            "dbrx" | "smaug-bpe" => plain(K::Llama3),
            "qwen2" | "deepseek-r1-qwen" => plain(K::Qwen2),
            "stablelm2" | "kormo" | "f2llmv2" | "megrez" | "hunyuan" | "solar-open" | "grok-2" => {
                plain(K::Qwen2Regex)
            }
            "qwen35" => plain(K::Qwen35),
            "seed-coder" => plain(K::SeedCoder),
            "tekken" => (K::Tekken, true, true),
            "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => plain(K::Gpt4o),
            "falcon" => plain(K::Falcon),
            "deepseek-coder" => plain(K::DeepseekCoder),
            "deepseek-v3" => plain(K::Deepseek3),
            "poro-chat" | "bloom" | "gpt3-finnish" => plain(K::Bloom),
            "viking" => plain(K::Viking),
            other => {
                return Err(tok_err(match REFUSED.iter().find(|(n, _)| *n == other) {
                    Some((_, why)) => format!(
                        "GGUF pre-tokenizer {other:?} is not supported: {why}; \
                         give the model's tokenizer.json with --tokenizer"
                    ),
                    None => format!(
                        "unknown GGUF pre-tokenizer {other:?} (tokenizer.ggml.pre); \
                         give the model's tokenizer.json with --tokenizer"
                    ),
                }))
            }
        };
        Ok(Self {
            kind,
            ignore_merges,
            add_bos_by_default,
        })
    }
}

/// Every `tokenizer.ggml.pre` value llama.cpp knows (mapped or refused).
pub const LLAMA_CPP_PRE_NAMES: &[&str] = &[
    "default",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "jina-v5-nano",
    "deepseek-llm",
    "deepseek-coder",
    "deepseek-v3",
    "spark2_5",
    "youtu",
    "falcon",
    "mpt",
    "starcoder",
    "gpt-2",
    "phi-2",
    "jina-es",
    "jina-de",
    "gigachat",
    "jina-v2-es",
    "jina-v2-de",
    "a.x-4.0",
    "mellum",
    "modern-bert",
    "jais-2",
    "gemma4",
    "granite-embed-multi-311m",
    "sarvam-moe",
    "jina-v1-en",
    "jina-v2-code",
    "roberta-bpe",
    "whitespace",
    "refact",
    "command-r",
    "qwen2",
    "deepseek-r1-qwen",
    "kormo",
    "f2llmv2",
    "qwen35",
    "stablelm2",
    "olmo",
    "dbrx",
    "smaug-bpe",
    "poro-chat",
    "glm4",
    "chatglm-bpe",
    "viking",
    "jais",
    "tekken",
    "smollm",
    "codeshell",
    "bloom",
    "gpt3-finnish",
    "exaone",
    "exaone4",
    "exaone-moe",
    "chameleon",
    "minerva-7b",
    "megrez",
    "gpt-4o",
    "llama4",
    "kanana2",
    "talkie",
    "granite-embed-multi-97m",
    "tiny_aya",
    "cohere2moe",
    "superbpe",
    "trillion",
    "granite-docling",
    "bailingmoe",
    "bailingmoe2",
    "llada-moe",
    "seed-coder",
    "hunyuan",
    "hunyuan-dense",
    "hy_v4",
    "joyai-llm",
    "kimi-k2",
    "ufakzeka",
    "grok-2",
    "afmoe",
    "laguna",
    "minimax-m2",
    "solar-open",
    "mellum2",
    "minicpm5",
];

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn split(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let pre = kind.pre_tokenizer().unwrap();
        let mut s = PreTokenizedString::from(text);
        pre.pre_tokenize(&mut s).unwrap();
        s.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(piece, _, _)| piece.to_string())
            .collect()
    }

    #[test]
    fn every_llama_cpp_value_is_mapped_or_refused_by_name() {
        let (mut mapped, mut refused) = (0, 0);
        for &name in LLAMA_CPP_PRE_NAMES {
            match GgufPreTokenizer::from_gguf_pre(Some(name)) {
                Ok(p) => {
                    p.kind.pre_tokenizer().unwrap();
                    mapped += 1;
                }
                Err(e) => {
                    let msg = e.to_string();
                    assert!(msg.contains(&format!("{name:?}")), "{msg}");
                    assert!(msg.contains("not supported"), "{msg}");
                    refused += 1;
                }
            }
        }
        assert_eq!(refused, REFUSED.len());
        assert!(mapped > 50, "{mapped}");
        // Every refusal is a name llama.cpp knows.
        for (name, _) in REFUSED {
            assert!(LLAMA_CPP_PRE_NAMES.contains(name), "{name}");
        }
    }

    #[test]
    fn unknown_values_are_errors_naming_them() {
        let msg = GgufPreTokenizer::from_gguf_pre(Some("nope-9"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("unknown") && msg.contains("\"nope-9\""),
            "{msg}"
        );
    }

    #[test]
    fn flags_follow_llama_cpp() {
        let p = |n| GgufPreTokenizer::from_gguf_pre(Some(n)).unwrap();
        assert!(p("llama-bpe").ignore_merges && p("llama-bpe").add_bos_by_default);
        assert!(!p("smaug-bpe").ignore_merges);
        assert!(p("tekken").ignore_merges);
        assert_eq!(p("smollm").kind, PreTokenizerKind::Gpt2IndividualDigits);
        assert_eq!(
            GgufPreTokenizer::from_gguf_pre(None).unwrap().kind,
            PreTokenizerKind::Default
        );
    }

    // Expected splits follow the published definitions of each split rule.
    #[test]
    fn digit_grouping_differs_by_family() {
        use PreTokenizerKind as K;
        assert_eq!(split(K::Gpt2, "a 12345"), ["a", "Ġ12345"]);
        assert_eq!(
            split(K::Gpt2IndividualDigits, "a 123"),
            ["a", "Ġ", "1", "2", "3"]
        );
        assert_eq!(split(K::Llama3, "a 12345"), ["a", "Ġ", "123", "45"]);
        assert_eq!(split(K::Qwen2, "a 123"), ["a", "Ġ", "1", "2", "3"]);
        assert_eq!(split(K::Falcon, "x 12345"), ["x", "Ġ", "123", "45"]);
        assert_eq!(
            split(K::Default, "a+b 1234"),
            ["a", "+", "b", "Ġ", "123", "4"]
        );
        assert_eq!(split(K::Deepseek3, "ab12345"), ["ab", "123", "45"]);
        assert_eq!(split(K::Viking, "hi 42!"), ["hi", "Ġ", "4", "2", "!"]);
    }

    #[test]
    fn llama3_keeps_one_leading_symbol_and_newlines_together() {
        assert_eq!(
            split(PreTokenizerKind::Llama3, "I'M here.\n\n  x"),
            ["I", "'M", "Ġhere", ".ĊĊ", "Ġ", "Ġx"]
        );
    }

    #[test]
    fn case_changes_split_words_in_tekken_and_gpt4o() {
        assert_eq!(
            split(PreTokenizerKind::Tekken, "helloWorld 12/"),
            ["hello", "World", "Ġ", "1", "2", "/"]
        );
        assert_eq!(
            split(PreTokenizerKind::Gpt4o, "I'm HTTPServer 1234"),
            ["I'm", "ĠHTTPServer", "Ġ", "123", "4"]
        );
    }
}
