//! One call: bounded by the timeout, guarded by the breaker, its errors
//! classified (STYLE.md 17) and counted; the script's call itself, as a
//! Function or by `EVALSHA`, grouped by hash slot on a cluster.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::*;

/// A late call when nothing has been answered for this long (and at least
/// twice the timeout) asks whether the server is there: a ping allowed
/// [`SILENCE`] more. Answered, however late, the server is slow, not gone:
/// the connections are kept and calls stay late (refused, never decided
/// locally). Unanswered, the connections are replaced: a server that
/// drops packets rather than refusing them is found down by the next
/// connection attempt, not waited on for ever (issue 52: replacing them on
/// silence alone sent a slow link's decisions local, as a new connection
/// could not be made within one call's timeout).
pub(super) const SILENCE: Duration = Duration::from_secs(3);

/// The kinds of [`StoreError`], as counted.
pub(super) const KINDS: [&str; 5] = StoreError::KINDS;

/// How long a call redirected by a moving slot waits before it tries
/// again (the slot table's refresh, a migration's next step).
const REDIRECT_PAUSE: Duration = Duration::from_millis(2);

/// Whether `e` is a cluster redirect: nothing was applied.
fn redirected(e: &redis::RedisError) -> bool {
    matches!(e.code(), Some("MOVED" | "ASK"))
}

/// Whether `e` is a connection that broke (not one refused).
fn broken(e: &redis::RedisError) -> bool {
    (e.is_io_error() || e.is_connection_dropped()) && !e.is_connection_refusal()
}

pub(super) fn no_functions(e: &redis::RedisError) -> bool {
    let m = e.to_string().to_ascii_lowercase();
    m.contains("unknown command") && (m.contains("fcall") || m.contains("function"))
}

/// A Redis error as the store's (STYLE.md 17):
/// - nothing applied, try later: a refused connection, or a server that
///   says it cannot serve now (`LOADING`, `BUSY`, `TRYAGAIN`,
///   `CLUSTERDOWN`, `MASTERDOWN`, `READONLY` after a failover) is
///   [`StoreError::Unavailable`], an outage;
/// - a redirect (`MOVED`, `ASK`) left over is [`StoreError::Late`]: nothing
///   applied, the cluster there, a slot moving;
/// - a connection that broke is an outage too ([`StoreError::Unavailable`]):
///   the server went away (a call in flight then may have been applied,
///   which the README's outage bound counts);
/// - sent, and perhaps applied, the server still there: a timeout is
///   [`StoreError::Late`];
/// - anything else the server answered (a script error, `WRONGTYPE`,
///   `NOAUTH`, `NOPERM`) is [`StoreError::Server`], and a reply that does
///   not parse [`StoreError::Protocol`]: retrying will not mend them.
pub fn classify(e: redis::RedisError) -> StoreError {
    if e.is_connection_refusal() {
        return StoreError::unavailable_from(e);
    }
    if let Some("LOADING" | "BUSY" | "TRYAGAIN" | "CLUSTERDOWN" | "MASTERDOWN" | "READONLY") =
        e.code()
    {
        return StoreError::unavailable_from(e);
    }
    // A redirect left over (the decision's call follows them within its
    // timeout): nothing applied, the cluster there, its slot moving. Late,
    // refused: never decided locally because of it (issue 52).
    if redirected(&e) {
        return StoreError::Late(e.to_string());
    }
    if e.is_timeout() {
        return StoreError::Late(e.to_string());
    }
    // A connection that broke (reset, closed, refused on reconnecting) is
    // the server going away: an outage. A call that was on it may have
    // been applied just before: deciding it locally can admit it once
    // more, so the outage bound (README) counts the calls in flight then.
    if e.is_io_error() || e.is_connection_dropped() {
        return StoreError::unavailable_from(e);
    }
    match e.kind() {
        redis::ErrorKind::Parse | redis::ErrorKind::UnexpectedReturnType => {
            StoreError::Protocol(e.to_string())
        }
        _ => StoreError::Server(e.to_string()),
    }
}

impl RedisStore {
    /// One command on a connection, bounded and guarded as a decision is.
    pub(super) async fn command<T: redis::FromRedisValue>(
        &self,
        cmd: redis::Cmd,
    ) -> Result<T, StoreError> {
        self.guarded(async {
            match self.conn().await? {
                Conn::Single(mut c) => cmd.query_async(&mut c).await,
                Conn::Cluster(mut c) => cmd.query_async(&mut c).await,
            }
            .map_err(classify)
        })
        .await
    }

    /// One script call of `ops`, bounded by the timeout and guarded by the
    /// breaker: `FCALL` of the library's function (loaded when missing:
    /// first use, a restarted or new node), or `EVALSHA` of the script
    /// where the server has no Functions (before Redis 7) or they are off.
    /// The reply is an apply or peek call's bytes or integer
    /// ([`script::reply`]), an inspection's integers, or nothing much.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        ops: &[Call<'_>],
        mode: script::Mode,
    ) -> Result<T, StoreError> {
        self.run_with(ops, mode, None, &[]).await
    }

    /// [`run`](Self::run) with one more key and more ARGV after the ops'
    /// (a grant's).
    pub(super) async fn run_with<T: redis::FromRedisValue>(
        &self,
        ops: &[Call<'_>],
        mode: script::Mode,
        key: Option<String>,
        extra: &[String],
    ) -> Result<T, StoreError> {
        let now = self
            .inner
            .config
            .local_clock
            .as_ref()
            .map_or(Micros::ZERO, |c| c.now());
        let local = if now > Micros::ZERO {
            now
        } else {
            self.inner.clock.now()
        };
        let mut keys = Vec::with_capacity(ops.len() * 2 + 1);
        let mut args = match ops {
            // Most calls: one op applied, in the compact form.
            [(op, cost, _)] if mode == script::Mode::Apply && key.is_none() => {
                let (k, log) = self.key_names(op);
                keys.push(k);
                if script::keeps_zset(op.rule) {
                    keys.push(log);
                }
                script::argv_one(op, *cost, now, local)
            }
            _ => {
                for (op, _, _) in ops {
                    let (k, log) = self.key_names(op);
                    keys.push(k);
                    keys.push(log);
                }
                argv(ops, mode, now, local)
            }
        };
        keys.extend(key);
        args.extend_from_slice(extra);
        self.guarded(async {
            // A redirect (`MOVED`, `ASK`: a slot moving between masters)
            // means nothing was applied: tried again, within the timeout,
            // never decided locally because of it. The cluster client
            // follows one redirect itself; two concurrent ones can still
            // come back as `MOVED` (it sends `ASKING` as a request of its
            // own on a shared connection, and two callers' `ASKING ASKING
            // cmd cmd` spend the one-shot flag on the first command).
            //
            // A connection that broke under the call is tried once more on
            // a fresh one: a single reset is not the server going away.
            // The call may have been applied before the break; applied
            // twice, it over-counts (the safe side), never over-admits.
            let mut broke = false;
            loop {
                match self.script_once(&keys, &args).await? {
                    Err(e) if redirected(&e) => {
                        tokio::time::sleep(REDIRECT_PAUSE).await;
                    }
                    Err(e) if !broke && broken(&e) => {
                        broke = true;
                        self.reconnect();
                    }
                    other => return other.map_err(classify),
                }
            }
        })
        .await
    }

    /// One try of [`run_with`](Self::run_with)'s call: `Err` when no
    /// connection could be had, else what the server said.
    async fn script_once<T: redis::FromRedisValue>(
        &self,
        keys: &[String],
        args: &[String],
    ) -> Result<redis::RedisResult<T>, StoreError> {
        let mut conn = self.conn().await?;
        if self.inner.functions.load(Ordering::Relaxed) != 2 {
            match self.fcall(&mut conn, keys, args).await {
                Err(e) if no_functions(&e) => {
                    self.inner.functions.store(2, Ordering::Relaxed);
                    tracing::info!(redis = %self.target(), "redis has no Functions (FCALL): the script goes by EVALSHA");
                }
                other => return Ok(other),
            }
        }
        let mut inv = self.inner.script.prepare_invoke();
        for k in keys {
            inv.key(k);
        }
        for a in args {
            inv.arg(a);
        }
        Ok(match conn {
            Conn::Single(mut c) => inv.invoke_async(&mut c).await,
            Conn::Cluster(mut c) => inv.invoke_async(&mut c).await,
        })
    }

    /// A new connection's servers get the script before the first decision
    /// needs it: the library (`FUNCTION LOAD`, every master of a cluster),
    /// or where there are no Functions the script (`SCRIPT LOAD`). Without
    /// this, a burst of first decisions each found it missing and loaded
    /// it (a 30 KB compile each), and their timeouts sent them to
    /// `on_error`. A failure here is left to the calls, which load on
    /// demand.
    pub(super) async fn preload(&self, mut conn: Conn) -> Conn {
        if self.inner.functions.load(Ordering::Relaxed) != 2 {
            let mut load = redis::cmd("FUNCTION");
            load.arg("LOAD").arg(&self.inner.library.0);
            match query::<String>(&mut conn, &load).await {
                Ok(_) => return conn,
                Err(e) if e.to_string().contains("already exists") => return conn,
                Err(e) if no_functions(&e) => {
                    self.inner.functions.store(2, Ordering::Relaxed);
                    tracing::info!(redis = %self.target(), "redis has no Functions (FCALL): the script goes by EVALSHA");
                }
                Err(_) => return conn,
            }
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(SCRIPT);
        let _ = query::<String>(&mut conn, &load).await;
        conn
    }

    /// `FCALL` of the library's function; on a server that does not have
    /// it yet, `FUNCTION LOAD` (to every master of a cluster) and again.
    pub(super) async fn fcall<T: redis::FromRedisValue>(
        &self,
        conn: &mut Conn,
        keys: &[String],
        args: &[String],
    ) -> redis::RedisResult<T> {
        let (library, name) = &self.inner.library;
        let mut call = redis::cmd("FCALL");
        call.arg(name).arg(keys.len()).arg(keys).arg(args);
        let first = query(conn, &call).await;
        match first {
            Err(e) if e.to_string().contains("Function not found") => {
                // One load at a time; the callers queued behind it find
                // the function there.
                let _one = self.inner.loading.lock().await;
                if let Ok(v) = query(conn, &call).await {
                    return Ok(v);
                }
                let mut load = redis::cmd("FUNCTION");
                load.arg("LOAD").arg(library);
                match query::<String>(conn, &load).await {
                    Ok(_) => {}
                    // Loaded meanwhile by another caller or gateway.
                    Err(e) if e.to_string().contains("already exists") => {}
                    Err(e) => return Err(e),
                }
                let answer = query(conn, &call).await;
                match answer {
                    // On a cluster, "every master" is every master the
                    // client knows of: a node that joined since (its slots
                    // given to it, its keys moved in; functions do not move
                    // with them) may not be among them until the client's
                    // slot table is refreshed. The call then goes as the
                    // script itself (`EVAL`), which any node runs.
                    Err(e) if e.to_string().contains("Function not found") => {
                        let mut eval = redis::cmd("EVAL");
                        eval.arg(SCRIPT).arg(keys.len()).arg(keys).arg(args);
                        query(conn, &eval).await
                    }
                    answer => {
                        if answer.is_ok() {
                            self.inner.functions.store(1, Ordering::Relaxed);
                        }
                        answer
                    }
                }
            }
            other => {
                if other.is_ok() {
                    self.inner.functions.store(1, Ordering::Relaxed);
                }
                other
            }
        }
    }

    /// Runs `call` unless the breaker is open, within the timeout, and
    /// tells the breaker how it went.
    ///
    /// Only an outage ([`StoreError::Unavailable`]: nothing applied) counts
    /// against the breaker. A late call says nothing of the server's
    /// health, since a busy host makes answers late; it is reported as
    /// [`StoreError::Late`], and only when nothing at all has been
    /// answered for [`SILENCE`], and a ping is not answered either, are
    /// the connections replaced, so that a server that silently drops
    /// packets is found down by the next connection attempt. A call that
    /// timed out before any connection was made sent nothing: that is
    /// unavailable, not late.
    pub(super) async fn guarded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        // Only the wait is generic: the breaker's admission and the
        // outcome's accounting are compiled once, not once per call's type
        // (issue 38, the build).
        let admit = self.admit()?;
        let timeout = self.inner.config.timeout;
        let res = match tokio::time::timeout(timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(self.timed_out(timeout)),
        };
        match res {
            Ok(v) => {
                self.answered();
                Ok(v)
            }
            Err(e) => Err(self.failed(admit, e)),
        }
    }

    /// The breaker's word on a call about to be made: refused while open
    /// (counted), or let through (perhaps as the probe).
    pub(super) fn admit(&self) -> Result<Admit, StoreError> {
        let admit = self.inner.breaker.admit_as();
        if admit == Admit::Refused {
            let e = StoreError::unavailable("circuit open: redis failing");
            self.count(&e);
            return Err(e);
        }
        Ok(admit)
    }

    /// What a call that ran out of `timeout` is: unavailable when no
    /// connection was made (nothing was sent), late otherwise.
    pub(super) fn timed_out(&self, timeout: Duration) -> StoreError {
        if self.pick().is_none() {
            StoreError::unavailable(format!("not connected within {timeout:?}"))
        } else {
            StoreError::Late(format!("no answer within {timeout:?}"))
        }
    }

    /// A call answered (well, or with the server's own error): the server
    /// is there. Tells the breaker, and logs a recovery.
    pub(super) fn answered(&self) {
        self.inner
            .last_answer
            .store(self.inner.clock.now().get(), Ordering::Relaxed);
        if let Change::Closed(after) = self.inner.breaker.success() {
            tracing::info!(redis = %self.target(), outage = ?after.as_duration(), "redis answering again: circuit closed");
        }
    }

    /// A call that failed with `error`: tells the breaker, the counters
    /// and the log, and gives back the error the caller sees.
    pub(super) fn failed(&self, admit: Admit, error: StoreError) -> StoreError {
        let timeout = self.inner.config.timeout;
        // A late answer in an outage (a probe, or a call while calls are
        // failing for want of the server) is part of that outage: the
        // server is going or gone, not busy (a cluster client's probe during
        // a failover waits on the dead node's slots). Such a call may have been
        // applied just before it went: the README's outage bound counts
        // the calls in flight then.
        let error = match error {
            StoreError::Late(e) if admit == Admit::Probe || self.inner.breaker.failing() => {
                StoreError::unavailable(format!("{e}, while redis is failing"))
            }
            other => other,
        };
        // Log lines on changes only (and the target, a string made from
        // the URL, made only for them): an outage is three lines (the first
        // failure, the circuit opening, the recovery), not one per call.
        match &error {
            StoreError::Server(_) | StoreError::Protocol(_) => {
                self.answered();
                self.count(&error);
            }
            late @ StoreError::Late(e) => {
                self.count(late);
                self.inner.breaker.late();
                let silent =
                    self.inner.clock.now().saturating_sub(Micros::new(
                        self.inner.last_answer.load(Ordering::Relaxed),
                    ));
                if silent.as_duration() >= SILENCE.max(timeout * 2)
                    && let Some(conn) = self.pick()
                {
                    self.ask_if_alive(conn, e, silent.as_duration());
                }
            }
            e => {
                self.count(e);
                // Connect afresh on the next call: a restarted server's
                // new connection, or under Sentinel the new master's.
                self.reconnect();
                match self.inner.breaker.failure() {
                    Change::Failing => {
                        tracing::warn!(redis = %self.target(), error = %e, "redis call failed");
                    }
                    Change::Opened => tracing::warn!(
                        redis = %self.target(),
                        error = %e,
                        "redis unreachable: circuit open, calls fail at once (one probe every 100 ms to 500 ms)"
                    ),
                    _ => tracing::debug!(redis = %self.target(), error = %e, "redis call failed"),
                }
            }
        }
        error
    }

    /// After [`SILENCE`] without an answer in time: a `PING` on `conn`,
    /// allowed [`SILENCE`] (one at a time, in a task of its own). An
    /// answer, however late, is proof of life: the connections are kept
    /// and the silence restarts from it. No answer: connect afresh.
    pub(super) fn ask_if_alive(&self, mut conn: Conn, error: &str, silent: Duration) {
        if self.inner.asking.swap(true, Ordering::AcqRel) {
            return;
        }
        let store = self.clone();
        let error = error.to_owned();
        tokio::spawn(async move {
            let asked = std::time::Instant::now();
            let ping = tokio::time::timeout(
                SILENCE,
                query::<redis::Value>(&mut conn, &redis::cmd("PING")),
            )
            .await;
            match ping {
                Ok(Ok(_)) => {
                    tracing::warn!(redis = %store.target(), error = %error, silent = ?silent, answered_after = ?asked.elapsed(), "redis slow: answering, but not within the timeout; calls stay late (refused)");
                    store
                        .inner
                        .last_answer
                        .store(store.inner.clock.now().get(), Ordering::Relaxed);
                }
                _ => {
                    store.silent_ping(&error, silent);
                    store.reconnect();
                }
            }
            store.inner.asking.store(false, Ordering::Release);
        });
    }

    /// A liveness ping went unanswered. Logged at most once per
    /// [`LogEvery::EVERY`](crate::store::LogEvery::EVERY) with the count
    /// since the last line: a stall lasting minutes asks again and again,
    /// and once said is enough.
    fn silent_ping(&self, error: &str, silent: Duration) {
        let inner = &self.inner;
        inner.silent_pings.fetch_add(1, Ordering::Relaxed);
        if !inner.silent_logged.due() {
            return;
        }
        let pings = inner.silent_pings.swap(0, Ordering::Relaxed);
        // A cluster's client keeps a connection per node and makes them
        // again itself; a standalone server's (or Sentinel's) are dropped
        // here and made afresh by the next call.
        let then = if inner.topology == Topology::Cluster {
            "the cluster client reconnects to its nodes"
        } else {
            "connecting afresh"
        };
        tracing::warn!(redis = %self.target(), error = %error, silent = ?silent, unanswered_pings = pings, "redis silent: no answer to a ping either; {then}");
    }

    /// Groups of ops that can go in one script call: all of them on a
    /// standalone server; ops sharing a group (hash slot) on a cluster.
    pub(super) fn batches<'a>(&self, ops: &[Call<'a>]) -> Vec<Vec<Call<'a>>> {
        if self.inner.topology != Topology::Cluster {
            return vec![ops.to_vec()];
        }
        let mut out: Vec<Vec<Call<'a>>> = vec![];
        for op in ops {
            match out.iter_mut().find(|b| b[0].0.group == op.0.group) {
                Some(b) => b.push(*op),
                None => out.push(vec![*op]),
            }
        }
        out
    }

    /// Where the store points, for log lines: the URL or the first seed,
    /// without a password.
    pub(super) fn target(&self) -> String {
        let c = &self.inner.config;
        if let Some(sc) = &c.sentinel {
            return format!("sentinel {} via {}", sc.master, redact(&sc.nodes[0]));
        }
        // A cluster's first seed, even where `url` is set too (as
        // `RedisConfig::default()` sets it): the seeds are what is used.
        let url = if self.inner.topology == Topology::Cluster {
            c.cluster.first().map(String::as_str)
        } else {
            c.url.as_deref()
        };
        redact(url.unwrap_or(""))
    }
}
