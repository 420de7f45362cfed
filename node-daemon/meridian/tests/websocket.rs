//! MQTT over WebSocket against the real daemon.

mod common;

use bytes::BytesMut;
use common::{DEADLINE, Daemon};
use futures_util::{SinkExt, StreamExt};
use meridian_core::codec::{self, Packet, ProtocolVersion};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

async fn ws_connect(
    port: u16,
    path: &str,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        Option<String>,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    ws_connect_from(port, path, None).await
}

/// Upgrade as a browser on the page `origin` would (with its `Origin` header).
async fn ws_connect_from(
    port: u16,
    path: &str,
    origin: Option<&str>,
) -> Result<
    (
        tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
        Option<String>,
    ),
    tokio_tungstenite::tungstenite::Error,
> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut req = format!("ws://127.0.0.1:{port}{path}")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    if let Some(origin) = origin {
        req.headers_mut().insert("origin", origin.parse().unwrap());
    }
    let (ws, resp) = tokio_tungstenite::client_async(req, stream).await?;
    let proto = resp
        .headers()
        .get("sec-websocket-protocol")
        .map(|v| v.to_str().unwrap().to_owned());
    Ok((ws, proto))
}

#[tokio::test]
async fn mqtt_over_websocket_connects_and_round_trips() {
    let d = Daemon::start();
    let (mut ws, proto) = ws_connect(d.ws, "/mqtt").await.expect("handshake");
    assert_eq!(proto.as_deref(), Some("mqtt"));
    let v = ProtocolVersion::V5;
    let mut out = BytesMut::new();
    codec::encode(
        &Packet::Connect(common::raw::connect_packet(v, "ws-client")),
        v,
        &mut out,
    )
    .unwrap();
    // Split the CONNECT across two frames: MQTT over WebSocket is a byte stream.
    let tail = out.split_off(5);
    ws.send(Message::Binary(out.freeze())).await.unwrap();
    ws.send(Message::Binary(tail.freeze())).await.unwrap();
    let mut buf = BytesMut::new();
    let packet = tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(p) = codec::decode(&mut buf, v, u32::MAX).unwrap() {
                return p;
            }
            match ws.next().await {
                Some(Ok(Message::Binary(b))) => buf.extend_from_slice(&b),
                other => panic!("unexpected {other:?}"),
            }
        }
    })
    .await
    .unwrap();
    match packet {
        Packet::ConnAck(a) => assert!(!a.reason.is_error()),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[tokio::test]
async fn websocket_on_another_path_is_refused() {
    let d = Daemon::start();
    assert!(ws_connect(d.ws, "/elsewhere").await.is_err());
}

#[tokio::test]
async fn oversized_websocket_message_closes_only_that_connection() {
    let d = Daemon::start_with_config(Some("[limits]\nmax_packet_size = 4096\n"));
    let (mut ws, _) = ws_connect(d.ws, "/mqtt").await.expect("handshake");
    let _ = ws
        .send(Message::Binary(bytes::Bytes::from(vec![0x30u8; 64 * 1024])))
        .await;
    let closed = tokio::time::timeout(DEADLINE, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return true,
                Some(Ok(_)) => {}
            }
        }
    })
    .await
    .unwrap();
    assert!(closed);
    let (ok, _) = ws_connect(d.ws, "/mqtt")
        .await
        .expect("others still served");
    drop(ok);
}

/// The HTTP status of a refused upgrade.
fn refusal_status(
    r: Result<
        (
            tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
            Option<String>,
        ),
        tokio_tungstenite::tungstenite::Error,
    >,
) -> u16 {
    match r {
        Err(tokio_tungstenite::tungstenite::Error::Http(resp)) => resp.status().as_u16(),
        Err(e) => panic!("expected an HTTP refusal, got {e}"),
        Ok(_) => panic!("expected an HTTP refusal, got a connection"),
    }
}

/// rumqttc over WebSocket: a client that is not a browser and sends no `Origin`.
async fn rumqttc_ws_connects(port: u16) {
    let mut options =
        rumqttc::MqttOptions::new("ws-app", format!("ws://127.0.0.1:{port}/mqtt"), port);
    options.set_transport(rumqttc::Transport::Ws);
    let (_client, mut eventloop) = rumqttc::AsyncClient::new(options, 10);
    let event = tokio::time::timeout(DEADLINE, eventloop.poll())
        .await
        .expect("an answer in time")
        .expect("connected");
    assert!(
        matches!(
            event,
            rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ref a))
                if a.code == rumqttc::ConnectReturnCode::Success
        ),
        "{event:?}"
    );
}

/// With anonymous access (the default), a web page the user happens to open must not reach
/// the broker: browsers' upgrades (they send `Origin`) are refused, other clients are not.
#[tokio::test]
async fn an_anonymous_listener_refuses_browsers_and_serves_other_clients() {
    let d = Daemon::start();
    let r = ws_connect_from(d.ws, "/mqtt", Some("https://evil.example")).await;
    assert_eq!(refusal_status(r), 403);
    rumqttc_ws_connects(d.ws).await;
    let (_, metrics) = common::http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics)
            .get(r#"meridian_websocket_refused_total{reason="origin"}"#),
        Some(1.0),
        "{metrics}"
    );
}

#[tokio::test]
async fn listed_origins_may_connect_and_no_others() {
    let d = Daemon::start_with_config(Some(
        "[listeners.ws]\nallowed_origins = [\"https://app.example.com\", \"http://localhost:3000\"]\n",
    ));
    ws_connect_from(d.ws, "/mqtt", Some("https://app.example.com"))
        .await
        .expect("a listed origin");
    ws_connect_from(d.ws, "/mqtt", Some("HTTP://LOCALHOST:3000"))
        .await
        .expect("origins compare without case");
    let r = ws_connect_from(d.ws, "/mqtt", Some("https://app.example.com:8443")).await;
    assert_eq!(refusal_status(r), 403);
    let r = ws_connect_from(d.ws, "/mqtt", Some("null")).await;
    assert_eq!(refusal_status(r), 403);
    rumqttc_ws_connects(d.ws).await;
}

/// Where every client must log in, a page gets no more than its user's credentials would
/// give it: any origin may connect unless a list says otherwise.
#[tokio::test]
async fn a_listener_that_requires_logins_lets_any_page_try() {
    let dir = tempfile::tempdir().unwrap();
    let passwd = dir.path().join("passwd");
    std::fs::write(&passwd, format!("alice:{}\n", common::cheap_hash("pw"))).unwrap();
    let d = Daemon::start_with_config(Some(&format!(
        "[auth]\npassword_file = \"{}\"\nallow_anonymous = false\n",
        passwd.display()
    )));
    ws_connect_from(d.ws, "/mqtt", Some("https://elsewhere.example"))
        .await
        .expect("any origin may try to log in");
}
