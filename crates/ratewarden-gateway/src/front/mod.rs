//! The front ends beside the proxy, each deciding through the one
//! admission path: the [`admin`] API (decisions for other languages, keys,
//! bans), the live page [`ui`], and Envoy's rate limit service [`rls`].

pub(crate) mod admin;
pub(crate) mod authz;
pub(crate) mod envoy_auth;
pub(crate) mod rls;
pub(crate) mod ui;
