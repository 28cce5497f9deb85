//! Fuzz target `jwt`: see `ratewarden_gateway::fuzzing::jwt`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::jwt(data));
