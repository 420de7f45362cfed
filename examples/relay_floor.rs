//! The least an MQTT relay can do per message, as a reference for the brokers' CPU figures.
//!
//! Not a broker: it keeps no sessions and matches no topics. Each connection gets a thread that
//! blocks on its socket; every PUBLISH is forwarded as it came to every connection that has
//! subscribed, whatever the filter. It answers CONNECT, SUBSCRIBE, PINGREQ and QoS 1 PUBLISH
//! (MQTT 3.1.1) so that `meridian bench` can drive it. A message costs one wake-up of one
//! thread, one read and the writes, with no readiness polling at all: below that, only batching
//! several messages per wake-up saves CPU.
//!
//! Its figures hold only where every subscriber wants every message, as in `pairs -c 1`,
//! `fan-in`, `fan-out` and `mesh`:
//!
//! ```text
//! cargo run --release -p meridian-mqtt-daemon --example relay-floor -- 28834
//! meridian bench pairs -c 1 -q 0 --rate 2000 -n 20000 -d 10 --port 28834 --broker-pid PID
//! ```
//!
//! `scripts/bench-baseline` runs it beside the brokers with `BROKERS="... relay-floor"`.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, PoisonError};

/// The largest packet taken; a larger one closes the connection.
const MAX_PACKET: usize = 64 * 1024;

/// Write halves of the connections that have subscribed.
type Subscribers = Arc<Mutex<Vec<TcpStream>>>;

fn main() -> io::Result<()> {
    let port = match std::env::args().nth(1) {
        Some(p) => p
            .parse()
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("port {p}: {e}")))?,
        None => 1883,
    };
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port))?;
    eprintln!("relay-floor listening on {}", listener.local_addr()?);
    let subscribers = Subscribers::default();
    for socket in listener.incoming() {
        let socket = socket?;
        socket.set_nodelay(true)?;
        let subscribers = subscribers.clone();
        std::thread::spawn(move || serve(socket, &subscribers));
    }
    Ok(())
}

/// Serve one connection until it closes or sends what this relay does not take.
fn serve(mut socket: TcpStream, subscribers: &Subscribers) -> io::Result<()> {
    let mut buf = vec![0; 2 * MAX_PACKET];
    let mut filled = 0;
    let mut replies = Vec::new();
    let mut forward = Vec::new();
    loop {
        let n = socket.read(&mut buf[filled..])?;
        if n == 0 {
            return Ok(());
        }
        filled += n;
        let mut at = 0;
        while let Some((header, len)) = frame(&buf[at..filled])? {
            let packet = &buf[at..at + header + len];
            let body = &packet[header..];
            match packet[0] >> 4 {
                // CONNECT: accepted, no session present.
                1 => replies.extend_from_slice(&[0x20, 2, 0, 0]),
                3 => {
                    forward.extend_from_slice(packet);
                    if (packet[0] >> 1) & 3 == 1 {
                        let id = packet_id_after_topic(body)?;
                        replies.extend_from_slice(&[0x40, 2, id[0], id[1]]);
                    }
                }
                // SUBSCRIBE: one filter, granted QoS 1.
                8 => {
                    let id = body.get(..2).ok_or_else(|| malformed("SUBSCRIBE"))?;
                    replies.extend_from_slice(&[0x90, 3, id[0], id[1], 1]);
                    lock(subscribers).push(socket.try_clone()?);
                }
                12 => replies.extend_from_slice(&[0xd0, 0]),
                14 => return Ok(()),
                // PUBACK and the rest: nothing to do.
                _ => {}
            }
            at += header + len;
        }
        buf.copy_within(at..filled, 0);
        filled -= at;
        if !replies.is_empty() {
            socket.write_all(&replies)?;
            replies.clear();
        }
        if !forward.is_empty() {
            for subscriber in lock(subscribers).iter_mut() {
                // A subscriber that went away is the reader's to notice.
                let _ = subscriber.write_all(&forward);
            }
            forward.clear();
        }
    }
}

/// The fixed header's length and the remaining length of the packet at the start of `bytes`,
/// once all of it is there.
fn frame(bytes: &[u8]) -> io::Result<Option<(usize, usize)>> {
    let mut len = 0;
    for (i, b) in bytes.iter().enumerate().skip(1).take(4) {
        len |= usize::from(b & 0x7f) << (7 * (i - 1));
        if b & 0x80 == 0 {
            if len > MAX_PACKET {
                return Err(malformed("packet length"));
            }
            return Ok((bytes.len() >= i + 1 + len).then_some((i + 1, len)));
        }
    }
    if bytes.len() >= 5 {
        return Err(malformed("remaining length"));
    }
    Ok(None)
}

/// The packet identifier of a QoS 1 PUBLISH's body.
fn packet_id_after_topic(body: &[u8]) -> io::Result<[u8; 2]> {
    let topic_len = body
        .get(..2)
        .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
        .ok_or_else(|| malformed("PUBLISH"))?;
    body.get(2 + topic_len..4 + topic_len)
        .map(|id| [id[0], id[1]])
        .ok_or_else(|| malformed("PUBLISH"))
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("malformed {what}"))
}

fn lock(subscribers: &Subscribers) -> std::sync::MutexGuard<'_, Vec<TcpStream>> {
    subscribers.lock().unwrap_or_else(PoisonError::into_inner)
}
