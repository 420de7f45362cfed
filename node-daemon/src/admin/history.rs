//! The last ten minutes of the broker's figures, for the status page's charts: a sample of
//! [`Stats`] every [`EVERY`], the newest [`KEPT`] kept, answered by `GET /api/history` with a
//! sample of the moment appended (so that a page opened just after a start has a line).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use meridian_core::broker::Stats;
use tokio::sync::watch;

use crate::mailbox::EngineHandle;

/// How often the figures are sampled.
pub const EVERY: Duration = Duration::from_secs(10);
/// How many samples are kept: ten minutes' worth.
pub const KEPT: usize = 60;

/// One sample: when (milliseconds since the Unix epoch) and what.
pub type Sample = (u64, Stats);

/// The samples, oldest first.
#[derive(Debug, Default)]
pub struct History {
    samples: Mutex<VecDeque<Sample>>,
}

impl History {
    /// Keep `sample`, dropping the oldest past [`KEPT`].
    pub fn push(&self, sample: Sample) {
        let mut samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        if samples.len() == KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    /// Every sample kept, oldest first.
    pub fn samples(&self) -> Vec<Sample> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner());
        samples.iter().cloned().collect()
    }
}

/// Milliseconds since the Unix epoch, as the page's clock counts.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Sample the broker's figures into `history` every [`EVERY`], the first at once, until `stop`
/// changes or the broker stops answering.
pub async fn sample(
    engine: EngineHandle,
    history: std::sync::Arc<History>,
    mut stop: watch::Receiver<bool>,
) {
    let mut every = tokio::time::interval(EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = stop.changed() => return,
        }
        let Some(stats) = engine.stats().await else {
            return;
        };
        history.push((now_ms(), stats));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_newest_ten_minutes_oldest_first() {
        let history = History::default();
        for at in 0..KEPT + 5 {
            let stats = Stats {
                connections: at,
                ..Stats::default()
            };
            history.push((at as u64 * 10_000, stats));
        }
        let samples = history.samples();
        assert_eq!(samples.len(), KEPT);
        assert_eq!(samples[0].0, 5 * 10_000);
        assert_eq!(samples[KEPT - 1].1.connections, KEPT + 4);
    }
}
