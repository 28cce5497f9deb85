//! Where a request's rate-limit key comes from.

use std::fmt::Display;
use std::marker::PhantomData;
use std::net::SocketAddr;

use http::HeaderName;
use http::request::Parts;

use crate::identity::ClientIp;

/// Longest key taken from a header or extension; longer values are cut, so
/// a client cannot grow the store's key names without bound.
pub const MAX_KEY_BYTES: usize = crate::admission::MAX_IDENTITY_BYTES;

/// `s` cut to [`MAX_KEY_BYTES`] (see [`crate::admission::bounded`]).
fn bounded(mut s: String) -> String {
    let n = crate::admission::bounded(&s).len();
    s.truncate(n);
    s
}

/// Extracts the key of a request; `None` when the request has none.
pub trait KeyExtractor: Send + Sync + 'static {
    /// The key for this request.
    fn extract(&self, parts: &Parts) -> Option<String>;
}

impl<F> KeyExtractor for F
where
    F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
{
    fn extract(&self, parts: &Parts) -> Option<String> {
        self(parts).map(bounded)
    }
}

/// The value of a header (e.g. `X-User-Id`, `X-Api-Key`).
#[derive(Debug, Clone)]
pub struct Header(HeaderName);

impl Header {
    /// Keys from header `name`. Panics on an invalid header name (a
    /// programming error, caught on first run).
    pub fn new(name: &str) -> Self {
        Self(HeaderName::from_bytes(name.as_bytes()).expect("valid header name"))
    }
}

impl KeyExtractor for Header {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let v = parts.headers.get(&self.0)?.to_str().ok()?.trim();
        (!v.is_empty()).then(|| bounded(v.to_owned()))
    }
}

/// A value an earlier layer put in the request's extensions (e.g. the user
/// id an authentication layer resolved), by its `Display`.
#[derive(Debug)]
pub struct Extension<T>(PhantomData<fn() -> T>);

impl<T> Extension<T> {
    /// Keys from the extension of type `T`.
    pub fn new() -> Self {
        Self(PhantomData)
    }
}

impl<T> Default for Extension<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Display + Send + Sync + 'static> KeyExtractor for Extension<T> {
    fn extract(&self, parts: &Parts) -> Option<String> {
        parts.extensions.get::<T>().map(|v| bounded(v.to_string()))
    }
}

/// The peer's socket address, as a server puts it in the request's
/// extensions (hyper users insert it themselves; with axum, map
/// `ConnectInfo<SocketAddr>` with a closure extractor or insert a `PeerAddr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerAddr(pub SocketAddr);

/// The client's address: the peer, or behind trusted proxies the address
/// they forward; IPv6 grouped by prefix. The same resolution as the gateway's.
#[derive(Debug, Clone, Default)]
pub struct PeerIp(pub ClientIp);

impl KeyExtractor for PeerIp {
    fn extract(&self, parts: &Parts) -> Option<String> {
        let peer = parts
            .extensions
            .get::<PeerAddr>()
            .map(|p| p.0)
            .or_else(|| parts.extensions.get::<SocketAddr>().copied())?;
        let ip = self
            .0
            .resolve(peer.ip(), crate::view::Fields::Map(&parts.headers));
        Some(self.0.key(ip))
    }
}
