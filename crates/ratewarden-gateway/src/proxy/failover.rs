//! Upstream attempts with failover, written once for every wire (the
//! HTTP/1.1 path's exchange, hyper's and the WebSocket tunnel's): which
//! server of the route's group is tried next, what each attempt's outcome
//! does to the group's health, how long the attempts took, and the answer
//! when no server gave one.
//!
//! A server that could not be connected to got nothing: the next one is
//! tried, until none is left. A server that timed out or broke after the
//! request went out may have acted on it: that is the answer (504, 502),
//! never a second attempt elsewhere (nginx's `proxy_next_upstream` default
//! for non-idempotent requests, which we keep for all).

use std::borrow::Cow;
use std::time::{Duration, Instant};

use http::Response;
use smallvec::SmallVec;

use crate::answer::Body;
use crate::observe::metrics::Metrics;
use crate::proxy::forward::{UpstreamFailure, tls_failure, upstream_failed};
use crate::upstream::pool::UpstreamError;
use crate::upstream::route::{Chosen, Group, Outcome};

/// One request's attempts on a route's group of servers.
pub(crate) struct Failover<'g> {
    group: &'g Group,
    metrics: &'g Metrics,
    /// The identity, for `balance: hash`.
    client: &'g str,
    /// Servers tried that could not be connected to.
    tried: SmallVec<[usize; 4]>,
    /// Why the last server tried could not be used, and which.
    last: Option<(Cow<'static, str>, String, &'g str)>,
    started: Instant,
}

impl<'g> Failover<'g> {
    /// Attempts for a request from `client` on `group`, starting now.
    pub(crate) fn new(group: &'g Group, metrics: &'g Metrics, client: &'g str) -> Self {
        Self {
            group,
            metrics,
            client,
            tried: SmallVec::new(),
            last: None,
            started: Instant::now(),
        }
    }

    /// The next server to try; when none is left, the answer (502, logged
    /// against the last server tried, or the route when every server was
    /// already ejected).
    pub(crate) fn next(&mut self) -> Result<Chosen<'g>, Box<Response<Body>>> {
        if let Some(chosen) = self.group.choose(self.client, &self.tried) {
            return Ok(chosen);
        }
        self.done();
        let (why, error, at) = self.last.take().unwrap_or_else(|| {
            (
                "no upstream server is up".into(),
                format!("every server of route {} is ejected", self.group.route),
                &self.group.route,
            )
        });
        Err(Box::new(upstream_failed(
            at,
            UpstreamFailure::Broken { why, error },
        )))
    }

    /// `chosen` could not be connected to (`e`); nothing was sent, so the
    /// next server is tried.
    pub(crate) fn unsent(&mut self, chosen: &Chosen<'g>, e: &UpstreamError) {
        self.group.record(chosen.index, Outcome::Failed);
        self.tried.push(chosen.index);
        self.last = Some((unsent_why(e), e.to_string(), &chosen.server().label));
    }

    /// `chosen` answered: the attempts are over.
    pub(crate) fn answered(&self, chosen: &Chosen<'g>) {
        self.done();
        self.group.record(chosen.index, Outcome::Answered);
    }

    /// `chosen` gave no answer within `timeout`: the answer (504).
    pub(crate) fn timed_out(&self, chosen: &Chosen<'g>, timeout: Duration) -> Response<Body> {
        self.done();
        self.group.record(chosen.index, Outcome::TimedOut);
        upstream_failed(&chosen.server().label, UpstreamFailure::Timeout(timeout))
    }

    /// The exchange with `chosen` broke after the request went out
    /// (`why` for the client, `error` for the log): the answer (502).
    pub(crate) fn broke(
        &self,
        chosen: &Chosen<'g>,
        why: Cow<'static, str>,
        error: String,
    ) -> Response<Body> {
        self.done();
        self.group.record(chosen.index, Outcome::Failed);
        upstream_failed(
            &chosen.server().label,
            UpstreamFailure::Broken { why, error },
        )
    }

    /// The attempts are over without the upstream's doing (the client's
    /// body failed): only their time is recorded.
    pub(crate) fn done(&self) {
        let took = self.started.elapsed();
        self.metrics.upstream_time(took);
        self.group.counts.upstream_time(took);
    }
}

/// What the client is told of a server that could not be connected to.
pub(crate) fn unsent_why(e: &UpstreamError) -> Cow<'static, str> {
    match e {
        UpstreamError::Tls { source, .. } => tls_failure(source),
        _ => "could not connect".into(),
    }
}
