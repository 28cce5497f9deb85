//! A rule charged by what its answers cost, as configured (`cost: {from:
//! ...}`): where the cost is read, how it is counted, what is reserved
//! before the answer. Plain specs: `proxy::flow::cost` builds the meters and
//! estimates from them.

/// One rule's cost read from its answers.
#[derive(Debug, Clone, PartialEq)]
pub struct CostSpec {
    /// The rule's name.
    pub rule: String,
    /// Where the cost is read.
    pub source: CostSource,
}

impl CostSpec {
    /// Whether its reservation reads the request's body (`from: llm`).
    pub fn reads_body(&self) -> bool {
        matches!(self.source, CostSource::Llm(_))
    }
}

/// Where an answer's cost is read.
#[derive(Debug, Clone, PartialEq)]
pub enum CostSource {
    /// A header or trailer the upstream sets (lowercase), a whole number
    /// (Kong's response-ratelimiting reads one).
    Header(String),
    /// A number in a JSON answer, at this pointer (RFC 6901).
    Json(String),
    /// The usage an LLM API reports.
    Llm(LlmCost),
}

/// `from: llm`.
#[derive(Debug, Clone, PartialEq)]
pub struct LlmCost {
    /// Which API's shapes are read (`auto`: by the request's path).
    pub dialect: Dialect,
    /// What the tokens weigh.
    pub count: Count,
    /// Reserve the estimate at admission (else 1 unit).
    pub reserve: bool,
    /// The reservation's output part when a request names no maximum.
    pub default_max_output: u64,
    /// Lower a request's maximum output to what the budget has left.
    pub cap_max_output: bool,
    /// Ask OpenAI Chat Completions streams for their usage
    /// (`stream_options.include_usage`).
    pub include_usage: bool,
}

impl LlmCost {
    /// What is reserved of a request whose body cannot be read (not JSON):
    /// the default maximum output at the output's weight (a price table:
    /// the dearest output); without `reserve`, one unit.
    pub fn fallback(&self) -> u64 {
        if !self.reserve {
            return 1;
        }
        let per = match &self.count {
            Count::Weights { output, .. } => *output,
            Count::Price(p) => p.iter().map(|(_, x)| x.output).fold(0.0, f64::max),
        };
        ((self.default_max_output as f64) * per).ceil().max(1.0) as u64
    }
}

/// An LLM API's request and answer shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// Chosen by the request's path: `/chat/completions`, `/responses`,
    /// `/messages`, `:generateContent` / `:streamGenerateContent`.
    Auto,
    /// OpenAI Chat Completions.
    OpenAi,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    Anthropic,
    /// Google Gemini.
    Gemini,
}

impl Dialect {
    /// Every dialect as the config writes it.
    pub const NAMES: [(&'static str, Dialect); 5] = [
        ("auto", Dialect::Auto),
        ("openai", Dialect::OpenAi),
        ("openai_responses", Dialect::OpenAiResponses),
        ("anthropic", Dialect::Anthropic),
        ("gemini", Dialect::Gemini),
    ];

    /// Its name in the config and the metrics.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, d)| *d == self)
            .map_or("auto", |(n, _)| n)
    }
}

/// What an answer's tokens weigh, in the rule's units.
#[derive(Debug, Clone, PartialEq)]
pub enum Count {
    /// Weights per kind of token: uncached input, cached input, output.
    /// `total` is 1, 1, 1; `input` 1, 1, 0; `output` 0, 0, 1.
    Weights {
        /// An uncached input token.
        input: f64,
        /// A cached input token.
        cached_input: f64,
        /// An output token.
        output: f64,
    },
    /// Prices per million tokens by model (the first pattern, in order of
    /// length, longest first, that matches): the units are millionths of
    /// the currency.
    Price(Vec<(String, Price)>),
}

/// A model's prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    /// An uncached input token.
    pub input: f64,
    /// A cached input token (the input price if not given).
    pub cached_input: f64,
    /// An output token.
    pub output: f64,
}

/// Millionths in one unit of money: a priced rule counts in them, so
/// that decimals are exact.
pub const MONEY: u64 = 1_000_000;

/// The shape of a rule's refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefusalShape {
    /// RFC 9457 problem details (the default).
    #[default]
    Problem,
    /// OpenAI's error object and `x-ratelimit-*-tokens` headers.
    OpenAi,
    /// Anthropic's error object and `anthropic-ratelimit-tokens-*`
    /// headers.
    Anthropic,
}
