//! Arbitrary bytes as a stream of MQTT 3.1.1 frames: see `meridian_fuzz::codec`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use meridian_core::codec::ProtocolVersion;

fuzz_target!(|data: &[u8]| meridian_fuzz::codec::check(data, ProtocolVersion::V311));
