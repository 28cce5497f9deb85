//! Connections and topology: a standalone server's connections taken in
//! turn, a cluster's, a Sentinel group's master found and followed;
//! connected lazily and again after a failure; each gateway announced in
//! the store, and the others counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster_async::ClusterConnection;

use super::call::SILENCE;
use super::*;

/// Connections to a standalone server, taken in turn by the calls: with
/// one, 64 concurrent callers reached 0.70x of the script's `-P 16`
/// ceiling on one key, with two 0.84-0.87x, with four 0.82x
/// (`benches/redis.rs`, BENCHMARKS.md): two multiplexed connections keep
/// Redis's reads fuller than one.
pub(super) const SINGLE_CONNECTIONS: usize = 2;

#[derive(Clone)]
pub(super) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// A connection attempt's outcome, `None` until it is known.
pub(super) type Attempt = tokio::sync::watch::Receiver<Option<Result<(), String>>>;

/// `cmd` on whichever connection.
pub(super) async fn query<T: redis::FromRedisValue>(
    conn: &mut Conn,
    cmd: &redis::Cmd,
) -> redis::RedisResult<T> {
    match conn {
        Conn::Single(c) => cmd.query_async(c).await,
        Conn::Cluster(c) => cmd.query_async(c).await,
    }
}

/// How often a gateway announces itself in the store.
pub(super) const ANNOUNCE_EVERY: Duration = Duration::from_secs(1);

/// A gateway not announced for this long is no longer counted.
pub const INSTANCE_TTL: Duration = Duration::from_secs(5);

/// The count of gateways a share is taken from is the most read at once
/// within this long. A gateway cut off from Redis (a partition of its
/// half) stops announcing while it still decides, locally, at its share:
/// were the others to stop counting it after [`INSTANCE_TTL`], and then
/// lose Redis too, each would take a larger share than it left them, and
/// together they would admit more than the outage bound (seen: 50 at a
/// bound of 44). Held, a gateway that left is counted a while longer: the
/// others' shares stay smaller meanwhile, the safe side.
pub(super) const PEAK_HOLD: Duration = Duration::from_secs(600);

/// Announces one gateway and counts those announced within a TTL, by
/// Redis's own clock. KEYS[1] the set; ARGV: the gateway's id, the TTL in
/// ms.
pub(super) const ANNOUNCE: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - ttl)
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
";

/// A new store's name in the set of gateways: its host, its process and a
/// counter. A reload makes a new store, whose old name lapses after
/// [`INSTANCE_TTL`] (meanwhile each gateway's share is a little smaller:
/// the safe side).
pub(super) fn instance_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros());
    format!(
        "{}:{}:{t:x}:{}",
        host.trim(),
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Bound on making a connection (calls keep their own, shorter, timeout).
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

impl RedisStore {
    /// The standalone server's client, with the configured certificates.
    pub(super) fn client(&self) -> redis::RedisResult<redis::Client> {
        let url = self.inner.config.url.as_deref().unwrap_or_default();
        self.client_for(redis::IntoConnectionInfo::into_connection_info(url)?)
    }

    pub(super) async fn connect(&self) -> Result<Vec<Conn>, StoreError> {
        let c = &self.inner.config;
        let t = c.timeout.max(Duration::from_millis(10));
        // A connection (a TLS handshake: two more round trips) may take
        // longer than one call is allowed to.
        let connect_t = t.max(CONNECT_TIMEOUT);
        if self.inner.topology != Topology::Cluster {
            let client = match self.inner.topology {
                Topology::Sentinel => tokio::time::timeout(connect_t, self.sentinel_master())
                    .await
                    .map_err(|_| {
                        StoreError::unavailable(format!(
                            "no sentinel named the master within {connect_t:?}"
                        ))
                    })??,
                _ => self.client().map_err(StoreError::unavailable_from)?,
            };
            // Each call is bounded by the timeout itself (`guarded`); the
            // connection waits longer, so that the ping asking a silent
            // server whether it is there can take its time over a slow link
            // (`ask_if_alive`).
            let cfg = ConnectionManagerConfig::new()
                .set_response_timeout(Some(t.max(SILENCE) * 2))
                .set_connection_timeout(Some(connect_t))
                .set_number_of_retries(1);
            let mut conns = Vec::with_capacity(SINGLE_CONNECTIONS);
            for _ in 0..SINGLE_CONNECTIONS {
                let m = ConnectionManager::new_with_config(client.clone(), cfg.clone())
                    .await
                    .map_err(StoreError::unavailable_from)?;
                conns.push(Conn::Single(m));
            }
            // One server: the library loaded once serves every connection.
            conns[0] = self.preload(conns[0].clone()).await;
            if self.inner.topology == Topology::Sentinel {
                // The sentinels may name a master that has not yet heard
                // of its promotion, or one demoted since: confirm.
                let role: redis::Value = query(&mut conns[0], &redis::cmd("ROLE"))
                    .await
                    .map_err(classify)?;
                let is_master = match &role {
                    redis::Value::Array(v) => matches!(
                        v.first(),
                        Some(redis::Value::BulkString(b)) if b == b"master"
                    ),
                    _ => false,
                };
                if !is_master {
                    return Err(StoreError::unavailable(
                        "the node the sentinels named is not a master (yet)",
                    ));
                }
            }
            Ok(conns)
        } else {
            let builder = redis::cluster::ClusterClientBuilder::new(c.cluster.clone());
            #[cfg(feature = "tls")]
            let builder = match &c.tls {
                Some(tls) => builder.certs(tls.certificates()),
                None => builder,
            };
            let client = builder
                .connection_timeout(connect_t)
                .response_timeout(t)
                .retries(1)
                .build()
                .map_err(StoreError::unavailable_from)?;
            let conn = client
                .get_async_connection()
                .await
                .map_err(StoreError::unavailable_from)?;
            Ok(vec![self.preload(Conn::Cluster(conn)).await])
        }
    }

    /// A client for the master the sentinels name now: each sentinel asked
    /// in turn (`SENTINEL get-master-addr-by-name`), the first answer
    /// taken; [`connect`](Self::connect) confirms the node's `ROLE`. A
    /// `rediss://` sentinel list means TLS to the sentinels and to the
    /// master, with `tls`'s certificates where given.
    pub(super) async fn sentinel_master(&self) -> Result<redis::Client, StoreError> {
        let c = &self.inner.config;
        let sc = c
            .sentinel
            .as_ref()
            .ok_or_else(|| StoreError::Config("no sentinel section".into()))?;
        let tls = sc.nodes.iter().any(|n| n.starts_with("rediss://"));
        let mut last = String::from("no sentinel answered");
        for n in &sc.nodes {
            let mut info = redis::IntoConnectionInfo::into_connection_info(n.as_str())
                .map_err(|e| StoreError::Config(e.to_string()))?;
            if let Some(pw) = &sc.sentinel_password {
                let settings = info.redis_settings().clone().set_password(pw);
                info = info.set_redis_settings(settings);
            }
            let asked = async {
                let mut con = self
                    .client_for(info)
                    .map_err(|e| e.to_string())?
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(|e| e.to_string())?;
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(&sc.master)
                    .query_async::<Option<(String, u16)>>(&mut con)
                    .await
                    .map_err(|e| e.to_string())
            };
            match tokio::time::timeout(c.timeout.max(CONNECT_TIMEOUT), asked).await {
                Ok(Ok(Some((host, port)))) => {
                    let scheme = if tls { "rediss" } else { "redis" };
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        host
                    };
                    let mut master = redis::IntoConnectionInfo::into_connection_info(format!(
                        "{scheme}://{host}:{port}/0"
                    ))
                    .map_err(StoreError::unavailable_from)?;
                    if let Some(pw) = &sc.password {
                        let settings = master.redis_settings().clone().set_password(pw);
                        master = master.set_redis_settings(settings);
                    }
                    return self
                        .client_for(master)
                        .map_err(StoreError::unavailable_from);
                }
                Ok(Ok(None)) => {
                    last = format!("{} does not know master `{}`", redact(n), sc.master);
                }
                Ok(Err(e)) => last = format!("{}: {e}", redact(n)),
                Err(_) => last = format!("{}: no answer", redact(n)),
            }
        }
        Err(StoreError::unavailable(last))
    }

    /// A client for `info`, with the configured certificates for TLS.
    pub(super) fn client_for(
        &self,
        info: redis::ConnectionInfo,
    ) -> redis::RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(tls) = &self.inner.config.tls {
            return redis::Client::build_with_tls(info, tls.certificates());
        }
        redis::Client::open(info)
    }

    /// Gateways that announced themselves in the store within
    /// [`INSTANCE_TTL`]: the most read at once within [`PEAK_HOLD`] (1
    /// until read).
    pub fn instances(&self) -> u64 {
        self.inner.instances.load(Ordering::Relaxed).max(1)
    }

    /// Starts announcing this gateway every [`ANNOUNCE_EVERY`] on the
    /// connections made, and reading how many announced, for the share
    /// each gateway takes during an outage. The task ends with the store.
    pub(super) fn announce(&self) {
        if self.inner.announcing.swap(true, Ordering::Relaxed) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        tokio::spawn(async move {
            let script = redis::Script::new(ANNOUNCE);
            let ttl = INSTANCE_TTL.as_millis().to_string();
            let id = instance_id();
            loop {
                let Some(inner) = weak.upgrade() else { return };
                let store = RedisStore { inner };
                let key = format!("{}{{ratewarden}}:gateways", store.inner.config.key_prefix);
                if let Some(conn) = store.pick() {
                    let mut inv = script.prepare_invoke();
                    inv.key(&key).arg(&id).arg(&ttl);
                    let t = store.inner.config.timeout;
                    let counted = tokio::time::timeout(t, async {
                        match conn {
                            Conn::Single(mut c) => inv.invoke_async::<u64>(&mut c).await,
                            Conn::Cluster(mut c) => inv.invoke_async::<u64>(&mut c).await,
                        }
                    })
                    .await;
                    if let Ok(Ok(n)) = counted {
                        store.note_instances(n.max(1));
                    }
                }
                drop(store);
                tokio::time::sleep(ANNOUNCE_EVERY).await;
            }
        });
    }

    /// `n` gateways counted now: the count shares are taken from rises at
    /// once, and falls only when no larger count has been read for
    /// [`PEAK_HOLD`].
    pub(super) fn note_instances(&self, n: u64) {
        let now = self.inner.clock.now().get();
        let inner = &self.inner;
        let held = inner.instances.load(Ordering::Relaxed);
        let at = inner.instances_at.load(Ordering::Relaxed);
        if n >= held || now.saturating_sub(at) >= PEAK_HOLD.as_micros() as u64 {
            inner.instances.store(n, Ordering::Relaxed);
            inner.instances_at.store(now, Ordering::Relaxed);
        }
    }

    /// Forgets the connections: the next call connects afresh (and, under
    /// Sentinel, asks the sentinels where the master is now). Calls under
    /// way keep theirs.
    pub(super) fn reconnect(&self) {
        if self.inner.topology != Topology::Cluster {
            *self.inner.conn.lock() = None;
        }
    }

    /// The next of the connections made, if they are.
    pub(super) fn pick(&self) -> Option<Conn> {
        let conns = self.inner.conn.lock();
        let conns = conns.as_ref()?;
        let i = self.inner.next.fetch_add(1, Ordering::Relaxed) % conns.len();
        Some(conns[i].clone())
    }

    /// A connection (the next, where there are several), made first if
    /// there is none. The attempt runs in a task of its own: a call that
    /// times out waiting for it (its timeout is one decision's, a TLS
    /// handshake over a long link may take longer) leaves it to finish for
    /// the calls after it, instead of cancelling it and starting over each
    /// time.
    pub(super) async fn conn(&self) -> Result<Conn, StoreError> {
        let mut outcome = {
            if let Some(c) = self.pick() {
                return Ok(c);
            }
            let mut connecting = self.inner.connecting.lock();
            match connecting.as_ref() {
                Some(rx) => rx.clone(),
                None => {
                    let (tx, rx) = tokio::sync::watch::channel(None);
                    *connecting = Some(rx.clone());
                    let store = self.clone();
                    tokio::spawn(async move {
                        let made = match store.connect().await {
                            Ok(c) => {
                                *store.inner.conn.lock() = Some(c);
                                store.announce();
                                Ok(())
                            }
                            Err(e) => Err(e.to_string()),
                        };
                        *store.inner.connecting.lock() = None;
                        let _ = tx.send(Some(made));
                    });
                    rx
                }
            }
        };
        let made = outcome
            .wait_for(Option::is_some)
            .await
            .map_err(|_| StoreError::unavailable("the connection attempt was abandoned"))?
            .clone();
        match made {
            Some(Ok(())) => self
                .pick()
                .ok_or_else(|| StoreError::unavailable("not connected")),
            Some(Err(e)) => Err(StoreError::unavailable(e)),
            None => Err(StoreError::unavailable("not connected")),
        }
    }

    /// Connects now rather than on the first decision, waiting at most
    /// `within`: a gateway calls it before it takes traffic, so that its
    /// first decisions are Redis's (on a cluster, a first connection
    /// takes longer than one decision's timeout, and those decisions would
    /// otherwise fall to `on_error`). An error leaves the connecting to
    /// the calls that follow.
    pub async fn connect_now(&self, within: Duration) -> Result<(), StoreError> {
        match tokio::time::timeout(within, self.conn()).await {
            Ok(r) => r.map(drop),
            Err(_) => Err(StoreError::unavailable(format!(
                "not connected within {within:?}"
            ))),
        }
    }
}
