//! The proxy: one request flow ([`flow`]) and the wires that feed it. The
//! gateway's own HTTP/1.1 path ([`h1`]) serves plain HTTP/1.1, hyper
//! ([`hyper`]) everything else, and `Upgrade` requests become tunnels; all
//! three take their phases from [`flow`], their upstream attempts from
//! `failover`, and what the two HTTP paths must do alike from [`forward`].

mod failover;
pub(crate) mod flow;
pub mod forward;
pub(crate) mod h1;
pub(crate) mod hyper;
mod tunnel;

pub use h1::serve_connection;
