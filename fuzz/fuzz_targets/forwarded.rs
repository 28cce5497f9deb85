//! Fuzz target `forwarded`: see `ratewarden_gateway::fuzzing::forwarded`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::forwarded(data));
