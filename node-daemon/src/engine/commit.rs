//! The commit window (`storage.commit_window_ms`): the commits of a few turns share one
//! fsync, and everything those turns send waits for it, in order, but only where the sources
//! of those commits keep sending without waiting for it.
//!
//! The engine writes a commit that outputs wait for to the journal without its fsync and
//! tells the window ([`CommitWindow::joined`]); it holds the turn's outputs
//! ([`CommitWindow::hold`]); once the window is due ([`CommitWindow::due`]), one fsync makes
//! every commit since it opened durable, and what it held goes out ([`CommitWindow::close`]).
//! Nothing is acknowledged before it is on the disk. Plain data, no clock of its own: the
//! engine passes the time in.
//!
//! Whether a commit waits for company is decided from its sources (the connections and peers
//! whose input made its records, [`Source`]), so that none waits that would wait for it:
//! - a commit waits only if each of its sources committed shortly before (within
//!   [`RECENT`], and no longer ago than the window and a millisecond): a source that sends
//!   now and then, or a client that just connected, is fsynced at once;
//! - a window that reaches its deadline shows that those of its sources not heard from again
//!   since their commit wait for what it holds (a publisher with one message in flight):
//!   their commits are fsynced at once for [`PROBE_AFTER`], then one waits again to see
//!   whether they still do; those that sent again keep sharing fsyncs;
//! - a commit of a source that may not wait closes an open window at the end of its turn.
//!
//! So a lone publisher that waits for each acknowledgement pays one fsync per message, with
//! no added wait but one window per [`PROBE_AFTER`], and a steady stream shares fsyncs.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use meridian_core::routes::NodeId;
use meridian_core::{ConnId, Output};

/// Records whose commits a window waits for at most: once its commits hold this many, it
/// closes at the end of the turn. An fsync shared this many ways costs little per record,
/// and publishers that keep this many messages in flight are not held back by the window:
/// what they send next waits for the acknowledgements it holds.
pub const COMMIT_WINDOW_RECORDS: usize = 8;

/// Outputs a window holds at most: past them it closes at the end of the turn, so that what
/// waits for its fsync stays within a few turns' worth at any rate.
pub const HELD_OUTPUTS_MAX: usize = 16 * 1024;

/// Bytes for connections and peers a window holds at most, as [`HELD_OUTPUTS_MAX`].
pub const HELD_BYTES_MAX: usize = super::TURN_OUTPUT_BYTES;

/// A commit waits for company only if each of its sources committed this recently before.
pub const RECENT: Duration = Duration::from_millis(5);

/// How long a source found to wait for its acknowledgements has its commits fsynced at once
/// before one of them waits again, to see whether it still waits.
pub const PROBE_AFTER: Duration = Duration::from_secs(1);

/// Whose input made a commit's records.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// A client connection.
    Conn(ConnId),
    /// A peer node or leaf, by its link.
    Peer(NodeId),
}

/// What the window knows of a source's pace.
#[derive(Debug, Clone, Copy)]
struct Pace {
    /// Its last commit.
    last: Instant,
    /// Since when it is known to wait for its acknowledgements (its commits do not wait).
    waits_since: Option<Instant>,
}

/// The commit window and what waits for its fsync.
#[derive(Debug, Default)]
pub struct CommitWindow {
    /// How long a commit that outputs wait for may wait for others (zero: no window).
    window: Duration,
    /// How recently before a source must have committed for its commit to wait ([`RECENT`]).
    recent: Duration,
    /// When the window's fsync is due, while it is open.
    due: Option<Instant>,
    /// Whether it is due before its deadline: a source sent again, a bound was reached.
    due_early: bool,
    /// Records committed since the window opened.
    records: usize,
    /// Outputs of the turns since the window opened, in order (their records are written).
    held: Vec<Output>,
    /// Bytes of the held outputs for connections and peers.
    held_bytes: usize,
    /// The sources of the commits the open window holds, and whether each committed again
    /// since its first (it sends without waiting for what the window holds).
    waiting: Vec<(Source, bool)>,
    /// The pace of each source heard from (forgotten when it goes).
    paces: HashMap<Source, Pace>,
    /// Commits that waited for company (joined a window), for the metrics.
    waited: u64,
}

impl CommitWindow {
    /// A window of `window` (zero: every commit is fsynced at once).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            recent: RECENT.min(window + Duration::from_millis(1)),
            ..Self::default()
        }
    }

    /// The same, taking commits `recent` apart as recent (tests on a slow disk).
    #[cfg(test)]
    pub fn with_recent(mut self, recent: Duration) -> Self {
        self.recent = recent;
        self
    }

    /// Whether commits may wait for company at all.
    pub fn enabled(&self) -> bool {
        !self.window.is_zero()
    }

    /// Whether a window is open: a commit waits for its fsync.
    pub fn is_open(&self) -> bool {
        self.due.is_some()
    }

    /// When the open window's fsync is due.
    pub fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Commits that waited for company so far.
    pub fn waited(&self) -> u64 {
        self.waited
    }

    /// Whether a commit from `sources` at `now` may wait for company (the window being
    /// closed): each source committed within [`RECENT`], and none is known to wait for its
    /// acknowledgements, or it was [`PROBE_AFTER`] ago. A commit of no source (a timer's)
    /// may: nobody waits for it.
    pub fn may_wait(&self, now: Instant, sources: &[Source]) -> bool {
        self.enabled()
            && sources.iter().all(|s| {
                self.paces.get(s).is_some_and(|p| {
                    now.saturating_duration_since(p.last) < self.recent
                        && p.waits_since
                            .is_none_or(|since| now.saturating_duration_since(since) >= PROBE_AFTER)
                })
            })
    }

    /// A commit from `sources` at `now` that was fsynced at once: their pace is noted.
    pub fn committed(&mut self, now: Instant, sources: &[Source]) {
        for s in sources {
            self.paces
                .entry(s.clone())
                .and_modify(|p| p.last = now)
                .or_insert(Pace {
                    last: now,
                    waits_since: None,
                });
        }
    }

    /// A commit of `records` records from `sources` that outputs wait for was written
    /// without its fsync: it opens a window at `now`, or joins the open one. The window is
    /// due at once (closed at the end of the turn) when one of `sources` may not wait
    /// ([`CommitWindow::may_wait`]), and once its commits hold [`COMMIT_WINDOW_RECORDS`]
    /// records.
    pub fn joined(&mut self, now: Instant, records: usize, sources: &[Source]) {
        if self.due.is_none() {
            self.due = Some(now + self.window);
            self.due_early = false;
            self.records = 0;
            self.waiting.clear();
        }
        let early = !self.may_wait(now, sources);
        self.waited += 1;
        self.records += records;
        for s in sources {
            match self.waiting.iter_mut().find(|(w, _)| w == s) {
                Some((_, again)) => *again = true,
                None => self.waiting.push((s.clone(), false)),
            }
            let pace = self.paces.entry(s.clone()).or_insert(Pace {
                last: now,
                waits_since: None,
            });
            pace.last = now;
            // Probed again, or heard from: waits for company until it shows it waits.
            pace.waits_since = None;
        }
        if early || self.records >= COMMIT_WINDOW_RECORDS {
            self.due = Some(now);
            self.due_early = true;
        }
    }

    /// Hold the turn's outputs (all of them: their records are written) until the fsync.
    /// Past [`HELD_OUTPUTS_MAX`] or [`HELD_BYTES_MAX`] the window is due at once.
    pub fn hold(&mut self, now: Instant, outputs: &mut Vec<Output>) {
        for out in outputs.drain(..) {
            self.held_bytes += match &out {
                Output::Persist { .. } => continue,
                Output::Send { data, .. } => data.len(),
                Output::ToPeer { frame, .. } | Output::Broadcast { frame } => frame.len(),
                _ => 0,
            };
            self.held.push(out);
        }
        if self.held.len() >= HELD_OUTPUTS_MAX || self.held_bytes >= HELD_BYTES_MAX {
            self.due = Some(now);
            self.due_early = true;
        }
    }

    /// The window's fsync is done at `now` (or the window was never open): what it held, in
    /// order. A window that reached its deadline shows that those of its sources not heard
    /// from again since their commit wait for what it held: their commits are fsynced at once
    /// from now.
    pub fn close(&mut self, now: Instant) -> Vec<Output> {
        if self.due.is_some_and(|due| now >= due) && !self.due_early {
            for (s, _) in self.waiting.iter().filter(|(_, again)| !again) {
                if let Some(p) = self.paces.get_mut(s) {
                    p.waits_since = Some(now);
                }
            }
        }
        self.due = None;
        self.due_early = false;
        self.records = 0;
        self.held_bytes = 0;
        self.waiting.clear();
        std::mem::take(&mut self.held)
    }

    /// `source` is gone (a connection closed, a link down): its pace is forgotten.
    pub fn forget(&mut self, source: &Source) {
        self.paces.remove(source);
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use meridian_core::ConnId;
    use meridian_core::broker::Durability;

    use super::*;

    fn send(n: u8) -> Output {
        Output::Send {
            conn: ConnId(1),
            data: Bytes::from(vec![n; 10]),
        }
    }

    fn record() -> Output {
        Output::Persist {
            key: Bytes::from_static(b"k"),
            value: None,
            durability: Durability::Now,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn a_window_opens_with_a_commit_holds_outputs_in_order_and_closes_when_due() {
        let start = Instant::now();
        let mut window = CommitWindow::new(ms(5));
        assert!(window.enabled() && !window.is_open());
        window.joined(start, 2, &[]);
        assert_eq!(window.due(), Some(start + ms(5)));
        let mut turn = vec![record(), send(1), send(2)];
        window.hold(start, &mut turn);
        assert!(turn.is_empty(), "the turn's outputs wait");
        // A later turn joins: the window stays due when it first was.
        let later = start + ms(1);
        window.joined(later, 1, &[]);
        window.hold(later, &mut vec![send(3)]);
        assert_eq!(window.due(), Some(start + ms(5)));
        assert_eq!(
            window.close(later),
            vec![send(1), send(2), send(3)],
            "records left out"
        );
        assert!(!window.is_open());
        assert!(window.close(later).is_empty());
    }

    #[test]
    fn enough_records_or_held_bytes_make_a_window_due_at_once() {
        let start = Instant::now();
        let mut window = CommitWindow::new(Duration::from_secs(3600));
        window.joined(start, COMMIT_WINDOW_RECORDS - 1, &[]);
        assert!(window.due() > Some(start));
        let now = start + ms(2);
        window.joined(now, 1, &[]);
        assert_eq!(
            window.due(),
            Some(now),
            "the record bound closes it at the turn's end"
        );
        window.close(now);
        window.joined(start, 1, &[]);
        let big = Output::Send {
            conn: ConnId(1),
            data: Bytes::from(vec![0; HELD_BYTES_MAX]),
        };
        window.hold(now, &mut vec![big]);
        assert_eq!(window.due(), Some(now), "the byte bound too");
        assert!(!CommitWindow::new(Duration::ZERO).enabled());
    }

    /// A source's first commit, and one long after its last, is fsynced at once; one soon
    /// after its last waits for company.
    #[test]
    fn only_a_source_that_committed_just_before_waits_for_company() {
        let start = Instant::now();
        let mut window = CommitWindow::new(ms(2));
        let client = [Source::Conn(ConnId(7))];
        assert!(!window.may_wait(start, &client), "a first commit");
        window.committed(start, &client);
        assert!(window.may_wait(start + ms(1), &client));
        assert!(!window.may_wait(start + RECENT, &client), "not recent");
        assert!(
            window.may_wait(start, &[]),
            "a timer's commit: nobody waits"
        );
        assert!(!CommitWindow::new(Duration::ZERO).may_wait(start, &[]));
    }

    /// A source that sends again while the window holds its commit does not wait for it: the
    /// window keeps its deadline, and after it the source's commits still wait for company.
    #[test]
    fn a_source_that_commits_again_during_the_window_keeps_sharing_fsyncs() {
        let start = Instant::now();
        let mut window = CommitWindow::new(ms(2));
        let stream = [Source::Peer(NodeId::new("12D3KooWpeer").unwrap())];
        window.committed(start, &stream);
        let t1 = start + ms(1);
        assert!(window.may_wait(t1, &stream));
        window.joined(t1, 1, &stream);
        assert_eq!(window.due(), Some(t1 + ms(2)));
        let t2 = t1 + Duration::from_micros(500);
        window.joined(t2, 1, &stream);
        assert_eq!(window.due(), Some(t1 + ms(2)), "the deadline holds");
        let deadline = t1 + ms(2);
        window.close(deadline);
        assert!(
            window.may_wait(deadline + Duration::from_micros(500), &stream),
            "it still shares fsyncs"
        );
        assert_eq!(window.waited(), 2);
    }

    /// A source whose window reaches its deadline without a word from it waits for what the
    /// window holds (one message in flight): its commits are fsynced at once until
    /// `PROBE_AFTER` has passed; then one waits again. Another source's commit that may not
    /// wait closes an open window at once.
    #[test]
    fn a_source_that_waits_for_its_acknowledgements_is_fsynced_at_once_until_probed_again() {
        let start = Instant::now();
        let mut window = CommitWindow::new(ms(2));
        let lone = [Source::Conn(ConnId(1))];
        window.committed(start, &lone);
        let t1 = start + Duration::from_micros(150);
        assert!(window.may_wait(t1, &lone), "probed");
        window.joined(t1, 1, &lone);
        let deadline = window.due().unwrap();
        window.close(deadline);
        for i in 1..10 {
            let t = deadline + Duration::from_micros(150 * i);
            assert!(!window.may_wait(t, &lone), "fsynced at once");
            window.committed(t, &lone);
        }
        let later = deadline + PROBE_AFTER;
        window.committed(later - ms(1), &lone);
        assert!(window.may_wait(later, &lone), "probed again");

        // While a stream's window is open, a commit of a source that may not wait (one it
        // does not know, say) closes it at once.
        let stream = [Source::Conn(ConnId(2))];
        let mut window = CommitWindow::new(ms(2));
        window.committed(start, &stream);
        window.joined(t1, 1, &stream);
        assert_eq!(window.due(), Some(t1 + ms(2)));
        let t = t1 + Duration::from_micros(500);
        window.forget(&lone[0]);
        window.joined(t, 1, &lone);
        assert_eq!(window.due(), Some(t), "a source it does not know");
    }
}
