//! Tokenizer, chat template and incremental detokenizer.
