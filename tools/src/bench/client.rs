//! One benchmark client: a rumqttc event loop in one task (plus a producer task for
//! publishers), counting what it sends and receives.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use hdrhistogram::Histogram;
use rumqttc::{
    AsyncClient, ConnectReturnCode, Event, EventLoop, MqttOptions, Outgoing, Packet, QoS,
    SubscribeReasonCode, TlsConfiguration, Transport,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};

use super::Common;

/// Bytes at the start of every payload: send time (ns since the run's epoch), publisher index,
/// sequence number; all little-endian.
pub const HEADER: usize = 8 + 4 + 8;

/// How to reach the broker.
#[derive(Clone)]
pub struct Target {
    host: String,
    port: u16,
    ws: Option<String>,
    tls: Option<TlsConfiguration>,
    credentials: Option<(String, String)>,
    keep_alive: Duration,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("ws", &self.ws)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Target {
    pub fn new(c: &Common) -> anyhow::Result<Self> {
        let tls = if c.tls {
            Some(match &c.ca {
                Some(path) => TlsConfiguration::Simple {
                    ca: std::fs::read(path)
                        .with_context(|| format!("cannot read --ca {}", path.display()))?,
                    alpn: None,
                    client_auth: None,
                },
                None => TlsConfiguration::default(),
            })
        } else {
            None
        };
        if let Some(url) = &c.ws {
            let want = if c.tls { "wss://" } else { "ws://" };
            anyhow::ensure!(
                url.starts_with(want),
                "--ws {url}: expected a {want} URL{}",
                if c.tls { " with --tls" } else { "" }
            );
        }
        anyhow::ensure!(
            c.password.is_none() || c.username.is_some(),
            "--password needs --username"
        );
        Ok(Self {
            host: c.host.clone(),
            port: c.port,
            ws: c.ws.clone(),
            tls,
            credentials: c
                .username
                .clone()
                .map(|u| (u, c.password.clone().unwrap_or_default())),
            keep_alive: Duration::from_secs(c.keep_alive.max(5)),
        })
    }

    /// Where subscribers connect when it is not where publishers do (`--sub-port`,
    /// `--sub-ws`).
    pub fn subscribers(&self, c: &Common) -> anyhow::Result<Option<Self>> {
        let mut t = self.clone();
        match (c.sub_port, &c.sub_ws) {
            (None, None) => return Ok(None),
            (Some(port), _) => {
                t.port = port;
                t.ws = None;
            }
            (None, Some(url)) => {
                let want = if c.tls { "wss://" } else { "ws://" };
                anyhow::ensure!(
                    url.starts_with(want),
                    "--sub-ws {url}: expected a {want} URL"
                );
                t.ws = Some(url.clone());
            }
        }
        Ok(Some(t))
    }

    pub fn describe(&self) -> String {
        match (&self.ws, &self.tls) {
            (Some(url), _) => url.clone(),
            (None, Some(_)) => format!("mqtts://{}:{}", self.host, self.port),
            (None, None) => format!("mqtt://{}:{}", self.host, self.port),
        }
    }

    fn options(&self, client_id: &str, inflight: u16) -> MqttOptions {
        let mut o = match &self.ws {
            // rumqttc takes the whole URL as the host of a WebSocket transport.
            Some(url) => MqttOptions::new(client_id, url.clone(), self.port),
            None => MqttOptions::new(client_id, self.host.clone(), self.port),
        };
        o.set_transport(match (&self.ws, &self.tls) {
            (None, None) => Transport::Tcp,
            (None, Some(t)) => Transport::Tls(t.clone()),
            (Some(_), None) => Transport::Ws,
            (Some(_), Some(t)) => Transport::Wss(t.clone()),
        });
        o.set_keep_alive(self.keep_alive)
            .set_clean_session(true)
            .set_inflight(inflight.max(1))
            .set_max_packet_size(1 << 20, 1 << 20);
        if let Some((u, p)) = &self.credentials {
            o.set_credentials(u.clone(), p.clone());
        }
        o
    }
}

/// Paces connection attempts: at most `concurrency` at once, started at `rate` per second.
#[derive(Debug)]
pub struct Gate {
    sem: Arc<Semaphore>,
    rate: f64,
    t0: Instant,
}

impl Gate {
    pub fn new(concurrency: usize, rate: f64) -> Self {
        Self {
            sem: Arc::new(Semaphore::new(concurrency.max(1))),
            rate,
            t0: Instant::now(),
        }
    }

    async fn enter(&self, index: usize) -> OwnedSemaphorePermit {
        if self.rate > 0.0 {
            #[allow(clippy::cast_precision_loss)]
            let at = self.t0 + Duration::from_secs_f64(index as f64 / self.rate);
            tokio::time::sleep_until(at.into()).await;
        }
        self.sem
            .clone()
            .acquire_owned()
            .await
            .expect("the gate's semaphore is never closed")
    }
}

/// Counters shared by every client of a run, read by the progress bar and the controller.
#[derive(Debug)]
pub struct Shared {
    pub epoch: Instant,
    pub sent: AtomicU64,
    pub acked: AtomicU64,
    pub received: AtomicU64,
    /// ns since `epoch` of the last PUBLISH written / received.
    pub last_sent_ns: AtomicU64,
    pub last_recv_ns: AtomicU64,
    pub publishers_done: AtomicUsize,
}

impl Shared {
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            sent: AtomicU64::new(0),
            acked: AtomicU64::new(0),
            received: AtomicU64::new(0),
            last_sent_ns: AtomicU64::new(0),
            last_recv_ns: AtomicU64::new(0),
            publishers_done: AtomicUsize::new(0),
        }
    }

    pub fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// What every client of a run shares.
#[derive(Debug)]
pub struct RunCfg {
    pub target: Target,
    /// Where subscribers that do not publish connect, if elsewhere.
    pub sub_target: Option<Target>,
    pub gate: Gate,
    pub qos: QoS,
    pub size: usize,
    /// Messages per second per publisher; 0 = as fast as possible.
    pub rate: f64,
    pub count: u64,
    pub duration: Duration,
    pub inflight: u16,
    pub retain: bool,
    pub publishers: usize,
    /// Bound on connecting and subscribing.
    pub connect_timeout: Duration,
    pub shared: Arc<Shared>,
    pub start: watch::Receiver<bool>,
    pub stop: watch::Receiver<bool>,
}

/// One client's part in a run.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    pub index: usize,
    pub client_id: String,
    pub subscribe: Option<String>,
    /// Topic and publisher index.
    pub publish: Option<(String, u32)>,
    /// The one publisher a subscriber hears (`None`: every publisher of the run).
    pub hears: Option<u32>,
}

/// Sent to the controller once a client is connected (and subscribed), or failed.
#[derive(Debug)]
pub enum Ready {
    Up,
    Failed(String),
}

/// What one client measured.
#[derive(Debug, Default)]
pub struct ClientResult {
    pub client_id: String,
    /// Publisher index, if this client published.
    pub publisher: Option<u32>,
    /// Whether this client subscribed, and to which publishers (see [`ClientSpec::hears`]).
    pub subscriber: bool,
    pub hears: Option<u32>,
    pub connect_ns: Option<u64>,
    pub suback_ns: Option<u64>,
    pub error: Option<String>,
    pub sent: u64,
    pub acked: u64,
    pub tally: Tally,
}

/// Deliveries seen by one subscriber.
#[derive(Debug, Default)]
pub struct Tally {
    pub received: u64,
    pub unique: u64,
    pub duplicates: u64,
    /// Payloads that are not from this run's publishers.
    pub foreign: u64,
    /// Per publisher, a bitset of the sequence numbers seen.
    seen: Vec<Vec<u64>>,
    pub latency_ns: Option<Histogram<u64>>,
}

/// Latencies up to a minute, 3 significant digits.
pub fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("valid histogram bounds")
}

impl Tally {
    fn record(&mut self, payload: &[u8], now_ns: u64, publishers: usize) {
        self.received += 1;
        let (Some(ts), Some(pubi), Some(seq)) = (
            payload.get(0..8),
            payload.get(8..12),
            payload.get(12..HEADER),
        ) else {
            self.foreign += 1;
            return;
        };
        let ts = u64::from_le_bytes(ts.try_into().expect("8 bytes"));
        let pubi = u32::from_le_bytes(pubi.try_into().expect("4 bytes")) as usize;
        let seq = u64::from_le_bytes(seq.try_into().expect("8 bytes"));
        if pubi >= publishers || ts > now_ns {
            self.foreign += 1;
            return;
        }
        if self.seen.len() < publishers {
            self.seen.resize_with(publishers, Vec::new);
        }
        let bits = &mut self.seen[pubi];
        let (word, bit) = (usize::try_from(seq / 64).unwrap_or(usize::MAX), seq % 64);
        if word >= bits.len() {
            if word > (1 << 28) {
                self.foreign += 1;
                return;
            }
            bits.resize((word + 1).next_power_of_two(), 0);
        }
        if bits[word] & (1 << bit) != 0 {
            self.duplicates += 1;
            return;
        }
        bits[word] |= 1 << bit;
        self.unique += 1;
        self.latency_ns
            .get_or_insert_with(new_histogram)
            .saturating_record((now_ns - ts).max(1));
    }

    /// Sequence numbers below `sent` not seen from `publisher`.
    pub fn missing(&self, publisher: usize, sent: u64) -> impl Iterator<Item = u64> + '_ {
        let bits = self.seen.get(publisher).map_or(&[][..], Vec::as_slice);
        (0..sent).filter(move |&seq| {
            let word = usize::try_from(seq / 64).unwrap_or(usize::MAX);
            bits.get(word).is_none_or(|w| w & (1 << (seq % 64)) == 0)
        })
    }

    pub fn merge(&mut self, other: &Tally) {
        self.received += other.received;
        self.unique += other.unique;
        self.duplicates += other.duplicates;
        self.foreign += other.foreign;
        if let Some(h) = &other.latency_ns {
            let _ = self.latency_ns.get_or_insert_with(new_histogram).add(h);
        }
    }
}

fn to_qos(q: u8) -> QoS {
    match q {
        0 => QoS::AtMostOnce,
        1 => QoS::AtLeastOnce,
        _ => QoS::ExactlyOnce,
    }
}

pub fn qos(q: u8) -> QoS {
    to_qos(q)
}

/// Poll until CONNACK (or SUBACK, by `want`), within `deadline`.
async fn poll_until(
    el: &mut EventLoop,
    deadline: Instant,
    what: &str,
    mut want: impl FnMut(&Packet) -> Option<Result<(), String>>,
) -> Result<(), String> {
    loop {
        match tokio::time::timeout_at(deadline.into(), el.poll()).await {
            Err(_) => return Err(format!("no {what} in time")),
            Ok(Err(e)) => return Err(format!("{what}: {e}")),
            Ok(Ok(Event::Incoming(p))) => {
                if let Some(r) = want(&p) {
                    return r;
                }
            }
            Ok(Ok(Event::Outgoing(_))) => {}
        }
    }
}

/// Run one client from connecting to the end of the run.
pub async fn run_client(
    spec: ClientSpec,
    cfg: Arc<RunCfg>,
    ready: mpsc::UnboundedSender<Ready>,
) -> ClientResult {
    let mut result = ClientResult {
        client_id: spec.client_id.clone(),
        publisher: spec.publish.as_ref().map(|(_, i)| *i),
        subscriber: spec.subscribe.is_some(),
        hears: spec.hears,
        ..ClientResult::default()
    };
    let shared = &cfg.shared;
    let permit = cfg.gate.enter(spec.index).await;
    let t = Instant::now();
    let deadline = t + cfg.connect_timeout;
    let target = match &cfg.sub_target {
        Some(t) if spec.publish.is_none() => t,
        _ => &cfg.target,
    };
    let (client, mut el) = AsyncClient::new(target.options(&spec.client_id, cfg.inflight), 16);
    let mut net = el.network_options();
    // No Nagle delay on small PUBLISHes; a slow broker gets the run's bound to accept.
    net.set_tcp_nodelay(true);
    net.set_connection_timeout(cfg.connect_timeout.as_secs().max(1));
    el.set_network_options(net);
    let connected = poll_until(&mut el, deadline, "CONNACK", |p| match p {
        Packet::ConnAck(a) if a.code == ConnectReturnCode::Success => Some(Ok(())),
        Packet::ConnAck(a) => Some(Err(format!("CONNACK refused: {:?}", a.code))),
        _ => None,
    })
    .await;
    if let Err(e) = connected {
        let _ = ready.send(Ready::Failed(e.clone()));
        result.error = Some(e);
        return result;
    }
    result.connect_ns = Some(elapsed_ns(t));
    if let Some(filter) = &spec.subscribe {
        let subscribed = match client.try_subscribe(filter.clone(), cfg.qos) {
            Err(e) => Err(format!("SUBSCRIBE: {e}")),
            Ok(()) => {
                poll_until(&mut el, deadline, "SUBACK", |p| match p {
                    Packet::SubAck(a) => Some(
                        if a.return_codes
                            .iter()
                            .all(|c| !matches!(c, SubscribeReasonCode::Failure))
                        {
                            Ok(())
                        } else {
                            Err(format!("SUBSCRIBE {filter} refused"))
                        },
                    ),
                    _ => None,
                })
                .await
            }
        };
        if let Err(e) = subscribed {
            let _ = ready.send(Ready::Failed(e.clone()));
            result.error = Some(e);
            return result;
        }
        result.suback_ns = Some(elapsed_ns(t));
    }
    drop(permit);
    let _ = ready.send(Ready::Up);

    let mut start = cfg.start.clone();
    let mut stop = cfg.stop.clone();
    let mut started = false;
    let mut producer: Option<tokio::task::JoinHandle<u64>> = None;
    let mut requested: Option<u64> = None;
    let mut done = spec.publish.is_none();
    let count_qos = cfg.qos != QoS::AtMostOnce;
    // One loop from SUBACK to the end: a subscriber may see its first delivery before it sees
    // the start (the publishers see it first), and that delivery counts like any other.
    'run: loop {
        // The poll future lives until it yields an event: cancelling rumqttc's poll part-way
        // through could lose a packet it has read or is writing, so only the end of the run
        // may drop it.
        let ev = {
            let poll = el.poll();
            tokio::pin!(poll);
            loop {
                tokio::select! {
                    biased;
                    _ = stop.wait_for(|s| *s) => break 'run,
                    _ = start.wait_for(|s| *s), if !started => {
                        started = true;
                        producer = spec.publish.clone().map(|(topic, index)| {
                            tokio::spawn(produce(client.clone(), topic, index, cfg.clone()))
                        });
                    }
                    r = async { producer.as_mut().expect("guarded").await }, if requested.is_none() && producer.is_some() => {
                        requested = Some(r.unwrap_or(0));
                        if check_done(&mut done, requested, &result, count_qos) {
                            shared.publishers_done.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    ev = &mut poll => break ev,
                }
            }
        };
        match ev {
            Ok(Event::Incoming(Packet::Publish(p))) => {
                let now = shared.now_ns();
                result.tally.record(&p.payload, now, cfg.publishers);
                shared.received.fetch_add(1, Ordering::Relaxed);
                shared.last_recv_ns.fetch_max(now, Ordering::Relaxed);
            }
            Ok(Event::Outgoing(Outgoing::Publish(_))) => {
                result.sent += 1;
                shared.sent.fetch_add(1, Ordering::Relaxed);
                shared
                    .last_sent_ns
                    .fetch_max(shared.now_ns(), Ordering::Relaxed);
            }
            Ok(Event::Incoming(Packet::PubAck(_) | Packet::PubComp(_))) => {
                result.acked += 1;
                shared.acked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                result.error = Some(e.to_string());
                break;
            }
        }
        if check_done(&mut done, requested, &result, count_qos) {
            shared.publishers_done.fetch_add(1, Ordering::Relaxed);
        }
    }
    if !done {
        shared.publishers_done.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(p) = producer {
        p.abort();
    }
    result
}

/// Whether a publisher just finished: every queued PUBLISH written (and acknowledged).
fn check_done(done: &mut bool, requested: Option<u64>, r: &ClientResult, count_acks: bool) -> bool {
    if *done {
        return false;
    }
    let Some(n) = requested else {
        return false;
    };
    *done = r.sent >= n && (!count_acks || r.acked >= n);
    *done
}

/// Queue `count` PUBLISHes (or fewer if the run's duration ends first) at the run's rate.
async fn produce(client: AsyncClient, topic: String, index: u32, cfg: Arc<RunCfg>) -> u64 {
    let started = Instant::now();
    let end = started + cfg.duration;
    let interval = (cfg.rate > 0.0).then(|| Duration::from_secs_f64(1.0 / cfg.rate));
    let size = cfg.size.max(HEADER);
    let mut n = 0u64;
    while n < cfg.count {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if let Some(iv) = interval {
            let due = started + iv.mul_f64(n as f64);
            if due >= end {
                break;
            }
            if due > now {
                tokio::time::sleep_until(due.into()).await;
            }
        }
        let mut buf = BytesMut::with_capacity(size);
        buf.put_u64_le(cfg.shared.now_ns());
        buf.put_u32_le(index);
        buf.put_u64_le(n);
        buf.put_bytes(b'x', size - HEADER);
        let payload: Bytes = buf.freeze();
        if client
            .publish_bytes(topic.clone(), cfg.qos, cfg.retain, payload)
            .await
            .is_err()
        {
            break;
        }
        n += 1;
    }
    n
}

fn elapsed_ns(t: Instant) -> u64 {
    u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: Common,
    }

    /// A subscriber may see its first delivery before it sees the run's start: the publishers
    /// see the start first. That delivery must be counted, not lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_delivery_before_the_subscriber_sees_the_start_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let server = meridian_daemon::BrokerBuilder::new()
            .mqtt_addr("127.0.0.1:0".parse().unwrap())
            .ws_addr(None)
            .admin_addr(None)
            .data_dir(dir.path())
            .start()
            .await
            .unwrap();
        let port = server
            .local_addr(meridian_daemon::ListenerKind::Tcp)
            .unwrap()
            .port()
            .to_string();
        let common = Cli::parse_from(["bench", "--port", &port, "--timeout", "10"]).common;
        let (start_tx, start) = watch::channel(false);
        let (stop_tx, stop) = watch::channel(false);
        let shared = Arc::new(Shared::new());
        let cfg = Arc::new(RunCfg {
            target: Target::new(&common).unwrap(),
            sub_target: None,
            gate: Gate::new(1, 0.0),
            qos: QoS::AtLeastOnce,
            size: HEADER,
            rate: 0.0,
            count: 1,
            duration: Duration::from_secs(1),
            inflight: 1,
            retain: false,
            publishers: 1,
            connect_timeout: Duration::from_secs(10),
            shared: shared.clone(),
            start,
            stop,
        });
        let spec = ClientSpec {
            index: 0,
            client_id: "early-sub".to_owned(),
            subscribe: Some("early/0".to_owned()),
            publish: None,
            hears: Some(0),
        };
        let (ready_tx, mut ready) = mpsc::unbounded_channel();
        let task = tokio::spawn(run_client(spec, cfg, ready_tx));
        assert!(matches!(ready.recv().await, Some(Ready::Up)));

        // Publisher 0's message #0, sent while the start has not been given.
        let mut payload = BytesMut::new();
        payload.put_u64_le(shared.now_ns());
        payload.put_u32_le(0);
        payload.put_u64_le(0);
        let mut publisher = server.client().connect().await.unwrap();
        publisher
            .publish(
                "early/0",
                payload.freeze(),
                meridian_daemon::client::QoS::AtLeastOnce,
                false,
            )
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while shared.received.load(Ordering::Relaxed) == 0 {
            assert!(
                Instant::now() < deadline,
                "the subscriber did not count a delivery that came before the start"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }

        let _ = stop_tx.send(true);
        let result = task.await.unwrap();
        drop(start_tx);
        assert_eq!(result.tally.unique, 1);
        assert_eq!(result.tally.missing(0, 1).count(), 0);
        server.shutdown().await.unwrap();
    }
}
