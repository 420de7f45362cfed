//! What a connection's task reads MQTT from and writes it to: a TCP socket, a TLS stream, or
//! WebSocket binary messages over either.
//!
//! Each transport is one object polled by hand, not split into halves: a connection's task
//! keeps its whole state for as long as the connection lives, and halves cost a shared
//! allocation (and, for WebSocket, a lock) per connection. Plain TCP sockets have no task:
//! the broker task serves them itself ([`crate::transport::tcp`]).

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message as WsMessage;
use tracing::debug;

/// Read buffer sizes. A connection whose reads fill the buffer doubles it, up to the largest,
/// and halves it again when reads get small.
const READ_MIN: usize = 256;
const READ_MAX: usize = 16 * 1024;

/// Chunks handed to one vectored write.
const MAX_IOV: usize = 64;

/// One connection's transport.
pub trait Wire: Unpin + Send {
    /// The next bytes of MQTT; `None` at the end of the stream or on an error.
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>>;

    /// Write from the front of `out` (removing what was written), or, with nothing queued,
    /// flush. Ready with the bytes written (0: flushed); pending, it wrote nothing.
    fn poll_write_some(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut VecDeque<Bytes>,
    ) -> Poll<io::Result<usize>>;

    /// End the writing side once everything was written.
    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>>;
}

/// MQTT straight over a byte stream (TLS), read into a buffer that
/// grows for busy connections and shrinks for quiet ones.
pub struct StreamWire<S> {
    stream: S,
    buf: BytesMut,
    want: usize,
}

impl<S> StreamWire<S> {
    pub fn new(stream: S) -> Self {
        Self {
            stream,
            buf: BytesMut::new(),
            want: READ_MIN,
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Wire for StreamWire<S> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        self.buf.reserve(self.want);
        match ready!(tokio_util::io::poll_read_buf(
            Pin::new(&mut self.stream),
            cx,
            &mut self.buf
        )) {
            Ok(0) | Err(_) => Poll::Ready(None),
            Ok(n) => {
                self.want = next_read_size(self.want, n);
                Poll::Ready(Some(self.buf.split().freeze()))
            }
        }
    }

    fn poll_write_some(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut VecDeque<Bytes>,
    ) -> Poll<io::Result<usize>> {
        poll_write_vectored(&mut self.stream, cx, out)
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// MQTT as binary WebSocket messages: one message per chunk written.
pub struct WsWire<S>(pub WebSocketStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin + Send> Wire for WsWire<S> {
    fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Bytes>> {
        loop {
            match ready!(Pin::new(&mut self.0).poll_next(cx)) {
                None => return Poll::Ready(None),
                Some(Ok(WsMessage::Binary(data))) => return Poll::Ready(Some(data)),
                Some(Ok(WsMessage::Ping(_) | WsMessage::Pong(_) | WsMessage::Frame(_))) => {}
                // Text frames are not MQTT; close like any other malformed input.
                Some(Ok(WsMessage::Text(_) | WsMessage::Close(_))) => return Poll::Ready(None),
                Some(Err(e)) => {
                    debug!(error = %e, "WebSocket read failed");
                    return Poll::Ready(None);
                }
            }
        }
    }

    fn poll_write_some(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut VecDeque<Bytes>,
    ) -> Poll<io::Result<usize>> {
        let mut ws = Pin::new(&mut self.0);
        let Some(len) = out.front().map(Bytes::len) else {
            ready!(ws.poll_flush(cx)).map_err(io::Error::other)?;
            return Poll::Ready(Ok(0));
        };
        ready!(ws.as_mut().poll_ready(cx)).map_err(io::Error::other)?;
        let chunk = out.pop_front().expect("checked above");
        if out.is_empty() {
            // An idle connection keeps no queue.
            *out = VecDeque::new();
        }
        ws.start_send(WsMessage::Binary(chunk))
            .map_err(io::Error::other)?;
        Poll::Ready(Ok(len))
    }

    fn poll_shutdown(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0)
            .poll_close(cx)
            .map_err(io::Error::other)
    }
}

/// The size of the next read after one of `want` bytes got `n`: larger for a connection whose
/// read filled the buffer, smaller for one whose reads are small.
fn next_read_size(want: usize, n: usize) -> usize {
    if n >= want {
        (want * 2).min(READ_MAX)
    } else if n < want / 4 {
        (want / 2).max(READ_MIN)
    } else {
        want
    }
}

/// Write from the front of `out`, as much as one vectored write takes (removing what was
/// written), or, with nothing queued, flush. Ready with the bytes written (0: flushed).
fn poll_write_vectored<W: AsyncWrite + Unpin>(
    wr: &mut W,
    cx: &mut Context<'_>,
    out: &mut VecDeque<Bytes>,
) -> Poll<io::Result<usize>> {
    if out.is_empty() {
        return Pin::new(wr).poll_flush(cx).map_ok(|()| 0);
    }
    let n = ready!(with_slices(out, |slices| {
        Pin::new(wr).poll_write_vectored(cx, slices)
    }))?;
    Poll::Ready(consume(out, n))
}

/// Call `write` with the front of `out` as slices. They are built on each call, so a task
/// waiting to write does not hold them.
pub fn with_slices<T>(out: &VecDeque<Bytes>, write: impl FnOnce(&[IoSlice<'_>]) -> T) -> T {
    let mut slices = [IoSlice::new(&[]); MAX_IOV];
    let mut used = 0;
    for (slice, chunk) in slices.iter_mut().zip(out.iter()) {
        *slice = IoSlice::new(chunk);
        used += 1;
    }
    write(&slices[..used])
}

/// Remove `n` written bytes from the front of `out`; `n` itself.
pub fn consume(out: &mut VecDeque<Bytes>, n: usize) -> io::Result<usize> {
    if n == 0 {
        return Err(io::ErrorKind::WriteZero.into());
    }
    let mut left = n;
    while let Some(chunk) = out.front_mut() {
        if left < chunk.len() {
            let _ = chunk.split_to(left);
            break;
        }
        left -= chunk.len();
        out.pop_front();
    }
    if out.is_empty() {
        // An idle connection keeps no queue.
        *out = VecDeque::new();
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A vectored write that takes at most `limit` bytes, across slices.
    fn trickle(limit: usize, written: &mut Vec<u8>, slices: &[IoSlice<'_>]) -> usize {
        let mut n = 0;
        for s in slices {
            let take = s.len().min(limit - n);
            written.extend_from_slice(&s[..take]);
            n += take;
        }
        n
    }

    #[test]
    fn writes_that_end_inside_a_chunk_resume_where_they_stopped() {
        let mut written = Vec::new();
        let mut out: VecDeque<Bytes> = ["abc", "defg", "hi"]
            .into_iter()
            .map(|s| Bytes::from_static(s.as_bytes()))
            .collect();
        let n = with_slices(&out, |s| trickle(5, &mut written, s));
        assert_eq!(consume(&mut out, n).unwrap(), 5);
        assert_eq!(out, [Bytes::from_static(b"fg"), Bytes::from_static(b"hi")]);
        let n = with_slices(&out, |s| trickle(5, &mut written, s));
        assert_eq!(consume(&mut out, n).unwrap(), 4);
        assert!(out.is_empty());
        assert_eq!(written, b"abcdefghi");
        assert!(
            consume(&mut out, 0).is_err(),
            "a write of nothing is an error"
        );
    }

    #[test]
    fn one_write_takes_at_most_max_iov_chunks() {
        let out: VecDeque<Bytes> = (0..MAX_IOV + 5).map(|_| Bytes::from_static(b"x")).collect();
        assert_eq!(with_slices(&out, |s| s.len()), MAX_IOV);
    }

    #[test]
    fn reads_grow_when_full_and_shrink_when_small() {
        assert_eq!(next_read_size(READ_MIN, READ_MIN), 2 * READ_MIN);
        assert_eq!(next_read_size(READ_MAX, READ_MAX), READ_MAX);
        assert_eq!(next_read_size(4 * READ_MIN, READ_MIN / 2), 2 * READ_MIN);
        assert_eq!(next_read_size(READ_MIN, 1), READ_MIN);
        assert_eq!(next_read_size(1024, 300), 1024);
    }
}
