//! The `ratewarden` gateway: a reverse proxy that rate-limits HTTP requests
//! before they reach the upstream, configured by one YAML file, with an admin
//! API that also answers decisions for applications in other languages.
//!
//! The folders are the architecture (ARCHITECTURE.md draws it), each using
//! only what is below it:
//!
//! - [`server`]: the listeners, reload and signals (the top);
//! - [`front`]: the front ends beside the proxy (the admin API, `/ui`,
//!   Envoy's rate limit service);
//! - [`proxy`]: the one request flow and the wires that feed it;
//! - [`gateway`]: the live configuration and what each decision records;
//! - [`upstream`]: routes, their groups of servers, and the pools;
//! - [`wire`]: client and upstream connections, idle watchdog;
//! - [`observe`]: metrics, the access log, request ids;
//! - [`config`]: plain specs, a leaf (with [`tls`] and [`jwt`], which it
//!   loads through);
//! - [`simulate`]: `ratewarden simulate`, on the same admission path.

pub(crate) mod answer;
pub mod cli;
pub mod config;
pub(crate) mod consumers;
pub(crate) mod front;
// Only for the fuzz targets and the tests (the `fuzzing` feature): not
// compiled into the gateway (issue 38, the build).
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod jwt;
pub(crate) mod observe;
pub(crate) mod overrides;
pub mod proxy;
pub mod server;
pub mod simulate;
pub(crate) mod store;
pub mod tls;
pub(crate) mod upstream;
pub mod wire;
