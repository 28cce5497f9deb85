//! The connections: one stream type per side ([`stream`]: TCP or TLS) and
//! the watchdog that closes idle ones ([`idle`]); and gRPC's framing with
//! the health service's messages ([`grpc`]).

pub mod grpc;
pub mod idle;
pub mod stream;
