//! What happened in a simulated run, in virtual time, for drawing: frames between nodes, links
//! going down and up, nodes crashing and restarting, SUBACKs, route convergence.

use crate::link::FrameKind;
use crate::routes::NodeId;

/// One thing on the timeline; times are milliseconds since the start of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineEvent {
    /// When it happened, in milliseconds since the start of the run.
    pub at_ms: u64,
    /// What happened.
    pub kind: TimelineKind,
}

/// What a [`TimelineEvent`] records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimelineKind {
    /// A link frame sent at `sent_ms` from one node arrived at another. Only frames that
    /// carry routes, messages or retained messages are recorded; keep-alives, acks and digests
    /// are not.
    Frame {
        /// The sending node.
        from: NodeId,
        /// The receiving node.
        to: NodeId,
        /// When it was sent, in milliseconds since the start of the run.
        sent_ms: u64,
        /// The frame's kind.
        frame: FrameKind,
    },
    /// The link between `a` and `b` was cut.
    LinkDown {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// The link between `a` and `b` came (back) up.
    LinkUp {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
    },
    /// A node crashed.
    Crash {
        /// The node.
        node: NodeId,
    },
    /// A crashed node restarted, with a new incarnation.
    Restart {
        /// The node.
        node: NodeId,
    },
    /// A client of `node` got a SUBACK.
    Suback {
        /// The client's node.
        node: NodeId,
        /// The client's name (its client id).
        client: String,
    },
    /// Every node's replica of every route set equals its owner's (again).
    RoutesConverged,
}

/// The recorded events, bounded: past `cap`, events are counted, not kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Timeline {
    /// The events kept, in the order recorded (see [`Timeline::sort`]).
    pub events: Vec<TimelineEvent>,
    /// Events past `cap`: counted, not kept.
    pub dropped: u64,
    /// The most events kept.
    pub cap: usize,
}

impl Timeline {
    /// An empty timeline that keeps at most `cap` events.
    pub fn new(cap: usize) -> Self {
        Self {
            events: Vec::new(),
            dropped: 0,
            cap,
        }
    }

    /// Record an event at `at_ms`; once `cap` events are kept, it is only counted in `dropped`.
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
