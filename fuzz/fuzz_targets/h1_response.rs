//! Fuzz target `h1_response`: see `ratewarden_gateway::fuzzing::h1_response`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::h1_response(data));
