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
pub fn raise() -> Limit {
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
    limit
}

/// What connections `soft` open files leave after `reserved` for the node's own.
pub fn for_connections(soft: u64, reserved: u64) -> u64 {
    soft.saturating_sub(reserved).max(1)
}

/// What each enabled listener may take of `available` connections, from its configured
/// `max_connections` (`(name, max)`, 0 for a share of the limit): those configured are taken
/// as they are while their sum fits, else scaled down in proportion; those at 0 share what is
/// left equally. At least 1 each. Returns the listeners' maxima, and what was scaled down for
/// the log: `(name, configured, now)`.
pub fn fit(
    available: u64,
    listeners: &[(String, usize)],
) -> (Vec<usize>, Vec<(String, usize, usize)>) {
    let set: u64 = listeners.iter().map(|(_, n)| *n as u64).sum();
    let shared = listeners.iter().filter(|(_, n)| *n == 0).count() as u64;
    let mut clamped = Vec::new();
    let mut taken: u64 = 0;
    let mut maxes: Vec<usize> = listeners
        .iter()
        .map(|(name, max)| {
            if *max == 0 || set <= available {
                return *max;
            }
            let share = (*max as u64).saturating_mul(available) / set;
            let now = usize::try_from(share.max(1)).unwrap_or(usize::MAX);
            clamped.push((name.clone(), *max, now));
            now
        })
        .collect();
    for max in &maxes {
        taken += *max as u64;
    }
    if let Some(each) = available.saturating_sub(taken).checked_div(shared) {
        let each = usize::try_from(each.max(1)).unwrap_or(usize::MAX);
        for max in maxes.iter_mut().filter(|m| **m == 0) {
            *max = each;
        }
    }
    (maxes, clamped)
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
        let (maxes, clamped) = fit(15_000, &listeners(&[10_000, 5_000]));
        assert_eq!(maxes, [10_000, 5_000]);
        assert!(clamped.is_empty());
    }

    #[test]
    fn listeners_at_0_share_what_the_others_leave() {
        assert_eq!(fit(20_000, &listeners(&[0, 0])).0, [10_000, 10_000]);
        assert_eq!(
            fit(20_000, &listeners(&[5_000, 0, 0])).0,
            [5_000, 7_500, 7_500]
        );
        let (maxes, clamped) = fit(44, &listeners(&[0, 0]));
        assert_eq!(maxes, [22, 22]);
        assert!(clamped.is_empty(), "a share is no clamp");
    }

    #[test]
    fn listeners_past_the_limit_share_it_in_proportion_and_say_so() {
        let (maxes, clamped) = fit(17_500, &listeners(&[10_000, 10_000, 5_000]));
        assert_eq!(maxes, [7_000, 7_000, 3_500]);
        assert_eq!(clamped.len(), 3);
        assert_eq!(clamped[0], ("l0".to_owned(), 10_000, 7_000));
        // A limit smaller than the listeners still leaves each one connection.
        assert_eq!(fit(1, &listeners(&[10, 10, 0])).0, [1, 1, 1]);
    }

    #[test]
    fn the_node_keeps_its_own_files() {
        assert_eq!(for_connections(20_000, 2_304), 17_696);
        assert_eq!(for_connections(100, 2_304), 1);
    }

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let limit = raise();
        // An unlimited hard limit is no number a soft one can be set to.
        assert!(
            limit.soft == limit.hard || limit.hard == u64::MAX,
            "{limit:?}"
        );
        assert!(limit.before <= limit.soft);
    }
}
