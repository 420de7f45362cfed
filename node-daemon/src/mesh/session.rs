//! A link session: the one long-lived libp2p stream between two nodes that carries the core's
//! link frames both ways (forwarded messages, their acks, digests, snapshots, route acks).
//!
//! A session tells the broker task `PeerUp` when it starts and `PeerDown` when it ends, so
//! the core sees one link session per stream: what it sent on a session that broke is re-sent
//! on the next (the outbox) and deduplicated on arrival (the inbox). Frames are the link
//! codec's own length-prefixed encoding, written back to back.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use futures_util::io::{AsyncReadExt, AsyncWriteExt};
use libp2p::Stream;
use meridian_core::link::{self, DEFAULT_MAX_FRAME_LEN};
use meridian_core::routes::NodeId;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{Notify, mpsc};
use tracing::{debug, warn};

use crate::engine::ToEngine;

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

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Run one session over `stream` until either side ends it, the stream fails, or the broker
/// task cuts it. Returns once the broker task was told it ended.
pub async fn run(
    peer: NodeId,
    mut stream: Stream,
    engine: mpsc::Sender<ToEngine>,
    limits: LinkLimits,
) {
    let session = NEXT_SESSION.fetch_add(1, Ordering::Relaxed);
    let (writer, mut rx, queued_bytes) = PeerWriter::channel(limits);
    let kill = writer.kill.clone();
    let up = ToEngine::PeerUp {
        peer: peer.clone(),
        session,
        writer,
    };
    if engine.send(up).await.is_err() {
        return;
    }
    debug!(%peer, session, "link session up");
    let why = {
        let (mut reader, mut writer) = (&mut stream).split();
        let read = async {
            let mut buf = BytesMut::with_capacity(64 * 1024);
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = reader.read(&mut chunk).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>("closed by the peer".to_owned());
                }
                buf.extend_from_slice(&chunk[..n]);
                loop {
                    match link::decode(&mut buf, DEFAULT_MAX_FRAME_LEN) {
                        Ok(Some(frame)) => {
                            let msg = ToEngine::PeerFrame {
                                peer: peer.clone(),
                                frame: Box::new(frame),
                            };
                            if engine.send(msg).await.is_err() {
                                return Ok("broker stopping".to_owned());
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            warn!(%peer, error = %e, "malformed link frame: ending the session");
                            return Ok("malformed frame".to_owned());
                        }
                    }
                }
            }
        };
        let write = async {
            while let Some(first) = rx.recv().await {
                writer.write_all(&first).await?;
                queued_bytes.fetch_sub(first.len(), Ordering::AcqRel);
                while let Ok(more) = rx.try_recv() {
                    writer.write_all(&more).await?;
                    queued_bytes.fetch_sub(more.len(), Ordering::AcqRel);
                }
                writer.flush().await?;
            }
            Ok::<_, std::io::Error>("ended by the broker".to_owned())
        };
        tokio::select! {
            r = read => r,
            r = write => r,
            () = kill.notified() => Ok("cut by the broker".to_owned()),
        }
    };
    match why {
        Ok(why) => debug!(%peer, session, why, "link session ended"),
        Err(e) => warn!(%peer, session, error = %e, "link session failed"),
    }
    let _ = stream.close().await;
    let _ = engine.send(ToEngine::PeerDown { peer, session }).await;
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
