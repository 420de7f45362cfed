//! The queue between the broker task and one link session: what the broker task holds of a
//! session ([`PeerWriter`]) and the bounds that say when the link is congested or stuck
//! ([`LinkLimits`]). It knows nothing of the rest of the daemon.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};

/// The bounds of a session's queue (`cluster.link_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkLimits {
    /// Frames queued for the peer before the session counts as stuck and is cut (the core
    /// re-sends what matters on the next session).
    pub queue_frames: usize,
    /// Bytes queued for the peer past which the link counts as congested (as it does past
    /// half of its frames): QoS 0 forwards to the peer are dropped
    /// ([`meridian_core::Input::PeerCongested`]) until the queue is back down to
    /// `drained_bytes` and a quarter of its frames. Only QoS 1/2 forwards, bounded by the
    /// outbox's window, and the link's own frames queue beyond it.
    pub congested_bytes: usize,
    /// Bytes queued for a congested peer at or below which QoS 0 forwards resume.
    pub drained_bytes: usize,
}

impl Default for LinkLimits {
    fn default() -> Self {
        Self {
            queue_frames: 16 * 1024,
            congested_bytes: 4 * 1024 * 1024,
            drained_bytes: 1024 * 1024,
        }
    }
}

/// Why a frame could not be queued on a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendError {
    /// The session's queue is full: it cannot keep up.
    Full,
    /// The session ended.
    Ended,
}

/// The broker task's end of a session: frames to write, and a way to end the session.
#[derive(Debug, Clone)]
pub struct PeerWriter {
    tx: mpsc::Sender<Bytes>,
    pub kill: Arc<Notify>,
    /// Bytes of the frames queued on `tx` and not yet written to the stream.
    queued_bytes: Arc<AtomicUsize>,
    congested_bytes: usize,
    drained_bytes: usize,
}

impl PeerWriter {
    /// The broker task's end of a new session's queue, and the session's end.
    pub fn channel(limits: LinkLimits) -> (Self, mpsc::Receiver<Bytes>, Arc<AtomicUsize>) {
        let (tx, rx) = mpsc::channel(limits.queue_frames);
        let queued_bytes = Arc::new(AtomicUsize::new(0));
        let writer = Self {
            tx,
            kill: Arc::new(Notify::new()),
            queued_bytes: queued_bytes.clone(),
            congested_bytes: limits.congested_bytes,
            drained_bytes: limits.drained_bytes,
        };
        (writer, rx, queued_bytes)
    }

    /// Queue a frame.
    pub fn send(&self, frame: Bytes) -> Result<(), SendError> {
        let len = frame.len();
        // Counted before it can be written, so the session never subtracts first.
        self.queued_bytes.fetch_add(len, Ordering::AcqRel);
        self.tx.try_send(frame).map_err(|e| {
            self.queued_bytes.fetch_sub(len, Ordering::AcqRel);
            match e {
                TrySendError::Full(_) => SendError::Full,
                TrySendError::Closed(_) => SendError::Ended,
            }
        })
    }

    /// Past the congestion mark ([`LinkLimits::congested_bytes`] or half the queue's frames)
    /// once `frames` more frames of `bytes` in all are queued.
    pub fn congested_with(&self, frames: usize, bytes: usize) -> bool {
        self.queued_bytes.load(Ordering::Acquire) + bytes > self.congested_bytes
            || self.queued_frames() + frames > self.tx.max_capacity() / 2
    }

    /// Back down to [`LinkLimits::drained_bytes`] and a quarter of the queue's frames.
    pub fn drained(&self) -> bool {
        self.queued_bytes.load(Ordering::Acquire) <= self.drained_bytes
            && self.queued_frames() <= self.tx.max_capacity() / 4
    }

    fn queued_frames(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_marks_are_the_configured_ones() {
        let limits = LinkLimits {
            queue_frames: 8,
            congested_bytes: 1000,
            drained_bytes: 100,
        };
        let (writer, mut rx, queued) = PeerWriter::channel(limits);
        assert!(
            !writer.congested_with(1, 1000),
            "at the mark is not past it"
        );
        assert!(writer.congested_with(1, 1001), "past the byte mark");
        assert!(writer.congested_with(5, 5), "past half the frames");

        writer.send(Bytes::from(vec![0; 600])).unwrap();
        writer.send(Bytes::from(vec![0; 401])).unwrap();
        assert!(writer.congested_with(0, 0));
        assert!(!writer.drained());
        // The session writes the first frame out: 401 bytes are left, above the drained mark.
        let first = rx.try_recv().unwrap();
        queued.fetch_sub(first.len(), Ordering::AcqRel);
        assert!(!writer.congested_with(0, 0));
        assert!(!writer.drained(), "401 bytes are above the drained mark");
        let second = rx.try_recv().unwrap();
        queued.fetch_sub(second.len(), Ordering::AcqRel);
        assert!(writer.drained());

        for _ in 0..8 {
            writer.send(Bytes::from_static(b"x")).unwrap();
        }
        assert_eq!(
            writer.send(Bytes::from_static(b"x")),
            Err(SendError::Full),
            "the queue holds its frames and no more"
        );
    }
}
