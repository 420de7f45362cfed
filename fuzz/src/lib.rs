//! Checkers behind Meridian's fuzz targets.
//!
//! Each target in `fuzz_targets/` is one line that hands libFuzzer's input to a `check`
//! function here. Keeping the checks in a library lets `examples/replay.rs` run the very same
//! code on stable, without libFuzzer, and print what it did (`MERIDIAN_FUZZ_TRACE=1` does the
//! same inside a fuzz binary). A check panics, with a message naming the broken invariant,
//! exactly when it finds a bug; any other outcome of an input is fine.
//!
//! - [`codec`]: decode → encode → decode agrees, `encoded_len` is exact, frames split anywhere
//!   decode the same, the packet-size limit cuts the stream where it should.
//! - [`broker`]: a sequence of connections, packets, timeouts, authentication decisions and
//!   crash-restarts against one [`meridian_core::Broker`], with protocol and bookkeeping
//!   invariants checked after every step.
//! - [`topic`]: validation never panics; both tries agree with the naive matcher, also after
//!   removals.
//! - [`link`]: link frames: decode → encode → decode agrees, frames split anywhere decode the
//!   same, a declared length over the limit is refused before the body arrives.
//! - [`routes`]: route replication between owners and replicas over a network that reorders,
//!   duplicates and loses frames; replicas never hold a set the owner did not have, and
//!   converge once the network heals.

pub mod broker;
pub mod codec;
pub mod link;
pub mod routes;
pub mod seeds;
pub mod topic;

use std::sync::atomic::{AtomicU8, Ordering};

/// 0: not decided yet; 1: off; 2: on.
static TRACING: AtomicU8 = AtomicU8::new(0);

/// Whether checkers print what they do: [`set_tracing`], or else `MERIDIAN_FUZZ_TRACE` set to
/// anything but `0`. The variable is read once: fuzzing runs millions of inputs a minute.
pub fn tracing() -> bool {
    match TRACING.load(Ordering::Relaxed) {
        0 => {
            let on = std::env::var_os("MERIDIAN_FUZZ_TRACE").is_some_and(|v| v != "0");
            set_tracing(on);
            on
        }
        state => state == 2,
    }
}

/// Turns tracing on or off for the rest of the process.
pub fn set_tracing(on: bool) {
    TRACING.store(if on { 2 } else { 1 }, Ordering::Relaxed);
}

/// Prints to stderr when [`tracing`] is on.
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {
        if $crate::tracing() {
            eprintln!($($arg)*);
        }
    };
}
