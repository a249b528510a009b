//! The served model's tokenizer: 256 byte tokens plus a few specials, and the chat template.
//!
//! Byte-level tokens make any text (and any model output) representable without a learned
//! vocabulary, which is what a model with synthetic weights needs. Token `b` (0..=255) is the
//! byte `b`; the specials follow. Model output is a byte sequence that need not be valid
//! UTF-8, so [`TextStream`] turns it into text incrementally: it emits only complete
//! characters, replaces each invalid sequence by U+FFFD exactly as
//! [`String::from_utf8_lossy`] does on the whole output (so the streamed pieces concatenate
//! to the non-streamed text), and holds back bytes that may begin a stop sequence.

/// Number of byte tokens (ids `0..256` are the bytes themselves).
pub const BYTE_TOKENS: u32 = 256;
/// Beginning of a sequence.
pub const BOS: u32 = 256;
/// End of a sequence and end of a chat turn; sampling it finishes a request ("stop").
pub const EOS: u32 = 257;
/// Starts a system message in the chat template.
pub const SYSTEM: u32 = 258;
/// Starts a user message in the chat template.
pub const USER: u32 = 259;
/// Starts an assistant message in the chat template (and the reply to generate).
pub const ASSISTANT: u32 = 260;
/// Vocabulary size: the bytes and the five specials.
pub const VOCAB: usize = 261;

/// True for a special (non-byte) token.
pub fn is_special(token: u32) -> bool {
    token >= BYTE_TOKENS
}

/// Tokens of a completion prompt: BOS then the prompt's bytes.
pub fn encode_prompt(text: &str) -> Vec<u32> {
    let mut out = Vec::with_capacity(text.len() + 1);
    out.push(BOS);
    out.extend(text.bytes().map(u32::from));
    out
}

/// A chat role as the template knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `system` (and OpenAI's `developer`).
    System,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
}

impl Role {
    /// The special token that opens a message of this role.
    pub fn token(self) -> u32 {
        match self {
            Role::System => SYSTEM,
            Role::User => USER,
            Role::Assistant => ASSISTANT,
        }
    }
}

/// Tokens of a chat prompt: `BOS (ROLE content EOS)* ASSISTANT`; generation continues after
/// the final `ASSISTANT` and ends at `EOS`.
pub fn encode_chat<'a>(messages: impl IntoIterator<Item = (Role, &'a str)>) -> Vec<u32> {
    let mut out = vec![BOS];
    for (role, content) in messages {
        out.push(role.token());
        out.extend(content.bytes().map(u32::from));
        out.push(EOS);
    }
    out.push(ASSISTANT);
    out
}

/// Incremental UTF-8 decoding of a byte stream, lossy like [`String::from_utf8_lossy`].
#[derive(Debug, Default, Clone)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Push bytes; returns the text that is complete so far (an incomplete character at the
    /// end is kept for the next call).
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    out.push_str(
                        std::str::from_utf8(&self.pending[..valid]).expect("valid up to here"),
                    );
                    match e.error_len() {
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + n);
                        }
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// The end of the stream: an incomplete character left becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

/// What [`TextStream::push`] says about the token it was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Piece {
    /// Text that can be sent now (may be empty).
    pub text: String,
    /// True when a stop sequence was completed: the request is finished, the stop sequence
    /// itself and anything after it are not part of the output.
    pub stopped: bool,
}

/// Generated tokens to text, with stop sequences (matched on bytes, held back while they
/// might still match).
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    stops: Vec<Vec<u8>>,
    held: Vec<u8>,
    utf8: Utf8Stream,
    done: bool,
}

impl TextStream {
    /// A stream that stops at any of `stops` (empty strings are ignored).
    pub fn new(stops: &[String]) -> Self {
        TextStream {
            stops: stops
                .iter()
                .filter(|s| !s.is_empty())
                .map(|s| s.as_bytes().to_vec())
                .collect(),
            ..TextStream::default()
        }
    }

    /// Push one generated token. Special tokens add no text.
    pub fn push(&mut self, token: u32) -> Piece {
        if self.done {
            return Piece {
                text: String::new(),
                stopped: true,
            };
        }
        if !is_special(token) {
            self.held.push(token as u8);
        }
        if let Some(at) = self.first_stop() {
            let text = self.utf8.push(&self.held[..at]) + &self.utf8.finish();
            self.held.clear();
            self.done = true;
            return Piece {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_stop_len();
        let emit = self.held.len() - keep;
        let text = self.utf8.push(&self.held[..emit]);
        self.held.drain(..emit);
        Piece {
            text,
            stopped: false,
        }
    }

    /// The end of generation (length or EOS): everything held is text.
    pub fn finish(&mut self) -> String {
        if self.done {
            return String::new();
        }
        self.done = true;
        let held = std::mem::take(&mut self.held);
        self.utf8.push(&held) + &self.utf8.finish()
    }

    /// Start of the earliest complete stop sequence in the held bytes.
    fn first_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.windows(s.len()).position(|w| w == s.as_slice()))
            .min()
    }

    /// Length of the longest suffix of the held bytes that is a proper prefix of a stop.
    fn partial_stop_len(&self) -> usize {
        let mut best = 0;
        for s in &self.stops {
            for n in (1..s.len()).rev() {
                if n <= self.held.len() && self.held.ends_with(&s[..n]) {
                    best = best.max(n);
                    break;
                }
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn templates() {
        assert_eq!(encode_prompt("hi"), vec![BOS, 104, 105]);
        let chat = encode_chat([(Role::System, "s"), (Role::User, "u")]);
        assert_eq!(chat, vec![BOS, SYSTEM, 115, EOS, USER, 117, EOS, ASSISTANT]);
        assert!(is_special(EOS) && !is_special(255));
        assert_eq!(VOCAB as u32, ASSISTANT + 1);
    }

    /// The streamed pieces of random byte sequences (valid, invalid, truncated UTF-8)
    /// concatenate to the lossy decoding of the whole (the slow reference).
    #[test]
    fn incremental_utf8_matches_lossy_decoding() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let alphabet: Vec<u8> = "aé€😀"
            .bytes()
            .chain([0x80, 0xff, 0xc3, 0xe2, 0xf0])
            .collect();
        for _ in 0..500 {
            let n = rng.random_range(0..24);
            let bytes: Vec<u8> = (0..n)
                .map(|_| alphabet[rng.random_range(0..alphabet.len())])
                .collect();
            let mut ts = TextStream::new(&[]);
            let mut out = String::new();
            for &b in &bytes {
                let p = ts.push(b as u32);
                assert!(!p.stopped);
                out += &p.text;
            }
            out += &ts.finish();
            assert_eq!(out, String::from_utf8_lossy(&bytes), "{bytes:?}");
        }
    }

    /// Stop sequences against a naive reference: the text before the first occurrence.
    #[test]
    fn stop_sequences_cut_the_output() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let stops = vec!["ab".to_string(), "bca".to_string()];
        for _ in 0..500 {
            let n = rng.random_range(0..16);
            let text: String = (0..n)
                .map(|_| ['a', 'b', 'c'][rng.random_range(0..3)])
                .collect();
            // The first prefix that ends with a stop; the longest such stop starts earliest.
            let expected_cut = (1..=text.len()).find_map(|k| {
                stops
                    .iter()
                    .filter(|s| text[..k].ends_with(s.as_str()))
                    .map(|s| k - s.len())
                    .min()
            });
            let mut ts = TextStream::new(&stops);
            let mut out = String::new();
            let mut stopped = false;
            for b in text.bytes() {
                let p = ts.push(b as u32);
                out += &p.text;
                if p.stopped {
                    stopped = true;
                    break;
                }
            }
            if !stopped {
                out += &ts.finish();
            }
            assert_eq!(stopped, expected_cut.is_some(), "{text}");
            assert_eq!(out, &text[..expected_cut.unwrap_or(text.len())], "{text}");
        }
    }

    #[test]
    fn specials_add_no_text() {
        let mut ts = TextStream::new(&[]);
        assert_eq!(ts.push(EOS).text, "");
        assert_eq!(ts.push(b'x' as u32).text, "x");
    }
}
