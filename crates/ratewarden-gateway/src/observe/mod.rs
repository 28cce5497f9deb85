//! What the gateway tells about itself: Prometheus [`metrics`], the
//! [`access`] log, and the [`request_id`] that ties a request's lines
//! together.

pub(crate) mod access;
pub(crate) mod metrics;
pub(crate) mod refusals;
pub(crate) mod request_id;
pub(crate) mod trace;
