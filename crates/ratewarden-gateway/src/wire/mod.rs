//! The connections: one stream type per side ([`stream`]: TCP or TLS) and
//! the watchdog that closes idle ones ([`idle`]).

pub mod idle;
pub mod stream;
