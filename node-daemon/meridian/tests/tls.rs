//! TLS and WSS listeners with a self-signed certificate made in the test.

mod common;

use std::sync::Arc;

use bytes::BytesMut;
use common::{DEADLINE, Daemon};
use futures_util::{SinkExt, StreamExt};
use meridian_core::codec::{self, Packet, ProtocolVersion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{ClientConfig, RootCertStore};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

struct Tls {
    daemon: Daemon,
    tls_port: u16,
    wss_port: u16,
    connector: TlsConnector,
    _dir: tempfile::TempDir,
}

fn start() -> Tls {
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_path = dir.path().join("cert.pem");
    let key_path = dir.path().join("key.pem");
    std::fs::write(&cert_path, ck.cert.pem()).unwrap();
    std::fs::write(&key_path, ck.signing_key.serialize_pem()).unwrap();
    let tls_port = common::free_port();
    let wss_port = common::free_port();
    let config = format!(
        r#"
[listeners.tls]
enabled = true
bind = "127.0.0.1:{tls_port}"
cert = "{cert}"
key = "{key}"

[listeners.wss]
enabled = true
bind = "127.0.0.1:{wss_port}"
cert = "{cert}"
key = "{key}"
"#,
        cert = cert_path.display(),
        key = key_path.display()
    );
    let daemon = Daemon::start_with_config(Some(&config));
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(ck.cert.der().to_vec()))
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Tls {
        daemon,
        tls_port,
        wss_port,
        connector: TlsConnector::from(Arc::new(config)),
        _dir: dir,
    }
}

impl Tls {
    async fn tls_stream(
        &self,
        port: u16,
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        self.connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("TLS handshake")
    }
}

fn connect_bytes(id: &str) -> BytesMut {
    let v = ProtocolVersion::V5;
    let mut out = BytesMut::new();
    codec::encode(
        &Packet::Connect(common::raw::connect_packet(v, id)),
        v,
        &mut out,
    )
    .unwrap();
    out
}

async fn read_packet<S: AsyncRead + Unpin>(s: &mut S) -> Packet {
    let mut buf = BytesMut::new();
    tokio::time::timeout(DEADLINE, async {
        loop {
            if let Some(p) = codec::decode(&mut buf, ProtocolVersion::V5, u32::MAX).unwrap() {
                return p;
            }
            assert!(s.read_buf(&mut buf).await.unwrap() > 0, "closed");
        }
    })
    .await
    .unwrap()
}

async fn mqtt_connect<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S, id: &str) {
    s.write_all(&connect_bytes(id)).await.unwrap();
    match read_packet(s).await {
        Packet::ConnAck(a) => assert!(!a.reason.is_error()),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[tokio::test]
async fn mqtt_over_tls() {
    let t = start();
    let mut s = t.tls_stream(t.tls_port).await;
    mqtt_connect(&mut s, "tls-client").await;
    // Plain TCP still works next to it.
    let _plain = common::raw::Raw::connect(t.daemon.mqtt, ProtocolVersion::V5, "plain").await;
}

#[tokio::test]
async fn mqtt_over_wss() {
    let t = start();
    let s = t.tls_stream(t.wss_port).await;
    let mut req = format!("wss://localhost:{}/mqtt", t.wss_port)
        .into_client_request()
        .unwrap();
    req.headers_mut()
        .insert("sec-websocket-protocol", "mqtt".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::client_async(req, s).await.unwrap();
    ws.send(Message::Binary(connect_bytes("wss-client").freeze()))
        .await
        .unwrap();
    let msg = tokio::time::timeout(DEADLINE, ws.next()).await.unwrap();
    let Some(Ok(Message::Binary(b))) = msg else {
        panic!("expected a binary frame, got {msg:?}");
    };
    let mut buf = BytesMut::from(&b[..]);
    match codec::decode(&mut buf, ProtocolVersion::V5, u32::MAX).unwrap() {
        Some(Packet::ConnAck(a)) => assert!(!a.reason.is_error()),
        other => panic!("expected CONNACK, got {other:?}"),
    }
}

#[tokio::test]
async fn plaintext_on_the_tls_port_is_dropped_without_harm() {
    let t = start();
    let mut raw = tokio::net::TcpStream::connect(("127.0.0.1", t.tls_port))
        .await
        .unwrap();
    raw.write_all(&connect_bytes("not-tls")).await.unwrap();
    let mut sink = Vec::new();
    let r = tokio::time::timeout(DEADLINE, raw.read_to_end(&mut sink)).await;
    assert!(r.is_ok(), "the daemon closes the connection");
    let mut s = t.tls_stream(t.tls_port).await;
    mqtt_connect(&mut s, "after").await;
}

/// Client certificates: required on the listener; a verified certificate's Common Name
/// becomes the client's username.
#[tokio::test]
async fn client_certificates_are_required_and_name_the_user() {
    use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

    let dir = tempfile::tempdir().unwrap();
    let server = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    // A CA and a client certificate it signs.
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "Test CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key).unwrap();
    let client_key = rcgen::KeyPair::generate().unwrap();
    let mut client_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    client_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "device-42");
    let client_cert = client_params.signed_by(&client_key, &ca).unwrap();

    let path = |n: &str| dir.path().join(n);
    std::fs::write(path("cert.pem"), server.cert.pem()).unwrap();
    std::fs::write(path("key.pem"), server.signing_key.serialize_pem()).unwrap();
    std::fs::write(path("ca.pem"), ca.pem()).unwrap();
    let tls_port = common::free_port();
    let config = format!(
        r#"
[listeners.tls]
enabled = true
bind = "127.0.0.1:{tls_port}"
cert = "{}"
key = "{}"
client_ca = "{}"
require_client_cert = true
"#,
        path("cert.pem").display(),
        path("key.pem").display(),
        path("ca.pem").display()
    );
    let d = Daemon::start_with_config(Some(&config));

    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from(server.cert.der().to_vec()))
        .unwrap();
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let builder = || {
        ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots.clone())
    };
    let anonymous = TlsConnector::from(Arc::new(builder().with_no_client_auth()));
    let with_cert = TlsConnector::from(Arc::new(
        builder()
            .with_client_auth_cert(
                vec![CertificateDer::from(client_cert.der().to_vec())],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
            )
            .unwrap(),
    ));
    let name = || ServerName::try_from("localhost").unwrap();

    // Without a certificate: the handshake fails, or the first read does (TLS 1.3 reports the
    // refusal after the client thinks it is done).
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", tls_port))
        .await
        .unwrap();
    if let Ok(mut s) = anonymous.connect(name(), tcp).await {
        let _ = s.write_all(&connect_bytes("no-cert")).await;
        let mut buf = [0u8; 64];
        let r = tokio::time::timeout(DEADLINE, s.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(r, Ok(0) | Err(_)),
            "refused without a certificate: {r:?}"
        );
    }

    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", tls_port))
        .await
        .unwrap();
    let mut s = with_cert
        .connect(name(), tcp)
        .await
        .expect("mTLS handshake");
    mqtt_connect(&mut s, "cert-client").await;
    let (status, body) = common::http(d.admin, "GET", "/api/clients/cert-client").await;
    assert_eq!(status, 200);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["username"], "device-42");

    // The certificate does not lend its holder another name (no password file could vouch
    // for one): rumqttc presenting it with the username "admin" is refused.
    let client_config = builder()
        .with_client_auth_cert(
            vec![CertificateDer::from(client_cert.der().to_vec())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(client_key.serialize_der())),
        )
        .unwrap();
    let mut options = rumqttc::MqttOptions::new("impostor", "localhost", tls_port);
    options.set_credentials("admin", "anything");
    options.set_transport(rumqttc::Transport::tls_with_config(
        rumqttc::TlsConfiguration::Rustls(Arc::new(client_config)),
    ));
    let (_client, mut eventloop) = rumqttc::AsyncClient::new(options, 10);
    let refused = tokio::time::timeout(DEADLINE, eventloop.poll())
        .await
        .expect("an answer in time");
    assert!(
        matches!(
            refused,
            Err(rumqttc::ConnectionError::ConnectionRefused(
                rumqttc::ConnectReturnCode::BadUserNamePassword
            ))
        ),
        "{refused:?}"
    );
    let (_, metrics) = common::http(d.admin, "GET", "/metrics").await;
    assert_eq!(
        common::Metrics::parse(&metrics)
            .get(r#"meridian_logins_refused_total{reason="certificate_mismatch"}"#),
        Some(1.0),
        "{metrics}"
    );
}
