//! Fuzz target `h1_request`: see `ratewarden_gateway::fuzzing::h1_request`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::h1_request(data));
