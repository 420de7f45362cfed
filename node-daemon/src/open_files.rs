//! How many connections the open-file limit lets the node take.
//!
//! Every connection is a file. At start the node raises its soft `RLIMIT_NOFILE` to the hard
//! limit (a process may, without privileges), keeps some for its own files (storage, mesh and
//! edge links, admin requests) and shares the rest among its MQTT listeners: a listener's
//! `max_connections` is taken as it is while the enabled listeners' sum fits, and scaled down
//! to fit when it does not, each clamp logged. Past the limit `accept` would fail for every
//! listener at once, and the node's own files with them (a store that cannot open a file);
//! with the clamp, the connection one past its listener's share is closed at accept and
//! counted, as `max_connections` always does.

use std::io;

/// Files the node keeps for itself besides its mesh and edge links: storage, the policy
/// document, logs, the runtime's own descriptors, admin requests.
pub const OWN_FILES: u64 = 256;

/// The soft open-file limit before and after [`raise`], and the hard one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    pub before: u64,
    pub soft: u64,
    pub hard: u64,
}

/// Raise the soft open-file limit to the hard one (an unlimited hard limit counts as
/// `u64::MAX`; the kernel then keeps the soft one where it was).
pub fn raise() -> io::Result<Limit> {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let soft = now.current.unwrap_or(u64::MAX);
    let hard = now.maximum.unwrap_or(u64::MAX);
    let mut limit = Limit {
        before: soft,
        soft,
        hard,
    };
    if soft < hard {
        let raised = Rlimit {
            current: now.maximum,
            maximum: now.maximum,
        };
        if setrlimit(Resource::Nofile, raised).is_ok() {
            limit.soft = hard;
        }
    }
    Ok(limit)
}

/// What connections `soft` open files leave after `reserved` for the node's own.
pub fn for_connections(soft: u64, reserved: u64) -> u64 {
    soft.saturating_sub(reserved).max(1)
}

/// Fit the enabled listeners' `max_connections` (`(name, max)`) within `available`: as they
/// are if their sum fits, else each scaled down in proportion (at least 1). Returns what it
/// clamped, for the log: `(name, configured, now)`.
pub fn fit(available: u64, listeners: &mut [(String, usize)]) -> Vec<(String, usize, usize)> {
    let sum: u64 = listeners.iter().map(|(_, n)| *n as u64).sum();
    if sum <= available {
        return Vec::new();
    }
    let mut clamped = Vec::new();
    for (name, max) in listeners.iter_mut() {
        let share = (*max as u64).saturating_mul(available) / sum.max(1);
        let now = usize::try_from(share.max(1)).unwrap_or(usize::MAX);
        if now < *max {
            clamped.push((name.clone(), *max, now));
            *max = now;
        }
    }
    clamped
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listeners(maxes: &[usize]) -> Vec<(String, usize)> {
        maxes
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("l{i}"), *m))
            .collect()
    }

    #[test]
    fn listeners_that_fit_are_left_as_configured() {
        let mut l = listeners(&[10_000, 5_000]);
        assert!(fit(15_000, &mut l).is_empty());
        assert_eq!(l, listeners(&[10_000, 5_000]));
    }

    #[test]
    fn listeners_past_the_limit_share_it_in_proportion_and_say_so() {
        let mut l = listeners(&[10_000, 10_000, 5_000]);
        let clamped = fit(17_500, &mut l);
        assert_eq!(l, listeners(&[7_000, 7_000, 3_500]));
        assert_eq!(clamped.len(), 3);
        assert_eq!(clamped[0], ("l0".to_owned(), 10_000, 7_000));
        let sum: usize = l.iter().map(|(_, n)| n).sum();
        assert!(sum <= 17_500);
        // A limit smaller than the listeners still leaves each one connection.
        let mut l = listeners(&[10, 10]);
        fit(1, &mut l);
        assert_eq!(l, listeners(&[1, 1]));
    }

    #[test]
    fn the_node_keeps_its_own_files() {
        assert_eq!(for_connections(20_000, 2_304), 17_696);
        assert_eq!(for_connections(100, 2_304), 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise().expect("getrlimit");
        // An unlimited hard limit is no number a soft one can be set to.
        assert!(limit.soft == limit.hard || limit.hard == u64::MAX, "{limit:?}");
        assert!(limit.before <= limit.soft);
    }
}
