//! Topic validation and both tries against the naive matcher: see `meridian_fuzz::topic`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meridian_fuzz::topic::check(data));
