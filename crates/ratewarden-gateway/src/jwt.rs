//! JSON Web Tokens, verified to key on their claims (`jwt:CLAIM` key
//! parts): never to authorise, which stays the upstream's job. A leaf, as
//! `tls` is: the config loads a verifier through it, the flow and the admin
//! API ask it for a request's claims.
//!
//! A token is trusted only when all of these hold (else it is a missing
//! part, and the reason is counted):
//! - at most [`MAX_TOKEN`] bytes, three base64url parts, JSON header and
//!   claims;
//! - its `alg` is one of RS256/384/512, PS256, ES256/384, EdDSA (with a key
//!   of the JWKS that its `kid` names, of that key's type) or HS256/384/512
//!   (with the configured secret); never `none`, never an RSA or EC key used
//!   as an HMAC secret;
//! - no `crit` header (no extension is understood);
//! - `exp` and `nbf`, when present, hold within `leeway`; `iss` and `aud`
//!   are the configured ones when configured.
//!
//! The signatures are checked by the crypto provider rustls is built with
//! (aws-lc-rs, or ring): no cryptography of ours.

use std::borrow::Cow;

#[cfg(feature = "aws-lc")]
use aws_lc_rs::{hmac, signature};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
#[cfg(all(feature = "ring", not(feature = "aws-lc")))]
use ring::{hmac, signature};
use serde_json::Value;

/// The longest token read, in bytes.
pub const MAX_TOKEN: usize = 8 * 1024;

/// Where a request carries its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum From {
    /// A header (`Authorization: Bearer <token>`, or the bare token).
    Header(String),
    /// A cookie.
    Cookie(String),
    /// A query parameter.
    Query(String),
}

/// Why a token was not trusted: the label of
/// `ratewarden_jwt_rejected_total{reason}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejected {
    /// Over [`MAX_TOKEN`].
    TooLarge,
    /// Not three base64url parts of JSON.
    Malformed,
    /// `none`, an algorithm not supported, or one the key cannot take.
    Algorithm,
    /// No key of the JWKS has its `kid` (or it has none, and the JWKS has
    /// more than one key of its type).
    UnknownKey,
    /// The signature does not verify.
    Signature,
    /// Past `exp`.
    Expired,
    /// Before `nbf`.
    NotYetValid,
    /// Another `iss`.
    Issuer,
    /// No configured `aud`.
    Audience,
    /// A `crit` header.
    Critical,
    /// Not checked: its client sent [`FAILURES_PER_CLIENT`] tokens with bad
    /// signatures within [`FAILURE_WINDOW`] (see [`FailureBudget`]).
    TooManyFailures,
}

impl Rejected {
    /// The metric's label.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejected::TooLarge => "too_large",
            Rejected::Malformed => "malformed",
            Rejected::Algorithm => "algorithm",
            Rejected::UnknownKey => "unknown_key",
            Rejected::Signature => "signature",
            Rejected::Expired => "expired",
            Rejected::NotYetValid => "not_yet_valid",
            Rejected::Issuer => "issuer",
            Rejected::Audience => "audience",
            Rejected::Critical => "crit",
            Rejected::TooManyFailures => "too_many_failures",
        }
    }
}

/// A public key of the JWKS.
#[derive(Debug, Clone)]
enum Key {
    Rsa { n: Vec<u8>, e: Vec<u8> },
    P256(Vec<u8>),
    P384(Vec<u8>),
    Ed25519(Vec<u8>),
}

/// A JWKS's keys, by `kid`.
type Keys = Vec<(Option<String>, Key)>;

/// A JWKS fetched from a URL: its keys (swapped whole when refreshed),
/// when it was last fetched, and whether a token named a `kid` it lacks.
#[derive(Debug)]
struct Remote {
    url: String,
    keys: arc_swap::ArcSwap<Keys>,
    /// When it was last fetched (or tried); `None` before the first.
    fetched: parking_lot::Mutex<Option<std::time::Instant>>,
    unknown_kid: std::sync::atomic::AtomicBool,
    /// Moved at each new key set: a cached token verified under another
    /// set is verified again (a key rotated out is never trusted from the
    /// cache).
    generation: std::sync::atomic::AtomicU64,
}

/// How often a `jwks_url` is fetched again.
pub const REFRESH: std::time::Duration = std::time::Duration::from_secs(300);
/// The least time between two fetches a token's unknown `kid` asks for.
pub const REFRESH_ON_UNKNOWN_KID: std::time::Duration = std::time::Duration::from_secs(60);

/// What verifies tokens: the JWKS's keys, the HMAC secret, the required
/// claims.
#[derive(Clone)]
pub struct Verifier {
    /// Where the token is.
    pub from: From,
    /// A request without a trusted token is answered 401 (else its claims
    /// are missing parts).
    pub required: bool,
    keys: Keys,
    remote: Option<std::sync::Arc<Remote>>,
    secret: Option<Vec<u8>>,
    issuer: Option<String>,
    audiences: Vec<String>,
    leeway: u64,
    /// Tokens verified lately, and those that failed ([`TokenCache`]):
    /// shared by a verifier's clones, made afresh with each config.
    cache: std::sync::Arc<TokenCache>,
    /// Bad signatures per client lately ([`FailureBudget`]), shared with
    /// the cache.
    failures: std::sync::Arc<FailureBudget>,
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the secret.
        f.debug_struct("Verifier")
            .field("from", &self.from)
            .field("keys", &self.keys.len())
            .field("secret", &self.secret.is_some())
            .finish_non_exhaustive()
    }
}

fn b64(s: &str) -> Option<Vec<u8>> {
    URL_SAFE_NO_PAD.decode(s.trim_end_matches('=')).ok()
}

impl Verifier {
    /// A verifier of tokens from `from`, with the keys of `jwks` (a JWKS
    /// document's text, when given) and the HMAC `secret` (when given).
    /// `Err` says what in the JWKS cannot be used.
    pub fn new(
        from: From,
        jwks: Option<&str>,
        secret: Option<&[u8]>,
        issuer: Option<String>,
        audiences: Vec<String>,
        leeway_secs: u64,
    ) -> Result<Self, String> {
        let keys = match jwks {
            Some(text) => parse_jwks(text)?,
            None => vec![],
        };
        Ok(Self {
            from,
            required: false,
            keys,
            remote: None,
            secret: secret.map(<[u8]>::to_vec),
            issuer,
            audiences,
            leeway: leeway_secs,
            cache: std::sync::Arc::new(TokenCache::new(CACHED_TOKENS)),
            failures: std::sync::Arc::new(FailureBudget::new(FAILING_CLIENTS)),
        })
    }

    /// Fetches the JWKS at `url` now (`http://` or `https://`, within 5 s)
    /// and keeps refreshing it (see [`Verifier::refresh_due`]). `Err` says
    /// why the first fetch failed: a config that names one never starts
    /// without it.
    pub fn with_url(self, url: &str) -> Result<Self, String> {
        let v = self.with_url_unfetched(url)?;
        v.fetch_now()?;
        Ok(v)
    }

    /// Names the JWKS at `url` without fetching it: what loading a config
    /// does (no network I/O there). The keys come with [`fetch_now`]
    /// (before the gateway serves with it) and the refreshes after; until
    /// then no token of the URL's keys is trusted. `Err`: the URL is not
    /// `http://` or `https://` with a host.
    ///
    /// [`fetch_now`]: Verifier::fetch_now
    pub fn with_url_unfetched(mut self, url: &str) -> Result<Self, String> {
        let uri: http::Uri = url.parse().map_err(|e| format!("`{url}`: {e}"))?;
        if !matches!(uri.scheme_str(), Some("http" | "https")) {
            return Err(format!("`{url}`: jwks_url is http:// or https://"));
        }
        if uri.host().is_none() {
            return Err(format!("`{url}` names no host"));
        }
        self.remote = Some(std::sync::Arc::new(Remote {
            url: url.to_owned(),
            keys: arc_swap::ArcSwap::from_pointee(vec![]),
            fetched: parking_lot::Mutex::new(None),
            unknown_kid: std::sync::atomic::AtomicBool::new(false),
            generation: std::sync::atomic::AtomicU64::new(0),
        }));
        Ok(self)
    }

    /// The `jwks_url` it names, if any.
    pub fn url(&self) -> Option<&str> {
        self.remote.as_ref().map(|r| r.url.as_str())
    }

    /// Fetches the `jwks_url` now (blocking, within 5 s: call it off the
    /// request threads); `Err` says why it failed, and the keys held stay.
    /// Nothing without a `jwks_url`.
    pub fn fetch_now(&self) -> Result<(), String> {
        let Some(r) = &self.remote else { return Ok(()) };
        let keys = parse_jwks(&fetch(&r.url)?)?;
        *r.fetched.lock() = Some(std::time::Instant::now());
        r.keys.store(std::sync::Arc::new(keys));
        r.generation
            .fetch_add(1, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    /// Takes `old`'s fetched keys of the same `jwks_url` (a reload that
    /// kept it: no fetch, no gap); whether it did.
    pub fn keep_keys_of(&mut self, old: &Verifier) -> bool {
        match (&self.remote, &old.remote) {
            (Some(new), Some(o)) if new.url == o.url && o.fetched.lock().is_some() => {
                self.remote = Some(o.clone());
                true
            }
            _ => false,
        }
    }

    /// Whether the `jwks_url` is to be fetched again: every [`REFRESH`],
    /// or sooner (at most every [`REFRESH_ON_UNKNOWN_KID`]) once a token
    /// named a `kid` it lacks.
    pub fn refresh_due(&self) -> bool {
        let Some(r) = &self.remote else { return false };
        let Some(since) = r.fetched.lock().map(|t| t.elapsed()) else {
            return true;
        };
        since >= REFRESH
            || (since >= REFRESH_ON_UNKNOWN_KID
                && r.unknown_kid.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Fetches the `jwks_url` again (blocking: call it off the request
    /// threads). A failure keeps the last good set, and is logged.
    pub fn refresh(&self) {
        let Some(r) = &self.remote else { return };
        *r.fetched.lock() = Some(std::time::Instant::now());
        r.unknown_kid
            .store(false, std::sync::atomic::Ordering::Relaxed);
        match fetch(&r.url).and_then(|t| parse_jwks(&t)) {
            Ok(keys) => {
                tracing::info!(url = r.url, keys = keys.len(), "jwks_url refreshed");
                r.keys.store(std::sync::Arc::new(keys));
                r.generation
                    .fetch_add(1, std::sync::atomic::Ordering::Release);
            }
            Err(e) => {
                tracing::warn!(url = r.url, error = %e, "jwks_url refresh failed; the last good keys stay")
            }
        }
    }

    /// The URL's keys as they are now (a reference count, not a copy).
    fn remote_keys(&self) -> Option<std::sync::Arc<Keys>> {
        self.remote.as_ref().map(|r| r.keys.load_full())
    }
}

/// The keys of a JWKS document.
fn parse_jwks(text: &str) -> Result<Keys, String> {
    let mut keys = vec![];
    {
        {
            let doc: Value =
                serde_json::from_str(text).map_err(|e| format!("the JWKS is not JSON: {e}"))?;
            let list = doc
                .get("keys")
                .and_then(Value::as_array)
                .ok_or("the JWKS has no `keys` list")?;
            for (i, k) in list.iter().enumerate() {
                let field = |name: &str| k.get(name).and_then(Value::as_str);
                let bytes = |name: &str| {
                    field(name)
                        .and_then(b64)
                        .ok_or_else(|| format!("key {i}: `{name}` is missing or not base64url"))
                };
                let key = match (field("kty"), field("crv")) {
                    (Some("RSA"), _) => Key::Rsa {
                        n: bytes("n")?,
                        e: bytes("e")?,
                    },
                    (Some("EC"), Some(crv @ ("P-256" | "P-384"))) => {
                        let (x, y) = (bytes("x")?, bytes("y")?);
                        let mut point = vec![4];
                        point.extend_from_slice(&x);
                        point.extend_from_slice(&y);
                        if crv == "P-256" {
                            Key::P256(point)
                        } else {
                            Key::P384(point)
                        }
                    }
                    (Some("OKP"), Some("Ed25519")) => Key::Ed25519(bytes("x")?),
                    (kty, crv) => {
                        return Err(format!(
                            "key {i}: kty {kty:?} crv {crv:?} is not supported (RSA, EC P-256/P-384, OKP Ed25519)"
                        ));
                    }
                };
                keys.push((field("kid").map(str::to_owned), key));
            }
        }
    }
    Ok(keys)
}

/// GETs `url` (`http://` or `https://`, the system's roots) within 5 s:
/// the body of a 200.
fn fetch(url: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let uri: http::Uri = url.parse().map_err(|e| format!("`{url}`: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err(format!("`{url}`: jwks_url is http:// or https://")),
    };
    let host = uri.host().ok_or_else(|| format!("`{url}` names no host"))?;
    let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let timeout = std::time::Duration::from_secs(5);
    let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| format!("`{url}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{url}`: no address"))?;
    let tcp = std::net::TcpStream::connect_timeout(&addr, timeout)
        .map_err(|e| format!("`{url}`: {e}"))?;
    tcp.set_read_timeout(Some(timeout)).ok();
    tcp.set_write_timeout(Some(timeout)).ok();
    let request = format!(
        "GET {path} HTTP/1.1\r\nhost: {host}\r\naccept: application/json\r\nconnection: close\r\nuser-agent: ratewarden\r\n\r\n"
    );
    // Read at most one byte past the bound, so that a server sending more
    // is refused without its answer ever being held whole.
    const MAX: usize = 1 << 20;
    let mut raw = vec![];
    let io = |e: std::io::Error| format!("`{url}`: {e}");
    if https {
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
        let config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from(host.to_owned())
            .map_err(|e| format!("`{url}`: {e}"))?;
        let conn = rustls::ClientConnection::new(std::sync::Arc::new(config), name)
            .map_err(|e| format!("`{url}`: {e}"))?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(request.as_bytes()).map_err(io)?;
        // (A server that closes without close_notify ends the body too.)
        let _ = (&mut tls).take(MAX as u64 + 1).read_to_end(&mut raw);
    } else {
        let mut tcp = tcp;
        tcp.write_all(request.as_bytes()).map_err(io)?;
        (&mut tcp)
            .take(MAX as u64 + 1)
            .read_to_end(&mut raw)
            .map_err(io)?;
    }
    if raw.len() > MAX {
        return Err(format!("`{url}`: larger than 1 MiB"));
    }
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("`{url}`: no HTTP answer"))?;
    let status = head.split_whitespace().nth(1).unwrap_or("");
    if status != "200" {
        return Err(format!("`{url}` answered {status}"));
    }
    if head.lines().any(|l| {
        l.to_ascii_lowercase().starts_with("transfer-encoding:")
            && l.to_ascii_lowercase().contains("chunked")
    }) {
        return Err(format!("`{url}`: a chunked answer (send it with a length)"));
    }
    Ok(body.to_owned())
}

impl Verifier {
    /// The token a request carries where [`Verifier::from`] says, if any.
    pub fn token<'a>(
        &self,
        request: &ratewarden_tower::view::RequestView<'a>,
    ) -> Option<Cow<'a, str>> {
        let t = match &self.from {
            From::Header(h) => {
                let v = request.header_text(h)?;
                let v = match v.split_once(' ') {
                    Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => rest.trim(),
                    _ => v,
                };
                Cow::Borrowed(v)
            }
            From::Cookie(c) => Cow::Borrowed(request.cookie(c)?),
            From::Query(q) => request.query_values(q).next()?,
        };
        (!t.is_empty()).then_some(t)
    }

    /// The claims of `token` at `now` (seconds since the epoch), if it is
    /// to be trusted.
    ///
    /// A token verified (or refused after its signature was checked) is
    /// kept, so that a client reusing its token costs one verification, not
    /// one per request: see [`TokenCache`].
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, Rejected> {
        self.verify_from(token, now, || None)
    }

    /// [`Self::verify`], for a request from `client` (asked only when the
    /// token is not in the cache): a client that sent
    /// [`FAILURES_PER_CLIENT`] tokens with bad signatures within
    /// [`FAILURE_WINDOW`] has its further tokens refused unchecked until
    /// the window ends ([`Rejected::TooManyFailures`]), so that a flood of
    /// distinct forged tokens from one client costs at most that many
    /// signature checks a window. Tokens it had verified before stay
    /// trusted from the cache.
    pub fn verify_from(
        &self,
        token: &str,
        now: u64,
        client: impl FnOnce() -> Option<std::net::IpAddr>,
    ) -> Result<Claims, Rejected> {
        if token.len() > MAX_TOKEN {
            return Err(Rejected::TooLarge);
        }
        let generation = self.generation();
        if let Some(hit) = self.cache.get(token, now, generation) {
            return hit;
        }
        let client = client().map(FailureBudget::client);
        if let Some(c) = client
            && self.failures.spent(c, now)
        {
            return Err(Rejected::TooManyFailures);
        }
        self.cache
            .verified
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let result = self.verify_uncached(token, now);
        if let (Some(c), Err(Rejected::Signature)) = (client, &result) {
            self.failures.fail(c, now);
        }
        self.cache.put(token, now, generation, &result, self.leeway);
        result
    }

    /// How many tokens were verified, not found in the cache (a test's
    /// measure of the cache).
    pub fn verified(&self) -> u64 {
        self.cache
            .verified
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The JWKS's key set's generation (0 without a `jwks_url`).
    fn generation(&self) -> u64 {
        self.remote.as_ref().map_or(0, |r| {
            r.generation.load(std::sync::atomic::Ordering::Acquire)
        })
    }

    /// [`Self::verify`] without the cache.
    fn verify_uncached(&self, token: &str, now: u64) -> Result<Claims, Rejected> {
        if token.len() > MAX_TOKEN {
            return Err(Rejected::TooLarge);
        }
        let mut parts = token.split('.');
        let (Some(h), Some(p), Some(s), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(Rejected::Malformed);
        };
        let header: Value = b64(h)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or(Rejected::Malformed)?;
        let sig = b64(s).ok_or(Rejected::Malformed)?;
        if header.get("crit").is_some() {
            return Err(Rejected::Critical);
        }
        let alg = header
            .get("alg")
            .and_then(Value::as_str)
            .ok_or(Rejected::Algorithm)?;
        let kid = header.get("kid").and_then(Value::as_str);
        let signed = &token.as_bytes()[..h.len() + 1 + p.len()];
        self.check_signature(alg, kid, signed, &sig)?;
        let claims: Value = b64(p)
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(Value::is_object)
            .ok_or(Rejected::Malformed)?;
        let time = |name: &str| claims.get(name).and_then(Value::as_f64);
        if let Some(exp) = time("exp")
            && (now as f64) >= exp + self.leeway as f64
        {
            return Err(Rejected::Expired);
        }
        if let Some(nbf) = time("nbf")
            && (now as f64) + (self.leeway as f64) < nbf
        {
            return Err(Rejected::NotYetValid);
        }
        if let Some(iss) = &self.issuer
            && claims.get("iss").and_then(Value::as_str) != Some(iss.as_str())
        {
            return Err(Rejected::Issuer);
        }
        if !self.audiences.is_empty() {
            let aud: Vec<&str> = match claims.get("aud") {
                Some(Value::String(a)) => vec![a.as_str()],
                Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
                _ => vec![],
            };
            if !aud.iter().any(|a| self.audiences.iter().any(|w| w == a)) {
                return Err(Rejected::Audience);
            }
        }
        Ok(Claims(std::sync::Arc::new(claims)))
    }

    fn check_signature(
        &self,
        alg: &str,
        kid: Option<&str>,
        signed: &[u8],
        sig: &[u8],
    ) -> Result<(), Rejected> {
        if let Some(hmac_alg) = match alg {
            "HS256" => Some(hmac::HMAC_SHA256),
            "HS384" => Some(hmac::HMAC_SHA384),
            "HS512" => Some(hmac::HMAC_SHA512),
            _ => None,
        } {
            // Only the configured secret: never a public key read as one.
            let secret = self.secret.as_deref().ok_or(Rejected::Algorithm)?;
            let key = hmac::Key::new(hmac_alg, secret);
            return hmac::verify(&key, signed, sig).map_err(|_| Rejected::Signature);
        }
        let fits = |k: &Key| {
            matches!(
                (alg, k),
                ("RS256" | "RS384" | "RS512" | "PS256", Key::Rsa { .. })
                    | ("ES256", Key::P256(_))
                    | ("ES384", Key::P384(_))
                    | ("EdDSA", Key::Ed25519(_))
            )
        };
        if !matches!(
            alg,
            "RS256" | "RS384" | "RS512" | "PS256" | "ES256" | "ES384" | "EdDSA"
        ) {
            return Err(Rejected::Algorithm);
        }
        // The file's keys, then the URL's: looked at where they are, not
        // copied per token.
        let remote = self.remote_keys();
        let keys = || self.keys.iter().chain(remote.iter().flat_map(|k| k.iter()));
        let key = match kid {
            Some(kid) => {
                let Some((_, k)) = keys().find(|(id, _)| id.as_deref() == Some(kid)) else {
                    if let Some(r) = &self.remote {
                        r.unknown_kid
                            .store(true, std::sync::atomic::Ordering::Relaxed);
                    }
                    return Err(Rejected::UnknownKey);
                };
                if !fits(k) {
                    return Err(Rejected::Algorithm);
                }
                k
            }
            None => {
                let mut of_type = keys().filter(|(_, k)| fits(k));
                match (of_type.next(), of_type.next()) {
                    (Some((_, k)), None) => k,
                    _ => return Err(Rejected::UnknownKey),
                }
            }
        };
        let ok = match key {
            Key::Rsa { n, e } => {
                let params = match alg {
                    "RS256" => &signature::RSA_PKCS1_2048_8192_SHA256,
                    "RS384" => &signature::RSA_PKCS1_2048_8192_SHA384,
                    "RS512" => &signature::RSA_PKCS1_2048_8192_SHA512,
                    _ => &signature::RSA_PSS_2048_8192_SHA256,
                };
                signature::RsaPublicKeyComponents { n, e }
                    .verify(params, signed, sig)
                    .is_ok()
            }
            Key::P256(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P256_SHA256_FIXED, point)
                    .verify(signed, sig)
                    .is_ok()
            }
            Key::P384(point) => {
                signature::UnparsedPublicKey::new(&signature::ECDSA_P384_SHA384_FIXED, point)
                    .verify(signed, sig)
                    .is_ok()
            }
            Key::Ed25519(x) => signature::UnparsedPublicKey::new(&signature::ED25519, x)
                .verify(signed, sig)
                .is_ok(),
        };
        if ok { Ok(()) } else { Err(Rejected::Signature) }
    }
}

/// Tokens a verifier keeps, at most this many.
pub const CACHED_TOKENS: usize = 16_384;
/// The longest a verified token is kept (its `exp` ends it sooner).
pub const CACHED_FOR: u64 = 300;
/// How long a token refused after its signature was checked is kept as
/// refused: long enough that a flood of one bad token costs one check a
/// few seconds, short enough that a token refused for `nbf` is soon
/// tried again.
pub const CACHED_FAILURE_FOR: u64 = 5;

/// Tokens verified lately, by a keyed hash of the whole token (the token
/// itself kept beside it and compared: a hash collision never lends one
/// token another's claims), each with what its verification said:
/// - a trusted token, until its `exp` (with the leeway) or [`CACHED_FOR`],
///   whichever is first, and only under the key set it was verified with;
/// - a token refused after its signature was checked (a bad signature, an
///   expired or not-yet-valid token, a wrong issuer or audience), for
///   [`CACHED_FAILURE_FOR`]: a flood of one bad token costs one check.
///   Tokens refused before (malformed, an unknown `kid`, an algorithm not
///   taken) are not kept: refusing them costs no signature check, and
///   keeping them would let garbage push out good tokens.
///
/// Bounded: [`SHARDS`] maps of at most `max / SHARDS` tokens each; a full
/// map drops an entry to take a new one. A token is held in memory as a
/// request carried it; it is never logged, exported or stored elsewhere.
#[derive(Debug)]
pub(crate) struct TokenCache {
    shards: Vec<parking_lot::Mutex<std::collections::HashMap<u64, Cached>>>,
    hasher: foldhash::fast::RandomState,
    per_shard: usize,
    /// Verifications made (not answered from the cache).
    verified: std::sync::atomic::AtomicU64,
}

const SHARDS: usize = 16;

#[derive(Debug)]
struct Cached {
    token: Box<str>,
    generation: u64,
    /// Seconds since the epoch: kept until then.
    until: u64,
    result: Result<Claims, Rejected>,
}

impl TokenCache {
    fn new(max: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| parking_lot::Mutex::new(std::collections::HashMap::new()))
                .collect(),
            hasher: foldhash::fast::RandomState::default(),
            per_shard: max.div_ceil(SHARDS),
            verified: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn key(&self, token: &str) -> u64 {
        use std::hash::BuildHasher as _;
        self.hasher.hash_one(token)
    }

    /// What verifying `token` at `now` under key set `generation` said,
    /// when it is kept and still holds.
    fn get(&self, token: &str, now: u64, generation: u64) -> Option<Result<Claims, Rejected>> {
        let h = self.key(token);
        let shard = self.shards[h as usize % SHARDS].lock();
        let c = shard.get(&h)?;
        (now < c.until && c.generation == generation && *c.token == *token)
            .then(|| c.result.clone())
    }

    /// Keeps what verifying `token` said, when it is kept (see the type).
    fn put(
        &self,
        token: &str,
        now: u64,
        generation: u64,
        result: &Result<Claims, Rejected>,
        leeway: u64,
    ) {
        let until = match result {
            Ok(claims) => {
                let exp = claims
                    .0
                    .get("exp")
                    .and_then(Value::as_f64)
                    .map_or(u64::MAX, |e| (e.max(0.0) as u64).saturating_add(leeway));
                exp.min(now + CACHED_FOR)
            }
            Err(
                Rejected::Signature
                | Rejected::Expired
                | Rejected::NotYetValid
                | Rejected::Issuer
                | Rejected::Audience,
            ) => now + CACHED_FAILURE_FOR,
            Err(_) => return,
        };
        if until <= now {
            return;
        }
        let h = self.key(token);
        let mut shard = self.shards[h as usize % SHARDS].lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&h) {
            // Full: those past their time first, else any one.
            shard.retain(|_, c| now < c.until);
            if shard.len() >= self.per_shard
                && let Some(k) = shard.keys().next().copied()
            {
                shard.remove(&k);
            }
        }
        shard.insert(
            h,
            Cached {
                token: token.into(),
                generation,
                until,
                result: result.clone(),
            },
        );
    }
}

/// Tokens with bad signatures one client may send within
/// [`FAILURE_WINDOW`] before its further unknown tokens go unchecked.
pub const FAILURES_PER_CLIENT: u32 = 16;
/// The window of [`FAILURES_PER_CLIENT`], in seconds.
pub const FAILURE_WINDOW: u64 = 10;
/// Clients whose failures are counted at once, at most.
pub const FAILING_CLIENTS: usize = 65_536;

/// Bad signatures per client over a fixed window of [`FAILURE_WINDOW`]:
/// what bounds the CPU that a flood of distinct forged tokens costs (each
/// would otherwise be one signature check, RSA's the dearest, and one
/// entry pushing a good token out of the [`TokenCache`]).
///
/// A client is its address, an IPv6 one by its /64 (what one host is
/// commonly given). Only clients that failed are held, at most `max`; when
/// that many are failing within their windows at once, a new one is not
/// counted (its tokens are checked, each at one check's cost: the bound per
/// client holds for those counted, and a check per request for the rest).
#[derive(Debug)]
pub(crate) struct FailureBudget {
    shards: Vec<parking_lot::Mutex<std::collections::HashMap<u128, (u64, u32)>>>,
    per_shard: usize,
}

impl FailureBudget {
    fn new(max: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| parking_lot::Mutex::new(std::collections::HashMap::new()))
                .collect(),
            per_shard: max.div_ceil(SHARDS),
        }
    }

    /// The client `ip` is counted as.
    fn client(ip: std::net::IpAddr) -> u128 {
        match ip {
            std::net::IpAddr::V4(v4) => u128::from(u32::from(v4)),
            std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => u128::from(u32::from(v4)),
                None => u128::from(v6) & !((1u128 << 64) - 1),
            },
        }
    }

    fn shard(
        &self,
        client: u128,
    ) -> &parking_lot::Mutex<std::collections::HashMap<u128, (u64, u32)>> {
        // Fibonacci hashing of both halves: the shard from the top bits.
        let h = ((client >> 64) as u64 ^ client as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    /// Whether `client` has no checks left in its window at `now`.
    fn spent(&self, client: u128, now: u64) -> bool {
        self.shard(client)
            .lock()
            .get(&client)
            .is_some_and(|&(start, n)| now < start + FAILURE_WINDOW && n >= FAILURES_PER_CLIENT)
    }

    /// Counts one bad signature from `client` at `now`.
    fn fail(&self, client: u128, now: u64) {
        let mut shard = self.shard(client).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&client) {
            shard.retain(|_, &mut (start, _)| now < start + FAILURE_WINDOW);
            if shard.len() >= self.per_shard {
                return;
            }
        }
        let e = shard.entry(client).or_insert((now, 0));
        if now >= e.0 + FAILURE_WINDOW {
            *e = (now, 0);
        }
        e.1 += 1;
    }
}

/// A verified token's claims.
#[derive(Debug, Clone)]
pub struct Claims(std::sync::Arc<Value>);

impl ratewarden_tower::view::Claims for Claims {
    /// A claim by its path (`sub`, `org.id`): a string, or a number as
    /// written; anything else is missing.
    fn claim(&self, path: &str) -> Option<Cow<'_, str>> {
        field(&self.0, path)
    }
}

/// The field of a JSON object at a dotted `path` (`org.id`) as text: a
/// string, or a number as written; anything else is missing. (A token's
/// claims, and a JSON request body's fields.)
pub(crate) fn field<'v>(v: &'v Value, path: &str) -> Option<Cow<'v, str>> {
    let mut v = v;
    for step in path.split('.') {
        v = v.get(step)?;
    }
    match v {
        Value::String(s) => Some(Cow::Borrowed(s.as_str())),
        Value::Number(n) => Some(Cow::Owned(n.to_string())),
        _ => None,
    }
}

/// A JSON request body's fields, for `json:FIELD` key parts.
#[derive(Debug)]
pub(crate) struct BodyFields<'v>(pub(crate) &'v Value);

impl ratewarden_tower::view::Claims for BodyFields<'_> {
    fn claim(&self, path: &str) -> Option<Cow<'_, str>> {
        field(self.0, path)
    }
}
