//! The embedding API: a broker in the test's own runtime, in-process clients, and a network
//! client side by side.

mod common;

use common::v3;
use meridian_daemon::BrokerBuilder;
use meridian_daemon::client::QoS;

async fn start(dir: &std::path::Path) -> meridian_daemon::Server {
    BrokerBuilder::new()
        .mqtt_addr("127.0.0.1:0".parse().unwrap())
        .ws_addr(None)
        .admin_addr(None)
        .data_dir(dir)
        .start()
        .await
        .expect("broker starts")
}

#[tokio::test]
async fn in_process_clients_publish_and_subscribe() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let mut sub = server.client().client_id("sub").connect().await.unwrap();
    assert_eq!(
        sub.subscribe("e/#", QoS::ExactlyOnce).await.unwrap(),
        QoS::ExactlyOnce
    );
    let mut publ = server.client().connect().await.unwrap();
    for qos in [QoS::AtMostOnce, QoS::AtLeastOnce, QoS::ExactlyOnce] {
        publ.publish("e/x", format!("{qos:?}"), qos, false)
            .await
            .unwrap();
        let m = sub.recv().await.unwrap();
        assert_eq!(m.topic, "e/x");
        assert_eq!(m.qos, qos);
        assert_eq!(&m.payload[..], format!("{qos:?}").as_bytes());
    }
    publ.disconnect().await.unwrap();
    sub.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn in_process_and_network_clients_see_each_other() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let port = server
        .local_addr(meridian_daemon::ListenerKind::Tcp)
        .unwrap()
        .port();
    let mut net = v3::connect(v3::options("net", port)).await;
    net.subscribe("to-net", rumqttc::QoS::AtLeastOnce).await;
    let mut app = server.client().client_id("app").connect().await.unwrap();
    app.subscribe("to-app", QoS::AtLeastOnce).await.unwrap();

    app.publish("to-net", "hi net", QoS::AtLeastOnce, false)
        .await
        .unwrap();
    let p = net.publish_msg().await;
    assert_eq!(&p.payload[..], b"hi net");

    net.client
        .publish("to-app", rumqttc::QoS::AtLeastOnce, false, "hi app")
        .await
        .unwrap();
    let m = tokio::time::timeout(common::DEADLINE, app.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&m.payload[..], b"hi app");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn embedded_state_persists_across_restarts() {
    state_persists_across_restarts().await;
}

/// The same on a multi-thread runtime, where commits that fsync leave the worker thread
/// (`block_in_place`) rather than run inline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_state_persists_across_restarts_on_a_multi_thread_runtime() {
    state_persists_across_restarts().await;
}

async fn state_persists_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let mut app = server.client().client_id("a").connect().await.unwrap();
    app.publish("cfg/mode", "eco", QoS::AtLeastOnce, true)
        .await
        .unwrap();
    app.disconnect().await.unwrap();
    server.shutdown().await.unwrap();

    let server = start(dir.path()).await;
    let mut app = server.client().client_id("b").connect().await.unwrap();
    app.subscribe("cfg/#", QoS::AtLeastOnce).await.unwrap();
    let m = app.recv().await.unwrap();
    assert!(m.retain);
    assert_eq!(&m.payload[..], b"eco");
    server.shutdown().await.unwrap();
}

/// The application's own authenticator: answers `Pending` and decides from another task
/// through `AuthDecisions`; its authorizer refuses one topic.
#[tokio::test]
async fn custom_authenticator_decides_asynchronously() {
    use meridian_core::broker::{
        AuthOutcome, AuthRequest, Authenticator, Authorizer, ClientRef, FilterAccess,
    };
    use meridian_core::codec::ReasonCode;
    use meridian_core::topic::TopicFilter;
    use meridian_daemon::AuthDecisions;

    struct Later(AuthDecisions);
    impl Authenticator for Later {
        fn authenticate(&mut self, r: &AuthRequest<'_>) -> AuthOutcome {
            let ok = r.client_id.starts_with("ok-");
            let decisions = self.0.clone();
            let conn = r.conn;
            tokio::spawn(async move {
                let outcome = if ok {
                    AuthOutcome::Allow {
                        username: Some("app-user".into()),
                    }
                } else {
                    AuthOutcome::Deny(ReasonCode::BANNED)
                };
                decisions.decide(conn, outcome).await;
            });
            AuthOutcome::Pending
        }
    }
    struct NoSecrets;
    impl Authorizer for NoSecrets {
        fn may_publish(&self, _: &ClientRef<'_>, topic: &str) -> bool {
            topic != "secret"
        }
        fn may_subscribe(&self, _: &ClientRef<'_>, f: &TopicFilter) -> FilterAccess {
            match f.pattern() {
                "secret" => FilterAccess::Denied,
                "#" => FilterAccess::Filtered,
                _ => FilterAccess::Allowed,
            }
        }
        fn may_receive(&self, _: &ClientRef<'_>, topic: &str) -> bool {
            topic != "secret"
        }
    }

    let dir = tempfile::tempdir().unwrap();
    let server = BrokerBuilder::new()
        .mqtt_addr("127.0.0.1:0".parse().unwrap())
        .ws_addr(None)
        .admin_addr(None)
        .data_dir(dir.path())
        .auth(Box::new(|decisions| {
            (Box::new(Later(decisions)), Box::new(NoSecrets))
        }))
        .start()
        .await
        .unwrap();
    let refused = server.client().client_id("nope").connect().await;
    assert!(
        matches!(
            refused,
            Err(meridian_daemon::client::ClientError::Refused(0x8A))
        ),
        "{refused:?}"
    );
    let mut ok = server.client().client_id("ok-1").connect().await.unwrap();
    assert!(ok.subscribe("secret", QoS::AtLeastOnce).await.is_err());
    assert!(ok.subscribe("open", QoS::AtLeastOnce).await.is_ok());
    let clients = server.handle().clients().await.unwrap();
    assert_eq!(clients[0].username.as_deref(), Some("app-user"));
    server.shutdown().await.unwrap();
}
