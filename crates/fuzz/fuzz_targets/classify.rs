//! Classification of raw bodies and of generated, then mutated, commands: see
//! `props::classify`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| staleguard_fuzz::props::classify(data));
