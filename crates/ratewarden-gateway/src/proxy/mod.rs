//! Forwarding admitted requests: the gateway's own HTTP/1.1 path ([`h1`])
//! for plain HTTP/1.1, hyper ([`hyper`]) for everything else, and what the
//! two must do alike ([`forward`]); `Upgrade` requests become tunnels.

pub mod forward;
pub mod h1;
pub mod hyper;
mod tunnel;

pub use h1::serve_connection;
