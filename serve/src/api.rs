//! The OpenAI wire format: request bodies, responses, stream chunks and errors.
//!
//! Requests are parsed strictly (`deny_unknown_fields`): a field the server does not know is
//! refused with 400 naming it, so a client never believes it got behaviour it did not. Every
//! field of OpenAI's that clients commonly send is known, and each gets one of three
//! treatments (the table is `docs/serve.md`'s):
//!
//! - **implemented**: `model`, `prompt` / `messages`, `max_tokens` / `max_completion_tokens`,
//!   `temperature`, `top_p`, `seed`, `stream`, `stream_options.include_usage`, `stop`, `n` = 1,
//!   plus vLLM's `ignore_eos`, which benchmark clients send to get exactly `max_tokens` tokens;
//! - **accepted and ignored**, named in the response headers [`IGNORED_HEADER`] and `Warning`
//!   whenever their value asks for something the server does not do: `frequency_penalty`,
//!   `presence_penalty` (non-zero), `store` (true), `service_tier`, `reasoning_effort`; and
//!   accepted without a header where the value has no effect on any response (`user`,
//!   `metadata`, `parallel_tool_calls`, a `response_format` of `text`, `tool_choice` `none` or
//!   `auto` without tools, `logprobs: false`, `top_logprobs: 0`, `modalities: ["text"]`);
//! - **rejected with 400** naming the field, where ignoring it would hand the client a
//!   response it cannot use: `n` > 1, `logprobs` / `top_logprobs` asked for, a JSON
//!   `response_format`, `logit_bias` (token ids of another tokenizer), `tools`, `echo`,
//!   `best_of` > 1, `suffix`, other `modalities`.
//!
//! Status codes: 400 for every request the server will not serve as asked (malformed JSON,
//! unknown field, wrong type, value out of range, a prompt or `max_tokens` beyond the context
//! limit; never 422, which OpenAI's clients treat as unexpected), 404 an unknown model,
//! 413 a body over the size limit, 429 every stream slot and queue place taken, 503 shutting
//! down, 500 a backend failure. Every error body is
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::sampling::SamplingParams;
use crate::tokenizer::{self, Role};

/// Default `max_tokens` when a request gives none (OpenAI's completions default).
pub const DEFAULT_MAX_TOKENS: usize = 16;
/// Highest temperature accepted (OpenAI's range is 0..=2).
pub const MAX_TEMPERATURE: f64 = 2.0;
/// Most stop sequences per request (OpenAI's limit).
pub const MAX_STOPS: usize = 4;
/// Largest magnitude of `frequency_penalty` and `presence_penalty` (OpenAI's range is
/// -2..=2).
pub const MAX_PENALTY: f64 = 2.0;
/// Response header naming the fields a request gave that the server accepted and ignored,
/// comma-separated (beside a `Warning: 299` header saying the same in words).
pub const IGNORED_HEADER: &str = "ft-ignored-fields";

/// An OpenAI-style error with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message naming the input.
    pub message: String,
    /// OpenAI error type.
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// An `invalid_request_error`.
    pub fn invalid(
        status: StatusCode,
        message: impl Into<String>,
        param: Option<&str>,
        code: Option<&'static str>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// Parse a JSON body strictly: every error is a 400 whose `param` names the field at fault
/// where there is one (the path to it, `messages[0].content`; for an unknown field, the field
/// itself; for a missing one, the one missing).
pub fn parse_body<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    let v = serde_path_to_error::deserialize(&mut *de)
        .map_err(|e| body_error(&e.path().to_string(), e.into_inner()))?;
    // Trailing characters after the object are a syntax error too.
    de.end().map_err(|e| body_error("", e))?;
    Ok(v)
}

/// The 400 for a body that failed to parse, `path` leading to where it failed.
fn body_error(path: &str, inner: serde_json::Error) -> ApiError {
    use serde_json::error::Category;
    match inner.classify() {
        Category::Syntax | Category::Eof | Category::Io => ApiError::invalid(
            StatusCode::BAD_REQUEST,
            format!("the request body is not valid JSON: {inner}"),
            None,
            Some("invalid_json"),
        ),
        Category::Data => {
            let msg = inner.to_string();
            let unknown = msg.starts_with("unknown field");
            let named = backticked(&msg).filter(|_| unknown || msg.starts_with("missing field"));
            let param = match (named, path) {
                (Some(f), "." | "") => f.to_string(),
                // The path of an unknown field already ends with it.
                (Some(f), p) if p == f || p.ends_with(&format!(".{f}")) => p.to_string(),
                (Some(f), p) => format!("{p}.{f}"),
                (None, p) => p.to_string(),
            };
            let param = (!param.is_empty() && param != ".").then_some(param);
            let message = match &param {
                Some(p) if unknown => {
                    format!("unknown field '{p}': this server does not implement it ({msg})")
                }
                Some(p) => format!("invalid '{p}': {msg}"),
                None => format!("the request body does not match the schema: {msg}"),
            };
            ApiError::invalid(
                StatusCode::BAD_REQUEST,
                message,
                param.as_deref(),
                Some("invalid_request_body"),
            )
        }
    }
}

/// The first `` `name` `` in a serde message.
fn backticked(msg: &str) -> Option<&str> {
    let start = msg.find('`')? + 1;
    let len = msg[start..].find('`')?;
    Some(&msg[start..start + len])
}

/// `prompt`: a string, a one-string array, or an array of token ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Several texts (only one is served per request).
    Texts(Vec<String>),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `stop`: a string or an array of strings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One sequence.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with the usage before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// Declares a request struct with its own fields followed by the fields completions and chat
/// share (serde's `flatten` does not combine with `deny_unknown_fields`, so they are spelled
/// out in each struct), and a `common()` accessor.
macro_rules! openai_request {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $f:ident : $t:ty,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fm])* pub $f: $t,)*
            /// Model id (must be the served one when given).
            #[serde(default)]
            pub model: Option<String>,
            /// Most tokens to generate.
            #[serde(default)]
            pub max_tokens: Option<u64>,
            /// Sampling temperature, 0 greedy.
            #[serde(default)]
            pub temperature: Option<f64>,
            /// Nucleus.
            #[serde(default)]
            pub top_p: Option<f64>,
            /// Sampling seed.
            #[serde(default)]
            pub seed: Option<u64>,
            /// Server-sent events.
            #[serde(default)]
            pub stream: Option<bool>,
            /// Stream options.
            #[serde(default)]
            pub stream_options: Option<StreamOptions>,
            /// Stop sequences.
            #[serde(default)]
            pub stop: Option<Stop>,
            /// Choices per request (only 1).
            #[serde(default)]
            pub n: Option<u32>,
            /// End-user id (accepted; it changes no response).
            #[serde(default)]
            pub user: Option<String>,
            /// vLLM's extension: never stop at EOS.
            #[serde(default)]
            pub ignore_eos: Option<bool>,
            /// Penalty on tokens by their count so far, -2..=2 (ignored when non-zero).
            #[serde(default)]
            pub frequency_penalty: Option<f64>,
            /// Penalty on tokens that appeared so far, -2..=2 (ignored when non-zero).
            #[serde(default)]
            pub presence_penalty: Option<f64>,
            /// Bias per token id (refused unless empty: the ids would be another
            /// tokenizer's).
            #[serde(default)]
            pub logit_bias: Option<serde_json::Map<String, Value>>,
            /// `{"type": "text"}` accepted; JSON modes refused.
            #[serde(default)]
            pub response_format: Option<Value>,
            /// Store the completion (nothing is stored; ignored when true).
            #[serde(default)]
            pub store: Option<bool>,
            /// Tags for stored completions (accepted; it changes no response).
            #[serde(default)]
            pub metadata: Option<Value>,
            /// Processing tier (ignored).
            #[serde(default)]
            pub service_tier: Option<String>,
        }

        impl $name {
            /// The shared fields.
            pub fn common(&self) -> Common {
                Common {
                    model: self.model.clone(),
                    max_tokens: self.max_tokens,
                    temperature: self.temperature,
                    top_p: self.top_p,
                    seed: self.seed,
                    stream: self.stream,
                    stream_options: self.stream_options,
                    stop: self.stop.clone(),
                    n: self.n,
                    ignore_eos: self.ignore_eos,
                    frequency_penalty: self.frequency_penalty,
                    presence_penalty: self.presence_penalty,
                    logit_bias: self.logit_bias.as_ref().map_or(0, |m| m.len()),
                    response_format: self.response_format.clone(),
                    store: self.store,
                    service_tier: self.service_tier.is_some(),
                }
            }
        }
    };
}

/// The fields completions and chat share (see the request structs for their meaning).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Common {
    /// Model id.
    pub model: Option<String>,
    /// Most tokens to generate.
    pub max_tokens: Option<u64>,
    /// Temperature.
    pub temperature: Option<f64>,
    /// Nucleus.
    pub top_p: Option<f64>,
    /// Seed.
    pub seed: Option<u64>,
    /// Stream.
    pub stream: Option<bool>,
    /// Stream options.
    pub stream_options: Option<StreamOptions>,
    /// Stop sequences.
    pub stop: Option<Stop>,
    /// Choices.
    pub n: Option<u32>,
    /// Never stop at EOS.
    pub ignore_eos: Option<bool>,
    /// Frequency penalty.
    pub frequency_penalty: Option<f64>,
    /// Presence penalty.
    pub presence_penalty: Option<f64>,
    /// Entries of `logit_bias`.
    pub logit_bias: usize,
    /// Response format.
    pub response_format: Option<Value>,
    /// Store.
    pub store: Option<bool>,
    /// A service tier was given.
    pub service_tier: bool,
}

openai_request! {
    /// `POST /v1/completions`.
    CompletionRequest {
        /// The prompt.
        prompt: Prompt,
        /// Log probabilities of this many top tokens (refused when given: none are
        /// returned).
        #[serde(default)]
        logprobs: Option<u32>,
        /// Echo the prompt before the completion (refused when true).
        #[serde(default)]
        echo: Option<bool>,
        /// Candidates to choose the best from (only 1).
        #[serde(default)]
        best_of: Option<u32>,
        /// Text after the completion (refused unless empty).
        #[serde(default)]
        suffix: Option<String>,
    }
}

/// Content of a chat message: text or text parts.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Text.
    Text(String),
    /// Parts (`{"type": "text", "text": ...}`).
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContentPart {
    /// Must be `text`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text.
    pub text: String,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// `system`, `developer`, `user` or `assistant`.
    pub role: String,
    /// The content.
    pub content: Content,
    /// Participant name (accepted, unused).
    #[serde(default)]
    pub name: Option<String>,
}

openai_request! {
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// The newer name of `max_tokens`.
        #[serde(default)]
        max_completion_tokens: Option<u64>,
        /// Return log probabilities (refused when true: none are returned).
        #[serde(default)]
        logprobs: Option<bool>,
        /// Top alternatives per token (refused when above 0).
        #[serde(default)]
        top_logprobs: Option<u32>,
        /// Tools the model may call (refused unless empty: the server calls none).
        #[serde(default)]
        tools: Option<Vec<Value>>,
        /// `none` or `auto` accepted (no tools); a forced tool refused.
        #[serde(default)]
        tool_choice: Option<Value>,
        /// Parallel tool calls (accepted; without tools it changes no response).
        #[serde(default)]
        parallel_tool_calls: Option<bool>,
        /// Output modalities: `["text"]` accepted, others refused.
        #[serde(default)]
        modalities: Option<Vec<String>>,
        /// Reasoning effort (ignored: the served model does not reason).
        #[serde(default)]
        reasoning_effort: Option<String>,
    }
}

/// A request reduced to what the decode loop needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Validated {
    /// Prompt tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Sampling.
    pub sampling: SamplingParams,
    /// Stop sequences.
    pub stops: Vec<String>,
    /// Stream the answer.
    pub stream: bool,
    /// Send usage in the stream.
    pub include_usage: bool,
    /// Fields the request gave that were accepted and ignored (for [`IGNORED_HEADER`]).
    pub ignored: Vec<&'static str>,
}

/// Limits a request is checked against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest context (prompt + max_tokens), tokens.
    pub context: usize,
    /// Vocabulary size (token-id prompts must be below it).
    pub vocab: usize,
}

fn bad_request(message: String, param: &str, code: &'static str) -> ApiError {
    ApiError::invalid(StatusCode::BAD_REQUEST, message, Some(param), Some(code))
}

/// A field refused because the server does not implement what its value asks for.
fn unsupported(param: &str, what: &str) -> ApiError {
    bad_request(
        format!("'{param}': {what}; this server does not support it (see docs/serve.md)"),
        param,
        "unsupported_parameter",
    )
}

impl Common {
    /// Check the shared fields against `served` (model id) and `limits`; `prompt` is the
    /// already encoded prompt, `seed` the seed to use when none is given.
    pub fn validate(
        &self,
        served: &str,
        prompt: Vec<u32>,
        max_tokens: Option<u64>,
        limits: Limits,
        seed: u64,
    ) -> Result<Validated, ApiError> {
        if let Some(m) = &self.model {
            if m != served {
                return Err(ApiError::invalid(
                    StatusCode::NOT_FOUND,
                    format!("the model '{m}' does not exist; this server serves '{served}'"),
                    Some("model"),
                    Some("model_not_found"),
                ));
            }
        }
        if let Some(n) = self.n {
            if n != 1 {
                return Err(unsupported(
                    "n",
                    &format!("n = {n} asks for {n} choices; one choice per request is served"),
                ));
            }
        }
        let mut ignored = Vec::new();
        for (name, p) in [
            ("frequency_penalty", self.frequency_penalty),
            ("presence_penalty", self.presence_penalty),
        ] {
            let p = p.unwrap_or(0.0);
            if !(-MAX_PENALTY..=MAX_PENALTY).contains(&p) {
                return Err(bad_request(
                    format!("{name} {p} is outside [-{MAX_PENALTY}, {MAX_PENALTY}]"),
                    name,
                    "invalid_value",
                ));
            }
            if p != 0.0 {
                ignored.push(name);
            }
        }
        if self.logit_bias > 0 {
            return Err(unsupported(
                "logit_bias",
                "biases are keyed by another tokenizer's token ids",
            ));
        }
        if let Some(f) = &self.response_format {
            match f.get("type").and_then(Value::as_str) {
                Some("text") => {}
                Some(t @ ("json_object" | "json_schema")) => {
                    let what = format!(
                        "type '{t}' asks for JSON output, which the served model cannot guarantee"
                    );
                    return Err(unsupported("response_format", &what));
                }
                _ => {
                    return Err(bad_request(
                        format!("response_format {f} has no type text, json_object or json_schema"),
                        "response_format",
                        "invalid_value",
                    ))
                }
            }
        }
        if self.store == Some(true) {
            ignored.push("store");
        }
        if self.service_tier {
            ignored.push("service_tier");
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !(0.0..=MAX_TEMPERATURE).contains(&temperature) {
            return Err(bad_request(
                format!("temperature {temperature} is outside [0, {MAX_TEMPERATURE}]"),
                "temperature",
                "invalid_value",
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(bad_request(
                format!("top_p {top_p} is outside (0, 1]"),
                "top_p",
                "invalid_value",
            ));
        }
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(bad_request(
                format!("{} stop sequences; at most {MAX_STOPS}", stops.len()),
                "stop",
                "invalid_value",
            ));
        }
        if prompt.is_empty() {
            return Err(bad_request(
                "the prompt is empty".into(),
                "prompt",
                "invalid_value",
            ));
        }
        if let Some(t) = prompt.iter().find(|&&t| t as usize >= limits.vocab) {
            return Err(bad_request(
                format!(
                    "token id {t} is not below the vocabulary size {}",
                    limits.vocab
                ),
                "prompt",
                "invalid_value",
            ));
        }
        if prompt.len() >= limits.context {
            return Err(ApiError::invalid(
                StatusCode::BAD_REQUEST,
                format!(
                    "the prompt is {} tokens; the context limit is {} (prompt and at least one generated token)",
                    prompt.len(),
                    limits.context
                ),
                Some("prompt"),
                Some("context_length_exceeded"),
            ));
        }
        let max_tokens = max_tokens.map_or(DEFAULT_MAX_TOKENS as u64, |m| m);
        if max_tokens == 0 {
            return Err(bad_request(
                "max_tokens must be at least 1".into(),
                "max_tokens",
                "invalid_value",
            ));
        }
        let room = (limits.context - prompt.len()) as u64;
        if max_tokens > room {
            return Err(bad_request(
                format!(
                    "max_tokens {max_tokens} is over the limit: the prompt is {} tokens, the context limit {}, so at most {room} can be generated",
                    prompt.len(),
                    limits.context
                ),
                "max_tokens",
                "max_tokens_exceeded",
            ));
        }
        Ok(Validated {
            prompt,
            max_tokens: max_tokens as usize,
            sampling: SamplingParams {
                temperature,
                top_p,
                seed: self.seed.unwrap_or(seed),
                ignore_eos: self.ignore_eos.unwrap_or(false),
            },
            stops,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            ignored,
        })
    }
}

impl CompletionRequest {
    /// Encode and validate.
    pub fn validate(&self, served: &str, limits: Limits, seed: u64) -> Result<Validated, ApiError> {
        let prompt = match &self.prompt {
            Prompt::Text(t) => tokenizer::encode_prompt(t),
            Prompt::Texts(v) if v.len() == 1 => tokenizer::encode_prompt(&v[0]),
            Prompt::Texts(v) => {
                return Err(bad_request(
                    format!("{} prompts in one request; send one per request", v.len()),
                    "prompt",
                    "invalid_value",
                ))
            }
            Prompt::Tokens(t) => t.clone(),
        };
        if self.logprobs.is_some() {
            return Err(unsupported(
                "logprobs",
                "log probabilities are not returned",
            ));
        }
        if self.echo == Some(true) {
            return Err(unsupported("echo", "the prompt is not echoed"));
        }
        if let Some(b) = self.best_of.filter(|&b| b != 1) {
            return Err(unsupported(
                "best_of",
                &format!("best_of = {b}; one candidate per request is generated"),
            ));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(unsupported(
                "suffix",
                "insertion after a suffix is not served",
            ));
        }
        let common = self.common();
        common.validate(served, prompt, common.max_tokens, limits, seed)
    }
}

impl ChatRequest {
    /// Apply the chat template and validate.
    pub fn validate(&self, served: &str, limits: Limits, seed: u64) -> Result<Validated, ApiError> {
        if self.messages.is_empty() {
            return Err(bad_request(
                "messages is empty".into(),
                "messages",
                "invalid_value",
            ));
        }
        let mut parts: Vec<(Role, String)> = Vec::with_capacity(self.messages.len());
        for (i, m) in self.messages.iter().enumerate() {
            let role = match m.role.as_str() {
                "system" | "developer" => Role::System,
                "user" => Role::User,
                "assistant" => Role::Assistant,
                other => {
                    return Err(bad_request(
                        format!(
                        "messages[{i}].role '{other}' is not system, developer, user or assistant"
                    ),
                        "messages",
                        "invalid_value",
                    ))
                }
            };
            let text = match &m.content {
                Content::Text(t) => t.clone(),
                Content::Parts(p) => {
                    if let Some(bad) = p.iter().find(|p| p.kind != "text") {
                        return Err(bad_request(
                            format!(
                                "messages[{i}] has a '{}' part; only text is served",
                                bad.kind
                            ),
                            "messages",
                            "invalid_value",
                        ));
                    }
                    p.iter().map(|p| p.text.as_str()).collect()
                }
            };
            parts.push((role, text));
        }
        if self.logprobs == Some(true) {
            return Err(unsupported(
                "logprobs",
                "log probabilities are not returned",
            ));
        }
        if self.top_logprobs.is_some_and(|k| k > 0) {
            return Err(unsupported(
                "top_logprobs",
                "log probabilities are not returned",
            ));
        }
        if self.tools.as_ref().is_some_and(|t| !t.is_empty()) {
            return Err(unsupported("tools", "the served model calls no tools"));
        }
        match &self.tool_choice {
            None => {}
            Some(Value::String(c)) if c == "none" || c == "auto" => {}
            Some(c) => {
                return Err(unsupported(
                    "tool_choice",
                    &format!("tool_choice {c} asks for a tool call; the served model calls none"),
                ))
            }
        }
        if let Some(m) = &self.modalities {
            if m.iter().any(|m| m != "text") {
                return Err(unsupported(
                    "modalities",
                    &format!("modalities {m:?}: only text is served"),
                ));
            }
        }
        let prompt = tokenizer::encode_chat(parts.iter().map(|(r, t)| (*r, t.as_str())));
        let max = self.max_completion_tokens.or(self.max_tokens);
        let mut v = self.common().validate(served, prompt, max, limits, seed)?;
        if self.reasoning_effort.is_some() {
            v.ignored.push("reasoning_effort");
        }
        Ok(v)
    }
}

/// Token usage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// From the two counts.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// Which endpoint a response belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/completions`.
    Completions,
    /// `/v1/chat/completions`.
    Chat,
}

/// Identity of one response: id, creation time (unix seconds), model.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponseId {
    /// `cmpl-...` or `chatcmpl-...`.
    pub id: String,
    /// Unix seconds.
    pub created: u64,
    /// Model id.
    pub model: String,
    /// Endpoint.
    pub endpoint: Endpoint,
}

impl ResponseId {
    /// The non-streamed response.
    pub fn full(&self, text: &str, finish: &str, usage: Usage) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
                "usage": usage,
            }),
            Endpoint::Chat => json!({
                "id": self.id, "object": "chat.completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": finish}],
                "usage": usage,
            }),
        }
    }

    /// A stream chunk with `text` (and, for chat, the role on the first chunk).
    pub fn chunk(&self, text: &str, first: bool, finish: Option<&str>) -> Value {
        match self.endpoint {
            Endpoint::Completions => json!({
                "id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": finish}],
            }),
            Endpoint::Chat => {
                let delta = if first {
                    json!({"role": "assistant", "content": text})
                } else if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({
                    "id": self.id, "object": "chat.completion.chunk", "created": self.created,
                    "model": self.model,
                    "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
                })
            }
        }
    }

    /// The usage chunk (`stream_options.include_usage`): no choices.
    pub fn usage_chunk(&self, usage: Usage) -> Value {
        let object = match self.endpoint {
            Endpoint::Completions => "text_completion",
            Endpoint::Chat => "chat.completion.chunk",
        };
        json!({"id": self.id, "object": object, "created": self.created, "model": self.model,
               "choices": [], "usage": usage})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        context: 64,
        vocab: tokenizer::VOCAB,
    };

    #[test]
    fn status_codes_of_bad_requests() {
        let e = parse_body::<CompletionRequest>(b"{\"prompt\": ").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = parse_body::<CompletionRequest>(b"{\"prompt\": \"x\"} trailing").unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e =
            parse_body::<CompletionRequest>(br#"{"prompt": "x", "frobnicate": 1}"#).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert!(e.message.contains("frobnicate"), "{}", e.message);
        let e = parse_body::<ChatRequest>(
            br#"{"messages": [{"role": "user", "content": "x", "extra": 1}]}"#,
        )
        .unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("messages[0].extra"));
        let e = parse_body::<CompletionRequest>(br#"{"prompt": "x", "max_tokens": "many"}"#)
            .unwrap_err();
        assert_eq!(
            (e.status, e.param.as_deref()),
            (StatusCode::BAD_REQUEST, Some("max_tokens"))
        );
        let e = parse_body::<CompletionRequest>(br#"{"max_tokens": 3}"#).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("prompt"), "{}", e.message);
        let r: CompletionRequest =
            parse_body(br#"{"prompt": "hello", "max_tokens": 100}"#).unwrap();
        let e = r.validate("m", LIMITS, 0).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert!(e.message.contains("at most 58"), "{}", e.message);
        let long = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(80));
        let r: CompletionRequest = parse_body(long.as_bytes()).unwrap();
        let e = r.validate("m", LIMITS, 0).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert_eq!(e.code, Some("context_length_exceeded"));
        let r: CompletionRequest = parse_body(br#"{"prompt": "x", "model": "other"}"#).unwrap();
        assert_eq!(
            r.validate("m", LIMITS, 0).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        let r: CompletionRequest = parse_body(br#"{"prompt": "x", "temperature": 3}"#).unwrap();
        assert_eq!(
            r.validate("m", LIMITS, 0).unwrap_err().param.as_deref(),
            Some("temperature")
        );
        let body = e.body();
        assert!(body["error"]["message"].is_string() && body["error"]["type"].is_string());
    }

    /// Every OpenAI field clients commonly send is implemented, ignored (and named) or
    /// refused with a 400 naming it, as the module's table says.
    #[test]
    fn openai_fields_are_served_ignored_or_refused_by_name() {
        let chat = |extra: &str| -> Result<Validated, ApiError> {
            let body = format!(
                r#"{{"messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 4{extra}}}"#
            );
            parse_body::<ChatRequest>(body.as_bytes())?.validate("m", LIMITS, 0)
        };
        let cmpl = |extra: &str| -> Result<Validated, ApiError> {
            let body = format!(r#"{{"prompt": "hi", "max_tokens": 4{extra}}}"#);
            parse_body::<CompletionRequest>(body.as_bytes())?.validate("m", LIMITS, 0)
        };
        // Accepted with no effect: nothing named.
        for extra in [
            r#", "frequency_penalty": 0, "presence_penalty": 0.0, "user": "u", "n": 1"#,
            r#", "logprobs": false, "top_logprobs": 0, "response_format": {"type": "text"}"#,
            r#", "tool_choice": "none", "parallel_tool_calls": true, "metadata": {"a": "b"}"#,
            r#", "logit_bias": {}, "tools": [], "modalities": ["text"], "store": false"#,
            r#", "seed": 7, "stop": ["x"], "stream_options": {"include_usage": true}"#,
        ] {
            let v = chat(extra).unwrap_or_else(|e| panic!("{extra}: {e:?}"));
            assert!(v.ignored.is_empty(), "{extra}: {:?}", v.ignored);
        }
        // Accepted and named as ignored.
        let v = chat(
            r#", "frequency_penalty": 0.5, "presence_penalty": -1, "store": true, "service_tier": "auto", "reasoning_effort": "low""#,
        )
        .unwrap();
        assert_eq!(
            v.ignored,
            vec![
                "frequency_penalty",
                "presence_penalty",
                "store",
                "service_tier",
                "reasoning_effort"
            ]
        );
        assert_eq!(
            cmpl(r#", "presence_penalty": 1"#).unwrap().ignored,
            vec!["presence_penalty"]
        );
        // Refused, by name, with 400.
        for (extra, param) in [
            (r#", "n": 2"#, "n"),
            (r#", "logprobs": true"#, "logprobs"),
            (r#", "top_logprobs": 3"#, "top_logprobs"),
            (
                r#", "response_format": {"type": "json_object"}"#,
                "response_format",
            ),
            (r#", "response_format": {"type": "xml"}"#, "response_format"),
            (r#", "logit_bias": {"50256": -100}"#, "logit_bias"),
            (r#", "tools": [{"type": "function"}]"#, "tools"),
            (
                r#", "tool_choice": {"type": "function", "function": {"name": "f"}}"#,
                "tool_choice",
            ),
            (r#", "modalities": ["text", "audio"]"#, "modalities"),
            (r#", "frequency_penalty": 3"#, "frequency_penalty"),
            (r#", "seed": -1"#, "seed"),
            (r#", "functions": []"#, "functions"),
        ] {
            let e = chat(extra).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
            assert!(e.message.contains(param), "{extra}: {}", e.message);
        }
        for (extra, param) in [
            (r#", "logprobs": 0"#, "logprobs"),
            (r#", "echo": true"#, "echo"),
            (r#", "best_of": 3"#, "best_of"),
            (r#", "suffix": "end""#, "suffix"),
            (r#", "n": 4"#, "n"),
        ] {
            let e = cmpl(extra).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{extra}");
            assert_eq!(e.param.as_deref(), Some(param), "{extra}: {}", e.message);
        }
        assert!(cmpl(r#", "echo": false, "best_of": 1, "suffix": """#).is_ok());
    }

    #[test]
    fn valid_requests() {
        let r: CompletionRequest = parse_body(
            br#"{"model": "m", "prompt": ["hi"], "max_tokens": 5, "temperature": 0, "seed": 9,
                 "stream": true, "stream_options": {"include_usage": true}, "stop": "\n", "ignore_eos": true}"#,
        )
        .unwrap();
        let v = r.validate("m", LIMITS, 1).unwrap();
        assert_eq!(v.prompt, tokenizer::encode_prompt("hi"));
        assert_eq!(
            (v.max_tokens, v.sampling.seed, v.sampling.temperature),
            (5, 9, 0.0)
        );
        assert!(v.stream && v.include_usage && v.sampling.ignore_eos);
        assert_eq!(v.stops, vec!["\n".to_string()]);
        let c: ChatRequest = parse_body(
            br#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "u"}]}],
                 "max_completion_tokens": 3}"#,
        )
        .unwrap();
        let v = c.validate("m", LIMITS, 1).unwrap();
        assert_eq!(
            v.prompt,
            tokenizer::encode_chat([(Role::System, "s"), (Role::User, "u")])
        );
        assert_eq!(v.max_tokens, 3);
        assert_eq!(v.sampling.seed, 1, "the server's seed when none is given");
        let id = ResponseId {
            id: "chatcmpl-1".into(),
            created: 0,
            model: "m".into(),
            endpoint: Endpoint::Chat,
        };
        assert_eq!(
            id.chunk("a", true, None)["choices"][0]["delta"]["role"],
            "assistant"
        );
        assert_eq!(
            id.full("a", "stop", Usage::new(1, 1))["usage"]["total_tokens"],
            2
        );
    }
}
