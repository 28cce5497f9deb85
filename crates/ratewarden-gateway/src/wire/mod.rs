//! The connections: one stream type per side ([`stream`]: TCP or TLS) and
//! the watchdog that closes idle ones ([`idle`]); and gRPC's framing with
//! the health service's messages ([`grpc`]); the one way a task of ours
//! is spawned ([`spawn`]).

pub mod grpc;
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
