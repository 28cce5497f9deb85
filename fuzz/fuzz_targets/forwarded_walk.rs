//! Fuzz target `forwarded_walk`: see `ratewarden_gateway::fuzzing::forwarded_walk`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::forwarded_walk(data));
