//! What the gateway tells about itself: Prometheus [`metrics`], the
//! [`access`] log, and the [`request_id`] that ties a request's lines
//! together.

pub mod access;
pub mod metrics;
pub mod request_id;
