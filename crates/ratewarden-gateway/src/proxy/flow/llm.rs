//! LLM APIs' token usage, read from their answers (JSON, or server-sent
//! events as they stream by), and the reservation a request's body
//! allows: the readers `cost: {from: llm}` runs. Plain functions over
//! bytes and `serde_json` values; fuzzed (`fuzz/` target `llm_usage`).
//!
//! One reader serves every dialect's answers: the usage objects differ in
//! their field names, never in a way that two dialects' fields collide,
//! and each stream's usage is read as "the last value of each field
//! wins" (OpenAI's last chunk, Anthropic's `message_start` then its
//! cumulative `message_delta`s, Responses' `response.completed`, each of
//! Gemini's chunks). The dialect matters for the request: where its
//! maximum output is written.

use serde_json::Value;

use std::sync::Arc;

use super::tap::{Meter, Read, Tokens};
use crate::config::cost::{CostSource, CostSpec, Count, Dialect, LlmCost};

/// The most of a JSON answer, or of one event, read for its usage: past
/// it, no usage (the reservation stays).
pub(crate) const MAX_JSON: usize = 1 << 20;

/// Tokens an answer used, as the API reported them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Input tokens, cached ones included.
    pub(crate) input: u64,
    /// Of them, read from a cache.
    pub(crate) cached: u64,
    /// Output tokens (every choice's, reasoning included).
    pub(crate) output: u64,
}

/// What a usage object says, field by field (`None`: not in this one).
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    input: Option<u64>,
    cached: Option<u64>,
    /// Anthropic counts cache reads and writes apart from `input_tokens`.
    cache_read: Option<u64>,
    cache_write: Option<u64>,
    output: Option<u64>,
    /// Gemini's thinking tokens, billed as output.
    thoughts: Option<u64>,
    /// Anthropic's shape (`input_tokens` excludes the cache).
    anthropic: bool,
    /// Whose shape the usage came in.
    dialect: Option<&'static str>,
}

impl Seen {
    /// Overwrites what `later` says (the last value of each field wins).
    fn update(&mut self, later: Seen) {
        macro_rules! take {
            ($($f:ident),*) => {$( if later.$f.is_some() { self.$f = later.$f; } )*};
        }
        take!(
            input,
            cached,
            cache_read,
            cache_write,
            output,
            thoughts,
            dialect
        );
        self.anthropic |= later.anthropic;
    }

    fn usage(&self) -> Option<Usage> {
        if self.input.is_none() && self.output.is_none() {
            return None;
        }
        let output = self.output.unwrap_or(0) + self.thoughts.unwrap_or(0);
        Some(if self.anthropic {
            let read = self.cache_read.unwrap_or(0);
            Usage {
                input: self.input.unwrap_or(0) + read + self.cache_write.unwrap_or(0),
                cached: read,
                output,
            }
        } else {
            let input = self.input.unwrap_or(0);
            Usage {
                input,
                cached: self.cached.unwrap_or(0).min(input),
                output,
            }
        })
    }
}

fn whole(v: Option<&Value>) -> Option<u64> {
    v.and_then(Value::as_u64)
}

/// The usage fields of one usage object, in whichever dialect's names.
fn usage_object(u: &Value) -> Seen {
    let mut s = Seen::default();
    if !u.is_object() {
        return s;
    }
    // OpenAI Chat Completions.
    s.input = whole(u.get("prompt_tokens"));
    s.output = whole(u.get("completion_tokens"));
    s.cached = whole(u.pointer("/prompt_tokens_details/cached_tokens"));
    // OpenAI Responses and Anthropic Messages.
    if let Some(i) = whole(u.get("input_tokens")) {
        s.input = Some(i);
    }
    if let Some(o) = whole(u.get("output_tokens")) {
        s.output = Some(o);
    }
    if let Some(c) = whole(u.pointer("/input_tokens_details/cached_tokens")) {
        s.cached = Some(c);
    }
    s.cache_read = whole(u.get("cache_read_input_tokens"));
    s.cache_write = whole(u.get("cache_creation_input_tokens"));
    s.anthropic = s.cache_read.is_some() || s.cache_write.is_some();
    // Gemini's usageMetadata.
    if let Some(p) = whole(u.get("promptTokenCount")) {
        s.input = Some(p);
    }
    if let Some(c) = whole(u.get("candidatesTokenCount")) {
        s.output = Some(c);
    }
    if let Some(c) = whole(u.get("cachedContentTokenCount")) {
        s.cached = Some(c);
    }
    s.thoughts = whole(u.get("thoughtsTokenCount"));
    s.dialect = if u.get("promptTokenCount").is_some() {
        Some("gemini")
    } else if s.anthropic {
        Some("anthropic")
    } else if u.get("prompt_tokens").is_some() {
        Some("openai")
    } else if u.get("input_tokens").is_some() {
        Some("openai_responses")
    } else {
        None
    };
    s
}

/// The usage and model one answer object (or one streamed event) carries.
fn read_object(v: &Value, seen: &mut Seen, model: &mut Option<String>) {
    let mut found = |u: Option<&Value>| {
        if let Some(u) = u {
            seen.update(usage_object(u));
        }
    };
    found(v.get("usage")); // OpenAI, Responses, Anthropic (answer, message_delta)
    found(v.pointer("/message/usage")); // Anthropic's message_start
    found(v.pointer("/response/usage")); // Responses' response.completed
    found(v.get("usageMetadata")); // Gemini
    if anthropic_shape(v) {
        seen.anthropic = true;
        seen.dialect = Some("anthropic");
    }
    for m in [
        v.get("model"),
        v.pointer("/message/model"),
        v.pointer("/response/model"),
        v.get("modelVersion"),
    ]
    .into_iter()
    .flatten()
    {
        if let Some(m) = m.as_str() {
            *model = Some(m.chars().take(128).collect());
        }
    }
}

/// The start of a usage key, `"usage"` or `"usageMetadata"`: one search
/// for both, built once (building a searcher costs more than a search).
static USAGE_KEY: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
    std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"usage"));

/// Whether the usage key found at `at` in `text` may open a usage object:
/// `"usage"` or `"usageMetadata"`, then `:` and `{`, spaces between; a
/// text that ends before it can tell says yes (it is parsed and read).
fn opens_usage(text: &[u8], at: usize) -> bool {
    let rest = &text[at + 6..];
    let rest = match rest.strip_prefix(b"\"") {
        Some(r) => r,
        None => match rest.strip_prefix(b"Metadata\"") {
            Some(r) => r,
            // Cut short inside `Metadata"`: cannot tell.
            None => return b"Metadata\"".starts_with(rest),
        },
    };
    let mut bytes = rest.iter().filter(|b| !b.is_ascii_whitespace());
    match bytes.next() {
        None => true,
        Some(b':') => bytes.next().is_none_or(|b| *b == b'{'),
        Some(_) => false,
    }
}

/// Whether a JSON text may hold a usage object: a key `"usage"` or
/// `"usageMetadata"` whose value is an object. A JSON text that holds one
/// written plainly has these bytes (a string's quotes are escaped inside
/// it, so text alone never passes for one); a key spelled with escapes is
/// not seen, and its usage is missing (the reservation stays, the safe
/// side).
pub(crate) fn carries_usage(json: &[u8]) -> bool {
    USAGE_KEY.find_iter(json).any(|at| opens_usage(json, at))
}

/// Anthropic's answers and events say `"type": "message"` or
/// `message_start` / `message_delta`: their `input_tokens` leaves the
/// cache out.
fn anthropic_shape(v: &Value) -> bool {
    matches!(
        v.get("type").and_then(Value::as_str),
        Some("message" | "message_start" | "message_delta")
    )
}

/// Reads an LLM answer's usage as it is relayed: a JSON answer kept aside
/// (up to [`MAX_JSON`]), or a stream of server-sent events read event by
/// event (nothing held back: each piece is read after it was handed on).
pub(crate) struct LlmMeter {
    /// The rule's spec (`from: llm`).
    spec: Arc<CostSpec>,
    /// The request's model, for a price when the answer names none.
    asked_model: Option<String>,
    /// `text/event-stream` (else JSON).
    sse: bool,
    body: Vec<u8>,
    over: bool,
    /// The SSE line being read, and the current event's data.
    line: Vec<u8>,
    data: Vec<u8>,
    /// A data line of the current event may hold a usage object.
    usage: bool,
    seen: Seen,
    model: Option<String>,
}

impl LlmMeter {
    /// A meter for `spec`'s rule (`None` unless it is `from: llm`).
    pub(crate) fn new(spec: Arc<CostSpec>, asked_model: Option<String>) -> Option<Self> {
        if !matches!(spec.source, CostSource::Llm(_)) {
            return None;
        }
        Some(Self {
            spec,
            asked_model,
            sse: false,
            body: Vec::new(),
            over: false,
            line: Vec::new(),
            data: Vec::new(),
            usage: false,
            seen: Seen::default(),
            model: None,
        })
    }

    fn count(&self) -> &Count {
        match &self.spec.source {
            CostSource::Llm(l) => &l.count,
            // (`new` made it only for `from: llm`.)
            _ => &Count::Weights {
                input: 1.0,
                cached_input: 1.0,
                output: 1.0,
            },
        }
    }

    /// The line held back (cut by a piece's end), read once whole: when its
    /// end arrives, or at the stream's end.
    fn event_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        self.line_of(&line, carries_usage(&line));
        self.line = line;
        self.line.clear();
    }

    /// One line of the stream, without its `\n`; `usage`: it may hold a
    /// usage object.
    fn line_of(&mut self, line: &[u8], usage: bool) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.dispatch();
        } else if let Some(d) = line.strip_prefix(b"data:") {
            let d = d.strip_prefix(b" ").unwrap_or(d);
            self.usage |= usage;
            if self.data.len() + d.len() < MAX_JSON {
                if !self.data.is_empty() {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(d);
            }
        }
    }

    fn dispatch(&mut self) {
        // Only an event that may carry a usage object is parsed (and the
        // first ones, until one names the model): a stream's other events,
        // nearly all of it, are passed over by a byte search.
        if !self.data.is_empty()
            && self.data != b"[DONE]"
            && (self.model.is_none() || self.usage)
            && let Ok(v) = serde_json::from_slice::<Value>(&self.data)
        {
            read_object(&v, &mut self.seen, &mut self.model);
        }
        self.data.clear();
        self.usage = false;
    }
}

impl Meter for LlmMeter {
    fn field(&mut self, name: &str, value: &[u8]) {
        if name.eq_ignore_ascii_case("content-type") {
            self.sse = value
                .get(..17)
                .is_some_and(|v| v.eq_ignore_ascii_case(b"text/event-stream"));
        }
    }

    fn data(&mut self, bytes: &[u8]) {
        if !self.sse {
            if self.over || self.body.len() + bytes.len() > MAX_JSON {
                self.over = true;
                self.body = Vec::new();
            } else {
                self.body.extend_from_slice(bytes);
            }
            return;
        }
        // Lines found by a vectorised search, and usage keys by one search
        // of the whole piece (one per event would cost more than the
        // relay): the relay's hot loop.
        let mut keys = USAGE_KEY.find_iter(bytes).peekable();
        let mut from = 0;
        for end in memchr::memchr_iter(b'\n', bytes) {
            let rest = &bytes[from..end];
            let mut usage = false;
            while let Some(&at) = keys.peek().filter(|at| **at < end) {
                usage |= at >= from && opens_usage(rest, at - from);
                keys.next();
            }
            from = end + 1;
            if self.line.is_empty() {
                // A whole line in this piece: read where it lies.
                self.line_of(rest, usage);
            } else {
                // A line cut by the piece's end, whole now: searched whole.
                if self.line.len() + rest.len() <= MAX_JSON {
                    self.line.extend_from_slice(rest);
                }
                self.event_line();
            }
        }
        let piece = &bytes[from..];
        if self.line.len() + piece.len() <= MAX_JSON {
            self.line.extend_from_slice(piece);
        }
    }

    fn model(&self) -> Option<&str> {
        self.model.as_deref().or(self.asked_model.as_deref())
    }

    fn tokens(&self) -> Option<Tokens> {
        let u = self.seen.usage()?;
        Some(Tokens {
            dialect: self.seen.dialect.unwrap_or("unknown"),
            input: u.input - u.cached.min(u.input),
            cached: u.cached.min(u.input),
            output: u.output,
        })
    }

    fn read(&mut self) -> Read {
        if self.sse {
            // A last event not followed by its blank line still counts.
            if !self.line.is_empty() {
                self.event_line();
            }
            self.dispatch();
        } else if self.over {
            return Read::Missing("too_large");
        } else {
            match serde_json::from_slice::<Value>(&self.body) {
                // Gemini's streamGenerateContent without `alt=sse`: an
                // array of chunks.
                Ok(Value::Array(chunks)) => {
                    for c in &chunks {
                        read_object(c, &mut self.seen, &mut self.model);
                    }
                }
                Ok(v) => read_object(&v, &mut self.seen, &mut self.model),
                Err(_) => return Read::Missing("not_json"),
            }
        }
        let Some(usage) = self.seen.usage() else {
            return Read::Missing("no_usage");
        };
        let model = self.model.as_deref().or(self.asked_model.as_deref());
        match units(self.count(), usage, model) {
            Some(n) => Read::Cost(n),
            None => Read::Missing("no_price"),
        }
    }
}

/// What `usage` costs under `count`, in the rule's units (a fraction
/// rounded up); `None` when priced and no pattern matches the model.
pub(crate) fn units(count: &Count, u: Usage, model: Option<&str>) -> Option<u64> {
    let uncached = (u.input - u.cached.min(u.input)) as f64;
    let (w_in, w_cached, w_out) = match count {
        Count::Weights {
            input,
            cached_input,
            output,
        } => (*input, *cached_input, *output),
        Count::Price(prices) => {
            let p = price_of(prices, model?)?;
            (p.input, p.cached_input, p.output)
        }
    };
    let x = uncached * w_in + u.cached as f64 * w_cached + u.output as f64 * w_out;
    Some(x.ceil().clamp(0.0, u64::MAX as f64) as u64)
}

/// The price of `model`: the first pattern (longest first) it matches.
fn price_of<'p>(
    prices: &'p [(String, crate::config::cost::Price)],
    model: &str,
) -> Option<&'p crate::config::cost::Price> {
    prices
        .iter()
        .find(|(pattern, _)| glob(pattern, model))
        .map(|(_, p)| p)
}

/// `*` matches any run of characters; everything else itself.
pub(crate) fn glob(pattern: &str, s: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = s.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for m in middle {
        match rest.find(m) {
            Some(i) => rest = &rest[i + m.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

/// The dialect a request to `path` speaks (`auto`: by its path; `None`
/// when the path says none).
pub(crate) fn dialect_of(configured: Dialect, path: &str) -> Option<Dialect> {
    if configured != Dialect::Auto {
        return Some(configured);
    }
    if path.ends_with("/chat/completions") {
        Some(Dialect::OpenAi)
    } else if path.ends_with("/responses") {
        Some(Dialect::OpenAiResponses)
    } else if path.ends_with("/messages") {
        Some(Dialect::Anthropic)
    } else if path.ends_with(":generateContent") || path.ends_with(":streamGenerateContent") {
        Some(Dialect::Gemini)
    } else {
        None
    }
}

/// What a request asks for: its model, the most output it allows (all
/// choices), and the bound on its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    pub(crate) model: Option<String>,
    /// The maximum output, times the choices asked for; `None` when the
    /// request names no maximum.
    pub(crate) max_output: Option<u64>,
    /// The choices asked for (`n`, Gemini's `candidateCount`), 1 to 128.
    pub(crate) choices: u64,
    /// The bound on its input tokens: the body's length in bytes (a text
    /// token is at least one byte of the text, and the JSON around the
    /// text outweighs the few tokens a chat template adds per message).
    pub(crate) input_bound: u64,
}

impl Asked {
    /// Lowered by `cap_max_output` to `per_choice` output tokens a choice
    /// (never raised).
    pub(crate) fn capped_to(&mut self, per_choice: Option<u64>) {
        if let Some(per) = per_choice {
            let total = per.saturating_mul(self.choices);
            self.max_output = Some(self.max_output.map_or(total, |m| m.min(total)));
        }
    }
}

/// A request body's JSON, when it is a JSON object.
pub(crate) fn body_json(body: &[u8]) -> Option<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
}

/// Reads a request body `v` (`len` bytes, a JSON object) in `dialect`
/// (`None`: any).
pub(crate) fn asked(dialect: Option<Dialect>, v: &Value, len: usize) -> Asked {
    // A number an API may read as a whole one (`500.0`) counts, rounded up.
    let n = |p: &str| v.pointer(p).and_then(whole_number);
    let choices = match dialect {
        Some(Dialect::Gemini) => n("/generationConfig/candidateCount"),
        _ => n("/n"),
    }
    .unwrap_or(1)
    .clamp(1, 128);
    let max = match dialect {
        Some(Dialect::OpenAi) => n("/max_completion_tokens").or_else(|| n("/max_tokens")),
        Some(Dialect::OpenAiResponses) => n("/max_output_tokens"),
        Some(Dialect::Anthropic) => n("/max_tokens"),
        Some(Dialect::Gemini) => n("/generationConfig/maxOutputTokens"),
        _ => n("/max_completion_tokens")
            .or_else(|| n("/max_output_tokens"))
            .or_else(|| n("/max_tokens"))
            .or_else(|| n("/generationConfig/maxOutputTokens")),
    };
    Asked {
        model: model_of(v),
        max_output: max.map(|m| m.saturating_mul(choices)),
        choices,
        input_bound: len as u64,
    }
}

/// The model a request body names (bounded).
pub(crate) fn model_of(v: &Value) -> Option<String> {
    v.get("model")
        .and_then(Value::as_str)
        .map(|m| m.chars().take(128).collect())
}

/// What a request is reserved at admission under `cost`: its input bound
/// and its maximum output (or `default_max_output`), at their weights (a
/// price table: the request's model's, else the dearest).
pub(crate) fn reservation(cost: &LlmCost, asked: Option<&Asked>) -> u64 {
    let Some(a) = asked.filter(|_| cost.reserve) else {
        return cost.fallback();
    };
    let output = a.max_output.unwrap_or(cost.default_max_output);
    let (w_in, w_out) = reserved_weights(cost, a);
    let x = a.input_bound as f64 * w_in + output as f64 * w_out;
    (x.ceil().clamp(1.0, u64::MAX as f64)) as u64
}

/// What a reserved input token and output token weigh: the input the
/// dearer of cached and not; under a price table, the request's model's
/// prices, else the dearest.
fn reserved_weights(cost: &LlmCost, a: &Asked) -> (f64, f64) {
    match &cost.count {
        Count::Weights {
            input,
            cached_input,
            output,
        } => (input.max(*cached_input), *output),
        Count::Price(prices) => match a.model.as_deref().and_then(|m| price_of(prices, m)) {
            Some(p) => (p.input.max(p.cached_input), p.output),
            None => dearest(prices),
        },
    }
}

/// `cap_max_output`: the most output tokens a choice may ask for so that
/// the request's reservation fits the `left` units its budget has; `None`
/// when what it asks already fits, when not one output token a choice
/// fits (it is refused as it is), or when its body cannot say a maximum.
pub(crate) fn capped(
    cost: &LlmCost,
    a: &Asked,
    left: u64,
    dialect: Option<Dialect>,
    v: &Value,
) -> Option<u64> {
    if !cost.reserve || !cost.cap_max_output || max_fields(dialect, v).is_none() {
        return None;
    }
    let (w_in, w_out) = reserved_weights(cost, a);
    let asked = a.max_output.unwrap_or(cost.default_max_output);
    let room = left as f64 - (a.input_bound as f64 * w_in).ceil();
    if w_out <= 0.0 || room < w_out {
        return None;
    }
    // Whole output tokens whose weight fits the room: the reservation
    // rounds up only its input part's fraction, which the room left out.
    let total = ((room / w_out).floor() as u64).min(asked);
    let per = total / a.choices.max(1);
    (total < asked && per > 0).then_some(per)
}

/// Where a body in `dialect` says its maximum output: the fields present
/// (as pointers' segments), and the one written when none is; `None` when
/// it cannot be said (no dialect, no field present).
fn max_fields(
    dialect: Option<Dialect>,
    v: &Value,
) -> Option<(Vec<&'static [&'static str]>, &'static [&'static str])> {
    const COMPLETION: &[&str] = &["max_completion_tokens"];
    const TOKENS: &[&str] = &["max_tokens"];
    const OUTPUT: &[&str] = &["max_output_tokens"];
    const GEMINI: &[&str] = &["generationConfig", "maxOutputTokens"];
    let (candidates, default): (&[&[&str]], Option<&[&str]>) = match dialect {
        Some(Dialect::OpenAi) => (&[COMPLETION, TOKENS], Some(COMPLETION)),
        Some(Dialect::OpenAiResponses) => (&[OUTPUT], Some(OUTPUT)),
        Some(Dialect::Anthropic) => (&[TOKENS], Some(TOKENS)),
        Some(Dialect::Gemini) => (&[GEMINI], Some(GEMINI)),
        _ => (&[COMPLETION, OUTPUT, TOKENS, GEMINI], None),
    };
    let present: Vec<_> = candidates
        .iter()
        .copied()
        .filter(|path| lookup(v, path).and_then(whole_number).is_some())
        .collect();
    match (present.first().copied(), default) {
        (Some(first), _) => Some((present, first)),
        (None, Some(d)) => {
            // Its parent must be an object, or absent.
            let parent_ok = d.len() == 1 || lookup(v, &d[..1]).is_none_or(Value::is_object);
            parent_ok.then_some((present, d))
        }
        (None, None) => None,
    }
}

/// A non-negative number, rounded up.
fn whole_number(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0)
            .map(|f| f.ceil().min(u64::MAX as f64) as u64)
    })
}

fn lookup<'v>(v: &'v Value, path: &[&str]) -> Option<&'v Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

/// The edits a request's body gets before it goes upstream: its maximum
/// output lowered to `max_per_choice` (`cap_max_output`), and an OpenAI
/// Chat Completions stream asked for its usage (`include_usage`). Whether
/// anything changed.
pub(crate) fn edit(
    v: &mut Value,
    dialect: Option<Dialect>,
    max_per_choice: Option<u64>,
    include_usage: bool,
) -> bool {
    let mut changed = false;
    if let Some(m) = max_per_choice
        && let Some((present, default)) = max_fields(dialect, v)
    {
        let targets = if present.is_empty() {
            vec![default]
        } else {
            present
        };
        for path in targets {
            let Some((last, parents)) = path.split_last() else {
                continue;
            };
            let mut at = &mut *v;
            for p in parents {
                at = match at {
                    Value::Object(o) => o
                        .entry(*p)
                        .or_insert_with(|| Value::Object(Default::default())),
                    other => other,
                };
            }
            if let Some(o) = at.as_object_mut()
                && o.get(*last).and_then(Value::as_u64).is_none_or(|n| n > m)
            {
                o.insert((*last).to_owned(), Value::from(m));
                changed = true;
            }
        }
    }
    if include_usage && dialect == Some(Dialect::OpenAi) && streams(v) {
        let o = v.as_object_mut().expect("streams() read an object");
        let options = o
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Some(opts) = options.as_object_mut()
            && opts.get("include_usage") != Some(&Value::Bool(true))
        {
            opts.insert("include_usage".to_owned(), Value::Bool(true));
            changed = true;
        }
    }
    changed
}

/// Whether an OpenAI Chat Completions body asks for a stream whose usage
/// `include_usage` would add.
pub(crate) fn streams(v: &Value) -> bool {
    v.get("stream") == Some(&Value::Bool(true))
        && v.get("stream_options")
            .is_none_or(|o| o.is_object() && o.get("include_usage") != Some(&Value::Bool(true)))
}

fn dearest(prices: &[(String, crate::config::cost::Price)]) -> (f64, f64) {
    prices.iter().fold((0.0, 0.0), |(i, o), (_, p)| {
        (i.max(p.input).max(p.cached_input), o.max(p.output))
    })
}

#[cfg(test)]
mod tests;
