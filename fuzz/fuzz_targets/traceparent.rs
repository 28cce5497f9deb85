//! Fuzz target `traceparent`: see `ratewarden_gateway::fuzzing::traceparent`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::traceparent(data));
