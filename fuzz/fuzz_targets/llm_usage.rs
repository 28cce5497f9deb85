//! Fuzz target `llm_usage`: see `ratewarden_gateway::fuzzing::llm_usage`.
#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| ratewarden_gateway::fuzzing::llm_usage(data));
