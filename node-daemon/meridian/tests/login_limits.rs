//! What a client can make the daemon hold or wait for before it has logged in: the input it
//! streams while its password is checked, and the password checks it asks for.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{Bytes, BytesMut};
use common::raw::{Raw, connect_packet};
use common::{DEADLINE, Daemon, http};
use futures_util::SinkExt;
use meridian_core::codec::{self, Packet, ProtocolVersion::V5, Publish, QoS, ReasonCode};
use tokio::io::AsyncWriteExt;

/// The broker-wide packet size limit in these tests, and so the most the broker holds of a
/// connection's input while its login is pending.
const MAX_PACKET: usize = 64 * 1024;

/// What the client tries to stream before its CONNACK: far more than the bound.
const STREAM_BYTES: usize = 32 * 1024 * 1024;

/// A password hash whose check takes minutes (8 KiB, ten million passes, which the tests'
/// `auth.max_hash_passes` allows): logins against it stay pending for as long as a test looks.
const SLOW_HASH: &str = "$argon2id$v=19$m=8,t=10000000,p=1$c2FsdHNhbHRzYWx0c2FsdA$\
                         AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";

fn config(dir: &std::path::Path) -> String {
    let passwd = dir.join("passwd");
    std::fs::write(&passwd, format!("slow:{SLOW_HASH}\n")).unwrap();
    format!(
        "[auth]\npassword_file = \"{}\"\nmax_hash_passes = 10000000\n[limits]\n\
         max_packet_size = {MAX_PACKET}\nconnect_timeout_ms = 60000\n",
        passwd.display()
    )
}

/// CONNECT as the user whose check never ends in time, then QoS 0 PUBLISHes of 1 KiB.
fn connect_bytes() -> BytesMut {
    let mut c = connect_packet(V5, "eager");
    c.username = Some("slow".into());
    c.password = Some(Bytes::from_static(b"guess"));
    let mut out = BytesMut::new();
    codec::encode(&Packet::Connect(c), V5, &mut out).unwrap();
    out
}

fn publish_bytes() -> Bytes {
    let p = Packet::Publish(Publish {
        dup: false,
        qos: QoS::AtMostOnce,
        retain: false,
        topic: "stream".into(),
        packet_id: None,
        payload: Bytes::from(vec![7u8; 1000]),
        properties: Default::default(),
    });
    let mut out = BytesMut::new();
    codec::encode(&p, V5, &mut out).unwrap();
    out.freeze()
}

/// Bytes waiting unread in the daemon's end of its established connections on `port`
/// (`ss`, from iproute2: Recv-Q).
fn unread_at(port: u16) -> usize {
    let out = std::process::Command::new("ss")
        .args(["-tnH", &format!("sport = :{port}")])
        .output()
        .expect("ss (iproute2) runs");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"ESTAB")).then(|| f[1].parse::<usize>().unwrap_or(0))
        })
        .sum()
}

fn rss_bytes(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmRSS in /proc/PID/status");
    kb * 1024
}

fn metric(text: &str, name: &str) -> usize {
    common::Metrics::parse(text)
        .get(name)
        .unwrap_or_else(|| panic!("{name} in {text}")) as usize
}

/// Stream until the daemon stops reading (its end of the connection holds a full receive
/// window, 32 KiB or more, unread), then check it took in no more than the bound plus `ahead`
/// (what may be on its way to the broker task when it asks for the pause); `written` counts
/// what the writer got out. The writer must not be refused or cut: pausing is not closing.
async fn check_held_to_the_bound(d: &Daemon, port: u16, written: &AtomicUsize, ahead: usize) {
    let pid = d.child.as_ref().unwrap().id();
    let (_, before) = http(d.admin, "GET", "/metrics").await;
    let received_before = metric(&before, "meridian_bytes_received_total");
    let rss_before = rss_bytes(pid);
    tokio::time::timeout(DEADLINE, async {
        while unread_at(port) < 32 * 1024 {
            assert!(
                written.load(Ordering::Relaxed) < STREAM_BYTES,
                "the daemon read all {STREAM_BYTES} bytes before the login was decided"
            );
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the daemon stops reading the connection");
    let (_, after) = http(d.admin, "GET", "/metrics").await;
    let received = metric(&after, "meridian_bytes_received_total") - received_before;
    // At most the bound, plus what was on its way, plus the CONNECT.
    assert!(
        received <= MAX_PACKET + ahead + 64,
        "{received} bytes taken in before the login was decided"
    );
    let grown = rss_bytes(pid).saturating_sub(rss_before);
    assert!(
        grown < 8 * 1024 * 1024,
        "the daemon grew by {grown} bytes while {} were streamed at it",
        written.load(Ordering::Relaxed)
    );
    eprintln!(
        "taken in before the login was decided: {received} bytes; the daemon grew by {grown} \
         bytes; the client got {} bytes out",
        written.load(Ordering::Relaxed)
    );
    let (_, after) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(metric(&after, "meridian_connections"), 1, "still connected");
}

#[tokio::test]
async fn a_tcp_client_streaming_before_its_login_is_decided_is_held_to_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with_config(Some(&config(dir.path())));
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", d.mqtt))
        .await
        .unwrap();
    stream.write_all(&connect_bytes()).await.unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let progress = written.clone();
    let writer = tokio::spawn(async move {
        let publish = publish_bytes();
        while progress.load(Ordering::Relaxed) < STREAM_BYTES {
            stream.write_all(&publish).await?;
            progress.fetch_add(publish.len(), Ordering::Relaxed);
        }
        Ok::<_, std::io::Error>(stream)
    });
    // Plain TCP: the broker task reads the socket itself, 16 KiB at a time.
    check_held_to_the_bound(&d, d.mqtt, &written, 16 * 1024).await;
    assert!(
        !writer.is_finished(),
        "the writer waits, neither done nor cut"
    );
    writer.abort();
}

#[tokio::test]
async fn a_websocket_client_streaming_before_its_login_is_decided_is_held_to_the_bound() {
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let dir = tempfile::tempdir().unwrap();
    let d = Daemon::start_with_config(Some(&config(dir.path())));
    let mut request = format!("ws://127.0.0.1:{}/mqtt", d.ws)
        .into_client_request()
        .unwrap();
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", d.ws))
        .await
        .unwrap();
    let (mut ws, _) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    ws.send(Message::Binary(connect_bytes().freeze()))
        .await
        .unwrap();
    let written = Arc::new(AtomicUsize::new(0));
    let progress = written.clone();
    let port = d.ws;
    let writer = tokio::spawn(async move {
        let publish = publish_bytes();
        while progress.load(Ordering::Relaxed) < STREAM_BYTES {
            ws.send(Message::Binary(publish.clone())).await?;
            progress.fetch_add(publish.len(), Ordering::Relaxed);
        }
        Ok::<_, tokio_tungstenite::tungstenite::Error>(ws)
    });
    // A WebSocket's task may have handed the broker task up to 64 KiB (the transport's
    // `UNFED_MAX`) and a frame more by the time the pause reaches it; seen on a loaded machine.
    check_held_to_the_bound(&d, port, &written, 64 * 1024 + 16 * 1024).await;
    assert!(
        !writer.is_finished(),
        "the writer waits, neither done nor cut"
    );
    writer.abort();
}

/// Bogus logins from one address (127.0.0.2) neither fill the password-check queue nor hold
/// up a good login from another (127.0.0.3): that address gets its share
/// (`max_pending_per_address`) and 0x89 beyond it, and checks are taken from each address in
/// turn, so the good login is decided after a few of the flood's checks, not after all of
/// those queued ahead of it.
#[tokio::test]
async fn bogus_logins_from_one_address_do_not_hold_up_a_login_from_another() {
    const FLOOD: usize = 24;
    const SHARE: usize = 16;
    let dir = tempfile::tempdir().unwrap();
    let passwd = dir.path().join("passwd");
    // A real hash (the argon2 defaults `meridian passwd` writes): each check takes a while.
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_meridian"))
        .arg("passwd")
        .arg(&passwd)
        .arg("alice")
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            writeln!(child.stdin.take().unwrap(), "right")?;
            child.wait()
        })
        .unwrap();
    assert!(status.success());
    let d = Daemon::start_with_config(Some(&format!(
        "[auth]\npassword_file = \"{}\"\nmax_pending_per_address = {SHARE}\n",
        passwd.display()
    )));
    let port = d.mqtt;
    let login = move |from: [u8; 4], id: String, password: &'static [u8]| async move {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from((from, 0)))
            .expect("bind a loopback source address");
        let stream = socket
            .connect(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap();
        let mut c = connect_packet(V5, &id);
        c.username = Some("alice".into());
        c.password = Some(Bytes::from_static(password));
        let mut raw = Raw::from_stream(stream, V5);
        raw.send(&Packet::Connect(c)).await;
        match raw.next().await {
            Some(Packet::ConnAck(a)) => a.reason,
            other => panic!("expected CONNACK, got {other:?}"),
        }
    };
    let checked = |m: &str| metric(m, "meridian_password_checks_total");

    let flood: Vec<_> = (0..FLOOD)
        .map(|i| tokio::spawn(login([127, 0, 0, 2], format!("bogus-{i}"), b"wrong")))
        .collect();
    // Once a flood login is refused for the address's share, the share is full.
    let checked_before = tokio::time::timeout(DEADLINE, async {
        loop {
            let (_, m) = http(d.admin, "GET", "/metrics").await;
            if metric(&m, "meridian_logins_refused_total{reason=\"busy_address\"}") > 0 {
                return checked(&m);
            }
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the address's share fills");
    assert_eq!(
        login([127, 0, 0, 3], "good".into(), b"right").await,
        ReasonCode::SUCCESS
    );
    let (_, m) = http(d.admin, "GET", "/metrics").await;
    // The good login's own check is one of them.
    let checked_meanwhile = checked(&m) - checked_before - 1;
    eprintln!("bogus logins checked while the good one waited: {checked_meanwhile}");
    assert!(
        checked_meanwhile < SHARE / 2,
        "{checked_meanwhile} bogus logins were checked while the good one waited"
    );
    let mut answers = Vec::new();
    for f in flood {
        answers.push(f.await.unwrap());
    }
    let busy = answers
        .iter()
        .filter(|&&a| a == ReasonCode::SERVER_BUSY)
        .count();
    assert!(busy > 0);
    assert_eq!(
        answers
            .iter()
            .filter(|&&a| a == ReasonCode::BAD_USER_NAME_OR_PASSWORD)
            .count(),
        FLOOD - busy
    );
    let (_, m) = http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        metric(&m, "meridian_logins_refused_total{reason=\"busy_address\"}"),
        busy
    );
}
