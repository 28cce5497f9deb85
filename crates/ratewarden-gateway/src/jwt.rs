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
}

impl Rejected {
    /// Every reason, for the metric's labels.
    pub const ALL: [Rejected; 10] = [
        Rejected::TooLarge,
        Rejected::Malformed,
        Rejected::Algorithm,
        Rejected::UnknownKey,
        Rejected::Signature,
        Rejected::Expired,
        Rejected::NotYetValid,
        Rejected::Issuer,
        Rejected::Audience,
        Rejected::Critical,
    ];

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

/// What verifies tokens: the JWKS's keys, the HMAC secret, the required
/// claims.
#[derive(Clone)]
pub struct Verifier {
    /// Where the token is.
    pub from: From,
    /// A request without a trusted token is answered 401 (else its claims
    /// are missing parts).
    pub required: bool,
    keys: Vec<(Option<String>, Key)>,
    secret: Option<Vec<u8>>,
    issuer: Option<String>,
    audiences: Vec<String>,
    leeway: u64,
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
        let mut keys = vec![];
        if let Some(text) = jwks {
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
        if keys.is_empty() && secret.is_none() {
            return Err("give `jwks` (public keys) or `secret` (HS256/384/512), or both".into());
        }
        Ok(Self {
            from,
            required: false,
            keys,
            secret: secret.map(<[u8]>::to_vec),
            issuer,
            audiences,
            leeway: leeway_secs,
        })
    }

    /// The token a request carries where [`Verifier::from`] says, if any.
    pub fn token<'a>(
        &self,
        request: &ratewarden_tower::view::RequestView<'a>,
    ) -> Option<Cow<'a, str>> {
        let t = match &self.from {
            From::Header(h) => {
                let v = ratewarden_tower::view::text(request.header(h)?)?.trim();
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
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, Rejected> {
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
        Ok(Claims(claims))
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
        let key = match kid {
            Some(kid) => {
                let (_, k) = self
                    .keys
                    .iter()
                    .find(|(id, _)| id.as_deref() == Some(kid))
                    .ok_or(Rejected::UnknownKey)?;
                if !fits(k) {
                    return Err(Rejected::Algorithm);
                }
                k
            }
            None => {
                let mut of_type = self.keys.iter().filter(|(_, k)| fits(k));
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

/// A verified token's claims.
#[derive(Debug, Clone)]
pub struct Claims(Value);

impl ratewarden_tower::view::Claims for Claims {
    /// A claim by its path (`sub`, `org.id`): a string, or a number as
    /// written; anything else is missing.
    fn claim(&self, path: &str) -> Option<Cow<'_, str>> {
        let mut v = &self.0;
        for step in path.split('.') {
            v = v.get(step)?;
        }
        match v {
            Value::String(s) => Some(Cow::Borrowed(s.as_str())),
            Value::Number(n) => Some(Cow::Owned(n.to_string())),
            _ => None,
        }
    }
}
