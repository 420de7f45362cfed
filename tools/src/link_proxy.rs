//! A fault-injecting TCP proxy for trying a deployment on one machine: put it between two
//! nodes' p2p ports to give their link one-way latency or a bandwidth, or to cut it (every
//! connection through it dropped, new ones refused) and restore it. `examples/three-regions` and the mesh tests
//! use it; nothing in the broker does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

#[derive(Debug, Default)]
struct Control {
    /// Added to each direction (so the round trip grows by twice this).
    one_way_ms: AtomicU64,
    /// Bytes per second each direction carries (0: as many as the sockets take).
    bytes_per_sec: AtomicU64,
    cut: AtomicBool,
    /// Wakes every connection when a cut starts.
    cut_now: Notify,
    connections: AtomicU64,
}

/// A proxy from a loopback port to `target` on loopback. Stops when dropped.
#[derive(Debug)]
pub struct LinkProxy {
    pub port: u16,
    control: Arc<Control>,
    task: JoinHandle<()>,
}

impl LinkProxy {
    /// Listen on a port the OS picks.
    pub async fn start(target: u16) -> std::io::Result<Self> {
        Self::start_on(0, target).await
    }

    /// Listen on `port` (0: the OS picks) and relay to `target`.
    pub async fn start_on(port: u16, target: u16) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", port)).await?;
        let port = listener.local_addr()?.port();
        let control = Arc::new(Control::default());
        let c = control.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    tokio::task::yield_now().await;
                    continue;
                };
                if c.cut.load(Ordering::SeqCst) {
                    drop(inbound);
                    continue;
                }
                let c = c.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else {
                        return;
                    };
                    c.connections.fetch_add(1, Ordering::SeqCst);
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    let cut = c.cut_now.notified();
                    tokio::select! {
                        () = pipe(ri, wo, c.clone()) => {}
                        () = pipe(ro, wi, c.clone()) => {}
                        () = cut => {}
                    }
                });
            }
        });
        Ok(Self {
            port,
            control,
            task,
        })
    }

    /// Add `ms` of latency in each direction (applies to bytes read from now on).
    pub fn set_one_way_latency(&self, ms: u64) {
        self.control.one_way_ms.store(ms, Ordering::SeqCst);
    }

    /// Carry at most `bytes_per_sec` in each direction (0: no limit), like a thin link: the
    /// sender's socket fills when it sends faster.
    pub fn set_bandwidth(&self, bytes_per_sec: u64) {
        self.control
            .bytes_per_sec
            .store(bytes_per_sec, Ordering::SeqCst);
    }

    /// Drop every connection and refuse new ones until [`LinkProxy::restore`].
    pub fn cut(&self) {
        self.control.cut.store(true, Ordering::SeqCst);
        self.control.cut_now.notify_waiters();
    }

    pub fn restore(&self) {
        self.control.cut.store(false, Ordering::SeqCst);
    }

    /// Connections made through the proxy so far.
    pub fn connections(&self) -> u64 {
        self.control.connections.load(Ordering::SeqCst)
    }
}

impl Drop for LinkProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Copy one direction through a delay line: each chunk is written `one_way_ms` after it was
/// read, in order.
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    control: Arc<Control>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        // When the bandwidth allows the next read.
        let mut next_read = Instant::now();
        loop {
            let rate = control.bytes_per_sec.load(Ordering::SeqCst);
            // Reads of about 20 ms worth of bytes at a limited rate.
            let room = if rate == 0 {
                buf.len()
            } else {
                usize::try_from(rate / 50).map_or(buf.len(), |r| r.clamp(512, buf.len()))
            };
            if rate > 0 {
                tokio::time::sleep_until(next_read).await;
            }
            match from.read(&mut buf[..room]).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if rate > 0 {
                        let took = Duration::from_secs_f64(n as f64 / rate as f64);
                        next_read = next_read.max(Instant::now()) + took;
                    }
                    let delay = Duration::from_millis(control.one_way_ms.load(Ordering::SeqCst));
                    if tx
                        .send((Instant::now() + delay, buf[..n].to_vec()))
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
    };
    // The reader ending (EOF) lets the writer drain what is in the delay line, then stop.
    tokio::join!(reader, writer);
}
