//! Plain MQTT-over-TCP connections, served by the broker task itself.
//!
//! Every plain TCP socket is registered with one epoll set of the broker task's own
//! ([`mio::Poll`]), which tokio watches as a single file descriptor ([`Poller`]). When it is
//! ready, the broker task reads each readable socket into one shared buffer and hands the
//! bytes straight to the core; at the end of its turn it writes what the turn queued for each
//! connection with one vectored write, and waits for a socket to become writable only when the
//! kernel's buffer is full. That is Mosquitto's shape inside tokio: a quiet connection costs
//! its socket, its entry here and its state in the core, and no task, no tokio registration,
//! no buffer. A message is read, routed and written on one thread without a hand-off.
//!
//! TLS and WebSocket connections keep a task each ([`crate::transport::task`]).

use std::collections::VecDeque;
use std::collections::hash_map::Entry;
use std::io::{self, Read as _, Write as _};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use bytes::Bytes;
use foldhash::HashMap;
use meridian_core::ConnId;
use mio::unix::SourceFd;
use mio::{Events, Interest, Token};
use tokio::io::unix::AsyncFd;
use tokio::sync::OwnedSemaphorePermit;

use crate::transport::wire::{consume, with_slices};

/// The shared read buffer. A read takes at most this much from one socket before the next
/// readable socket gets its turn.
pub const READ_BYTES: usize = 16 * 1024;

/// Readiness events taken from the epoll set at once.
const EVENTS: usize = 1024;

/// How long a connection the broker closes may take to write what is left.
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The epoll set of the plain TCP connections, as the broker task waits on it.
pub struct Poller {
    poll: AsyncFd<mio::Poll>,
    events: Events,
}

impl std::fmt::Debug for Poller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Poller").finish_non_exhaustive()
    }
}

impl Poller {
    /// Watch `poll` from the current tokio runtime.
    pub fn new(poll: mio::Poll) -> io::Result<Self> {
        // Deprecated in favour of an `unsafe` function, which this crate does not use: the
        // caller must vouch that the descriptor stays open and the same while watched. A
        // `mio::Poll` owns its epoll descriptor from creation to drop, and the `AsyncFd`
        // owns the `Poll`.
        #[allow(deprecated)]
        let poll = AsyncFd::with_interest(poll, tokio::io::Interest::READABLE)?;
        Ok(Self {
            poll,
            events: Events::with_capacity(EVENTS),
        })
    }

    /// Wait until some socket is ready; the readiness events gathered since the last wait.
    pub async fn wait(&mut self) -> io::Result<&Events> {
        loop {
            let mut guard = self.poll.readable_mut().await?;
            match guard
                .get_inner_mut()
                .poll(&mut self.events, Some(Duration::ZERO))
            {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            // Fewer events than room for them: the set has no more. Readiness tokio saw after
            // this wait began is kept, so an event arriving meanwhile is not missed.
            if self.events.iter().count() < EVENTS {
                guard.clear_ready();
            }
            if !self.events.is_empty() {
                return Ok(&self.events);
            }
        }
    }
}

/// An epoll set for plain TCP connections, and the connections it will serve.
pub fn new() -> io::Result<(mio::Poll, TcpConns)> {
    let poll = mio::Poll::new()?;
    let conns = TcpConns {
        registry: poll.registry().try_clone()?,
        conns: HashMap::default(),
        backlogs: HashMap::default(),
        readable: VecDeque::new(),
        dirty: Vec::new(),
        closing: Vec::new(),
        buf: vec![0; READ_BYTES].into_boxed_slice(),
    };
    Ok((poll, conns))
}

/// The plain TCP connections the broker task serves.
pub struct TcpConns {
    registry: mio::Registry,
    conns: HashMap<ConnId, TcpConn>,
    /// What connections have queued and the kernel has not taken yet. A connection with
    /// nothing waiting has no entry.
    backlogs: HashMap<ConnId, Backlog>,
    /// Connections with bytes to read, in the order they are to be read.
    readable: VecDeque<ConnId>,
    /// Connections to write to (or to close) at the end of the turn.
    dirty: Vec<ConnId>,
    /// Connections the broker closed that still have bytes to write, and until when.
    closing: Vec<(ConnId, Instant)>,
    buf: Box<[u8]>,
}

impl std::fmt::Debug for TcpConns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpConns")
            .field("connections", &self.conns.len())
            .field("with_backlog", &self.backlogs.len())
            .finish_non_exhaustive()
    }
}

struct TcpConn {
    /// In non-blocking mode.
    socket: TcpStream,
    flags: u8,
    /// The listener's connection permit, given back when the socket closes.
    _permit: OwnedSemaphorePermit,
}

/// In [`TcpConns::readable`].
const READ_QUEUED: u8 = 1;
/// In [`TcpConns::dirty`].
const DIRTY: u8 = 2;
/// The kernel's send buffer was full: nothing is written until the socket is writable again.
const WRITE_BLOCKED: u8 = 4;
/// The broker closed it: nothing more is read, and it closes once its backlog is written.
const CLOSING: u8 = 8;
/// The broker holds enough of its input for now ([`TcpConns::pause`]): nothing is read until
/// [`TcpConns::resume`].
const PAUSED: u8 = 16;

#[derive(Default)]
struct Backlog {
    chunks: VecDeque<Bytes>,
    bytes: usize,
}

/// What a read from a connection gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Read {
    /// This many bytes, at the start of [`TcpConns::read_buf`].
    Data(usize),
    /// The client went away, or the socket failed.
    Gone,
}

impl TcpConns {
    /// Serve `socket`, in non-blocking mode, as connection `conn` until it closes.
    pub fn add(
        &mut self,
        conn: ConnId,
        socket: TcpStream,
        permit: OwnedSemaphorePermit,
    ) -> io::Result<()> {
        let token = usize::try_from(conn.0)
            .map(Token)
            .map_err(|_| io::Error::other("connection id out of range"))?;
        // Edge-triggered: an event for every arrival of bytes and every freeing of room. Bytes
        // that arrived before the registration are reported at once.
        self.registry.register(
            &mut SourceFd(&socket.as_raw_fd()),
            token,
            Interest::READABLE | Interest::WRITABLE,
        )?;
        self.conns.insert(
            conn,
            TcpConn {
                socket,
                flags: 0,
                _permit: permit,
            },
        );
        Ok(())
    }

    /// Connections served.
    pub fn count(&self) -> usize {
        self.conns.len()
    }

    /// Bytes queued for `conn` and not yet taken by the kernel; `None` if it is not served
    /// here.
    pub fn queued(&self, conn: ConnId) -> Option<usize> {
        self.conns
            .contains_key(&conn)
            .then(|| self.backlogs.get(&conn).map_or(0, |b| b.bytes))
    }

    /// Note what the epoll set reported.
    pub fn on_events(&mut self, events: &Events) {
        for event in events {
            let Ok(id) = u64::try_from(event.token().0) else {
                continue;
            };
            let conn = ConnId(id);
            let Some(c) = self.conns.get_mut(&conn) else {
                continue; // Closed since.
            };
            // An error or a hang-up is found by the next read or write.
            let failed = event.is_error();
            if (event.is_readable() || event.is_read_closed() || failed)
                && c.flags & (READ_QUEUED | CLOSING | PAUSED) == 0
            {
                c.flags |= READ_QUEUED;
                self.readable.push_back(conn);
            }
            if event.is_writable() || event.is_write_closed() || failed {
                c.flags &= !WRITE_BLOCKED;
                if self.backlogs.contains_key(&conn) || c.flags & CLOSING != 0 {
                    mark_dirty(&mut self.dirty, conn, c);
                }
            }
        }
    }

    /// Some connection has bytes waiting to be read.
    pub fn has_readable(&self) -> bool {
        !self.readable.is_empty()
    }

    /// Read from the next readable connection. A connection whose read filled the buffer may
    /// have more: it goes to the back of the line.
    pub fn read_next(&mut self) -> Option<(ConnId, Read)> {
        while let Some(conn) = self.readable.pop_front() {
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            c.flags &= !READ_QUEUED;
            if c.flags & (CLOSING | PAUSED) != 0 {
                continue;
            }
            match (&c.socket).read(&mut self.buf) {
                Ok(0) => return Some((conn, Read::Gone)),
                Ok(n) => {
                    // A read that did not fill the buffer emptied the socket: bytes arriving
                    // later raise a new event.
                    if n == self.buf.len() {
                        c.flags |= READ_QUEUED;
                        self.readable.push_back(conn);
                    }
                    return Some((conn, Read::Data(n)));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    c.flags |= READ_QUEUED;
                    self.readable.push_back(conn);
                }
                Err(_) => return Some((conn, Read::Gone)),
            }
        }
        None
    }

    /// Read nothing more from `conn` until [`TcpConns::resume`]: what the client sends waits in
    /// the kernel's buffers, and then in the client's.
    pub fn pause(&mut self, conn: ConnId) {
        if let Some(c) = self.conns.get_mut(&conn) {
            c.flags |= PAUSED;
        }
    }

    /// Read from `conn` again, starting with what arrived while it was paused (an
    /// edge-triggered set reports no event for that).
    pub fn resume(&mut self, conn: ConnId) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.flags & PAUSED == 0 {
            return;
        }
        c.flags &= !PAUSED;
        if c.flags & (READ_QUEUED | CLOSING) == 0 {
            c.flags |= READ_QUEUED;
            self.readable.push_back(conn);
        }
    }

    /// The bytes of the last [`Read::Data`].
    pub fn read_buf(&self, n: usize) -> &[u8] {
        &self.buf[..n]
    }

    /// Queue `data` for `conn`, to be written at the end of the turn ([`TcpConns::write`]).
    pub fn push(&mut self, conn: ConnId, data: Bytes) {
        if data.is_empty() {
            return;
        }
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.flags & CLOSING != 0 {
            return;
        }
        let backlog = self.backlogs.entry(conn).or_default();
        backlog.bytes += data.len();
        backlog.chunks.push_back(data);
        mark_dirty(&mut self.dirty, conn, c);
    }

    /// Close `conn` once what is queued for it is written, within [`CLOSE_TIMEOUT`] of `now`.
    pub fn close(&mut self, conn: ConnId, now: Instant) {
        let Some(c) = self.conns.get_mut(&conn) else {
            return;
        };
        if c.flags & CLOSING != 0 {
            return;
        }
        c.flags |= CLOSING;
        if self.backlogs.contains_key(&conn) {
            self.closing.push((conn, now + CLOSE_TIMEOUT));
        }
        mark_dirty(&mut self.dirty, conn, c);
    }

    /// Close `conn` now, dropping what is queued; whether it was served here.
    pub fn remove(&mut self, conn: ConnId) -> bool {
        self.backlogs.remove(&conn);
        match self.conns.remove(&conn) {
            Some(c) => {
                let _ = self
                    .registry
                    .deregister(&mut SourceFd(&c.socket.as_raw_fd()));
                true
            }
            None => false,
        }
    }

    /// Write what was queued to every connection that has something to write and room for
    /// it, and finish the closes whose bytes are all written. Connections whose socket failed
    /// are added to `gone`.
    pub fn write(&mut self, gone: &mut Vec<ConnId>) {
        for i in 0..self.dirty.len() {
            let conn = self.dirty[i];
            let Some(c) = self.conns.get_mut(&conn) else {
                continue;
            };
            c.flags &= !DIRTY;
            if c.flags & WRITE_BLOCKED != 0 {
                continue;
            }
            let written = match self.backlogs.entry(conn) {
                Entry::Vacant(_) => Ok(true),
                Entry::Occupied(mut backlog) => {
                    let r = write_some(&c.socket, backlog.get_mut());
                    if matches!(r, Ok(true)) {
                        backlog.remove();
                    }
                    r
                }
            };
            match written {
                Ok(true) if c.flags & CLOSING != 0 => {
                    let _ = c.socket.shutdown(std::net::Shutdown::Write);
                    self.remove(conn);
                }
                Ok(true) => {}
                Ok(false) => c.flags |= WRITE_BLOCKED,
                Err(_) => gone.push(conn),
            }
        }
        self.dirty.clear();
    }

    /// The earliest deadline of a close under way.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.closing.iter().map(|&(_, at)| at).min()
    }

    /// Drop the connections whose close took longer than [`CLOSE_TIMEOUT`].
    pub fn expire(&mut self, now: Instant) {
        if self.closing.is_empty() {
            return;
        }
        let mut expired = Vec::new();
        let conns = &self.conns;
        // Closes that finished since are dropped from the list too.
        self.closing.retain(|&(conn, at)| {
            if at <= now {
                expired.push(conn);
                return false;
            }
            conns.contains_key(&conn)
        });
        for conn in expired {
            if self
                .conns
                .get(&conn)
                .is_some_and(|c| c.flags & CLOSING != 0)
            {
                self.remove(conn);
            }
        }
    }
}

fn mark_dirty(dirty: &mut Vec<ConnId>, conn: ConnId, c: &mut TcpConn) {
    if c.flags & DIRTY == 0 {
        c.flags |= DIRTY;
        dirty.push(conn);
    }
}

/// Write from the front of `backlog` until it is empty (`Ok(true)`) or the kernel takes no
/// more (`Ok(false)`).
fn write_some(socket: &TcpStream, backlog: &mut Backlog) -> io::Result<bool> {
    while !backlog.chunks.is_empty() {
        let mut w = socket;
        match with_slices(&backlog.chunks, |slices| w.write_vectored(slices)) {
            Ok(n) => {
                consume(&mut backlog.chunks, n)?;
                backlog.bytes -= n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::io::{Read as _, Write as _};
    use std::net::{TcpListener, TcpStream as StdStream};
    use std::sync::Arc;

    use tokio::sync::Semaphore;

    use super::*;

    const DEADLINE: Duration = Duration::from_secs(10);
    const CONN: ConnId = ConnId(3);

    /// An epoll set with one connection served, its client end, and the listener's permits.
    struct Harness {
        poll: mio::Poll,
        events: Events,
        conns: TcpConns,
        client: StdStream,
        permits: Arc<Semaphore>,
    }

    fn harness() -> Harness {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = StdStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let (poll, mut conns) = new().unwrap();
        let permits = Arc::new(Semaphore::new(1));
        let permit = permits.clone().try_acquire_owned().unwrap();
        conns.add(CONN, server, permit).unwrap();
        Harness {
            poll,
            events: Events::with_capacity(64),
            conns,
            client,
            permits,
        }
    }

    impl Harness {
        /// Wait for readiness events (at most briefly) and note them.
        fn poll(&mut self) {
            self.poll
                .poll(&mut self.events, Some(Duration::from_millis(50)))
                .unwrap();
            self.conns.on_events(&self.events);
        }

        /// Poll until `done` holds, within the deadline.
        fn until(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
            let deadline = Instant::now() + DEADLINE;
            while !done(self) {
                assert!(Instant::now() < deadline, "{what}: not within {DEADLINE:?}");
                self.poll();
            }
        }

        /// Everything readable now, appended to `into`; whether the client went away.
        fn read_all(&mut self, into: &mut Vec<u8>) -> bool {
            while let Some((conn, read)) = self.conns.read_next() {
                assert_eq!(conn, CONN);
                match read {
                    Read::Data(n) => into.extend_from_slice(self.conns.read_buf(n)),
                    Read::Gone => return true,
                }
            }
            false
        }

        fn served(&self) -> bool {
            self.conns.count() == 1
        }
    }

    /// Bytes a client sends that no single read can take, then its hang-up.
    #[test]
    fn what_a_client_sends_is_read_in_order_and_its_hang_up_is_seen() {
        let mut h = harness();
        let sent: Vec<u8> = (0..3 * READ_BYTES + 10).map(|i| (i % 251) as u8).collect();
        h.client.write_all(&sent).unwrap();
        let mut got = Vec::new();
        h.until("all bytes read", |h| {
            assert!(!h.read_all(&mut got), "no hang-up yet");
            got.len() == sent.len()
        });
        assert!(got == sent, "the bytes arrive whole and in order");
        h.client.shutdown(std::net::Shutdown::Both).unwrap();
        let mut rest = Vec::new();
        h.until("the hang-up", |h| h.read_all(&mut rest));
        assert!(rest.is_empty());
    }

    /// A client that does not read: what the kernel does not take waits, counted, and goes
    /// out in order once the client reads.
    #[test]
    fn a_backlog_waits_for_room_and_goes_out_in_order() {
        let mut h = harness();
        let chunk: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
        const CHUNKS: usize = 512;
        for _ in 0..CHUNKS {
            h.conns.push(CONN, Bytes::from(chunk.clone()));
        }
        let mut gone = Vec::new();
        h.conns.write(&mut gone);
        assert!(gone.is_empty());
        let left = h.conns.queued(CONN).unwrap();
        assert!(left > 0, "32 MiB fit in the kernel's buffers at once");
        let mut client = h.client.try_clone().unwrap();
        let reader = std::thread::spawn(move || {
            let mut got = vec![0; CHUNKS * chunk.len()];
            client.read_exact(&mut got).unwrap();
            got.chunks(chunk.len()).all(|c| c == chunk)
        });
        h.until("the backlog written", |h| {
            h.conns.write(&mut gone);
            h.conns.queued(CONN) == Some(0)
        });
        assert!(gone.is_empty());
        assert!(reader.join().unwrap(), "every byte, in order");
    }

    #[test]
    fn a_close_writes_what_is_queued_then_closes_and_frees_the_permit() {
        let mut h = harness();
        h.conns.push(CONN, Bytes::from_static(b"last "));
        h.conns.push(CONN, Bytes::from_static(b"words"));
        h.conns.close(CONN, Instant::now());
        h.conns
            .push(CONN, Bytes::from_static(b" ignored after the close"));
        let mut gone = Vec::new();
        h.conns.write(&mut gone);
        assert!(gone.is_empty());
        assert!(!h.served(), "closed once written");
        assert_eq!(h.permits.available_permits(), 1);
        let mut got = Vec::new();
        h.client.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"last words");
    }

    #[test]
    fn a_close_that_cannot_write_its_backlog_ends_at_its_deadline() {
        let mut h = harness();
        for _ in 0..512 {
            h.conns.push(CONN, Bytes::from(vec![7u8; 64 * 1024]));
        }
        let start = Instant::now();
        h.conns.close(CONN, start);
        let mut gone = Vec::new();
        h.conns.write(&mut gone);
        assert!(h.served(), "still writing");
        assert_eq!(h.conns.next_deadline(), Some(start + CLOSE_TIMEOUT));
        h.conns
            .expire(start + CLOSE_TIMEOUT - Duration::from_millis(1));
        assert!(h.served(), "not before its deadline");
        h.conns.expire(start + CLOSE_TIMEOUT);
        assert!(!h.served());
        assert_eq!(h.conns.next_deadline(), None);
        assert_eq!(h.permits.available_permits(), 1);
    }

    #[test]
    fn nothing_is_read_from_a_connection_being_closed() {
        let mut h = harness();
        h.client.write_all(b"too late").unwrap();
        h.until("readable", |h| h.conns.has_readable());
        h.conns.close(CONN, Instant::now());
        assert_eq!(h.conns.read_next(), None);
    }

    #[test]
    fn a_paused_connection_is_not_read_until_resumed_and_loses_nothing() {
        let mut h = harness();
        h.client.write_all(b"before ").unwrap();
        h.until("readable", |h| h.conns.has_readable());
        h.conns.pause(CONN);
        assert_eq!(h.conns.read_next(), None, "nothing read while paused");
        h.client.write_all(b"and during").unwrap();
        // More bytes raise an event; the paused connection stays off the list.
        h.poll();
        assert!(!h.conns.has_readable());
        h.conns.resume(CONN);
        let mut got = Vec::new();
        h.until("all bytes read", |h| {
            h.read_all(&mut got);
            got.len() == b"before and during".len()
        });
        assert_eq!(got, b"before and during");
    }

    /// Bytes the record of a quiet connection may take, beside its key in the map: its socket,
    /// its flags and its listener permit.
    const CONN_BUDGET: usize = 24;

    #[test]
    fn a_connection_record_stays_within_its_budget() {
        let size = size_of::<TcpConn>();
        assert!(
            size <= CONN_BUDGET,
            "a TCP connection's record takes {size} bytes"
        );
    }

    #[test]
    fn a_removed_connection_is_forgotten_with_its_backlog() {
        let mut h = harness();
        h.conns.push(CONN, Bytes::from_static(b"dropped"));
        assert!(h.conns.remove(CONN));
        assert!(!h.conns.remove(CONN));
        assert_eq!(h.conns.queued(CONN), None);
        let mut gone = Vec::new();
        h.conns.write(&mut gone);
        let mut got = Vec::new();
        h.client.read_to_end(&mut got).unwrap();
        assert!(got.is_empty(), "nothing was written: {got:?}");
        assert_eq!(h.permits.available_permits(), 1);
    }
}
