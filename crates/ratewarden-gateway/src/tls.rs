//! TLS with rustls: the listeners' certificates (several, chosen by the
//! client's SNI), client certificates on the admin listener, and the client
//! side for https upstreams.
//!
//! Everything here is built when a config is loaded (`serve`, `validate`,
//! reload), so a certificate that does not parse, a key that does not
//! belong to its certificate or a CA file with no certificate is a config
//! error naming the file, and a bad reload keeps the running config.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::ClientConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::{ClientHello, ResolvesServerCert, ServerConfig, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{RootCertStore, version};

/// The crypto provider: aws-lc-rs (feature `aws-lc`, the default), or
/// ring (feature `ring`). Both were measured (BENCHMARKS.md, "TLS").
pub fn provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "aws-lc")]
    let p = rustls::crypto::aws_lc_rs::default_provider();
    #[cfg(all(feature = "ring", not(feature = "aws-lc")))]
    let p = rustls::crypto::ring::default_provider();
    Arc::new(p)
}

#[cfg(not(any(feature = "aws-lc", feature = "ring")))]
compile_error!("ratewarden-gateway needs a TLS crypto provider: feature `aws-lc` or `ring`");

/// Makes [`provider`] the process's default, which libraries that build
/// their own rustls configs (the Redis client) use. Idempotent.
pub fn install_provider() {
    let _ = CryptoProvider::install_default((*provider()).clone());
}

/// A listener's TLS: the rustls config and the files it was read from
/// (watched: a changed certificate reloads the config).
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// What the acceptor runs.
    pub config: Arc<ServerConfig>,
    /// The certificate, key and CA files.
    pub files: Vec<PathBuf>,
}

/// The upstream's TLS client.
#[derive(Debug, Clone)]
pub struct ClientTls {
    /// What the connector runs.
    pub config: Arc<ClientConfig>,
    /// The name the upstream's certificate must carry, also sent as SNI.
    pub server_name: ServerName<'static>,
    /// The CA and client certificate files.
    pub files: Vec<PathBuf>,
    /// A fingerprint of the name and the files' contents: a reload that
    /// read the same keeps the upstream's warm connections.
    id: u64,
}

impl PartialEq for ClientTls {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

/// A certificate chain and its key, as files.
#[derive(Debug)]
pub struct Pair<'a> {
    /// PEM: the leaf first, then intermediates.
    pub cert: &'a Path,
    /// PEM: PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    pub key: &'a Path,
}

/// Why TLS material could not be loaded: the file and what is wrong.
#[derive(Debug, thiserror::Error)]
#[error("{}: {message}", path.display())]
pub struct MaterialError {
    /// The file at fault.
    pub path: PathBuf,
    /// What is wrong with it.
    pub message: String,
}

fn fault(path: &Path, message: impl Into<String>) -> MaterialError {
    MaterialError {
        path: path.to_owned(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, MaterialError> {
    std::fs::read(path).map_err(|e| fault(path, format!("cannot be read: {e}")))
}

/// Every certificate in a PEM file; at least one.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, MaterialError> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fault(path, format!("is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(fault(path, "holds no certificate (`BEGIN CERTIFICATE`)"));
    }
    Ok(certs)
}

/// The private key in a PEM file.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, MaterialError> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => fault(
            path,
            "holds no private key (`BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY`)",
        ),
        e => fault(path, format!("is not valid PEM: {e}")),
    })
}

/// A chain and its key, checked to belong together.
pub fn certified_key(pair: &Pair<'_>) -> Result<CertifiedKey, MaterialError> {
    let chain = certificates(pair.cert)?;
    let key = private_key(pair.key)?;
    let signing = provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| fault(pair.key, format!("is not a usable private key: {e}")))?;
    let ck = CertifiedKey::new(chain, signing);
    // The leaf must parse, and its public key must be the key's.
    webpki::EndEntityCert::try_from(&ck.cert[0]).map_err(|e| {
        fault(
            pair.cert,
            format!("its first certificate does not parse: {e:?}"),
        )
    })?;
    match ck.keys_match() {
        Ok(()) => Ok(ck),
        Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => Ok(ck),
        Err(_) => Err(fault(
            pair.key,
            format!(
                "is not the key of the certificate in {}",
                pair.cert.display()
            ),
        )),
    }
}

/// Roots from a PEM file of CA certificates.
pub fn roots(path: &Path) -> Result<RootCertStore, MaterialError> {
    let mut roots = RootCertStore::empty();
    for c in certificates(path)? {
        roots.add(c).map_err(|e| {
            fault(
                path,
                format!("holds a certificate that is not a usable CA: {e}"),
            )
        })?;
    }
    Ok(roots)
}

/// Chooses among certificates by the name the client asked for (SNI): the
/// first whose names cover it (wildcards included, as a client would check
/// them), else the first certificate (also for clients that send no name),
/// as nginx's default server answers.
#[derive(Debug)]
struct BySni(Vec<Arc<CertifiedKey>>);

impl ResolvesServerCert for BySni {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        if self.0.len() > 1
            && let Some(name) = hello.server_name()
            && let Ok(name) = ServerName::try_from(name)
        {
            let fits = |ck: &&Arc<CertifiedKey>| {
                webpki::EndEntityCert::try_from(&ck.cert[0])
                    .is_ok_and(|ee| ee.verify_is_valid_for_subject_name(&name).is_ok())
            };
            if let Some(ck) = self.0.iter().find(fits) {
                return Some(ck.clone());
            }
        }
        self.0.first().cloned()
    }
}

/// A listener's rustls config: TLS 1.2 and 1.3, ALPN `h2` then
/// `http/1.1`, the certificates chosen by SNI, and with `client_ca` a
/// client certificate signed by it required (mTLS).
pub fn server(pairs: &[Pair<'_>], client_ca: Option<&Path>) -> Result<ServerTls, MaterialError> {
    let mut files = vec![];
    let mut keys = vec![];
    for p in pairs {
        keys.push(Arc::new(certified_key(p)?));
        files.extend([p.cert.to_owned(), p.key.to_owned()]);
    }
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .expect("the provider supports TLS 1.2 and 1.3");
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                    .build()
                    .map_err(|e| fault(ca, format!("cannot verify clients: {e}")))?;
            files.push(ca.to_owned());
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder.with_cert_resolver(Arc::new(BySni(keys)));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(ServerTls {
        config: Arc::new(config),
        files,
    })
}

/// The upstream's TLS client: the system's roots (or only `ca`), a client
/// certificate when given, ALPN `http/1.1` (the gateway speaks HTTP/1.1
/// upstream), sessions resumed on new connections.
pub fn client(
    server_name: ServerName<'static>,
    ca: Option<&Path>,
    client_cert: Option<&Pair<'_>>,
) -> Result<ClientTls, MaterialError> {
    let mut files = vec![];
    let roots = match ca {
        Some(ca) => {
            files.push(ca.to_owned());
            roots(ca)?
        }
        None => system_roots(),
    };
    let builder = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .expect("the provider supports TLS 1.2 and 1.3")
        .with_root_certificates(roots);
    let mut config = match client_cert {
        None => builder.with_no_client_auth(),
        Some(p) => {
            let chain = certificates(p.cert)?;
            let key = private_key(p.key)?;
            // Checked like a listener's pair, for the same clear error.
            certified_key(p)?;
            files.extend([p.cert.to_owned(), p.key.to_owned()]);
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| fault(p.key, format!("is not a usable client key: {e}")))?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let mut h = std::hash::DefaultHasher::new();
    std::hash::Hash::hash(&server_name.to_str(), &mut h);
    for f in &files {
        std::hash::Hash::hash(&std::fs::read(f).unwrap_or_default(), &mut h);
    }
    Ok(ClientTls {
        config: Arc::new(config),
        server_name,
        files,
        id: std::hash::Hasher::finish(&h),
    })
}

/// The operating system's trust store (rustls-native-certs: what the
/// machine's administrators maintain, private CAs included, rather than a
/// copy of Mozilla's list frozen into the binary). Certificates it cannot
/// parse are skipped, as every TLS client does; none at all is logged.
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    for e in &found.errors {
        tracing::debug!(error = %e, "system trust store: an entry was skipped");
    }
    let mut roots = RootCertStore::empty();
    let (added, _) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        tracing::warn!(
            "no usable certificate in the system trust store: https upstreams will fail \
             verification unless `upstream_tls.ca` is set"
        );
    }
    roots
}

/// The keyed hash of hashed key parts (`{hash: header:X-Api-Key}`):
/// HMAC-SHA256 under `secret`, its first 128 bits in hex after a `#`
/// (`#` and 32 hex digits), through the crypto provider the TLS stack is
/// built with (aws-lc-rs, or ring). A secret is never recovered from it:
/// guessing one needs the key, and an API key's entropy besides.
pub fn key_hasher(secret: &[u8]) -> ratewarden_tower::policy::KeyHasher {
    #[cfg(feature = "aws-lc")]
    use aws_lc_rs::hmac;
    #[cfg(all(feature = "ring", not(feature = "aws-lc")))]
    use ring::hmac;
    let key = hmac::Key::new(hmac::HMAC_SHA256, secret);
    ratewarden_tower::policy::KeyHasher::new(move |value: &str| {
        let tag = hmac::sign(&key, value.as_bytes());
        let mut out = String::with_capacity(33);
        out.push('#');
        for b in &tag.as_ref()[..16] {
            out.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
            out.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
        }
        out
    })
}

/// `out` filled from the crypto provider's secure random source (API keys
/// the admin API and `ratewarden key new` make).
pub fn random_bytes(out: &mut [u8]) {
    #[cfg(feature = "aws-lc")]
    use aws_lc_rs::rand::{SecureRandom, SystemRandom};
    #[cfg(all(feature = "ring", not(feature = "aws-lc")))]
    use ring::rand::{SecureRandom, SystemRandom};
    // The system's source fails only where no secure source exists at
    // all; no key is made from anything less.
    SystemRandom::new()
        .fill(out)
        .expect("the system's secure random source");
}

/// A fresh API key: `rw_` and 48 hex digits (192 random bits).
pub fn new_api_key() -> String {
    let mut bytes = [0u8; 24];
    random_bytes(&mut bytes);
    let mut key = String::with_capacity(51);
    key.push_str("rw_");
    for b in bytes {
        key.push(char::from(b"0123456789abcdef"[usize::from(b >> 4)]));
        key.push(char::from(b"0123456789abcdef"[usize::from(b & 0xf)]));
    }
    key
}
