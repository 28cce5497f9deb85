//! The gateway's configuration file as written: the types serde reads
//! from YAML, every value with its location (`Sp`), unknown keys refused,
//! and nothing checked beyond its type. The gateway's `config` module
//! validates them into the configuration it runs (`ratewarden-gateway`'s
//! `config::validate`), and the book (`docs/src/reference/configuration.md`) is their reference: each field is
//! the key of the same name.
//!
//! A crate of its own for the build's time (issue 38): serde's code for
//! these types, generic code instantiated for serde-saphyr's deserializer,
//! was the largest part of the gateway crate's compile (a third of its
//! LLVM IR), compiled at the end of the build with nothing beside it. Here
//! it compiles beside the rest of the build, as soon as serde-saphyr is
//! built, and at `opt-level = 0` (the workspace's profile): it runs once
//! per config load. The parse functions ([`file`], [`compat::file`],
//! [`rls::file`]) are where serde-saphyr is instantiated, so that none of
//! it is compiled again in the gateway.

// Each field is the config key of the same name, documented in the book (`docs/src/reference/configuration.md`).
#![allow(missing_docs)]

use serde::Deserialize;
use serde_saphyr::Spanned;

pub type Sp<T> = Spanned<T>;

/// A value made up by the gateway (a translated seed-002 file), located
/// nowhere.
pub fn nowhere<T>(value: T) -> Sp<T> {
    Sp::new(
        value,
        serde_saphyr::Location::UNKNOWN,
        serde_saphyr::Location::UNKNOWN,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct File {
    /// `Some(None)`: written as `listen: null` (an error: `off` says no
    /// listener), told apart from a file that does not name it.
    #[serde(default, deserialize_with = "written")]
    pub listen: Option<Option<Sp<String>>>,
    pub workers: Option<Sp<i64>>,
    #[serde(alias = "target")]
    pub upstream: Option<Sp<String>>,
    pub upstream_timeout: Option<Sp<String>>,
    pub upstream_path: Option<Sp<String>>,
    pub client_idle_timeout: Option<Sp<String>>,
    pub client_header_timeout: Option<Sp<String>>,
    pub client_body_timeout: Option<Sp<String>>,
    pub client_max_body_size: Option<Sp<String>>,
    pub underscores_in_headers: Option<Sp<bool>>,
    pub preserve_host: Option<Sp<bool>>,
    pub forwarded: Option<Sp<bool>>,
    pub x_forwarded_for: Option<Sp<String>>,
    pub request_headers: Option<Sp<RequestHeadersFile>>,
    pub tls: Option<Sp<TlsFile>>,
    pub upstream_tls: Option<Sp<UpstreamTlsFile>>,
    pub log: Option<Sp<LogFile>>,
    pub access_log: Option<Sp<AccessLogFile>>,
    pub tracing: Option<Sp<TracingFile>>,
    #[serde(default = "default_admin")]
    pub admin: Option<AdminFile>,
    pub store: Option<StoreFile>,
    pub identity: Option<IdentityFile>,
    #[serde(default)]
    pub allow: Vec<Sp<String>>,
    #[serde(default)]
    pub deny: Vec<Sp<String>>,
    pub headers: Option<Vec<Sp<String>>>,
    pub status: Option<Sp<i64>>,
    #[serde(default)]
    pub rules: Vec<RuleFile>,
    #[serde(default)]
    pub routes: Vec<RouteFile>,
    pub rls: Option<Sp<RlsFile>>,
    /// The key of the keyed hash of hashed key parts.
    pub key_secret: Option<Sp<String>>,
    /// Tokens verified for `jwt:CLAIM` key parts.
    pub jwt: Option<Sp<JwtFile>>,
    /// Runtime overrides of one key's limit: their bound.
    pub overrides: Option<Sp<OverridesFile>>,
    /// Where a gateway on the memory store keeps what must survive a
    /// restart (its overrides).
    pub state_dir: Option<Sp<String>>,
    /// The authorisation listener for other proxies' hooks.
    pub authz: Option<Sp<AuthzFile>>,
    /// API keys that name consumers.
    pub consumers: Option<Sp<ConsumersFile>>,
}

/// `consumers: {from, unknown, file, max}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumersFile {
    /// Where the key is: `header:NAME`, `authorization` (Bearer), `query:NAME`.
    pub from: Sp<String>,
    /// A key that names no consumer: `reject` (401) or `anonymous`.
    pub unknown: Option<Sp<String>>,
    /// A file of consumers (`[{name, key_hash, tier, metadata}]`).
    pub file: Option<Sp<String>>,
    /// The most the admin API may make.
    pub max: Option<Sp<i64>>,
}

/// One entry of `consumers.file`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumerEntry {
    pub name: String,
    pub key_hash: String,
    pub tier: Option<String>,
    /// Any YAML mapping; kept as given.
    pub metadata: Option<std::collections::BTreeMap<String, rls::Scalar>>,
}

/// Parses `consumers.file`.
pub fn consumers(text: &str) -> Result<Vec<ConsumerEntry>, serde_saphyr::Error> {
    serde_saphyr::from_str(text)
}

/// `authz: {listen}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthzFile {
    pub listen: Sp<String>,
}

/// `overrides: {max: N}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverridesFile {
    pub max: Option<Sp<i64>>,
}

/// `jwt:`: where the token is, the keys, the claims required.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFile {
    pub from: Option<Sp<JwtFromFile>>,
    /// A JWKS file (public keys).
    pub jwks: Option<Sp<String>>,
    /// A JWKS fetched at start and refreshed.
    pub jwks_url: Option<Sp<String>>,
    /// The HS256/384/512 secret.
    pub secret: Option<Sp<String>>,
    pub issuer: Option<Sp<String>>,
    pub audiences: Option<Vec<Sp<String>>>,
    pub leeway: Option<Sp<String>>,
    /// A request without a trusted token is answered 401.
    pub required: Option<Sp<bool>>,
}

/// `from: {header: NAME}` (the default, `Authorization`), `{cookie: NAME}`
/// or `{query: NAME}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtFromFile {
    pub header: Option<String>,
    pub cookie: Option<String>,
    pub query: Option<String>,
}

/// A `key:` part: its name (`header:X-Api-Key`), or `{hash: NAME}` for one
/// kept only as a keyed hash.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum KeyPartFile {
    Plain(String),
    Hashed(HashedPartFile),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HashedPartFile {
    pub hash: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RlsFile {
    pub listen: Sp<String>,
    /// envoyproxy/ratelimit's configuration: one file, or a directory of
    /// `.yaml` / `.yml` files.
    pub config: Option<Sp<String>>,
    /// Domains written here, in the same format (with ratewarden's
    /// extension).
    #[serde(default)]
    pub domains: Vec<crate::rls::DomainFile>,
    pub headers: Option<Vec<Sp<String>>>,
    /// The names of the `envoy` headers (envoyproxy/ratelimit's
    /// `LIMIT_*_HEADER`).
    pub header_names: Option<Sp<HeaderNamesFile>>,
}

/// `rls.header_names: {limit, remaining, reset}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeaderNamesFile {
    pub limit: Option<Sp<String>>,
    pub remaining: Option<Sp<String>>,
    pub reset: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteFile {
    pub name: Sp<String>,
    #[serde(rename = "match")]
    pub matcher: Option<Sp<MatchFile>>,
    pub upstream: Sp<RouteUpstreamFile>,
    pub preserve_host: Option<Sp<bool>>,
    pub request_headers: Option<Sp<RequestHeadersFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestHeadersFile {
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, Sp<String>>,
    #[serde(default)]
    pub remove: Vec<Sp<String>>,
}

/// A route's upstream: one URL, or servers with a balance and checks.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum RouteUpstreamFile {
    Url(String),
    Group(GroupFile),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GroupFile {
    pub servers: Vec<ServerFile>,
    pub balance: Option<String>,
    pub health: Option<HealthFile>,
}

/// One of a group's servers: its URL, or its URL and `protocol`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum ServerFile {
    Url(String),
    Full(ServerFullFile),
}

impl ServerFile {
    pub fn url(&self) -> &String {
        match self {
            Self::Url(u) => u,
            Self::Full(f) => &f.url,
        }
    }

    pub fn protocol(&self) -> Option<&String> {
        match self {
            Self::Url(_) => None,
            Self::Full(f) => f.protocol.as_ref(),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerFullFile {
    pub url: String,
    pub protocol: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthFile {
    pub passive: Option<PassiveFile>,
    pub active: Option<ActiveFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PassiveFile {
    pub failures: Option<i64>,
    pub eject_for: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActiveFile {
    pub path: String,
    pub interval: Option<String>,
    pub timeout: Option<String>,
}

pub fn default_admin() -> Option<AdminFile> {
    Some(AdminFile {
        listen: None,
        token: None,
        tls: None,
        token_for_probes: None,
        hosts: None,
    })
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogFile {
    pub format: Option<Sp<String>>,
    pub level: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TracingFile {
    pub otlp: Option<Sp<OtlpFile>>,
    pub sample: Option<Sp<f64>>,
    pub service_name: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpFile {
    pub endpoint: Sp<String>,
    pub protocol: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccessLogFile {
    pub path: Sp<String>,
    pub format: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminFile {
    pub listen: Option<Sp<String>>,
    pub token: Option<Sp<String>>,
    pub tls: Option<Sp<TlsFile>>,
    pub token_for_probes: Option<Sp<bool>>,
    pub hosts: Option<Vec<Sp<String>>>,
}

/// A listener's TLS: one certificate (`cert` + `key`) or several
/// (`certificates`), and for the admin listener `client_ca`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsFile {
    pub cert: Option<Sp<String>>,
    pub key: Option<Sp<String>>,
    pub certificates: Option<Vec<Sp<PairFile>>>,
    pub client_ca: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairFile {
    pub cert: Sp<String>,
    pub key: Sp<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamTlsFile {
    pub ca: Option<Sp<String>>,
    pub server_name: Option<Sp<String>>,
    pub client_cert: Option<Sp<String>>,
    pub client_key: Option<Sp<String>>,
}

/// The Redis client's TLS (with `rediss://` URLs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreTlsFile {
    pub ca: Option<Sp<String>>,
    pub client_cert: Option<Sp<String>>,
    pub client_key: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreFile {
    #[serde(rename = "type")]
    pub kind: Sp<String>,
    pub max_keys: Option<Sp<i64>>,
    pub url: Option<Sp<String>>,
    pub cluster: Option<Vec<Sp<String>>>,
    pub key_prefix: Option<Sp<String>>,
    pub timeout: Option<Sp<String>>,
    pub on_error: Option<Sp<String>>,
    pub tls: Option<Sp<StoreTlsFile>>,
    pub sentinel: Option<Sp<SentinelFile>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelFile {
    pub master: Sp<String>,
    #[serde(default)]
    pub nodes: Vec<Sp<String>>,
    pub password: Option<Sp<String>>,
    pub sentinel_password: Option<Sp<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdentityFile {
    pub from: Option<Sp<String>>,
    pub header: Option<Sp<String>>,
    /// With `from: jwt`: the claim (default `sub`).
    pub claim: Option<Sp<String>>,
    pub missing: Option<Sp<String>>,
    #[serde(default)]
    pub trusted_proxies: Vec<Sp<String>>,
    pub ipv6_prefix: Option<Sp<i64>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub name: Sp<String>,
    #[serde(rename = "match")]
    pub matcher: Option<Sp<MatchFile>>,
    pub key: Option<Vec<Sp<KeyPartFile>>>,
    /// What a request lacking a key part gets: identity (the default),
    /// anonymous, skip, reject.
    pub missing: Option<Sp<String>>,
    pub algorithm: Option<Sp<String>>,
    /// Required, but in a rule whose tiers each set one. A whole number;
    /// with `cost.price`, an amount of money (decimals allowed).
    pub limit: Option<Sp<LimitFile>>,
    /// Required, but for `concurrency` (which has `max_hold` instead) and
    /// `calendar` windows.
    pub window: Option<Sp<String>>,
    pub burst: Option<Sp<i64>>,
    pub mode: Option<Sp<String>>,
    pub max_delay: Option<Sp<String>>,
    pub min_interval: Option<Sp<String>>,
    pub penalty: Option<Sp<PenaltyFile>>,
    pub count: Option<Sp<String>>,
    pub reset_on_success: Option<Sp<bool>>,
    pub failure_status: Option<Vec<Sp<i64>>>,
    /// The `grpc-status` codes of a gRPC answer that are failures.
    pub failure_grpc_status: Option<Vec<Sp<i64>>>,
    pub count_rejected: Option<Sp<bool>>,
    /// Units a request costs, or where its answer's cost is read.
    pub cost: Option<Sp<CostFile>>,
    /// The shape of a refusal: `problem` (RFC 9457, the default),
    /// `openai` or `anthropic` (what their SDKs read).
    pub refusal: Option<Sp<String>>,
    /// A request the rule matches needs a trusted token (`jwt:`): 401
    /// without one.
    pub jwt_required: Option<Sp<bool>>,
    pub shadow: Option<Sp<bool>>,
    pub max_hold: Option<Sp<String>>,
    pub distribution: Option<Sp<DistributionFile>>,
    /// `fixed_window` windows that are calendar periods of a zone.
    pub calendar: Option<Sp<CalendarFile>>,
    /// Parameters chosen by a request value.
    pub tiers: Option<Sp<TiersFile>>,
    /// The status of a refusal by this rule.
    pub status: Option<Sp<i64>>,
    /// The problem `type` URI of a refusal by this rule.
    pub problem_type: Option<Sp<String>>,
}

/// `calendar: {period, timezone, anchor_day, anchor_month, anchor_weekday}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalendarFile {
    pub period: Sp<String>,
    pub timezone: Option<Sp<String>>,
    pub anchor_day: Option<Sp<i64>>,
    pub anchor_month: Option<Sp<i64>>,
    pub anchor_weekday: Option<Sp<String>>,
}

/// `tiers: {from, default, values: {NAME: {...} | unlimited}}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TiersFile {
    pub from: Sp<String>,
    /// Required; checked with the rest (a parser's "required" would hide
    /// every other error of the file).
    pub default: Option<Sp<String>>,
    pub values: std::collections::BTreeMap<String, Sp<TierFile>>,
}

/// A tier: `unlimited`, or the rule's parameters it sets.
#[derive(Debug, Clone)]
pub enum TierFile {
    Unlimited,
    Params(Box<TierParams>),
}

/// What a tier may set (the rest is the rule's).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TierParams {
    pub algorithm: Option<Sp<String>>,
    pub limit: Option<Sp<LimitFile>>,
    pub window: Option<Sp<String>>,
    pub burst: Option<Sp<i64>>,
    pub mode: Option<Sp<String>>,
    pub max_delay: Option<Sp<String>>,
    pub min_interval: Option<Sp<String>>,
    pub penalty: Option<Sp<PenaltyFile>>,
    pub cost: Option<Sp<CostFile>>,
    pub calendar: Option<Sp<CalendarFile>>,
    pub status: Option<Sp<i64>>,
    pub problem_type: Option<Sp<String>>,
}

/// A rule's `limit`: a whole number of units, or (with `cost.price`) an
/// amount of money.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LimitFile {
    Whole(i64),
    Decimal(f64),
}

impl<'de> Deserialize<'de> for LimitFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = LimitFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<LimitFile, E> {
                Ok(LimitFile::Whole(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<LimitFile, E> {
                Ok(LimitFile::Whole(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<LimitFile, E> {
                Ok(LimitFile::Decimal(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// A rule's `cost`: units per request, or where an answer's cost is read.
#[derive(Debug, Clone)]
pub enum CostFile {
    Fixed(i64),
    From(Box<CostFromFile>),
}

impl<'de> Deserialize<'de> for CostFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CostFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a whole number (units per request) or where the answer's cost is read (`{from: llm}`, `{from: header, header: NAME}`, `{from: json, pointer: /PATH}`)")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<CostFile, E> {
                Ok(CostFile::Fixed(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<CostFile, E> {
                Ok(CostFile::Fixed(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<CostFile, A::Error> {
                CostFromFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|c| CostFile::From(Box::new(c)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `cost: {from: ...}`: a rule charged by what its answers cost.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CostFromFile {
    /// `llm` (the usage an LLM API reports), `header` (a header or
    /// trailer the upstream sets) or `json` (a number in a JSON answer).
    pub from: Sp<String>,
    /// `from: header`: the header or trailer.
    pub header: Option<Sp<String>>,
    /// `from: json`: a JSON pointer (RFC 6901) to the number.
    pub pointer: Option<Sp<String>>,
    /// `llm`: reserve the estimate at admission (true, the default) or
    /// not; `header` / `json`: the units reserved (default 1).
    pub reserve: Option<Sp<ReserveFile>>,
    /// `llm`: `auto` (by path), `openai`, `openai_responses`,
    /// `anthropic` or `gemini`.
    pub dialect: Option<Sp<String>>,
    /// `llm`: `input`, `output`, `total`, or weights per kind of token.
    pub count: Option<Sp<CountFile>>,
    /// `llm`: the reservation's output part when a request names no
    /// maximum.
    pub default_max_output: Option<Sp<i64>>,
    /// `llm`: lower a request's maximum output to what the budget has left.
    pub cap_max_output: Option<Sp<bool>>,
    /// `llm`: ask OpenAI streams for their usage.
    pub include_usage: Option<Sp<bool>>,
    /// `llm`: prices per million tokens, by model pattern (`*` any run):
    /// the limit is then money.
    pub price: Option<Sp<std::collections::BTreeMap<String, Sp<PriceFile>>>>,
}

/// `reserve:` of a cost read from the answer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ReserveFile {
    On(bool),
    Units(i64),
}

impl<'de> Deserialize<'de> for ReserveFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl serde::de::Visitor<'_> for V {
            type Value = ReserveFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("true or false (`from: llm`), or the units reserved")
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<ReserveFile, E> {
                Ok(ReserveFile::On(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ReserveFile, E> {
                Ok(ReserveFile::Units(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ReserveFile, E> {
                Ok(ReserveFile::Units(i64::try_from(v).unwrap_or(i64::MAX)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `count:` of an LLM cost: one kind of token, or weights.
#[derive(Debug, Clone)]
pub enum CountFile {
    Kind(String),
    Weights(WeightsFile),
}

impl<'de> Deserialize<'de> for CountFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = CountFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`input`, `output`, `total`, or weights (`{input: 1, output: 4, cached_input: 0.1}`)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<CountFile, E> {
                Ok(CountFile::Kind(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<CountFile, A::Error> {
                WeightsFile::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(CountFile::Weights)
            }
        }
        d.deserialize_any(V)
    }
}

/// Weights per kind of token (`cached_input`: the input read from a
/// cache; `input`: the rest).
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightsFile {
    pub input: Option<f64>,
    pub output: Option<f64>,
    pub cached_input: Option<f64>,
}

/// A model's prices per million tokens.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceFile {
    pub input: f64,
    pub output: f64,
    pub cached_input: Option<f64>,
}

impl<'de> Deserialize<'de> for TierFile {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = TierFile;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("`unlimited` or a map of the tier's parameters (limit, window, burst, algorithm, cost, penalty, min_interval...)")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<TierFile, E> {
                if v == "unlimited" {
                    Ok(TierFile::Unlimited)
                } else {
                    Err(E::invalid_value(serde::de::Unexpected::Str(v), &self))
                }
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<TierFile, A::Error> {
                TierParams::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(|p| TierFile::Params(Box::new(p)))
            }
        }
        d.deserialize_any(V)
    }
}

/// `distribution: {mode: lease, epsilon, max_share}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistributionFile {
    pub mode: String,
    pub epsilon: Option<f64>,
    pub max_share: Option<f64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PenaltyFile {
    Plain(String),
    Full(PenaltyFull),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PenaltyFull {
    pub duration: String,
    pub multiplier: Option<u32>,
    pub max: Option<String>,
    pub memory: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchFile {
    pub methods: Option<Vec<Sp<String>>>,
    pub path: Option<Sp<String>>,
    pub path_prefix: Option<Sp<String>>,
    pub path_regex: Option<Sp<String>>,
    pub case_insensitive: Option<Sp<bool>>,
    pub route: Option<Sp<String>>,
    pub hosts: Option<Vec<Sp<String>>>,
    pub headers: Option<Vec<Sp<ConditionFile>>>,
    pub query: Option<Vec<Sp<ConditionFile>>>,
    /// Conditions on the JSON request body's fields (dotted names).
    pub json: Option<Vec<Sp<ConditionFile>>>,
}

/// A `headers:` or `query:` condition: a name and one test.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConditionFile {
    pub name: Sp<String>,
    pub exact: Option<Sp<String>>,
    pub prefix: Option<Sp<String>>,
    pub regex: Option<Sp<String>>,
    pub present: Option<Sp<bool>>,
    pub invert: Option<Sp<bool>>,
}

/// A key's value where `null` must be told apart from the key's absence.
fn written<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

/// Parses a config file (not yet validated, `${VAR}` already replaced).
pub fn file(text: &str) -> Result<File, serde_saphyr::Error> {
    serde_saphyr::from_str(text)
}

pub mod rls {
    //! Envoy's rate limit descriptors as written (envoyproxy/ratelimit's
    //! files, and `rls.domains`).

    use serde::Deserialize;

    /// Parses one descriptor file.
    pub fn file(text: &str) -> Result<DomainFile, serde_saphyr::Error> {
        serde_saphyr::from_str(text)
    }

    /// One configuration file's root (or one entry of `rls.domains`).
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct DomainFile {
        pub domain: Option<Scalar>,
        #[serde(default)]
        pub descriptors: Vec<DescriptorFile>,
    }

    /// A descriptor as written.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct DescriptorFile {
        pub key: Option<Scalar>,
        pub value: Option<Scalar>,
        pub rate_limit: Option<RateLimitFile>,
        #[serde(default)]
        pub descriptors: Vec<DescriptorFile>,
        #[serde(default)]
        pub shadow_mode: bool,
        #[serde(default)]
        pub detailed_metric: bool,
        // envoyproxy/ratelimit's keys this service does not implement: refused
        // by name rather than accepted and ignored.
        pub quota_mode: Option<serde::de::IgnoredAny>,
        pub value_to_metric: Option<serde::de::IgnoredAny>,
        pub share_threshold: Option<serde::de::IgnoredAny>,
        pub metadata: Option<serde::de::IgnoredAny>,
    }

    /// `rate_limit:` as written, with ratewarden's extension.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct RateLimitFile {
        pub unit: Option<String>,
        pub requests_per_unit: Option<u64>,
        #[serde(default)]
        pub unlimited: bool,
        pub name: Option<Scalar>,
        #[serde(default)]
        pub replaces: Vec<ReplacesFile>,
        pub algorithm: Option<String>,
        pub window: Option<String>,
        pub burst: Option<u64>,
        pub min_interval: Option<String>,
        pub penalty: Option<String>,
        pub distribution: Option<crate::DistributionFile>,
    }

    /// One `replaces:` entry.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ReplacesFile {
        pub name: Scalar,
    }

    /// A YAML scalar read as text, as Go's YAML reads a string field
    /// (`value: 200` is `"200"`).
    #[derive(Debug, Clone)]
    pub struct Scalar(pub String);

    impl<'de> Deserialize<'de> for Scalar {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl serde::de::Visitor<'_> for V {
                type Value = Scalar;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string, number or boolean")
                }
                fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
                    Ok(Scalar(v.to_owned()))
                }
                fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
                    Ok(Scalar(v.to_string()))
                }
                fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
                    Ok(Scalar(v.to_string()))
                }
                fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
                    Ok(Scalar(v.to_string()))
                }
                fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
                    Ok(Scalar(v.to_string()))
                }
            }
            d.deserialize_any(V)
        }
    }
}

pub mod compat {
    //! The Go gateway's format of seed 002 (root key `rateLimiter:`), as
    //! written.

    use super::Sp;
    use serde::Deserialize;

    /// Parses a seed-002 file.
    pub fn file(text: &str) -> Result<CompatFile, serde_saphyr::Error> {
        serde_saphyr::from_str(text)
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CompatFile {
        #[serde(rename = "rateLimiter")]
        pub rate_limiter: Root,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct Root {
        pub strategy: Option<Sp<String>>,
        pub identity: Option<CompatIdentity>,
        pub client: Option<Limit>,
        #[serde(default)]
        pub apis: Vec<Api>,
        pub target: Option<Sp<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct CompatIdentity {
        pub key: Option<Sp<String>>,
        pub header: Option<Sp<String>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Limit {
        pub limit: Sp<i64>,
        pub window_seconds: Option<Sp<i64>>,
        pub refill_seconds: Option<Sp<i64>>,
        pub expire_seconds: Option<Sp<i64>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    pub struct Api {
        pub identifier: Sp<String>,
        pub path: ApiPath,
        pub method: Option<Sp<String>>,
        pub limit: Sp<i64>,
        pub window_seconds: Option<Sp<i64>>,
        pub refill_seconds: Option<Sp<i64>>,
        pub expire_seconds: Option<Sp<i64>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    pub struct ApiPath {
        pub expression: Sp<String>,
        pub value: Sp<String>,
    }
}
