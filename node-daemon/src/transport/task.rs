//! One TLS or WebSocket connection's task (plain TCP connections have none: [`crate::transport::tcp`]).
//!
//! The task registers the connection with the broker task, then hands what it reads to the
//! broker task (waiting, without reading more, while the broker's queue is full) and writes
//! what the broker task queued in the connection's [`Outbox`]. Reading and writing proceed
//! independently. When either side ends, it tells the broker task the connection is gone.
//!
//! It is a future written by hand rather than an `async fn`: a task keeps its whole state for
//! as long as its connection lives, and a hand-written one holds exactly its fields. Rarely
//! needed state (a registration under way, bytes waiting for room, a close under way) is
//! boxed.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use meridian_core::{ConnId, ConnInfo};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::error::{SendError, TrySendError};
use tokio::sync::mpsc::{OwnedPermit, Sender};

use crate::mailbox::outbox::{End, Outbox};
use crate::mailbox::{ConnEvent, EngineHandle, ToEngine};
use crate::transport::wire::Wire;

/// How long a connection the broker closes may take to write what is left and shut down.
const CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Rounds of reading and writing in one poll before the task lets others run.
const ROUNDS_PER_POLL: u32 = 32;

type Registering = Pin<Box<dyn Future<Output = Option<ConnId>> + Send>>;

/// Waiting for room in the broker task's queue.
type Room = Pin<Box<dyn Future<Output = Result<OwnedPermit<ToEngine>, SendError<()>>> + Send>>;

/// A connection's task: serves `wire` until the broker or the client ends the connection.
pub struct ConnectionTask<W> {
    wire: W,
    outbox: Arc<Outbox>,
    /// Taken from the outbox, not yet written.
    out: VecDeque<Bytes>,
    /// Something was written since the last flush.
    unflushed: bool,
    to_broker: Sender<ToEngine>,
    phase: Phase,
    /// The listener's connection permit, held until the connection ends (given back before
    /// the broker task hears of it, so that a client that saw the broker count the
    /// connection gone finds its slot free).
    permit: Option<OwnedSemaphorePermit>,
}

enum Phase {
    /// Registering with the broker task.
    Registering(Registering),
    /// Reading and writing. While the broker's queue is full, bytes read are held, with the
    /// wait for room, and no more are read.
    Serving(ConnId, Option<Box<(Bytes, Room)>>),
    /// The broker closed the connection: what it wrote last (a DISCONNECT, say) goes out,
    /// within a bound.
    Closing(ConnId, Pin<Box<tokio::time::Sleep>>),
    /// Telling the broker task the connection is gone, once its queue has room.
    Ending(Pin<Box<dyn Future<Output = ()> + Send>>),
    Ended,
}

/// Why serving stopped.
enum Stop {
    /// The client went away, or the broker dropped the connection: end now.
    Now,
    /// The broker closed it: write what is queued, then end.
    Close,
}

impl<W: Wire> ConnectionTask<W> {
    pub fn new(
        wire: W,
        info: ConnInfo,
        engine: &EngineHandle,
        permit: OwnedSemaphorePermit,
    ) -> Self {
        let outbox = Outbox::new();
        Self {
            wire,
            phase: Phase::Registering(Box::pin(engine.accept(info, outbox.clone()))),
            outbox,
            out: VecDeque::new(),
            unflushed: false,
            to_broker: engine.tx.clone(),
            permit: Some(permit),
        }
    }

    /// Read, write and hand over until nothing more can be done now, or serving stops.
    fn poll_serve(
        &mut self,
        cx: &mut Context<'_>,
        conn: ConnId,
        held: &mut Option<Box<(Bytes, Room)>>,
    ) -> Poll<Stop> {
        for _ in 0..ROUNDS_PER_POLL {
            let mut busy = false;
            if self.outbox.poll_changed(cx).is_ready() {
                // Busy: another round registers the waker again.
                busy = true;
                match self.outbox.take(&mut self.out) {
                    Some(End::Kill) => return Poll::Ready(Stop::Now),
                    Some(End::Close) => return Poll::Ready(Stop::Close),
                    None => {}
                }
            }
            if !self.out.is_empty() || self.unflushed {
                match self.wire.poll_write_some(cx, &mut self.out) {
                    Poll::Ready(Ok(0)) => self.unflushed = false,
                    Poll::Ready(Ok(n)) => {
                        self.outbox.written(n);
                        self.unflushed = true;
                        busy = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Stop::Now),
                    Poll::Pending => {}
                }
            }
            if let Some((_, room)) = held.as_deref_mut() {
                match room.as_mut().poll(cx) {
                    Poll::Ready(Ok(permit)) => {
                        let (data, _) = *held.take().expect("held above");
                        permit.send(ToEngine::Conn(ConnEvent::Bytes { conn, data }));
                        busy = true;
                    }
                    Poll::Ready(Err(_)) => return Poll::Ready(Stop::Now),
                    Poll::Pending => {}
                }
            }
            // Otherwise the outbox wakes the task when reading may go on.
            if held.is_none() && self.outbox.may_read() {
                match self.wire.poll_next(cx) {
                    Poll::Ready(Some(data)) => {
                        self.outbox.handed(data.len());
                        match self
                            .to_broker
                            .try_send(ToEngine::Conn(ConnEvent::Bytes { conn, data }))
                        {
                            Ok(()) => {}
                            Err(TrySendError::Full(ToEngine::Conn(ConnEvent::Bytes {
                                data,
                                ..
                            }))) => {
                                let room: Room = Box::pin(self.to_broker.clone().reserve_owned());
                                *held = Some(Box::new((data, room)));
                            }
                            Err(_) => return Poll::Ready(Stop::Now),
                        }
                        busy = true;
                    }
                    Poll::Ready(None) => return Poll::Ready(Stop::Now),
                    Poll::Pending => {}
                }
            }
            if !busy {
                return Poll::Pending;
            }
        }
        // Still busy: let the worker's other tasks run, and come back.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    /// Write everything taken from the outbox, then shut the writing side.
    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        loop {
            match ready!(self.wire.poll_write_some(cx, &mut self.out)) {
                Ok(0) => break,
                Ok(n) => self.outbox.written(n),
                Err(_) => return Poll::Ready(()),
            }
        }
        let _ = ready!(self.wire.poll_shutdown(cx));
        Poll::Ready(())
    }

    /// Tell the broker task the connection is gone: now if its queue has room, else once it
    /// has.
    fn end(&mut self, conn: ConnId) {
        self.permit = None;
        self.phase = match self
            .to_broker
            .try_send(ToEngine::Conn(ConnEvent::Closed { conn }))
        {
            Ok(()) | Err(TrySendError::Closed(_)) => Phase::Ended,
            Err(TrySendError::Full(_)) => {
                let to_broker = self.to_broker.clone();
                Phase::Ending(Box::pin(async move {
                    let _ = to_broker
                        .send(ToEngine::Conn(ConnEvent::Closed { conn }))
                        .await;
                }))
            }
        };
    }
}

impl<W: Wire> Future for ConnectionTask<W> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        loop {
            match &mut this.phase {
                Phase::Registering(registering) => match ready!(registering.as_mut().poll(cx)) {
                    Some(conn) => this.phase = Phase::Serving(conn, None),
                    None => this.phase = Phase::Ended,
                },
                Phase::Serving(conn, held) => {
                    let conn = *conn;
                    let mut held = held.take();
                    let stop = this.poll_serve(cx, conn, &mut held);
                    match stop {
                        Poll::Pending => {
                            this.phase = Phase::Serving(conn, held);
                            return Poll::Pending;
                        }
                        Poll::Ready(Stop::Now) => {
                            // Bytes still held are dropped first: their wait may hold the
                            // queue's last place.
                            drop(held);
                            this.end(conn);
                        }
                        Poll::Ready(Stop::Close) => {
                            let deadline = Box::pin(tokio::time::sleep(CLOSE_TIMEOUT));
                            this.phase = Phase::Closing(conn, deadline);
                        }
                    }
                }
                Phase::Closing(conn, deadline) => {
                    let conn = *conn;
                    let timed_out = deadline.as_mut().poll(cx).is_ready();
                    if !timed_out {
                        ready!(this.poll_close(cx));
                    }
                    this.end(conn);
                }
                Phase::Ending(ending) => {
                    ready!(ending.as_mut().poll(cx));
                    this.phase = Phase::Ended;
                }
                Phase::Ended => return Poll::Ready(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::{Semaphore, mpsc, oneshot};

    use super::*;
    use crate::transport::wire::StreamWire;

    const DEADLINE: Duration = Duration::from_secs(10);
    const CONN: ConnId = ConnId(7);

    /// A connection task on a loopback socket, with a broker queue of `capacity` that the
    /// test drains itself.
    struct Harness {
        client: TcpStream,
        to_broker: mpsc::Sender<ToEngine>,
        broker: mpsc::Receiver<ToEngine>,
    }

    async fn harness(capacity: usize) -> (Harness, ConnectionTask<StreamWire<TcpStream>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (socket, _) = listener.accept().await.unwrap();
        let (to_broker, broker) = mpsc::channel(capacity);
        let engine = EngineHandle {
            tx: to_broker.clone(),
            counters: Default::default(),
        };
        let permit = Arc::new(Semaphore::new(1)).try_acquire_owned().unwrap();
        let task = ConnectionTask::new(
            StreamWire::new(socket),
            ConnInfo::default(),
            &engine,
            permit,
        );
        let h = Harness {
            client,
            to_broker,
            broker,
        };
        (h, task)
    }

    /// Run the task and answer its registration; the connection's outbox.
    async fn spawn_registered(
        h: &mut Harness,
        task: ConnectionTask<StreamWire<TcpStream>>,
    ) -> (Arc<Outbox>, tokio::task::JoinHandle<()>) {
        let task = tokio::spawn(task);
        let outbox = match next(&mut h.broker).await {
            ToEngine::Conn(ConnEvent::Accept { outbox, reply, .. }) => {
                reply.send(CONN).unwrap();
                outbox
            }
            other => panic!("expected the registration, got {other:?}"),
        };
        (outbox, task)
    }

    async fn next(broker: &mut mpsc::Receiver<ToEngine>) -> ToEngine {
        tokio::time::timeout(DEADLINE, broker.recv())
            .await
            .expect("a message for the broker within the deadline")
            .expect("the queue is open")
    }

    async fn expect_closed(
        broker: &mut mpsc::Receiver<ToEngine>,
        task: tokio::task::JoinHandle<()>,
    ) {
        match next(broker).await {
            ToEngine::Conn(ConnEvent::Closed { conn }) => assert_eq!(conn, CONN),
            other => panic!("expected the end of the connection, got {other:?}"),
        }
        tokio::time::timeout(DEADLINE, task)
            .await
            .expect("the task ends")
            .unwrap();
    }

    /// Poll the task once.
    async fn poll_once(task: &mut ConnectionTask<StreamWire<TcpStream>>) -> Poll<()> {
        std::future::poll_fn(|cx| Poll::Ready(Pin::new(&mut *task).poll(cx))).await
    }

    #[tokio::test]
    async fn what_is_read_while_the_broker_queue_is_full_waits_and_arrives_in_order() {
        let (mut h, task) = harness(1).await;
        let (outbox, task) = spawn_registered(&mut h, task).await;
        // Far more than one read: the queue of one fills at once, and the task must hold
        // what it read and stop reading until there is room.
        let sent: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let mut client = h.client;
        let writer = tokio::spawn({
            let sent = sent.clone();
            async move {
                client.write_all(&sent).await.unwrap();
                client
            }
        });
        let mut received = Vec::with_capacity(sent.len());
        while received.len() < sent.len() {
            match next(&mut h.broker).await {
                ToEngine::Conn(ConnEvent::Bytes { conn, data }) => {
                    assert_eq!(conn, CONN);
                    received.extend_from_slice(&data);
                    // As the broker task does once the broker has the bytes.
                    outbox.fed(data.len());
                }
                other => panic!("expected bytes, got {other:?}"),
            }
        }
        assert!(received == sent, "the bytes arrive whole and in order");
        drop(writer.await.unwrap());
        expect_closed(&mut h.broker, task).await;
    }

    /// With room in the broker's queue but the broker task behind, the task stops reading
    /// once it is `UNFED_MAX` ahead, and goes on as the bytes are fed; a pause stops it
    /// until the resume.
    #[tokio::test]
    async fn a_task_reads_no_further_ahead_of_the_broker_than_its_bound() {
        use crate::mailbox::outbox::UNFED_MAX;
        let (mut h, task) = harness(1024).await;
        let (outbox, task) = spawn_registered(&mut h, task).await;
        let sent: Vec<u8> = (0..4 * UNFED_MAX as u32).map(|i| (i % 251) as u8).collect();
        let mut client = h.client;
        let writer = tokio::spawn({
            let sent = sent.clone();
            async move {
                client.write_all(&sent).await.unwrap();
                client
            }
        });
        let mut received = Vec::new();
        let mut unfed = Vec::new();
        // Take what the task hands over without feeding it, until it stops.
        while received.len() < UNFED_MAX {
            let ToEngine::Conn(ConnEvent::Bytes { data, .. }) = next(&mut h.broker).await else {
                panic!("expected bytes");
            };
            received.extend_from_slice(&data);
            unfed.push(data.len());
        }
        for _ in 0..ROUNDS_PER_POLL {
            tokio::task::yield_now().await;
        }
        assert!(
            h.broker.is_empty(),
            "nothing more while the broker is behind"
        );
        assert!(!outbox.may_read());
        // Fed: it reads on, to the end.
        for n in unfed {
            outbox.fed(n);
        }
        outbox.pause_reading();
        outbox.resume_reading();
        while received.len() < sent.len() {
            let ToEngine::Conn(ConnEvent::Bytes { data, .. }) = next(&mut h.broker).await else {
                panic!("expected bytes");
            };
            received.extend_from_slice(&data);
            outbox.fed(data.len());
        }
        assert!(received == sent, "the bytes arrive whole and in order");
        drop(writer.await.unwrap());
        expect_closed(&mut h.broker, task).await;
    }

    #[tokio::test]
    async fn a_close_writes_what_the_broker_queued_then_ends() {
        let (mut h, task) = harness(8).await;
        let (outbox, task) = spawn_registered(&mut h, task).await;
        outbox.push(Bytes::from_static(b"last "));
        outbox.push(Bytes::from_static(b"words"));
        outbox.close();
        let mut got = Vec::new();
        tokio::time::timeout(DEADLINE, h.client.read_to_end(&mut got))
            .await
            .expect("the connection ends")
            .unwrap();
        assert_eq!(got, b"last words");
        assert_eq!(outbox.queued(), 0, "what was written is accounted for");
        expect_closed(&mut h.broker, task).await;
    }

    #[tokio::test]
    async fn a_kill_ends_the_connection_without_writing() {
        let (mut h, task) = harness(8).await;
        let (outbox, task) = spawn_registered(&mut h, task).await;
        outbox.push(Bytes::from_static(b"dropped"));
        outbox.kill();
        // The broker task lets go of the outbox it kills; the socket closes with the task.
        drop(outbox);
        let mut got = Vec::new();
        let _ = tokio::time::timeout(DEADLINE, h.client.read_to_end(&mut got))
            .await
            .expect("the connection ends");
        assert!(got.is_empty(), "nothing queued is written: {got:?}");
        expect_closed(&mut h.broker, task).await;
    }

    #[tokio::test]
    async fn the_end_is_told_once_the_broker_queue_has_room() {
        let (mut h, mut task) = harness(1).await;
        // Registered by hand, so that the test can fill the queue before the end.
        assert!(poll_once(&mut task).await.is_pending());
        match next(&mut h.broker).await {
            ToEngine::Conn(ConnEvent::Accept { reply, .. }) => reply.send(CONN).unwrap(),
            other => panic!("expected the registration, got {other:?}"),
        }
        assert!(poll_once(&mut task).await.is_pending());
        assert!(matches!(task.phase, Phase::Serving(CONN, None)));
        let (stats, _) = oneshot::channel();
        h.to_broker
            .try_send(ToEngine::Admin(crate::mailbox::AdminRequest::Stats(stats)))
            .unwrap();

        task.end(CONN);
        assert!(matches!(task.phase, Phase::Ending(_)), "the queue is full");
        assert!(poll_once(&mut task).await.is_pending());
        assert!(matches!(
            next(&mut h.broker).await,
            ToEngine::Admin(crate::mailbox::AdminRequest::Stats(_))
        ));
        let ended = tokio::time::timeout(DEADLINE, &mut task).await;
        assert!(ended.is_ok(), "the task ends once there is room");
        assert!(matches!(
            next(&mut h.broker).await,
            ToEngine::Conn(ConnEvent::Closed { conn: CONN })
        ));
    }
}
