//! Route replication over a lossy, reordering network, then healing: see
//! `meridian_fuzz::routes`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| meridian_fuzz::routes::check(data));
