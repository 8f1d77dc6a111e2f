//! Framing and opening a message: see `props::frames`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| staleguard_fuzz::props::frames(data));
