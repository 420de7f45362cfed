//! What the broker task hands one TLS or WebSocket connection, or an in-process client, to
//! write.
//!
//! The broker task pushes chunks of bytes and may ask for the connection to be closed; the
//! connection's task takes everything queued at once and writes it. The queue is bounded in
//! bytes by the broker task (`max_write_buffer_bytes`), which reads [`Outbox::queued`] before
//! it pushes. An idle outbox holds no buffer of its own.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::AtomicWaker;

/// How the broker task ends a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// Write everything queued, then close.
    Close,
    /// Close now, dropping what is queued (a slow consumer, a replaced connection).
    Kill,
}

#[derive(Debug, Default)]
struct State {
    chunks: VecDeque<Bytes>,
    end: Option<End>,
}

/// One connection's outgoing queue, shared by the broker task and the connection's task.
#[derive(Debug, Default)]
pub struct Outbox {
    state: Mutex<State>,
    /// Something was pushed or an end was asked for since the task last looked. A flag and a
    /// waker rather than a `Notify`: waiting on it costs the task no state of its own.
    changed: AtomicBool,
    waker: AtomicWaker,
    /// Bytes pushed and not yet written to the socket.
    queued: AtomicUsize,
    /// The broker holds enough of this connection's input for now: read no more until it says
    /// otherwise ([`meridian_core::Broker::wants_input`]).
    reading_paused: AtomicBool,
    /// Bytes the connection handed the broker task that it has not fed to the broker yet.
    unfed: AtomicUsize,
}

/// The most a connection may have handed the broker task and not seen fed to the broker: its
/// task reads no more until the broker task has caught up. It bounds what one connection
/// holds in the broker task's queue (one message may be larger: it is read whole), and so how
/// far its input runs ahead of a pause.
pub const UNFED_MAX: usize = 64 * 1024;

impl Outbox {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Bytes pushed and not yet written.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Queue bytes to write (ignored once the connection is being ended). Nothing is queued for
    /// empty bytes: a writer takes a write of nothing for a flush.
    pub fn push(&self, data: Bytes) {
        if data.is_empty() {
            return;
        }
        {
            let mut state = self.lock();
            if state.end.is_some() {
                return;
            }
            self.queued.fetch_add(data.len(), Ordering::AcqRel);
            state.chunks.push_back(data);
        }
        self.notify();
    }

    /// Close once everything queued is written.
    pub fn close(&self) {
        self.lock().end.get_or_insert(End::Close);
        self.notify();
    }

    /// Close now, dropping what is queued.
    pub fn kill(&self) {
        {
            let mut state = self.lock();
            state.end = Some(End::Kill);
            state.chunks = VecDeque::new();
        }
        self.notify();
    }

    /// Move everything queued to the back of `into`; how the connection is to end, if it is.
    pub fn take(&self, into: &mut VecDeque<Bytes>) -> Option<End> {
        let mut state = self.lock();
        if into.is_empty() {
            *into = std::mem::take(&mut state.chunks);
        } else {
            into.append(&mut state.chunks);
        }
        state.end
    }

    /// Ask the connection's task to read no more for now.
    pub fn pause_reading(&self) {
        self.reading_paused.store(true, Ordering::Release);
    }

    /// Let the connection's task read again (and wake it to do so).
    pub fn resume_reading(&self) {
        if self.reading_paused.swap(false, Ordering::AcqRel) {
            self.notify();
        }
    }

    /// Whether the task may read more of the connection's input now: reading is not paused
    /// and the broker task has caught up with what it was handed. Otherwise the task is woken
    /// when that changes.
    pub fn may_read(&self) -> bool {
        !self.reading_paused.load(Ordering::Acquire)
            && self.unfed.load(Ordering::Acquire) < UNFED_MAX
    }

    /// The connection's task hands `n` bytes to the broker task.
    pub fn handed(&self, n: usize) {
        self.unfed.fetch_add(n, Ordering::AcqRel);
    }

    /// The broker task fed `n` handed bytes to the broker; the task is woken if that lets it
    /// read again.
    pub fn fed(&self, n: usize) {
        let before = self.unfed.fetch_sub(n, Ordering::AcqRel);
        if before >= UNFED_MAX && before - n < UNFED_MAX {
            self.notify();
        }
    }

    /// Account for bytes written to the socket.
    pub fn written(&self, n: usize) {
        self.queued.fetch_sub(n, Ordering::AcqRel);
    }

    /// Wait until something was pushed or an end was asked for since the last wait (a push
    /// before the wait counts: it is never missed). Cancel-safe.
    pub async fn changed(&self) {
        std::future::poll_fn(|cx| self.poll_changed(cx)).await;
    }

    /// Ready once something was pushed or an end was asked for since it was last ready;
    /// otherwise `cx` is woken at the next push or end.
    pub fn poll_changed(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.changed.swap(false, Ordering::AcqRel) {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        // A push between the check and the registration must not be missed.
        if self.changed.swap(false, Ordering::AcqRel) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn notify(&self) {
        self.changed.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state stays consistent whatever a panicking holder did: plain pushes and swaps.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn take_moves_everything_and_says_how_it_ends() {
        let o = Outbox::new();
        o.push(Bytes::from_static(b"ab"));
        o.push(Bytes::from_static(b"cde"));
        assert_eq!(o.queued(), 5);
        let mut out = VecDeque::new();
        assert_eq!(o.take(&mut out), None);
        assert_eq!(out.len(), 2);
        o.push(Bytes::from_static(b"f"));
        o.close();
        o.push(Bytes::from_static(b"ignored after close"));
        assert_eq!(o.take(&mut out), Some(End::Close));
        assert_eq!(out.len(), 3);
        o.written(6);
        assert_eq!(o.queued(), 0);
    }

    #[test]
    fn empty_bytes_queue_nothing() {
        let o = Outbox::new();
        o.push(Bytes::new());
        let mut out = VecDeque::new();
        assert_eq!(o.take(&mut out), None);
        assert!(out.is_empty());
        assert!(!o.changed.load(Ordering::Acquire), "and wake no one");
    }

    #[test]
    fn kill_drops_what_is_queued_and_wins_over_close() {
        let o = Outbox::new();
        o.push(Bytes::from_static(b"ab"));
        o.close();
        o.kill();
        o.close();
        let mut out = VecDeque::new();
        assert_eq!(o.take(&mut out), Some(End::Kill));
        assert!(out.is_empty());
    }

    /// Bytes an outbox may take. There is one per connection, in an `Arc`: with its two
    /// counters, a 160-byte malloc chunk.
    const OUTBOX_BUDGET: usize = 128;

    #[test]
    fn an_outbox_stays_within_its_budget() {
        let size = size_of::<Outbox>();
        assert!(size <= OUTBOX_BUDGET, "an outbox takes {size} bytes");
    }

    #[tokio::test]
    async fn resuming_a_paused_reader_wakes_its_task() {
        let o = Outbox::new();
        o.resume_reading();
        assert!(!o.changed.load(Ordering::Acquire), "nothing to resume");
        o.pause_reading();
        assert!(!o.may_read());
        o.resume_reading();
        assert!(o.may_read());
        tokio::time::timeout(std::time::Duration::from_secs(5), o.changed())
            .await
            .expect("the resume wakes the task");
    }

    #[tokio::test]
    async fn a_task_ahead_of_the_broker_waits_until_it_catches_up() {
        let o = Outbox::new();
        o.handed(UNFED_MAX - 1);
        assert!(o.may_read());
        o.handed(10);
        assert!(!o.may_read());
        o.fed(5);
        assert!(!o.may_read());
        assert!(
            !o.changed.load(Ordering::Acquire),
            "still too far ahead: no wake"
        );
        o.fed(UNFED_MAX);
        assert!(o.may_read());
        tokio::time::timeout(std::time::Duration::from_secs(5), o.changed())
            .await
            .expect("catching up wakes the task");
    }

    #[tokio::test]
    async fn a_push_before_the_wait_is_not_missed() {
        let o = Outbox::new();
        o.push(Bytes::from_static(b"x"));
        tokio::time::timeout(std::time::Duration::from_secs(5), o.changed())
            .await
            .expect("the earlier push wakes the waiter");
    }
}
