//! The commit window (`storage.commit_window_ms`): the commits of the turns of a few
//! milliseconds share one fsync, and everything those turns send waits for it, in order.
//!
//! The engine writes a commit that outputs wait for to the journal without its fsync and
//! tells the window ([`CommitWindow::joined`]); it holds the turn's outputs
//! ([`CommitWindow::hold`]); once the window is due ([`CommitWindow::due`]), one fsync makes
//! every commit since it opened durable, and what it held goes out ([`CommitWindow::close`]).
//! Nothing is acknowledged before it is on the disk. Plain data, no clock of its own: the
//! engine passes the time in.

use std::time::{Duration, Instant};

use meridian_core::Output;

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

/// The commit window and what waits for its fsync.
#[derive(Debug, Default)]
pub struct CommitWindow {
    /// How long a commit that outputs wait for may wait for others (zero: no window).
    window: Duration,
    /// When the window's fsync is due, while it is open.
    due: Option<Instant>,
    /// Records committed since the window opened.
    records: usize,
    /// Outputs of the turns since the window opened, in order (their records are written).
    held: Vec<Output>,
    /// Bytes of the held outputs for connections and peers.
    held_bytes: usize,
}

impl CommitWindow {
    /// A window of `window` (zero: every commit is fsynced at once).
    pub fn new(window: Duration) -> Self {
        Self {
            window,
            ..Self::default()
        }
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

    /// A commit of `records` records that outputs wait for was written without its fsync:
    /// it opens a window at `now`, or joins the open one. One that brings the window to
    /// [`COMMIT_WINDOW_RECORDS`] makes it due at once (closed at the end of the turn).
    pub fn joined(&mut self, now: Instant, records: usize) {
        if self.due.is_none() {
            self.due = Some(now + self.window);
            self.records = 0;
        }
        self.records += records;
        if self.records >= COMMIT_WINDOW_RECORDS {
            self.due = Some(now);
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
        }
    }

    /// The window's fsync is done (or the window was never open): what it held, in order.
    pub fn close(&mut self) -> Vec<Output> {
        self.due = None;
        self.records = 0;
        self.held_bytes = 0;
        std::mem::take(&mut self.held)
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

    #[test]
    fn a_window_opens_with_a_commit_holds_outputs_in_order_and_closes_when_due() {
        let start = Instant::now();
        let mut window = CommitWindow::new(Duration::from_millis(5));
        assert!(window.enabled() && !window.is_open());
        window.joined(start, 2);
        assert_eq!(window.due(), Some(start + Duration::from_millis(5)));
        let mut turn = vec![record(), send(1), send(2)];
        window.hold(start, &mut turn);
        assert!(turn.is_empty(), "the turn's outputs wait");
        // A later turn joins: the window stays due when it first was.
        let later = start + Duration::from_millis(1);
        window.joined(later, 1);
        window.hold(later, &mut vec![send(3)]);
        assert_eq!(window.due(), Some(start + Duration::from_millis(5)));
        assert_eq!(
            window.close(),
            vec![send(1), send(2), send(3)],
            "records left out"
        );
        assert!(!window.is_open());
        assert!(window.close().is_empty());
    }

    #[test]
    fn enough_records_or_held_bytes_make_a_window_due_at_once() {
        let start = Instant::now();
        let mut window = CommitWindow::new(Duration::from_secs(3600));
        window.joined(start, COMMIT_WINDOW_RECORDS - 1);
        assert!(window.due() > Some(start));
        let now = start + Duration::from_millis(2);
        window.joined(now, 1);
        assert_eq!(
            window.due(),
            Some(now),
            "the record bound closes it at the turn's end"
        );
        window.close();
        window.joined(start, 1);
        let big = Output::Send {
            conn: ConnId(1),
            data: Bytes::from(vec![0; HELD_BYTES_MAX]),
        };
        window.hold(now, &mut vec![big]);
        assert_eq!(window.due(), Some(now), "the byte bound too");
        assert!(!CommitWindow::new(Duration::ZERO).enabled());
    }
}
