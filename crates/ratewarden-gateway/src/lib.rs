//! The `ratewarden` gateway: a reverse proxy that rate-limits HTTP requests
//! before they reach the upstream, configured by one YAML file, with an admin
//! API that also answers decisions for applications in other languages.

pub mod access;
pub mod admin;
pub mod answer;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod idle;
pub mod metrics;
pub mod proxy;
pub mod request_id;
pub mod rls;
pub mod route;
pub mod server;
pub mod simulate;
pub mod store;
pub mod stream;
pub mod tls;
pub mod ui;
pub mod upstream;
