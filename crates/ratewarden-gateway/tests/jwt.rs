//! `jwt:` (issue 34): tokens verified to key on their claims. A table of
//! good and bad tokens, made here with keys generated for the test (each
//! algorithm; expired, not yet valid, wrong issuer and audience; `none`,
//! HS256 signed with the RSA public key, an unknown `kid`, a bad signature,
//! a truncated token, `crit`, one too large), then the key part through
//! the gateway on both HTTP paths.

mod support;

use aws_lc_rs::hmac;
use aws_lc_rs::rand::SystemRandom;
use aws_lc_rs::rsa::{KeySize, PublicKeyComponents};
use aws_lc_rs::signature::{self, EcdsaKeyPair, Ed25519KeyPair, KeyPair, RsaKeyPair};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use ratewarden_gateway::jwt::{From, Rejected, Verifier};
use ratewarden_tower::view::Claims as _;
use serde_json::{Value, json};

const NOW: u64 = 1_800_000_000;
const SECRET: &[u8] = b"an HMAC secret of 32 bytes......";

/// The test's keys, and the JWKS of their public halves.
struct Keys {
    rsa: RsaKeyPair,
    p256: EcdsaKeyPair,
    p384: EcdsaKeyPair,
    ed: Ed25519KeyPair,
    jwks: String,
    rsa_n: Vec<u8>,
}

fn keys() -> Keys {
    let rsa = RsaKeyPair::generate(KeySize::Rsa2048).unwrap();
    let p256 = EcdsaKeyPair::generate(&signature::ECDSA_P256_SHA256_FIXED_SIGNING).unwrap();
    let p384 = EcdsaKeyPair::generate(&signature::ECDSA_P384_SHA384_FIXED_SIGNING).unwrap();
    let ed = Ed25519KeyPair::generate().unwrap();
    let c = PublicKeyComponents::<Vec<u8>>::from(rsa.public_key());
    let point = |k: &EcdsaKeyPair| k.public_key().as_ref().to_vec();
    let ec = |kid: &str, crv: &str, p: Vec<u8>| {
        let half = (p.len() - 1) / 2;
        json!({"kty": "EC", "kid": kid, "crv": crv, "x": B64.encode(&p[1..1 + half]), "y": B64.encode(&p[1 + half..])})
    };
    let jwks = json!({"keys": [
        {"kty": "RSA", "kid": "rsa", "n": B64.encode(&c.n), "e": B64.encode(&c.e)},
        ec("p256", "P-256", point(&p256)),
        ec("p384", "P-384", point(&p384)),
        {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": B64.encode(ed.public_key().as_ref())},
    ]})
    .to_string();
    Keys {
        rsa_n: c.n.clone(),
        rsa,
        p256,
        p384,
        ed,
        jwks,
    }
}

/// A token of `header` and `claims`, signed as `alg` says with `keys`.
fn token(k: &Keys, header: Value, claims: Value) -> String {
    let alg = header["alg"].as_str().unwrap_or("none").to_owned();
    let signed = format!(
        "{}.{}",
        B64.encode(header.to_string()),
        B64.encode(claims.to_string())
    );
    let rng = SystemRandom::new();
    let sig: Vec<u8> = match alg.as_str() {
        "RS256" | "RS384" | "RS512" | "PS256" => {
            let enc: &'static dyn signature::RsaEncoding = match alg.as_str() {
                "RS256" => &signature::RSA_PKCS1_SHA256,
                "RS384" => &signature::RSA_PKCS1_SHA384,
                "RS512" => &signature::RSA_PKCS1_SHA512,
                _ => &signature::RSA_PSS_SHA256,
            };
            let mut sig = vec![0; k.rsa.public_modulus_len()];
            k.rsa.sign(enc, &rng, signed.as_bytes(), &mut sig).unwrap();
            sig
        }
        "ES256" => k
            .p256
            .sign(&rng, signed.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec(),
        "ES384" => k
            .p384
            .sign(&rng, signed.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec(),
        "EdDSA" => k.ed.sign(signed.as_bytes()).as_ref().to_vec(),
        "HS256" => hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, SECRET),
            signed.as_bytes(),
        )
        .as_ref()
        .to_vec(),
        "HS384" => hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA384, SECRET),
            signed.as_bytes(),
        )
        .as_ref()
        .to_vec(),
        "HS512" => hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA512, SECRET),
            signed.as_bytes(),
        )
        .as_ref()
        .to_vec(),
        _ => vec![],
    };
    format!("{signed}.{}", B64.encode(sig))
}

fn verifier(k: &Keys, secret: Option<&[u8]>) -> Verifier {
    Verifier::new(
        From::Header("authorization".into()),
        Some(&k.jwks),
        secret,
        Some("https://issuer.example".into()),
        vec!["api".into()],
        30,
    )
    .unwrap()
}

fn good_claims() -> Value {
    json!({"sub": "user-7", "org": {"id": 42}, "iss": "https://issuer.example", "aud": ["other", "api"], "exp": NOW + 60, "nbf": NOW - 60})
}

#[test]
fn every_algorithm_verifies_and_its_claims_are_read() {
    let k = keys();
    let v = verifier(&k, Some(SECRET));
    for (alg, kid) in [
        ("RS256", Some("rsa")),
        ("RS384", Some("rsa")),
        ("RS512", Some("rsa")),
        ("PS256", Some("rsa")),
        ("ES256", Some("p256")),
        ("ES384", Some("p384")),
        ("EdDSA", Some("ed")),
        ("HS256", None),
        ("HS384", None),
        ("HS512", None),
    ] {
        let mut header = json!({"alg": alg, "typ": "JWT"});
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let t = token(&k, header, good_claims());
        let claims = v.verify(&t, NOW).unwrap_or_else(|e| panic!("{alg}: {e:?}"));
        assert_eq!(claims.claim("sub").as_deref(), Some("user-7"), "{alg}");
        assert_eq!(claims.claim("org.id").as_deref(), Some("42"), "{alg}");
        assert_eq!(
            claims.claim("org").as_deref(),
            None,
            "an object is no value"
        );
    }
}

#[test]
fn bad_tokens_are_refused_each_for_its_reason() {
    let k = keys();
    let v = verifier(&k, Some(SECRET));
    let rs = |claims: Value| token(&k, json!({"alg": "RS256", "kid": "rsa"}), claims);
    let with = |f: &dyn Fn(&mut Value)| {
        let mut c = good_claims();
        f(&mut c);
        c
    };
    let good = rs(good_claims());
    // A character in the middle of the signature changed: the encoding
    // stays valid (the last one may carry bits a decoder refuses), the
    // signature does not.
    let mut bad_sig = good.clone().into_bytes();
    let at = bad_sig.len() - 20;
    bad_sig[at] = if bad_sig[at] == b'A' { b'B' } else { b'A' };
    let bad_sig = String::from_utf8(bad_sig).unwrap();
    // HS256 "signed" with the RSA public key as the secret: the classic
    // confusion. Without a secret configured, HS256 is refused outright.
    let confused = {
        let signed = format!(
            "{}.{}",
            B64.encode(json!({"alg": "HS256", "kid": "rsa"}).to_string()),
            B64.encode(good_claims().to_string())
        );
        let tag = hmac::sign(
            &hmac::Key::new(hmac::HMAC_SHA256, &k.rsa_n),
            signed.as_bytes(),
        );
        format!("{signed}.{}", B64.encode(tag.as_ref()))
    };
    let none = format!(
        "{}.{}.",
        B64.encode(json!({"alg": "none"}).to_string()),
        B64.encode(good_claims().to_string())
    );
    let cases: Vec<(&str, String, Rejected)> = vec![
        (
            "expired",
            rs(with(&|c| c["exp"] = json!(NOW - 31))),
            Rejected::Expired,
        ),
        (
            "not yet valid",
            rs(with(&|c| c["nbf"] = json!(NOW + 31))),
            Rejected::NotYetValid,
        ),
        (
            "wrong iss",
            rs(with(&|c| c["iss"] = json!("https://evil.example"))),
            Rejected::Issuer,
        ),
        (
            "no iss",
            rs(with(&|c| {
                c.as_object_mut().unwrap().remove("iss");
            })),
            Rejected::Issuer,
        ),
        (
            "wrong aud",
            rs(with(&|c| c["aud"] = json!("web"))),
            Rejected::Audience,
        ),
        ("alg none", none, Rejected::Algorithm),
        (
            "HS256 with the RSA key",
            confused.clone(),
            Rejected::Signature,
        ),
        (
            "unknown kid",
            token(&k, json!({"alg": "RS256", "kid": "gone"}), good_claims()),
            Rejected::UnknownKey,
        ),
        (
            "kid of another type",
            token(&k, json!({"alg": "RS256", "kid": "p256"}), good_claims()),
            Rejected::Algorithm,
        ),
        (
            "unsupported alg",
            token(&k, json!({"alg": "RS1", "kid": "rsa"}), good_claims()),
            Rejected::Algorithm,
        ),
        ("bad signature", bad_sig, Rejected::Signature),
        (
            "truncated in its signature",
            good[..good.len() - 2].to_owned(),
            Rejected::Signature,
        ),
        (
            "truncated in its claims",
            good[..good.find('.').unwrap() + 10].to_owned(),
            Rejected::Malformed,
        ),
        (
            "two parts",
            good.rsplit_once('.').unwrap().0.to_owned(),
            Rejected::Malformed,
        ),
        (
            "crit",
            token(
                &k,
                json!({"alg": "RS256", "kid": "rsa", "crit": ["b64"]}),
                good_claims(),
            ),
            Rejected::Critical,
        ),
        (
            "too large",
            rs(with(&|c| c["pad"] = json!("x".repeat(9000)))),
            Rejected::TooLarge,
        ),
    ];
    for (what, t, want) in &cases {
        assert_eq!(v.verify(t, NOW).err(), Some(*want), "{what}");
    }
    // Within the leeway: still good.
    let leeway = rs(with(&|c| c["exp"] = json!(NOW - 29)));
    assert!(v.verify(&leeway, NOW).is_ok());
    // No secret configured: HS256 is not an algorithm this gateway takes,
    // whatever it was signed with.
    let no_secret = verifier(&k, None);
    assert_eq!(
        no_secret.verify(&confused, NOW).err(),
        Some(Rejected::Algorithm)
    );
}

/// The gateway in-process on the test's clock at `NOW`, with `jwt:` keys
/// `k` (written to a JWKS file) and `extra` (more `jwt:` fields), then
/// `rest` of the config; its upstream.
async fn gateway_with(
    k: &Keys,
    extra: &str,
    rest: &str,
) -> (
    support::Upstream,
    ratewarden_gateway::server::Running,
    support::Scratch,
) {
    let dir = support::scratch_dir("rw-jwt");
    let jwks = dir.join("jwks.json");
    std::fs::write(&jwks, &k.jwks).unwrap();
    let up = support::Upstream::start().await;
    let clock = ratewarden::clock::ManualClock::new(NOW * 1_000_000);
    let yaml = format!(
        "jwt: {{jwks: {}, issuer: https://issuer.example, audiences: [api]{extra}}}\n{rest}",
        jwks.display()
    );
    let gw = support::gateway(&yaml, &up.url(), Some(clock)).await;
    (up, gw, dir)
}

/// A bearer token for `sub` signed as `header` says.
fn bearer(k: &Keys, header: Value, sub: &str) -> String {
    let mut c = good_claims();
    c["sub"] = json!(sub);
    format!("Bearer {}", token(k, header, c))
}

/// `key: ['jwt:sub']` through the gateway (the flow both HTTP paths share
/// verifies the token): one bucket per subject; a token that fails is a
/// missing part (here: the client's address stands in), counted by reason
/// in the metrics.
#[tokio::test]
async fn the_jwt_key_part_through_the_gateway() {
    let k = keys();
    let (_up, gw, _dir) = gateway_with(
        &k,
        "",
        "rules:\n  - {name: per-user, limit: 1, window: 1h, key: ['jwt:sub']}\n",
    )
    .await;
    let bearer = |sub: &str| bearer(&k, json!({"alg": "ES256", "kid": "p256"}), sub);
    let (a, b) = (bearer("alice"), bearer("bob"));
    let listen = gw.listen();
    let status = |auth: &str| {
        let auth = auth.to_owned();
        async move {
            support::send(listen, "GET", "/", &[("authorization", auth.as_str())], "")
                .await
                .status
        }
    };
    assert_eq!(status(&a).await, 200);
    assert_eq!(status(&a).await, 429, "alice's one");
    assert_eq!(status(&b).await, 200, "bob has his own");
    // A forged token: not trusted, so the address stands in.
    // (A character in the middle of the signature changed: the encoding
    // stays valid, the signature does not.)
    let mut forged = b.clone().into_bytes();
    let at = forged.len() - 20;
    forged[at] = if forged[at] == b'A' { b'B' } else { b'A' };
    let forged = String::from_utf8(forged).unwrap();
    assert_eq!(status(&forged).await, 200);
    assert_eq!(
        status("").await,
        429,
        "the address's bucket, as the forged one's"
    );
    let m = support::send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    assert!(
        m.contains("ratewarden_jwt_rejected_total{reason=\"signature\"} 1"),
        "{m}"
    );
    gw.shutdown().await;
}

/// `identity: {from: jwt, claim: sub}`: the client is the token's subject
/// (every rule keyed by the identity counts per subject); without a
/// trusted token, the address (`missing: ip`, the default).
#[tokio::test]
async fn the_identity_from_a_claim() {
    let k = keys();
    let (_up, gw, _dir) = gateway_with(
        &k,
        "",
        "identity: {from: jwt, claim: sub}\nrules:\n  - {name: per-client, limit: 1, window: 1h}\n",
    )
    .await;
    let gw_listen = gw.listen();
    let bearer = |sub: &str| bearer(&k, json!({"alg": "EdDSA", "kid": "ed"}), sub);
    let send = |auth: String| async move {
        let headers: Vec<(&str, &str)> = if auth.is_empty() {
            vec![]
        } else {
            vec![("authorization", auth.as_str())]
        };
        support::send(gw_listen, "GET", "/", &headers, "")
            .await
            .status
    };
    assert_eq!(send(bearer("alice")).await, 200);
    assert_eq!(send(bearer("alice")).await, 429);
    assert_eq!(send(bearer("bob")).await, 200);
    assert_eq!(send(String::new()).await, 200, "no token: the address");
    assert_eq!(send(String::new()).await, 429);
    let explain = support::send(
        gw.admin.unwrap(),
        "GET",
        &format!(
            "/v1/explain?jwt={}",
            bearer("carol").trim_start_matches("Bearer ")
        ),
        &[],
        "",
    )
    .await
    .body;
    assert!(explain.contains("\"identity\":\"carol\""), "{explain}");
    gw.shutdown().await;
}

/// `required: true`: a request without a trusted token is answered 401
/// with `WWW-Authenticate: Bearer error="invalid_token"`, never limited
/// as anyone.
#[tokio::test]
async fn a_required_token_is_a_401_when_missing_or_bad() {
    let k = keys();
    let (up, gw, _dir) = gateway_with(
        &k,
        ", required: true",
        "rules:\n  - {name: per-user, limit: 5, window: 1h, key: ['jwt:sub']}\n",
    )
    .await;
    let r = support::send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 401);
    assert_eq!(
        r.header("www-authenticate"),
        Some("Bearer error=\"invalid_token\"")
    );
    let mut expired = good_claims();
    expired["exp"] = json!(NOW - 3600);
    let bad = format!(
        "Bearer {}",
        token(&k, json!({"alg": "RS256", "kid": "rsa"}), expired)
    );
    let r = support::send(
        gw.listen(),
        "GET",
        "/",
        &[("authorization", bad.as_str())],
        "",
    )
    .await;
    assert_eq!(r.status, 401);
    let good = format!(
        "Bearer {}",
        token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims())
    );
    let r = support::send(
        gw.listen(),
        "GET",
        "/",
        &[("authorization", good.as_str())],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        up.hits.load(std::sync::atomic::Ordering::Relaxed),
        1,
        "only the good one went on"
    );
    gw.shutdown().await;
}

/// `jwt_required` on a rule: a request it matches needs a trusted token
/// (401 without one); a path no such rule matches (a health check) works
/// without one. A rule that asks for it without a `jwt:` section is a
/// config error.
#[tokio::test]
async fn a_rule_can_require_a_token_for_what_it_matches() {
    let k = keys();
    let (up, gw, _dir) = gateway_with(
        &k,
        "",
        "rules:\n  - {name: api, match: {path_prefix: /api/}, limit: 5, window: 1h, key: ['jwt:sub'], jwt_required: true}\n  - {name: all, limit: 100, window: 1h}\n",
    )
    .await;
    let r = support::send(gw.listen(), "GET", "/health", &[], "").await;
    assert_eq!(r.status, 200, "no rule requires one here");
    let r = support::send(gw.listen(), "GET", "/api/orders", &[], "").await;
    assert_eq!(r.status, 401);
    let good = bearer(&k, json!({"alg": "RS256", "kid": "rsa"}), "ann");
    let r = support::send(
        gw.listen(),
        "GET",
        "/api/orders",
        &[("authorization", good.as_str())],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(up.hits.load(std::sync::atomic::Ordering::Relaxed), 2);
    gw.shutdown().await;
    let e = ratewarden_gateway::config::load(
        "upstream: echo\nrules:\n  - {name: api, limit: 5, window: 1h, jwt_required: true}\n",
        "t.yaml",
        &ratewarden_gateway::config::Overrides::default(),
    )
    .unwrap_err();
    assert!(e.first().message.contains("needs a `jwt:` section"), "{e}");
    assert_eq!(e.first().line, 3);
}

/// A JWKS served over HTTP by the test, then rotated: `jwks_url` is fetched
/// when the config loads; a token signed by a key not yet published is not
/// trusted (and asks for a refresh); once the server publishes it, a
/// refresh trusts it; a failed refresh keeps the last good keys.
/// Issue 51: a token verified once is answered from the verifier's cache
/// until its `exp` (with the leeway), and no longer; one refused after its
/// signature was checked is refused from the cache for a few seconds (a
/// flood of one bad token costs one check); malformed ones cost no check.
#[test]
fn verified_tokens_are_kept_until_their_exp_and_bad_ones_briefly() {
    let k = keys();
    let v = verifier(&k, None);
    let rsa = token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims());
    for _ in 0..100 {
        let c = v.verify(&rsa, NOW).unwrap();
        assert_eq!(
            ratewarden_tower::view::Claims::claim(&c, "sub").as_deref(),
            Some("user-7")
        );
    }
    assert_eq!(v.verified(), 1, "one verification for 100 uses");
    // exp is NOW + 60, the leeway 30: trusted at NOW + 89, not at + 90.
    assert!(v.verify(&rsa, NOW + 89).is_ok());
    assert_eq!(v.verify(&rsa, NOW + 90).err(), Some(Rejected::Expired));
    assert_eq!(v.verify(&rsa, NOW + 91).err(), Some(Rejected::Expired));
    assert_eq!(
        v.verified(),
        2,
        "the expired one checked once, then kept as refused"
    );
    // A bad signature: checked once, refused from the cache for 5 s, then
    // checked again.
    // (The signature's first character changed: still base64.)
    let at = rsa.rfind('.').unwrap() + 1;
    let first = &rsa[at..at + 1];
    let forged = format!(
        "{}{}{}",
        &rsa[..at],
        if first == "A" { "B" } else { "A" },
        &rsa[at + 1..]
    );
    let before = v.verified();
    for _ in 0..100 {
        assert_eq!(v.verify(&forged, NOW).err(), Some(Rejected::Signature));
    }
    assert_eq!(v.verified() - before, 1);
    assert_eq!(v.verify(&forged, NOW + 5).err(), Some(Rejected::Signature));
    assert_eq!(v.verified() - before, 2);
    // Garbage is refused without a check, and not kept.
    assert_eq!(v.verify("a.b", NOW).err(), Some(Rejected::Malformed));
    // Another token of the same claims is its own entry.
    let other = token(&k, json!({"alg": "ES256", "kid": "p256"}), good_claims());
    assert!(v.verify(&other, NOW).is_ok());
}

/// Issue 51: a flood of *distinct* forged tokens from one client costs at
/// most `FAILURES_PER_CLIENT` signature checks a `FAILURE_WINDOW`; the rest
/// are refused unchecked (and not kept, so they push no good token out of
/// the cache). Another client is not touched; the client's own token
/// verified before stays trusted; its window ends and it is checked again.
/// An IPv6 client is counted by its /64.
#[test]
fn a_flood_of_distinct_forged_tokens_costs_a_bounded_number_of_checks() {
    use ratewarden_gateway::jwt::{FAILURE_WINDOW, FAILURES_PER_CLIENT};
    let k = keys();
    let v = verifier(&k, None);
    let attacker: std::net::IpAddr = "203.0.113.9".parse().unwrap();
    let other: std::net::IpAddr = "198.51.100.4".parse().unwrap();
    // The attacker's own good token, verified before the flood.
    let mine = token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims());
    assert!(v.verify_from(&mine, NOW, || Some(attacker)).is_ok());
    // 1,000 distinct forgeries: each a real token's claims with another sub,
    // signed by nobody (a signature of the right length, all wrong).
    let good = token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims());
    let sig = &good[good.rfind('.').unwrap() + 1..];
    let forge = |i: u32| {
        let mut claims = good_claims();
        claims["sub"] = json!(format!("forged-{i}"));
        let t = token(&k, json!({"alg": "RS256", "kid": "rsa"}), claims);
        format!("{}.{sig}", &t[..t.rfind('.').unwrap()])
    };
    let before = v.verified();
    let mut unchecked = 0;
    for i in 0..1000 {
        match v.verify_from(&forge(i), NOW, || Some(attacker)) {
            Err(Rejected::Signature) => {}
            Err(Rejected::TooManyFailures) => unchecked += 1,
            r => panic!("forgery {i}: {r:?}"),
        }
    }
    assert_eq!(v.verified() - before, u64::from(FAILURES_PER_CLIENT));
    assert_eq!(unchecked, 1000 - FAILURES_PER_CLIENT);
    // Its token verified before is still trusted (from the cache); a new
    // good one of its is not checked until the window ends.
    assert!(v.verify_from(&mine, NOW + 1, || Some(attacker)).is_ok());
    let mut later = good_claims();
    later["sub"] = json!("user-8");
    let fresh = token(&k, json!({"alg": "ES256", "kid": "p256"}), later);
    assert_eq!(
        v.verify_from(&fresh, NOW + 1, || Some(attacker)).err(),
        Some(Rejected::TooManyFailures)
    );
    // Another client is checked as ever.
    assert!(v.verify_from(&fresh, NOW + 1, || Some(other)).is_ok());
    assert_eq!(
        v.verify_from(&forge(5000), NOW + 1, || Some(other)).err(),
        Some(Rejected::Signature)
    );
    // The window ends: the attacker is checked again.
    let next = NOW + FAILURE_WINDOW;
    assert_eq!(
        v.verify_from(&forge(6000), next, || Some(attacker)).err(),
        Some(Rejected::Signature)
    );
    // IPv6: the addresses of one /64 are one client; another /64 is not.
    let v = verifier(&k, None);
    for i in 0..u64::from(FAILURES_PER_CLIENT) {
        let ip: std::net::IpAddr = format!("2001:db8:1:2::{:x}", i + 1).parse().unwrap();
        assert_eq!(
            v.verify_from(&forge(7000 + i as u32), NOW, || Some(ip))
                .err(),
            Some(Rejected::Signature)
        );
    }
    let same: std::net::IpAddr = "2001:db8:1:2:ffff::1".parse().unwrap();
    let apart: std::net::IpAddr = "2001:db8:1:3::1".parse().unwrap();
    assert_eq!(
        v.verify_from(&forge(8000), NOW, || Some(same)).err(),
        Some(Rejected::TooManyFailures)
    );
    assert_eq!(
        v.verify_from(&forge(8001), NOW, || Some(apart)).err(),
        Some(Rejected::Signature)
    );
}

#[test]
fn a_jwks_url_is_fetched_and_refreshed_through_rotation() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    let k = keys();
    let doc: Value = serde_json::from_str(&k.jwks).unwrap();
    let only = |kid: &str| {
        let keys: Vec<Value> = doc["keys"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|x| x["kid"] == kid)
            .cloned()
            .collect();
        json!({ "keys": keys }).to_string()
    };
    // What the server answers: (status, body).
    let served = Arc::new(Mutex::new((200, only("rsa"))));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let s = served.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut buf = [0; 4096];
            let _ = conn.read(&mut buf);
            let (status, body) = s.lock().unwrap().clone();
            let _ = write!(
                conn,
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let url = format!("http://{addr}/.well-known/jwks.json");
    let v = Verifier::new(
        From::Header("authorization".into()),
        None,
        None,
        None,
        vec![],
        0,
    )
    .unwrap()
    .with_url(&url)
    .unwrap();
    let rsa = token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims());
    let ed = token(&k, json!({"alg": "EdDSA", "kid": "ed"}), good_claims());
    assert!(v.verify(&rsa, NOW).is_ok(), "fetched at load");
    assert!(v.verify(&rsa, NOW).is_ok(), "and kept");
    assert_eq!(v.verified(), 1);
    assert_eq!(v.verify(&ed, NOW).err(), Some(Rejected::UnknownKey));
    assert!(!v.refresh_due(), "not within a minute of the last fetch");
    // Rotation: the server publishes the new key and drops the old one.
    *served.lock().unwrap() = (200, only("ed"));
    v.refresh();
    assert!(v.verify(&ed, NOW).is_ok(), "the new key, after a refresh");
    assert_eq!(
        v.verify(&rsa, NOW).err(),
        Some(Rejected::UnknownKey),
        "the old one gone, though its token was kept as trusted"
    );
    // A failed refresh keeps the last good set.
    *served.lock().unwrap() = (500, String::new());
    v.refresh();
    assert!(v.verify(&ed, NOW).is_ok());
    // A config naming a URL that does not answer never starts.
    let bad = Verifier::new(
        From::Header("authorization".into()),
        None,
        None,
        None,
        vec![],
        0,
    )
    .unwrap()
    .with_url("http://127.0.0.1:1/jwks.json");
    assert!(bad.is_err());
}

/// Issue 47: loading a config does no network I/O. A `jwks_url` is named
/// by `config::load` and fetched by `server::start` before the port opens
/// (the first request's token is verified); a URL that does not answer
/// fails the start, not the load.
#[tokio::test]
async fn loading_names_a_jwks_url_and_starting_fetches_it() {
    use std::io::{Read, Write};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let k = keys();
    let fetches = Arc::new(AtomicUsize::new(0));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (f, body) = (fetches.clone(), k.jwks.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            f.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0; 4096];
            let _ = conn.read(&mut buf);
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    let yaml = |url: &str| {
        format!(
            "upstream: echo\n\
             jwt: {{jwks_url: '{url}', issuer: https://issuer.example, audiences: [api], required: true}}\n\
             rules:\n  - {{name: per-user, limit: 5, window: 1h, key: ['jwt:sub']}}\n"
        )
    };
    let good = format!("http://{addr}/jwks.json");
    let overrides = ratewarden_gateway::config::Overrides::default();
    ratewarden_gateway::config::load(&yaml(&good), "t.yaml", &overrides).unwrap();
    assert_eq!(fetches.load(Ordering::SeqCst), 0, "load fetched nothing");

    let up = support::Upstream::start().await;
    let clock = ratewarden::clock::ManualClock::new(NOW * 1_000_000);
    let gw = support::gateway(&yaml(&good), &up.url(), Some(clock)).await;
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "start fetched it once");
    let bearer = format!(
        "Bearer {}",
        token(&k, json!({"alg": "RS256", "kid": "rsa"}), good_claims())
    );
    let r = support::send(
        gw.listen(),
        "GET",
        "/",
        &[("authorization", bearer.as_str())],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "the first request's token is verified");
    gw.shutdown().await;

    // Nothing listens on port 1: loading is fine, starting is not.
    let dead = yaml("http://127.0.0.1:1/jwks.json");
    let cfg = ratewarden_gateway::config::load(&dead, "t.yaml", &overrides).unwrap();
    let started = ratewarden_gateway::server::start(
        cfg,
        ratewarden_gateway::server::Source {
            loaded: None,
            path: None,
            overrides: ratewarden_gateway::config::Overrides {
                listen: Some("127.0.0.1:0".into()),
                admin_listen: Some("127.0.0.1:0".into()),
                upstream: Some(up.url()),
                workers: None,
            },
            clock: None,
        },
    )
    .await;
    let Err(e) = started else {
        panic!("a gateway started without its jwks_url's keys")
    };
    assert!(e.to_string().starts_with("jwt.jwks_url:"), "{e}");
}
