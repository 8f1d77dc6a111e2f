//! Reply inspection: see `props::reply`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| staleguard_fuzz::props::reply(data));
