//! The rewrite property (valid BSON out, only the spec's fields changed): see `props::rewrite`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| staleguard_fuzz::props::rewrite(data));
