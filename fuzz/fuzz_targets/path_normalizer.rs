//! Fuzz target `path_normalizer`: see `ratewarden_gateway::fuzzing::path_normalizer`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::path_normalizer(data));
