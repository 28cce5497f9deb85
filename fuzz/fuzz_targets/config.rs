//! Fuzz target `config`: see `ratewarden_gateway::fuzzing::config`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::config(data));
