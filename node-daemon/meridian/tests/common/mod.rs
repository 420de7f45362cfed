//! The real `meridian` binary as a child process, and rumqttc helpers.

#![allow(dead_code)]

pub mod forger;
pub mod leaf;
pub mod mesh;

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const DEADLINE: Duration = Duration::from_secs(20);

/// A password hash with tiny Argon2 parameters, for password files made in tests: the daemon
/// verifies with the parameters in the PHC string, and default-cost hashing is slow in debug
/// builds.
pub fn cheap_hash(password: &str) -> String {
    use argon2::password_hash::PasswordHasher;
    let params = argon2::Params::new(64, 1, 1, None).unwrap();
    argon2::Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
        .hash_password(password.as_bytes())
        .unwrap()
        .to_string()
}

/// A free loopback port (bound then released; the daemon binds it right after).
///
/// Taken from outside the kernel's ephemeral range, which outgoing connections draw their local
/// ports from: a port from that range, once released, could become the local port of any
/// test's client connection before the daemon binds it, or while a restarted daemon is down
/// (its config keeps the port). Each test process walks the ports from its own starting point.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| {
            let mut it = r.split_whitespace().map(|p| p.parse::<u32>().ok());
            Some((it.next()??, it.next()??))
        })
        .unwrap_or((32_768, 60_999));
    // Up to 12,000 ports just below the range where there is room for 2,048, else above it.
    let below = low.saturating_sub(12_000).max(1_024);
    let (first, span) = if low >= below + 2_048 {
        (below, low - below)
    } else {
        (high + 1, 65_535u32.saturating_sub(high).max(1))
    };
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..span {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let Ok(port) = u16::try_from(first + start.wrapping_add(i) % span) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port outside the ephemeral range {low}-{high}");
}

/// A daemon child process with its own data directory and ports. Killed on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub data_dir: PathBuf,
    pub mqtt: u16,
    pub ws: u16,
    pub admin: u16,
    pub config: Option<PathBuf>,
    pub log: PathBuf,
    /// More arguments for `meridian run`.
    pub args: Vec<String>,
    /// A program (and its arguments) the binary runs under, as `prlimit --nofile=N:M`.
    pub wrapper: Vec<String>,
    _tmp: Option<tempfile::TempDir>,
}

impl Daemon {
    /// Start on fresh ports with a fresh data directory.
    pub fn start() -> Self {
        Self::start_with_config(None)
    }

    /// Start with a config file body (written into the temp dir).
    pub fn start_with_config(config: Option<&str>) -> Self {
        Self::start_with(config, Vec::new())
    }

    /// Start with a config file body and more `meridian run` arguments.
    pub fn start_with(config: Option<&str>, args: Vec<String>) -> Self {
        Self::start_in(tempfile::tempdir().expect("temp dir"), config, args)
    }

    /// Start under `wrapper` (a program that runs the binary, as `prlimit --nofile=N:M`).
    pub fn start_under(wrapper: &[&str], config: Option<&str>) -> Self {
        Self::start_in_under(
            tempfile::tempdir().expect("temp dir"),
            config,
            Vec::new(),
            wrapper.iter().map(|s| (*s).to_owned()).collect(),
        )
    }

    /// Start in `tmp` (the data directory is `tmp/data`, which may exist already).
    pub fn start_in(tmp: tempfile::TempDir, config: Option<&str>, args: Vec<String>) -> Self {
        Self::start_in_under(tmp, config, args, Vec::new())
    }

    fn start_in_under(
        tmp: tempfile::TempDir,
        config: Option<&str>,
        args: Vec<String>,
        wrapper: Vec<String>,
    ) -> Self {
        let config = config.map(|body| {
            let p = tmp.path().join("meridian.toml");
            std::fs::write(&p, body).expect("write config");
            p
        });
        let mut d = Self {
            child: None,
            data_dir: tmp.path().join("data"),
            mqtt: 0,
            ws: 0,
            admin: 0,
            config,
            log: tmp.path().join("daemon.log"),
            args,
            wrapper,
            _tmp: Some(tmp),
        };
        d.spawn_and_wait();
        d
    }

    pub fn dir(&self) -> &Path {
        self.data_dir.parent().expect("data dir has a parent")
    }

    pub fn mqtt_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.mqtt))
    }

    /// Spawn the binary (new ports unless already chosen) and wait until MQTT accepts.
    fn spawn_and_wait(&mut self) {
        // A port picked by free_port can be taken by someone else before the daemon binds
        // it; try a few times with new ports.
        for attempt in 0..5 {
            if self.mqtt == 0 || attempt > 0 {
                self.mqtt = free_port();
                self.ws = free_port();
                self.admin = free_port();
            }
            self.spawn();
            if self.wait_ready() {
                return;
            }
            self.kill9();
        }
        panic!("daemon did not become ready; log:\n{}", self.log_text());
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let bin = env!("CARGO_BIN_EXE_meridian");
        let mut cmd = match self.wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        cmd.arg("run");
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        cmd.arg("--mqtt")
            .arg(format!("127.0.0.1:{}", self.mqtt))
            .arg("--ws")
            .arg(format!("127.0.0.1:{}", self.ws))
            .arg("--admin")
            .arg(format!("127.0.0.1:{}", self.admin))
            .arg("--data-dir")
            .arg(&self.data_dir)
            .args(&self.args)
            .env("RUST_LOG", "meridian_daemon=debug,info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log);
        self.child = Some(cmd.spawn().expect("spawn meridian"));
    }

    /// Wait until the MQTT port accepts connections or the process exits.
    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + DEADLINE;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(_)) = child.try_wait()
            {
                return false;
            }
            // The daemon binds MQTT/TCP last, but check every port anyway.
            let up = |port: u16| {
                TcpStream::connect_timeout(
                    &SocketAddr::from(([127, 0, 0, 1], port)),
                    Duration::from_millis(200),
                )
                .is_ok()
            };
            if up(self.mqtt) && up(self.ws) && up(self.admin) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Restart on the same ports and data directory (after a stop or a kill).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "stop or kill the daemon first");
        for _ in 0..50 {
            self.spawn();
            if self.wait_ready() {
                return;
            }
            // The old process's ports may still be in TIME_WAIT on some systems; retry.
            self.kill9();
        }
        panic!("daemon did not restart; log:\n{}", self.log_text());
    }

    /// SIGKILL, no chance to flush anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait (bounded) for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + DEADLINE;
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!(
                    "daemon did not exit after SIGTERM; log:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Send SIGHUP (reload the password file and ACL rules).
    pub fn hangup(&self) {
        let child = self.child.as_ref().expect("daemon running");
        let status = Command::new("kill")
            .arg("-HUP")
            .arg(child.id().to_string())
            .status()
            .expect("run kill");
        assert!(status.success());
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// rumqttc 3.1.1 helpers.
pub mod v3 {
    use std::time::Duration;

    use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish, QoS};
    use tokio::sync::mpsc;

    use super::DEADLINE;

    /// A client whose event loop runs in a task; incoming packets arrive on `rx`.
    pub struct Client {
        pub client: AsyncClient,
        pub rx: mpsc::Receiver<Packet>,
        pub task: tokio::task::JoinHandle<()>,
        /// CONNACK's Session Present.
        pub session_present: bool,
    }

    pub fn options(id: &str, port: u16) -> MqttOptions {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    /// Connect and wait for CONNACK.
    pub async fn connect(opts: MqttOptions) -> Client {
        let (client, eventloop) = AsyncClient::new(opts, 100);
        let (tx, mut rx) = mpsc::channel(1000);
        let task = tokio::spawn(drive(eventloop, tx));
        let first = tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .expect("CONNACK in time")
            .expect("event loop alive");
        let Packet::ConnAck(ack) = first else {
            panic!("expected CONNACK, got {first:?}");
        };
        Client {
            client,
            rx,
            task,
            session_present: ack.session_present,
        }
    }

    async fn drive(mut eventloop: EventLoop, tx: mpsc::Sender<Packet>) {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(_)) => {}
                Err(_) => return,
            }
        }
    }

    impl Client {
        /// The next packet matching `f`, skipping others, within the deadline.
        pub async fn expect<T>(&mut self, mut f: impl FnMut(Packet) -> Option<T>) -> T {
            tokio::time::timeout(DEADLINE, async {
                loop {
                    let p = self
                        .rx
                        .recv()
                        .await
                        .expect("connection ended while waiting");
                    if let Some(t) = f(p) {
                        return t;
                    }
                }
            })
            .await
            .expect("expected packet in time")
        }

        pub async fn publish_msg(&mut self) -> Publish {
            self.expect(|p| match p {
                Packet::Publish(p) => Some(p),
                _ => None,
            })
            .await
        }

        pub async fn subscribe(
            &mut self,
            filter: &str,
            qos: QoS,
        ) -> Vec<rumqttc::SubscribeReasonCode> {
            self.client
                .subscribe(filter, qos)
                .await
                .expect("subscribe queued");
            self.expect(|p| match p {
                Packet::SubAck(a) => Some(a.return_codes),
                _ => None,
            })
            .await
        }

        /// Drop the connection without DISCONNECT.
        pub fn abort(self) {
            self.task.abort();
        }

        /// DISCONNECT and wait for the event loop to end.
        pub async fn disconnect(self) {
            let _ = self.client.disconnect().await;
            let _ = tokio::time::timeout(DEADLINE, self.task).await;
        }
    }
}

/// rumqttc MQTT 5.0 helpers.
pub mod v5 {
    use std::time::Duration;

    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::{Disconnect, Packet, Publish};
    use rumqttc::v5::{AsyncClient, ConnectionError, Event, EventLoop, MqttOptions, StateError};
    use tokio::sync::mpsc;

    use super::DEADLINE;

    pub struct Client {
        pub client: AsyncClient,
        pub rx: mpsc::Receiver<Packet>,
        pub task: tokio::task::JoinHandle<()>,
    }

    pub fn options(id: &str, port: u16) -> MqttOptions {
        let mut o = MqttOptions::new(id, "127.0.0.1", port);
        o.set_keep_alive(Duration::from_secs(30));
        o
    }

    pub async fn connect(opts: MqttOptions) -> Client {
        let (client, eventloop) = AsyncClient::new(opts, 100);
        let (tx, mut rx) = mpsc::channel(1000);
        let task = tokio::spawn(drive(eventloop, tx));
        let first = tokio::time::timeout(DEADLINE, rx.recv())
            .await
            .expect("CONNACK in time")
            .expect("event loop alive");
        assert!(
            matches!(first, Packet::ConnAck(_)),
            "expected CONNACK, got {first:?}"
        );
        Client { client, rx, task }
    }

    async fn drive(mut eventloop: EventLoop, tx: mpsc::Sender<Packet>) {
        loop {
            match eventloop.poll().await {
                Ok(Event::Incoming(p)) => {
                    if tx.send(p).await.is_err() {
                        return;
                    }
                }
                Ok(Event::Outgoing(_)) => {}
                // rumqttc reports a server DISCONNECT as an error; hand it on as the packet.
                Err(ConnectionError::MqttState(StateError::ServerDisconnect {
                    reason_code,
                    ..
                })) => {
                    let _ = tx
                        .send(Packet::Disconnect(Disconnect::new(reason_code)))
                        .await;
                    return;
                }
                Err(e) => {
                    eprintln!("v5 event loop ended: {e:?}");
                    return;
                }
            }
        }
    }

    impl Client {
        pub async fn expect<T>(&mut self, mut f: impl FnMut(Packet) -> Option<T>) -> T {
            tokio::time::timeout(DEADLINE, async {
                loop {
                    let p = self
                        .rx
                        .recv()
                        .await
                        .expect("connection ended while waiting");
                    if let Some(t) = f(p) {
                        return t;
                    }
                }
            })
            .await
            .expect("expected packet in time")
        }

        pub async fn publish_msg(&mut self) -> Publish {
            self.expect(|p| match p {
                Packet::Publish(p) => Some(p),
                _ => None,
            })
            .await
        }

        pub async fn subscribe(&mut self, filter: &str, qos: QoS) {
            self.client
                .subscribe(filter, qos)
                .await
                .expect("subscribe queued");
            self.expect(|p| matches!(p, Packet::SubAck(_)).then_some(()))
                .await;
        }

        pub fn abort(self) {
            self.task.abort();
        }
    }
}

/// A raw MQTT client over the core's codec, for what rumqttc hides (the exact DISCONNECT).
pub mod raw {
    use bytes::BytesMut;
    use meridian_core::codec::{self, Connect, ConnectProperties, Packet, ProtocolVersion};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    use super::DEADLINE;

    pub struct Raw {
        pub stream: TcpStream,
        pub version: ProtocolVersion,
        buf: BytesMut,
    }

    pub fn connect_packet(version: ProtocolVersion, client_id: &str) -> Connect {
        Connect {
            protocol: version,
            clean_start: true,
            keep_alive: 0,
            client_id: client_id.into(),
            will: None,
            username: None,
            password: None,
            properties: ConnectProperties::default(),
        }
    }

    impl Raw {
        pub async fn open(port: u16, version: ProtocolVersion) -> Self {
            let stream = TcpStream::connect(("127.0.0.1", port))
                .await
                .expect("connect");
            Self::from_stream(stream, version)
        }

        /// Speak MQTT over a stream connected by the caller.
        pub fn from_stream(stream: TcpStream, version: ProtocolVersion) -> Self {
            Self {
                stream,
                version,
                buf: BytesMut::new(),
            }
        }

        /// Open, send this CONNECT, return the CONNACK.
        pub async fn connect_with(
            port: u16,
            connect: Connect,
        ) -> (Self, meridian_core::codec::ConnAck) {
            let mut r = Self::open(port, connect.protocol).await;
            r.send(&Packet::Connect(connect)).await;
            match r.next().await {
                Some(Packet::ConnAck(a)) => (r, a),
                other => panic!("expected CONNACK, got {other:?}"),
            }
        }

        /// Open, CONNECT, and check the CONNACK accepts.
        pub async fn connect(port: u16, version: ProtocolVersion, client_id: &str) -> Self {
            let mut r = Self::open(port, version).await;
            r.send(&Packet::Connect(connect_packet(version, client_id)))
                .await;
            match r.next().await {
                Some(Packet::ConnAck(a)) => assert!(!a.reason.is_error(), "refused: {a:?}"),
                other => panic!("expected CONNACK, got {other:?}"),
            }
            r
        }

        pub async fn send(&mut self, p: &Packet) {
            let mut out = BytesMut::new();
            codec::encode(p, self.version, &mut out).expect("encode");
            self.stream.write_all(&out).await.expect("write");
        }

        /// The next packet, or `None` at end of stream (within the deadline).
        pub async fn next(&mut self) -> Option<Packet> {
            tokio::time::timeout(DEADLINE, async {
                loop {
                    if let Some(p) =
                        codec::decode(&mut self.buf, self.version, u32::MAX).expect("decodes")
                    {
                        return Some(p);
                    }
                    match self.stream.read_buf(&mut self.buf).await {
                        Ok(0) | Err(_) => return None,
                        Ok(_) => {}
                    }
                }
            })
            .await
            .expect("a packet or end of stream in time")
        }

        /// Whether the server closes the connection (within the deadline), skipping packets.
        pub async fn closed(&mut self) -> bool {
            while self.next().await.is_some() {}
            true
        }
    }
}

/// `meridian ARGS...` (no stdin): its stdout, trimmed, asserting success.
pub fn meridian(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_meridian"))
        .args(args)
        .output()
        .expect("run meridian");
    assert!(
        out.status.success(),
        "meridian {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// A minimal HTTP/1.1 client for the admin API: (status, body).
/// A metrics page, read line by line: each series (its name and labels, as the page writes
/// them) and its value. A series is found by its whole name, never by searching the page:
/// `meridian_connections` is not `meridian_connections_rejected_total`, and 2 is not 20.
#[derive(Debug)]
pub struct Metrics(std::collections::BTreeMap<String, f64>);

impl Metrics {
    pub fn parse(page: &str) -> Self {
        Self(
            page.lines()
                .filter(|l| !l.starts_with('#'))
                .filter_map(|l| {
                    let (series, value) = l.rsplit_once(' ')?;
                    Some((series.to_owned(), value.parse().ok()?))
                })
                .collect(),
        )
    }

    /// The metrics page of the daemon whose admin API is on `admin`.
    pub async fn of(admin: u16) -> Self {
        let (status, page) = http(admin, "GET", "/metrics").await;
        assert_eq!(status, 200, "{page}");
        Self::parse(&page)
    }

    /// The value of `series` (`meridian_messages_dropped_total{reason="queue_full"}`), if the
    /// page has it.
    pub fn get(&self, series: &str) -> Option<f64> {
        self.0.get(series).copied()
    }

    /// The value of `series`, 0 when the page does not have it (a family with no series
    /// yet).
    pub fn value(&self, series: &str) -> f64 {
        self.get(series).unwrap_or(0.0)
    }
}

/// The JSON the admin API on `admin` answers `GET path` with (status 200).
pub async fn api(admin: u16, path: &str) -> serde_json::Value {
    let (status, body) = http(admin, "GET", path).await;
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {body}"))
}

/// Wait (bounded) until `cond` holds of what the admin API on `admin` answers `GET path`
/// with; that answer.
pub async fn wait_for_api(
    admin: u16,
    path: &str,
    what: &str,
    mut cond: impl FnMut(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let value = api(admin, path).await;
        if cond(&value) {
            return value;
        }
        assert!(Instant::now() < deadline, "{what}: {path} answers {value}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub async fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    http_with(port, method, path, &[("host", "127.0.0.1")]).await
}

/// [`http`] with these headers (give `host` yourself).
pub async fn http_with(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    tokio::time::timeout(DEADLINE, async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("admin connect");
        let mut req = format!("{method} {path} HTTP/1.1\r\n");
        for (name, value) in headers {
            req.push_str(&format!("{name}: {value}\r\n"));
        }
        req.push_str("connection: close\r\ncontent-length: 0\r\n\r\n");
        s.write_all(req.as_bytes()).await.expect("write request");
        let mut resp = Vec::new();
        s.read_to_end(&mut resp).await.expect("read response");
        let text = String::from_utf8(resp).expect("utf-8 response");
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status code");
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    })
    .await
    .expect("HTTP answer in time")
}
