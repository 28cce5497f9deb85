//! Fuzz target `differential`: see `ratewarden_gateway::fuzzing::differential`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::differential(data));
