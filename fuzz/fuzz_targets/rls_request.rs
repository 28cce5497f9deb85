//! Fuzz target `rls_request`: see `ratewarden_gateway::fuzzing::rls_request`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::rls_request(data));
