//! What happened in a simulated run, in virtual time, for drawing: frames between nodes, links
//! going down and up, nodes crashing and restarting, SUBACKs, route convergence.

use crate::link::FrameKind;
use crate::routes::NodeId;

/// One thing on the timeline; times are milliseconds since the start of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEvent {
    pub at_ms: u64,
    pub kind: TimelineKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimelineKind {
    /// A link frame sent at `sent_ms` from one node arrived at another. Only frames that
    /// carry routes, messages or retained messages are recorded; keep-alives, acks and digests
    /// are not.
    Frame {
        from: NodeId,
        to: NodeId,
        sent_ms: u64,
        frame: FrameKind,
    },
    LinkDown {
        a: NodeId,
        b: NodeId,
    },
    LinkUp {
        a: NodeId,
        b: NodeId,
    },
    Crash {
        node: NodeId,
    },
    Restart {
        node: NodeId,
    },
    /// A client of `node` got a SUBACK.
    Suback {
        node: NodeId,
        client: String,
    },
    /// Every node's replica of every route set equals its owner's (again).
    RoutesConverged,
}

/// The recorded events, bounded: past `cap`, events are counted, not kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    pub events: Vec<TimelineEvent>,
    pub dropped: u64,
    pub cap: usize,
}

impl Timeline {
    pub fn new(cap: usize) -> Self {
        Self {
            events: Vec::new(),
            dropped: 0,
            cap,
        }
    }

    pub fn push(&mut self, at_ms: u64, kind: TimelineKind) {
        if self.events.len() < self.cap {
            self.events.push(TimelineEvent { at_ms, kind });
        } else {
            self.dropped += 1;
        }
    }

    /// Events in time order (those added after the run, like SUBACKs, are merged in).
    pub fn sort(&mut self) {
        self.events.sort_by_key(|e| e.at_ms);
    }
}
