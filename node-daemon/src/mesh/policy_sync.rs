//! Policy sync: one libp2p stream per peer pair (`/meridian/policy/1`, opened by the node with
//! the smaller peer id, like the link session) carries the policy document's automerge sync
//! messages both ways. Each side sends what the other's last message shows it lacks, and again
//! whenever its own document changes; a node that was away catches up in a few round trips.
//!
//! Frames are a 4-byte big-endian length and the message. A frame longer than
//! `policy.max_document_bytes` (plus room for the sync message's own fields), a message that
//! does not decode, or one whose changes would make the document larger than that bound ends
//! the stream; the opener tries again later (backing off while streams end at once), and the
//! document stays as it was. One stream per peer stands at a time: a newer one from the same
//! peer replaces the older. Every stream ends when the policy task starts again after a
//! failure (its sync states are gone); the opener then opens a new one. Where members must be
//! certified, nothing is synced with a peer until the broker took it as a member (its hello
//! carried the operator's certificate of it, [`MemberGate`]): a holder of the cluster key
//! without one reads nothing of the document.

use futures_util::io::{AsyncReadExt, AsyncWriteExt};
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use crate::mailbox::MemberGate;
use crate::policy::PolicyHandle;

/// The stream protocol of policy sync.
pub const POLICY_PROTOCOL: StreamProtocol = StreamProtocol::new("/meridian/policy/1");

/// Room for a sync message's heads, need list and bloom filter beyond the changes.
const FRAME_OVERHEAD: usize = 1024 * 1024;

/// How long a stream waits for the broker's word on its peer (its hello comes on the link
/// session, which may open after this stream).
const MEMBER_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Where members must be certified: the broker's word on each peer, and where refusals are
/// counted.
#[derive(Clone, Debug)]
pub struct MemberCheck {
    pub gate: MemberGate,
    pub stats: std::sync::Arc<super::MeshStats>,
}

/// Sync the policy document with `peer` over `stream` until either side ends it, or `stop`
/// fires (a newer stream from the same peer replaces this one). With `members`, only once the
/// broker took `peer` as a member.
pub async fn run(
    peer: PeerId,
    stream: Stream,
    policy: PolicyHandle,
    members: Option<MemberCheck>,
    stop: Option<tokio::sync::oneshot::Receiver<()>>,
) {
    if let Some(members) = members {
        let node = meridian_core::routes::NodeId::new(&peer.to_string());
        let admitted = match &node {
            Ok(node) => members.gate.admits(node, MEMBER_WAIT).await,
            Err(_) => false,
        };
        if !admitted {
            (members.stats.policy_refused).fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            warn!(%peer, "policy sync refused: the peer is no certified member");
            return;
        }
    }
    static NEXT_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let session = NEXT_SESSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let max_frame = policy.max_document_bytes().saturating_add(FRAME_OVERHEAD);
    let peer_id = peer.to_string();
    let mut changes = policy.watch();
    let (mut reader, mut writer) = stream.split();
    // Frames read on their own future, so that a partly read frame is never dropped.
    let (inbox_tx, mut inbox) = mpsc::channel::<Vec<u8>>(1);
    let read = async move {
        loop {
            let mut len = [0u8; 4];
            reader.read_exact(&mut len).await?;
            let len = u32::from_be_bytes(len) as usize;
            if len > max_frame {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("a policy sync frame of {len} bytes (at most {max_frame})"),
                ));
            }
            let mut message = vec![0u8; len];
            reader.read_exact(&mut message).await?;
            if inbox_tx.send(message).await.is_err() {
                return Ok(());
            }
        }
    };
    let sync = async {
        let restarts = changes.borrow_and_update().restarts;
        loop {
            while let Some(message) = policy.sync_out(session, &peer_id).await {
                let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
                writer.write_all(&len.to_be_bytes()).await?;
                writer.write_all(&message).await?;
                writer.flush().await?;
            }
            tokio::select! {
                message = inbox.recv() => {
                    let Some(message) = message else { return Ok(()) };
                    if let Err(e) = policy.sync_in(session, &peer_id, message).await {
                        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, e));
                    }
                }
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    if changes.borrow_and_update().restarts != restarts {
                        return Err(std::io::Error::other("the policy task started again"));
                    }
                }
            }
        }
    };
    let stopped = async {
        match stop {
            Some(stop) => {
                let _ = stop.await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let ended: std::io::Result<()> = tokio::select! {
        r = read => r,
        r = sync => r,
        () = stopped => Ok(()),
    };
    match ended {
        Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
            warn!(%peer, error = %e, "policy sync refused");
        }
        Err(e) => debug!(%peer, error = %e, "policy sync ended"),
        Ok(()) => debug!(%peer, "policy sync ended"),
    }
    policy.sync_end(session).await;
}
