//! Wall-clock time as the daemon reads it: milliseconds since the Unix epoch, stable across
//! restarts (the core persists deadlines), never going backwards within a process where it
//! matters ([`Clock`]).

use std::time::{SystemTime, UNIX_EPOCH};

use meridian_core::Timestamp;

/// Milliseconds since the Unix epoch now (0 for a clock set before it).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The broker's time: [`unix_ms`], never going backwards within a process.
#[derive(Debug, Default)]
pub struct Clock {
    last: u64,
}

impl Clock {
    pub fn now(&mut self) -> Timestamp {
        self.last = self.last.max(unix_ms());
        Timestamp(self.last)
    }
}
