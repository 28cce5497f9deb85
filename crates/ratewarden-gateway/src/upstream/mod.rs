//! Upstreams: the routes and their groups of servers ([`route`]: balance,
//! passive ejection, active checks) and each server's connection pool
//! ([`pool`]).

pub(crate) mod pool;
pub(crate) mod route;
