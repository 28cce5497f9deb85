//! The front ends beside the proxy, each deciding through the one
//! admission path: the [`admin`] API (decisions for other languages, keys,
//! bans), the live page [`ui`], and Envoy's rate limit service [`rls`].

pub mod admin;
pub mod authz;
pub mod envoy_auth;
pub mod rls;
pub mod ui;
