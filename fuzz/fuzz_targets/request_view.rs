//! Fuzz target `request_view`: see `ratewarden_gateway::fuzzing::request_view`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::request_view(data));
