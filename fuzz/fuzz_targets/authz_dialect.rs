//! Fuzz target `authz_dialect`: see `ratewarden_gateway::fuzzing::authz_dialect`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::authz_dialect(data));
