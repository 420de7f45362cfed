//! The client connections the broker task writes to, and their write backlogs: plain TCP
//! connections it serves itself ([`TcpConns`]), and connections with a task of their own,
//! reached through their [`Outbox`]. It bounds what waits for each (a slow consumer is cut
//! off) and notes which pass the QoS 0 mark, for the engine to tell the broker.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use bytes::Bytes;
use foldhash::{HashMap as ConnMap, HashSet as ConnSet};
use meridian_core::ConnId;
use tracing::{debug, warn};

use crate::mailbox::{DaemonCounters, Outbox};
use crate::transport::tcp::TcpConns;

/// Bounds on the bytes waiting to be written to one connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteLimits {
    /// Past this backlog the connection is cut off as a slow consumer.
    pub max_bytes: usize,
    /// Past this backlog QoS 0 messages to the connection are dropped
    /// ([`meridian_core::Input::Congested`]), until it falls to half of it
    /// ([`meridian_core::Input::Drained`]).
    pub qos0_max_bytes: usize,
}

impl WriteLimits {
    pub fn from_config(limits: &crate::config::Limits) -> Self {
        Self {
            max_bytes: limits.max_write_buffer_bytes,
            qos0_max_bytes: limits.qos0_max_write_buffer_bytes.unwrap_or(
                (limits.max_write_buffer_bytes / 8)
                    .max(1024)
                    .min(limits.max_write_buffer_bytes),
            ),
        }
    }
}

/// Every open client connection and what waits to be written to it.
#[derive(Debug)]
pub struct Conns {
    /// Plain TCP connections.
    pub tcp: TcpConns,
    /// Connections served by tasks.
    outboxes: ConnMap<ConnId, Arc<Outbox>>,
    limits: WriteLimits,
    /// Connections the broker was told are congested ([`WriteLimits::qos0_max_bytes`]).
    congested: ConnSet<ConnId>,
    /// Connections past their mark in this drain, for the broker to be told.
    newly_congested: Vec<ConnId>,
    /// Bytes for each connection in this batch, not yet handed to it.
    batch_bytes: ConnMap<ConnId, usize>,
    /// The sum of `batch_bytes`.
    turn_bytes: usize,
    /// Connections to report closed to the broker after this batch's outputs are out: gone,
    /// or cut off as slow consumers.
    gone: Vec<ConnId>,
    counters: Arc<DaemonCounters>,
}

impl Conns {
    pub fn new(tcp: TcpConns, limits: WriteLimits, counters: Arc<DaemonCounters>) -> Self {
        Self {
            tcp,
            outboxes: ConnMap::default(),
            limits,
            congested: ConnSet::default(),
            newly_congested: Vec::new(),
            batch_bytes: ConnMap::default(),
            turn_bytes: 0,
            gone: Vec::new(),
            counters,
        }
    }

    /// Open connections.
    pub fn count(&self) -> usize {
        self.tcp.count() + self.outboxes.len()
    }

    /// A connection served by a task, writing what `outbox` gets.
    pub fn add_task(&mut self, conn: ConnId, outbox: Arc<Outbox>) {
        self.outboxes.insert(conn, outbox);
    }

    /// The task of `conn` took `n` bytes of its input off the broker's queue.
    pub fn fed(&self, conn: ConnId, n: usize) {
        if let Some(outbox) = self.outboxes.get(&conn) {
            outbox.fed(n);
        }
    }

    /// Bytes handed to `conn` and not yet written to its socket; `None` if it is not open.
    pub fn queued(&self, conn: ConnId) -> Option<usize> {
        self.tcp
            .queued(conn)
            .or_else(|| self.outboxes.get(&conn).map(|o| o.queued()))
    }

    /// Stop reading from `conn` (its login is pending and the broker holds enough).
    pub fn pause(&mut self, conn: ConnId) {
        self.tcp.pause(conn);
        if let Some(outbox) = self.outboxes.get(&conn) {
            outbox.pause_reading();
        }
    }

    /// Read from `conn` again.
    pub fn resume(&mut self, conn: ConnId) {
        self.tcp.resume(conn);
        if let Some(outbox) = self.outboxes.get(&conn) {
            outbox.resume_reading();
        }
    }

    /// `len` more bytes for `conn` in this batch. Past [`WriteLimits::qos0_max_bytes`] with
    /// what it has queued, it is noted for the broker to be told
    /// ([`Conns::take_newly_congested`]).
    pub fn note_send(&mut self, conn: ConnId, len: usize) {
        self.turn_bytes += len;
        let pending = self.batch_bytes.entry(conn).or_default();
        *pending += len;
        let pending = *pending;
        let Some(queued) = self.queued(conn) else {
            return;
        };
        let backlog = queued + pending;
        if backlog > self.limits.qos0_max_bytes && self.congested.insert(conn) {
            debug!(
                conn = conn.0,
                backlog, "write backlog past its mark: QoS 0 messages are dropped"
            );
            self.newly_congested.push(conn);
        }
    }

    /// The connections that passed their mark since the last call.
    pub fn take_newly_congested(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.newly_congested)
    }

    /// The congested connections that wrote enough of their backlog to take QoS 0 messages
    /// again; those that are gone are no longer congested.
    pub fn take_drained(&mut self) -> Vec<ConnId> {
        if self.congested.is_empty() {
            return Vec::new();
        }
        let low = self.limits.qos0_max_bytes / 2;
        let mut drained = Vec::new();
        let (tcp, outboxes) = (&self.tcp, &self.outboxes);
        self.congested.retain(|&conn| {
            let queued = tcp
                .queued(conn)
                .or_else(|| outboxes.get(&conn).map(|o| o.queued()));
            match queued {
                Some(queued) if queued > low => true,
                Some(_) => {
                    debug!(
                        conn = conn.0,
                        "write backlog drained: QoS 0 messages resume"
                    );
                    drained.push(conn);
                    false
                }
                None => false,
            }
        });
        drained
    }

    /// Whether the turn has as much to write as it should before it reads more.
    pub fn turn_is_full(&self) -> bool {
        self.turn_bytes >= super::TURN_OUTPUT_BYTES
    }

    /// Hand bytes to a connection: queued for its socket, written at the end of the turn, or
    /// for its task. A connection whose backlog would pass [`WriteLimits::max_bytes`] is cut
    /// off as a slow consumer.
    pub fn send(&mut self, conn: ConnId, data: Bytes) {
        // Already cut off in this batch: drop the rest, and count the connection once.
        if self.gone.contains(&conn) {
            return;
        }
        let Some(queued) = self.queued(conn) else {
            return;
        };
        let queued = queued + data.len();
        if queued > self.limits.max_bytes {
            warn!(
                conn = conn.0,
                queued, "slow consumer: write buffer full, disconnecting"
            );
            self.counters
                .slow_consumer_disconnects
                .fetch_add(1, Ordering::Relaxed);
            self.gone.push(conn);
        } else if let Some(outbox) = self.outboxes.get(&conn) {
            outbox.push(data);
        } else {
            self.tcp.push(conn, data);
        }
    }

    /// Close `conn` once what was sent to it is written.
    pub fn close(&mut self, conn: ConnId) {
        if let Some(outbox) = self.outboxes.remove(&conn) {
            outbox.close();
        } else {
            self.tcp.close(conn, Instant::now());
        }
    }

    /// Close `conn` at once, dropping what is queued for it; whether it was open.
    pub fn kill(&mut self, conn: ConnId) -> bool {
        if self.tcp.remove(conn) {
            return true;
        }
        match self.outboxes.remove(&conn) {
            Some(outbox) => {
                outbox.kill();
                true
            }
            None => false,
        }
    }

    /// `conn` went away: it is closed, and reported to the broker, after the batch.
    pub fn mark_gone(&mut self, conn: ConnId) {
        self.gone.push(conn);
    }

    /// Whether connections wait to be reported closed.
    pub fn has_gone(&self) -> bool {
        !self.gone.is_empty()
    }

    /// The connections that went away (or were cut off) during the batch.
    pub fn take_gone(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.gone)
    }

    /// Write to the TCP sockets what the turn queued, and what waited for room in a socket
    /// that has some now; sockets that fail are noted gone.
    pub fn write_tcp(&mut self) {
        self.tcp.write(&mut self.gone);
    }

    /// What the batch noted for each connection is in its queue now.
    pub fn end_batch(&mut self) {
        if !self.batch_bytes.is_empty() {
            self.batch_bytes.clear();
        }
        self.turn_bytes = 0;
    }

    /// Every task's connection, killed (the broker task is ending).
    pub fn kill_tasks(&mut self) {
        for outbox in self.outboxes.values() {
            outbox.kill();
        }
    }
}
