//! Listeners, graceful shutdown, and reload.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use ratewarden::store::Shared;
use rustls::ServerConfig;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::{self, Config, Overrides};
use crate::gateway::Gateway;
use crate::proxy;
use crate::wire::idle::{Activity, Watched, run_until_idle};
use crate::wire::stream::ClientIo;

/// A client connection being served, to its end.
type BoxFuture = std::pin::Pin<
    Box<dyn Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> + Send>,
>;

/// How long in-flight requests may take to finish after a shutdown signal.
const DRAIN: Duration = Duration::from_secs(30);

/// Where the running configuration came from, for reloads.
#[derive(Clone)]
pub struct Source {
    /// The file (`None`: the built-in example; nothing to reload).
    pub path: Option<PathBuf>,
    /// The text the running configuration was parsed from. The file is
    /// watched for differences from it, so a change made while the gateway
    /// was starting is not missed (`None`: compare with the file as it is
    /// when watching starts).
    pub loaded: Option<String>,
    /// Command-line overrides, applied on every reload too.
    pub overrides: Overrides,
    /// A clock for the memory store instead of the system's (tests drive
    /// bans and windows with a manual clock).
    pub clock: Option<Arc<dyn ratewarden::clock::Clock>>,
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Source").finish_non_exhaustive()
    }
}

/// A running gateway.
#[derive(Debug)]
pub struct Running {
    /// The proxy's bound address (port 0 resolved); `None` under `listen:
    /// off` (see [`Running::listen`]).
    pub proxy: Option<SocketAddr>,
    /// The admin API's bound address.
    pub admin: Option<SocketAddr>,
    /// The authorisation listener's bound address.
    pub authz: Option<SocketAddr>,
    /// Envoy's rate limit service's bound address (`rls.listen`).
    pub rls: Option<SocketAddr>,
    /// The shared state.
    pub gateway: Arc<Gateway>,
    stop: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Running {
    /// The proxy's bound address.
    ///
    /// # Panics
    ///
    /// Under `listen: off`, which has no proxy listener ([`Running::proxy`]
    /// says so without panicking).
    pub fn listen(&self) -> SocketAddr {
        self.proxy
            .expect("the proxy listener is off (`listen: off`)")
    }

    /// Stops accepting, lets in-flight requests finish (at most 30 s),
    /// writes out the access log's buffered lines, returns.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = t.await;
        }
        // The refusals counted since the last summary, not lost at exit.
        crate::observe::refusals::flush();
        if let Some(log) = self.gateway.access.clone() {
            // The writer's last round and the sink's flush: a blocking
            // thread's work, bounded (a stuck disk must not hold the exit).
            let closing = tokio::task::spawn_blocking(move || log.close());
            if tokio::time::timeout(Duration::from_secs(5), closing)
                .await
                .is_err()
            {
                tracing::warn!("the access log's last lines were not written within 5 s");
            }
        }
        // Slices of leased rules not used go back to Redis, for the other
        // gateways (bounded: a lost Redis leaves them to lapse).
        let live = self.gateway.live();
        let store = live.limiter.store();
        if store.is_shared() {
            match tokio::time::timeout(Duration::from_secs(2), store.give_back()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "leased slices not given back; they lapse on their own")
                }
                Err(_) => tracing::warn!(
                    "leased slices not given back within 2 s; they lapse on their own"
                ),
            }
        }
    }
}

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listener could not be bound.
    #[error("cannot listen on {addr}{}: {source}", if *.admin { " (admin)" } else { "" })]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The admin listener, not the proxy's.
        admin: bool,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The gateway's state (store, access log) could not be created.
    #[error(transparent)]
    Gateway(#[from] crate::gateway::GatewayError),
    /// `jwt.jwks_url` could not be fetched: a token could not be verified.
    #[error("jwt.jwks_url: {0}")]
    Jwks(String),
}

/// Fetches `jwt.jwks_url`'s keys, off the async threads (within 5 s),
/// unless `old` (the running config's verifier) holds them already for
/// the same URL.
async fn fetch_jwks(
    jwt: Option<&mut crate::jwt::Verifier>,
    old: Option<&crate::jwt::Verifier>,
) -> Result<(), String> {
    let Some(v) = jwt else { return Ok(()) };
    if old.is_some_and(|o| v.keep_keys_of(o)) || v.url().is_none() {
        return Ok(());
    }
    let v = v.clone();
    tokio::task::spawn_blocking(move || v.fetch_now())
        .await
        .unwrap_or_else(|e| Err(e.to_string()))
}

async fn bind(addr: SocketAddr, admin: bool) -> Result<(TcpListener, SocketAddr), StartError> {
    let listen = |source| StartError::Listen {
        addr,
        admin,
        source,
    };
    let l = TcpListener::bind(addr).await.map_err(listen)?;
    let bound = l.local_addr().map_err(listen)?;
    Ok((l, bound))
}

/// Builds the gateway, then binds the listeners and starts serving
/// `config`.
pub async fn start(mut config: Config, source: Source) -> Result<Running, StartError> {
    let timeouts = Timeouts {
        idle: config.client_idle_timeout,
        head: config.client_header_timeout,
    };
    let (listen, admin) = (config.listen, config.admin.as_ref().map(|(a, _)| *a));
    let rls = config.rls.as_ref().map(|r| r.listen);
    let authz = config.authz;
    // Everything a first request would otherwise set up is set up before
    // the port opens: a client that connects is served at once. (A fresh
    // instance under load once had a p99 ten times a warm one's: its first
    // request calibrated the TSC clock, up to 200 ms, with every
    // connection queued behind it.)
    let _ = quanta::Instant::now();
    // And the JWKS a `jwt.jwks_url` names: a token is verified from the
    // first request (a URL that does not answer never starts, as a bad
    // `jwks` file does not).
    fetch_jwks(config.jwt.as_mut(), None)
        .await
        .map_err(StartError::Jwks)?;
    let gateway = Gateway::new(config, source.clock.clone())?;
    // And the store's connection: a first request is decided by Redis, not
    // by `on_error` while the connection is made (up to 2 s; a server that
    // refuses fails at once, and the gateway serves per `on_error`).
    if let Err(e) = gateway
        .live()
        .limiter
        .store()
        .connect_now(Duration::from_secs(2))
        .await
    {
        tracing::warn!(error = %e, "redis not reachable at start; serving per on_error until it is");
    }
    // The overrides the shared store holds, in force from the first request.
    let mut overrides = crate::overrides::Sync::new();
    crate::overrides::restore(&gateway);
    overrides.poll(&gateway).await;
    // And the consumers (revoked keys refused from the first request).
    let mut consumers = crate::consumers::Sync::new();
    crate::consumers::restore(&gateway);
    consumers.poll(&gateway).await;
    if !gateway.live().limiter.store().is_shared() {
        for r in &gateway.live().config.policy.rules {
            if r.rule.distribution().is_some() {
                tracing::warn!(
                    rule = r.rule.name(),
                    "`distribution: lease` has no effect on the memory store: its decisions are already local"
                );
            }
        }
    }
    let (listener, proxy) = match listen {
        Some(addr) => {
            let (l, a) = bind(addr, false).await?;
            (Some(l), Some(a))
        }
        None => (None, None),
    };
    let (admin_listener, admin) = match admin {
        Some(addr) => {
            let (l, a) = bind(addr, true).await?;
            (Some(l), Some(a))
        }
        None => (None, None),
    };
    let (rls_listener, rls) = match rls {
        Some(addr) => {
            let (l, a) = bind(addr, false).await?;
            (Some(l), Some(a))
        }
        None => (None, None),
    };
    let (authz_listener, authz) = match authz {
        Some(addr) => {
            let (l, a) = bind(addr, false).await?;
            (Some(l), Some(a))
        }
        None => (None, None),
    };
    let (stop, stopped) = watch::channel(false);
    let mut tasks = vec![];
    if let Some(l) = authz_listener {
        let gw = gateway.clone();
        tasks.push(crate::wire::spawn(serve(
            "authz",
            l,
            stopped.clone(),
            timeouts,
            Arc::new(move |req, client| {
                let gw = gw.clone();
                Box::pin(async move { crate::front::authz::handle(&gw, req, client).await })
            }),
            gateway.clone(),
            false,
            None,
        )));
    }
    if let Some(l) = rls_listener {
        tasks.push(crate::wire::spawn(crate::front::rls::serve(
            l,
            gateway.clone(),
            stopped.clone(),
        )));
    }
    if let Some(listener) = listener {
        let gw = gateway.clone();
        let tls = Tls::of(&gateway, |c| c.tls.as_ref());
        tasks.push(crate::wire::spawn(serve(
            "proxy",
            listener,
            stopped.clone(),
            timeouts,
            Arc::new(move |req, client| {
                let gw = gw.clone();
                Box::pin(async move { crate::proxy::hyper::handle(&gw, req, client).await })
            }),
            gateway.clone(),
            true,
            tls,
        )));
    }
    if let Some(l) = admin_listener {
        let gw = gateway.clone();
        let tls = Tls::of(&gateway, |c| c.admin_tls.as_ref());
        tasks.push(crate::wire::spawn(serve(
            "admin",
            l,
            stopped.clone(),
            timeouts,
            Arc::new(move |req, _peer| {
                let gw = gw.clone();
                Box::pin(async move { crate::front::admin::handle(&gw, req).await })
            }),
            gateway.clone(),
            false,
            tls,
        )));
    }
    // Take over SIGHUP before `start` returns, not when the housekeeping task
    // first runs: a SIGHUP in between would meet the default action and kill
    // the process.
    let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    tasks.push(crate::wire::spawn(sync_overrides(
        gateway.clone(),
        overrides,
        consumers,
        stopped.clone(),
    )));
    tasks.push(crate::wire::spawn(housekeeping(
        gateway.clone(),
        source,
        stopped,
        hup,
    )));
    Ok(Running {
        proxy,
        admin,
        rls,
        authz,
        gateway,
        stop,
        tasks,
    })
}

/// A TLS listener's certificates, read from the config in force at each
/// accept: a reloaded certificate serves the next connection, and the ones
/// already open keep theirs. Whether a listener speaks TLS is fixed at
/// start (like its address); a reload that drops `tls` keeps the last one.
struct Tls {
    current: fn(&Config) -> Option<&crate::tls::ServerTls>,
    last: parking_lot::Mutex<Arc<ServerConfig>>,
}

impl Tls {
    fn of(gw: &Gateway, current: fn(&Config) -> Option<&crate::tls::ServerTls>) -> Option<Self> {
        let live = gw.live();
        let first = current(&live.config)?.config.clone();
        Some(Self {
            current,
            last: parking_lot::Mutex::new(first),
        })
    }

    fn config(&self, gw: &Gateway) -> Arc<ServerConfig> {
        let live = gw.live();
        let mut last = self.last.lock();
        if let Some(t) = (self.current)(&live.config) {
            *last = t.config.clone();
        }
        last.clone()
    }
}

/// The client timeouts a listener applies, read at start.
#[derive(Clone, Copy)]
struct Timeouts {
    /// `client_idle_timeout` (see [`crate::wire::idle`]).
    idle: Duration,
    /// `client_header_timeout`, for the heads hyper reads (the HTTP/1.1
    /// path bounds its own).
    head: Duration,
}

/// How a listener answers a request: one type for the three listeners
/// (proxy, admin, authz), so that hyper's server, HTTP/1.1 and HTTP/2, is
/// compiled once and not once per listener (issue 38, the build). A request
/// that hyper reads pays one boxed future for it; the proxy's own HTTP/1.1
/// path does not go through here.
type Handler = Arc<
    dyn Fn(
            http::Request<hyper::body::Incoming>,
            crate::proxy::forward::Client,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = http::Response<crate::gateway::Body>> + Send>,
        > + Send
        + Sync,
>;

/// Accepts connections (HTTP/1 and HTTP/2) until told to stop, then drains;
/// closes connections idle for `timeouts.idle` (see [`crate::wire::idle`]). With
/// `proxy`, HTTP/1 connections start on the gateway's own HTTP/1.1 path
/// ([`crate::proxy`]) and go over to hyper and `handler` for what that path
/// does not take. With `tls`, each connection's handshake comes first, in
/// its own task, within `client_header_timeout`; ALPN `h2` goes to hyper.
#[allow(clippy::too_many_arguments)]
async fn serve(
    role: &'static str,
    listener: TcpListener,
    mut stop: watch::Receiver<bool>,
    timeouts: Timeouts,
    handler: Handler,
    gw: Arc<Gateway>,
    proxy: bool,
    tls: Option<Tls>,
) {
    let graceful = GracefulShutdown::new();
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // One flat buffer per response instead of a head/body iovec pair: most
    // answers are small (a 429, an API reply), and a plain write measured
    // 3-4% faster than writev here; large bodies pay one extra copy.
    builder.http1().writev(false);
    // Heads read by hyper (connections handed over, the admin API) are
    // bounded as a whole too; hyper drops such a connection without an
    // answer. Its timer costs only the connections that go there.
    builder
        .http1()
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(timeouts.head);
    let idle = timeouts.idle;
    let port = listener.local_addr().map_or(0, |a| a.port());
    let mut failures = crate::wire::AcceptFailures::default();
    loop {
        tokio::select! {
            conn = listener.accept() => {
                let (stream, peer) = match conn {
                    Ok(c) => c,
                    Err(e) => {
                        // Out of file descriptors and the like: back off, keep serving.
                        failures.failed(role, &e).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let handler = handler.clone();
                let activity = Arc::new(Activity::default());
                // Taken now, not when hyper gets the connection: a shutdown
                // signalled in between is then still seen (see `watcher`).
                let watcher = graceful.watcher();
                let builder = builder.clone();
                let acceptor = tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.config(&gw)));
                let (gw, stop) = (gw.clone(), stop.clone());
                crate::wire::spawn(async move {
                    let io = match acceptor {
                        None => ClientIo::Plain(stream),
                        Some(acceptor) => {
                            match tokio::time::timeout(timeouts.head, acceptor.accept(stream)).await {
                                Ok(Ok(s)) => ClientIo::Tls(Box::new(s)),
                                // A client's doing (a scanner, a wrong
                                // name or version): counted, logged at
                                // debug, as nginx logs them at info.
                                Ok(Err(e)) => {
                                    gw.metrics.tls_failure();
                                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                                    return;
                                }
                                Err(_) => {
                                    gw.metrics.tls_failure();
                                    tracing::debug!(%peer, "TLS handshake timed out");
                                    return;
                                }
                            }
                        }
                    };
                    let client = crate::proxy::forward::Client {
                        peer,
                        tls: io.is_tls(),
                        port,
                        sni: io.sni().map(Arc::from),
                    };
                    let requests = activity.clone();
                    let for_hyper = client.clone();
                    let svc = service_fn(move |req| {
                        let answering = requests.answering();
                        let fut = handler(req, for_hyper.clone());
                        async move {
                            let resp = fut.await;
                            drop(answering);
                            Ok::<_, Infallible>(resp)
                        }
                    });
                    let hyper = move |io: Watched<ClientIo>| {
                        watcher.watch(
                            builder
                                .serve_connection_with_upgrades(TokioIo::new(io), svc)
                                .into_owned(),
                        )
                    };
                    let h2 = io.is_h2();
                    let io = Watched::new(io, activity.clone());
                    let conn: BoxFuture = if proxy && !h2 {
                        Box::pin(proxy::serve_connection(gw, io, client, stop, hyper))
                    } else {
                        Box::pin(hyper(io))
                    };
                    match run_until_idle(conn, activity, idle).await {
                        Some(Err(e)) => {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        Some(Ok(())) => {}
                        None => tracing::debug!(%peer, "closed a connection idle for {idle:?}"),
                    }
                });
            }
            _ = stop.changed() => break,
        }
    }
    drop(listener);
    tokio::select! {
        _ = graceful.shutdown() => {}
        _ = tokio::time::sleep(DRAIN) => tracing::warn!("in-flight requests still running after {DRAIN:?}; closing"),
    }
}

/// Keeps the overrides the shared store's ([`crate::overrides::Sync`]);
/// sweeps expired ones.
async fn sync_overrides(
    gw: Arc<Gateway>,
    mut sync: crate::overrides::Sync,
    mut consumers: crate::consumers::Sync,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(crate::overrides::POLL);
    // A key cleared or unbanned on any gateway: the refusals kept here go.
    let mut cleared = crate::store::TableFollower::new(crate::store::CLEARED);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                sync.poll(&gw).await;
                consumers.poll(&gw).await;
                let live = gw.live();
                let store = live.limiter.store();
                if let Some(refusals) = store.refusals()
                    && let Some((v, _)) = cleared.changed(store).await
                {
                    if cleared.read_once() {
                        refusals.clear();
                    }
                    cleared.read(v);
                }
            }
        }
    }
}

/// Reloads on SIGHUP and when the file changes; purges expired states.
async fn housekeeping(
    gw: Arc<Gateway>,
    source: Source,
    mut stop: watch::Receiver<bool>,
    mut hup: Option<tokio::signal::unix::Signal>,
) {
    let mut last = match (&source.loaded, &source.path) {
        (Some(text), _) => Some(text.clone()),
        (None, Some(p)) => std::fs::read_to_string(p).ok(),
        (None, None) => None,
    };
    // A change seen at the last tick, not yet reloaded.
    let mut changed: Option<String> = None;
    let mut files = tls_fingerprint(&gw.live().config);
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    let mut purge = tokio::time::interval(Duration::from_secs(10));
    // The refusal log's period: its summaries are written when it ends,
    // traffic or not.
    let mut refusals = tokio::time::interval(crate::observe::refusals::PERIOD);
    refusals.tick().await;
    loop {
        let hup_signal = async {
            match hup.as_mut() {
                Some(h) => {
                    h.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.changed() => return,
            _ = hup_signal => {
                tracing::info!("SIGHUP: reloading");
                if let Some(path) = &source.path {
                    last = tokio::fs::read_to_string(path).await.ok();
                }
                reload(&gw, &source, last.as_deref()).await;
                files = tls_fingerprint(&gw.live().config);
            }
            _ = poll.tick() => {
                // `jwt.jwks_url`: fetched again every 5 min, and at once
                // (at most once a minute) when a token named a kid it lacks;
                // off the request threads, not awaited (the fetch marks
                // itself begun, so ticks do not stack them); a failure keeps
                // the last good keys.
                // (Cloned only when due: the check reads the live config.)
                let live = gw.live();
                if let Some(v) = &live.config.jwt
                    && v.refresh_due()
                {
                    let v = v.clone();
                    tokio::task::spawn_blocking(move || v.refresh());
                }
                let Some(path) = &source.path else { continue };
                // On tokio's blocking pool: a slow disk must not stall the
                // request thread twice a second.
                let now = tokio::fs::read_to_string(path).await.ok();
                if now.is_some() && now != last {
                    // Read again at the next tick, and reloaded only when
                    // it reads the same: a file being written (`cat >`, an
                    // editor that writes in place) is never validated half
                    // done.
                    if now != changed {
                        changed = now;
                        continue;
                    }
                    tracing::info!(file = %path.display(), "config file changed: reloading");
                    last = changed.take();
                    reload(&gw, &source, last.as_deref()).await;
                    files = tls_fingerprint(&gw.live().config);
                    continue;
                }
                // A certificate renewed in place (certbot, cert-manager),
                // or an Envoy descriptor file edited, added or removed,
                // reloads the config as an edit of the file would; a file
                // caught half-written fails, is logged, and is tried again
                // when the next write lands.
                let config = gw.live().config.clone();
                let now_files = tokio::task::spawn_blocking(move || tls_fingerprint(&config))
                    .await
                    .unwrap_or(files);
                if now_files != files {
                    tracing::info!("a TLS or rls.config file changed: reloading");
                    files = now_files;
                    reload(&gw, &source, last.as_deref()).await;
                }
            }
            _ = refusals.tick() => crate::observe::refusals::flush(),
            _ = purge.tick() => {
                // A scan of every shard: 10-15 ms for a million keys, which
                // on the request thread (`--workers 1`) would stall every
                // connection. Shards are locked one at a time, so requests
                // only wait for the one being swept.
                let store = gw.live().limiter.store().clone();
                let _ = tokio::task::spawn_blocking(move || store.purge()).await;
            }
        }
    }
}

/// A fingerprint of the contents of every TLS file `config` read, and of
/// the Envoy descriptor files `rls.config` names now.
fn tls_fingerprint(config: &Config) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    for f in &config.tls_files {
        std::fs::read(f).ok().hash(&mut h);
    }
    for f in config
        .rls
        .iter()
        .flat_map(crate::front::rls::RlsSpec::files)
    {
        f.hash(&mut h);
        std::fs::read(&f).ok().hash(&mut h);
    }
    h.finish()
}

/// Validates `text` and swaps it in; an invalid config is logged and ignored.
pub async fn reload(gw: &Gateway, source: &Source, text: Option<&str>) -> bool {
    let Some(path) = &source.path else {
        return false;
    };
    let Some(text) = text else {
        gw.metrics.reload(false);
        tracing::error!(file = %path.display(), "reload: cannot read the file; keeping the running config");
        return false;
    };
    match config::load(text, &path.display().to_string(), &source.overrides) {
        Ok(mut cfg) => {
            let old = gw.live();
            // A new `jwks_url` is fetched before the config is swapped in
            // (one that does not answer keeps the running config); the same
            // one keeps the keys the running config fetched.
            if let Err(e) = fetch_jwks(cfg.jwt.as_mut(), old.config.jwt.as_ref()).await {
                gw.metrics.reload(false);
                tracing::error!(error = %e, "reload: jwt.jwks_url cannot be fetched; keeping the running config");
                return false;
            }
            // What a running process cannot change: said, not ignored.
            let admin_addr = |c: &Config| c.admin.as_ref().map(|a| a.0);
            let restart: Vec<&str> = [
                ("listen", cfg.listen != old.config.listen),
                ("admin.listen", admin_addr(&cfg) != admin_addr(&old.config)),
                ("workers", cfg.workers != old.config.workers),
                (
                    "rls.listen (or rls on or off)",
                    cfg.rls.as_ref().map(|r| r.listen) != old.config.rls.as_ref().map(|r| r.listen),
                ),
                (
                    "tls (on or off)",
                    cfg.tls.is_some() != old.config.tls.is_some(),
                ),
                (
                    "admin.tls (on or off)",
                    cfg.admin_tls.is_some() != old.config.admin_tls.is_some(),
                ),
                (
                    "client_idle_timeout",
                    cfg.client_idle_timeout != old.config.client_idle_timeout,
                ),
                ("log", cfg.log != old.config.log),
                ("access_log", cfg.access_log != old.config.access_log),
            ]
            .into_iter()
            .filter_map(|(k, changed)| changed.then_some(k))
            .collect();
            if !restart.is_empty() {
                tracing::warn!(
                    changed = %restart.join(", "),
                    "reload: these changed and take effect only on restart; everything else applies now (certificates included)"
                );
            }
            match gw.swap(cfg) {
                Ok(()) => {
                    // Counted before it is logged: whoever reads the log
                    // line and then the metric sees the reload counted.
                    gw.metrics.reload(true);
                    tracing::info!("config reloaded");
                    true
                }
                Err(e) => {
                    gw.metrics.reload(false);
                    tracing::error!(error = %e, "reload: store cannot be created; keeping the running config");
                    false
                }
            }
        }
        Err(e) => {
            gw.metrics.reload(false);
            tracing::error!("reload rejected, keeping the running config: {e}");
            false
        }
    }
}
