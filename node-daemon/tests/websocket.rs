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
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let mut req = format!("ws://127.0.0.1:{port}{path}")
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "mqtt".parse().unwrap());
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
