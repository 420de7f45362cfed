//! Arbitrary bytes as a stream of link frames: see `meridian_fuzz::link`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meridian_fuzz::link::check(data));
