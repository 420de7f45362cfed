//! The link sessions the broker task writes frames to: one per peer node of the mesh and per
//! leaf (edge link), each a bounded queue ([`PeerWriter`]) that its session task writes out.
//! It notes which pass their congestion mark, for the engine to tell the broker, cuts a
//! session whose queue is full, and sends broadcasts by gossip (or, when gossip cannot take
//! one, on every mesh session).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use meridian_core::routes::NodeId;
use tokio::sync::mpsc;
use tracing::{info, warn};

use crate::mailbox::link_queue::SendError;
use crate::mailbox::{DaemonCounters, MeshCmd, PeerWriter};

/// One link session.
#[derive(Debug)]
struct Session {
    id: u64,
    writer: PeerWriter,
    /// A leaf's edge link: broadcasts (meant for the mesh) do not go on it.
    leaf: bool,
    /// The broker was told ([`meridian_core::Input::PeerCongested`]) and not yet told it
    /// drained.
    congested: bool,
    /// Frames for the peer in this batch, and their bytes, not yet queued on the session.
    batch_frames: usize,
    batch_bytes: usize,
}

/// Every open link session, by node.
#[derive(Debug)]
pub struct Links {
    sessions: HashMap<NodeId, Session>,
    /// Peers whose link the broker was told is congested.
    congested: Vec<NodeId>,
    /// Peers past their mark in this drain, for the broker to be told.
    newly_congested: Vec<NodeId>,
    /// Sessions to end after the batch: their queue overflowed, or the broker cut them.
    cut: Vec<NodeId>,
    /// Where broadcasts go (gossip), in cluster mode.
    mesh: Option<mpsc::Sender<MeshCmd>>,
    counters: Arc<DaemonCounters>,
}

impl Links {
    pub fn new(counters: Arc<DaemonCounters>) -> Self {
        Self {
            sessions: HashMap::new(),
            congested: Vec::new(),
            newly_congested: Vec::new(),
            cut: Vec::new(),
            mesh: None,
            counters,
        }
    }

    /// Send broadcasts by gossip through the mesh task.
    pub fn set_mesh(&mut self, mesh: mpsc::Sender<MeshCmd>) {
        self.mesh = Some(mesh);
    }

    /// A session `id` to `peer` started; the one it replaces, if any, is told to end, and
    /// returned as `true`.
    pub fn up(&mut self, peer: NodeId, id: u64, writer: PeerWriter, leaf: bool) -> bool {
        let old = self.sessions.insert(
            peer,
            Session {
                id,
                writer,
                leaf,
                congested: false,
                batch_frames: 0,
                batch_bytes: 0,
            },
        );
        match old {
            Some(old) => {
                old.writer.kill.notify_one();
                true
            }
            None => false,
        }
    }

    /// Session `id` to `peer` ended: whether it was the current one (then it is gone).
    pub fn down(&mut self, peer: &NodeId, id: u64) -> bool {
        if self.sessions.get(peer).is_some_and(|s| s.id == id) {
            self.sessions.remove(peer);
            return true;
        }
        false
    }

    /// One more frame of `len` bytes for `peer` in this batch: past the link's congestion
    /// mark with what its session has queued, it is noted for the broker to be told
    /// ([`Links::take_newly_congested`]).
    pub fn note_frame(&mut self, peer: &NodeId, len: usize) {
        let Some(s) = self.sessions.get_mut(peer) else {
            return;
        };
        s.batch_frames += 1;
        s.batch_bytes += len;
        if s.congested || !s.writer.congested_with(s.batch_frames, s.batch_bytes) {
            return;
        }
        s.congested = true;
        info!(
            peer = %peer,
            "link session congested: QoS 0 forwards dropped until it drains"
        );
        self.congested.push(peer.clone());
        self.newly_congested.push(peer.clone());
    }

    /// The links that passed their mark since the last call.
    pub fn take_newly_congested(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.newly_congested)
    }

    /// The congested links whose sessions wrote enough of their queue to take QoS 0
    /// forwards again. Links that ended need no word: the core starts every session
    /// uncongested.
    pub fn take_drained(&mut self) -> Vec<NodeId> {
        if self.congested.is_empty() {
            return Vec::new();
        }
        let mut drained = Vec::new();
        let sessions = &mut self.sessions;
        self.congested.retain(|peer| match sessions.get_mut(peer) {
            Some(s) if s.congested => {
                if !s.writer.drained() {
                    return true;
                }
                s.congested = false;
                info!(peer = %peer, "link session drained: QoS 0 forwards resume");
                drained.push(peer.clone());
                false
            }
            _ => false,
        });
        drained
    }

    /// Queue an encoded frame on `peer`'s session; a session whose queue is full is cut
    /// (QoS 0 forwards stop well before, at the congestion mark). No session: the core
    /// re-sends what matters on the next one.
    pub fn write(&mut self, peer: &NodeId, frame: Bytes) {
        let Some(s) = self.sessions.get(peer) else {
            return;
        };
        match s.writer.send(frame) {
            Ok(()) => {}
            Err(SendError::Full) if !self.cut.contains(peer) => {
                warn!(peer = %peer, "link session queue full: cutting the session");
                self.counters
                    .link_sessions_cut
                    .fetch_add(1, Ordering::Relaxed);
                self.cut.push(peer.clone());
            }
            // Cut already, or the session ended by itself (its end is on its way).
            Err(_) => {}
        }
    }

    /// A broadcast: by gossip, or on every mesh session when gossip cannot take it.
    pub fn broadcast(&mut self, frame: Bytes) {
        if let Some(mesh) = &self.mesh
            && mesh.try_send(MeshCmd::Gossip(frame.clone())).is_ok()
        {
            return;
        }
        self.write_to_every_peer(&frame);
    }

    /// Queue an encoded frame on every open session to a mesh member.
    pub fn write_to_every_peer(&mut self, frame: &Bytes) {
        let peers: Vec<NodeId> = self
            .sessions
            .iter()
            .filter(|(_, s)| !s.leaf)
            .map(|(p, _)| p.clone())
            .collect();
        for peer in peers {
            self.write(&peer, frame.clone());
        }
    }

    /// End `peer`'s session after the batch (the broker cut it).
    pub fn cut(&mut self, peer: NodeId) {
        if self.sessions.contains_key(&peer) && !self.cut.contains(&peer) {
            self.cut.push(peer);
        }
    }

    /// The sessions cut in this batch, ended now: the peers to report down.
    pub fn take_cut(&mut self) -> Vec<NodeId> {
        let mut down = Vec::new();
        for peer in std::mem::take(&mut self.cut) {
            if let Some(s) = self.sessions.remove(&peer) {
                s.writer.kill.notify_one();
                down.push(peer);
            }
        }
        down
    }

    /// A node was forgotten: discovery stops dialling it (a configured peer is dialled
    /// still).
    pub fn forgotten(&self, peer: &NodeId) {
        if let Some(mesh) = &self.mesh {
            let _ = mesh.try_send(MeshCmd::Forget(peer.clone()));
        }
    }

    /// What the batch noted for each session is in its queue now.
    pub fn end_batch(&mut self) {
        for s in self.sessions.values_mut() {
            s.batch_frames = 0;
            s.batch_bytes = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::mailbox::LinkLimits;

    /// A link session whose queue is full is cut once, at the end of the batch: its task is
    /// told to end, what it had queued stays in order, and nothing more goes to it.
    #[tokio::test]
    async fn a_link_session_that_cannot_keep_up_is_cut() {
        let mut links = Links::new(Arc::default());
        let peer = NodeId::new("far-away").unwrap();
        let (writer, mut frames, _) = PeerWriter::channel(LinkLimits {
            queue_frames: 2,
            ..LinkLimits::default()
        });
        let kill = writer.kill.clone();
        links.up(peer.clone(), 1, writer, false);
        for frame in ["one", "two", "three", "four"] {
            links.write(&peer, Bytes::from_static(frame.as_bytes()));
        }
        assert_eq!(
            links.cut,
            std::slice::from_ref(&peer),
            "cut once, however many frames overflow"
        );
        assert_eq!(links.take_cut(), vec![peer.clone()]);
        assert!(!links.sessions.contains_key(&peer), "the session is gone");
        tokio::time::timeout(Duration::from_secs(5), kill.notified())
            .await
            .expect("the session's task is told to end");
        links.write(&peer, Bytes::from_static(b"after"));
        assert_eq!(frames.recv().await.as_deref(), Some(&b"one"[..]));
        assert_eq!(frames.recv().await.as_deref(), Some(&b"two"[..]));
        assert!(frames.try_recv().is_err(), "nothing after the cut");
    }

    /// Past half its frames a link is congested, once, as soon as the batch's outputs show it;
    /// at a quarter, written by its session, it is drained at the next turn.
    #[tokio::test]
    async fn a_link_is_congested_past_its_mark_and_drained_below_it() {
        let mut links = Links::new(Arc::default());
        let peer = NodeId::new("thin").unwrap();
        let (writer, mut frames, written) = PeerWriter::channel(LinkLimits {
            queue_frames: 8,
            ..LinkLimits::default()
        });
        links.up(peer.clone(), 1, writer, false);
        // Two frames queued from an earlier batch, then a batch of more.
        for _ in 0..2 {
            links.write(&peer, Bytes::from_static(b"frame"));
        }
        for _ in 0..2 {
            links.note_frame(&peer, 5);
        }
        assert!(
            links.take_newly_congested().is_empty(),
            "half the frames is the mark"
        );
        for _ in 0..3 {
            links.note_frame(&peer, 5);
        }
        assert_eq!(
            links.take_newly_congested(),
            vec![peer.clone()],
            "noted before the batch is written, once"
        );
        links.end_batch();
        for _ in 0..5 {
            links.write(&peer, Bytes::from_static(b"frame"));
        }
        // The session writes all but three.
        for _ in 0..4 {
            let frame = frames.recv().await.unwrap();
            written.fetch_sub(frame.len(), Ordering::AcqRel);
        }
        assert!(
            links.take_drained().is_empty(),
            "three left: above a quarter"
        );
        let frame = frames.recv().await.unwrap();
        written.fetch_sub(frame.len(), Ordering::AcqRel);
        assert_eq!(links.take_drained(), vec![peer.clone()]);
        assert!(links.congested.is_empty());
        assert!(links.cut.is_empty());
    }
}
