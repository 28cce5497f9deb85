//! The connections: one stream type per side ([`stream`]: TCP or TLS) and
//! the watchdog that closes idle ones ([`idle`]); and gRPC's framing with
//! the health service's messages ([`grpc`]); the one way a task of ours
//! is spawned ([`spawn`]).

pub(crate) mod grpc;
pub mod idle;
pub mod stream;

use std::future::Future;
use std::pin::Pin;

/// Spawns a task of ours as one boxed future type, so that tokio's task
/// machinery (some 600 lines of LLVM IR per future type) is compiled once
/// for all of them and not once per spawn site (issue 38, the build). A
/// task costs one allocation more; tasks are per connection, per listener
/// or per process, and per request only for a gRPC call's settlement.
pub fn spawn(task: impl Future<Output = ()> + Send + 'static) -> tokio::task::JoinHandle<()> {
    let task: Pin<Box<dyn Future<Output = ()> + Send>> = Box::pin(task);
    tokio::spawn(task)
}

/// How often a listener that cannot accept (out of file descriptors, say)
/// says so: once when it starts failing, then once per this long with the
/// count, however many accepts fail meanwhile.
const ACCEPT_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A listener's failed accepts: logged once per [`ACCEPT_LOG_EVERY`] with
/// their count (at `EMFILE` every accept fails at once, and a line each
/// was a hundred a second), each followed by a short pause so that the
/// loop does not spin while nothing can be accepted.
#[derive(Debug, Default)]
pub struct AcceptFailures {
    /// When the last line was written.
    logged: Option<std::time::Instant>,
    /// Failures since then.
    since: u64,
}

impl AcceptFailures {
    /// Records a failed accept on `listener` (its role, for the log), then
    /// pauses 10 ms.
    pub async fn failed(&mut self, listener: &str, e: &std::io::Error) {
        self.since += 1;
        if self.logged.is_none_or(|t| t.elapsed() >= ACCEPT_LOG_EVERY) {
            tracing::warn!(
                listener,
                error = %e,
                failed = self.since,
                "accept failed ({} since the last such line); serving the connections already open",
                self.since
            );
            self.logged = Some(std::time::Instant::now());
            self.since = 0;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}
