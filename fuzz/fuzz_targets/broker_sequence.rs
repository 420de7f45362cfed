//! A sequence of connections, packets, timeouts and restarts against one broker: see
//! `meridian_fuzz::broker`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meridian_fuzz::broker::check(data));
