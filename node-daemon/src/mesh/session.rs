//! A link session: the one long-lived libp2p stream between two nodes that carries the core's
//! link frames both ways (forwarded messages, their acks, digests, snapshots, route acks).
//!
//! A session tells the broker task `PeerUp` when it starts and `PeerDown` when it ends, so
//! the core sees one link session per stream: what it sent on a session that broke is re-sent
//! on the next (the outbox) and deduplicated on arrival (the inbox). Frames are the link
//! codec's own length-prefixed encoding, written back to back.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::BytesMut;
use futures_util::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use libp2p::Stream;
use meridian_core::link::{DEFAULT_MAX_FRAME_LEN, FrameReader};
use meridian_core::routes::NodeId;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::mailbox::{LinkEvent, LinkLimits, PeerWriter, ToEngine};

static NEXT_SESSION: AtomicU64 = AtomicU64::new(1);

/// Frames are gathered into writes of about this size (the multiplexer's own frame size);
/// a frame this large or larger is written by itself.
const WRITE_BATCH_BYTES: usize = 16 * 1024;

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
    let up = ToEngine::Link(LinkEvent::PeerUp {
        peer: peer.clone(),
        session,
        writer,
    });
    if engine.send(up).await.is_err() {
        return;
    }
    debug!(%peer, session, "link session up");
    let why = {
        let (mut reader, mut writer) = (&mut stream).split();
        let read = async {
            let mut frames = FrameReader::new(DEFAULT_MAX_FRAME_LEN);
            let mut chunk = vec![0u8; 64 * 1024];
            loop {
                let n = reader.read(&mut chunk).await?;
                if n == 0 {
                    return Ok::<_, std::io::Error>("closed by the peer".to_owned());
                }
                let read = frames.read(&chunk[..n]);
                if !read.frames.is_empty() {
                    // The frames of one read, one input for the broker.
                    let msg = ToEngine::Link(LinkEvent::Frames {
                        peer: peer.clone(),
                        frames: read.frames,
                    });
                    if engine.send(msg).await.is_err() {
                        return Ok("broker stopping".to_owned());
                    }
                }
                if let Some(e) = read.error {
                    warn!(%peer, error = %e, "malformed link frame: ending the session");
                    return Ok("malformed frame".to_owned());
                }
            }
        };
        let write = async {
            // The frames queued when the session gets to run, written as one: one frame of
            // the multiplexer and of the encryption, and one system call, for all of them.
            let mut batch = BytesMut::new();
            while let Some(first) = rx.recv().await {
                let mut next = Some(first);
                while let Some(frame) = next {
                    if frame.len() >= WRITE_BATCH_BYTES {
                        // A large one (a snapshot chunk) goes as it is, after what came first.
                        write_batch(&mut writer, &mut batch, &queued_bytes).await?;
                        writer.write_all(&frame).await?;
                        queued_bytes.fetch_sub(frame.len(), Ordering::AcqRel);
                    } else {
                        batch.extend_from_slice(&frame);
                        if batch.len() >= WRITE_BATCH_BYTES {
                            write_batch(&mut writer, &mut batch, &queued_bytes).await?;
                        }
                    }
                    next = rx.try_recv().ok();
                }
                write_batch(&mut writer, &mut batch, &queued_bytes).await?;
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
    let _ = engine
        .send(ToEngine::Link(LinkEvent::Down { peer, session }))
        .await;
}

/// Write what `batch` gathered, if anything, and count it as written.
async fn write_batch(
    writer: &mut (impl AsyncWrite + Unpin),
    batch: &mut BytesMut,
    queued_bytes: &AtomicUsize,
) -> std::io::Result<()> {
    if batch.is_empty() {
        return Ok(());
    }
    writer.write_all(batch).await?;
    queued_bytes.fetch_sub(batch.len(), Ordering::AcqRel);
    batch.clear();
    Ok(())
}
