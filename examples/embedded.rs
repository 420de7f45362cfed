//! Embed Meridian in an application: start the broker inside the app's tokio runtime, talk to
//! it through an in-process client (no socket), and let network clients in on a TCP port.
//!
//! Run with: `cargo run -p meridian-mqtt-daemon --example embedded`

use meridian_daemon::BrokerBuilder;
use meridian_daemon::client::QoS;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let data = std::env::temp_dir().join(format!("meridian-embedded-{}", std::process::id()));
    let server = BrokerBuilder::new()
        .mqtt_addr("127.0.0.1:0".parse()?) // any free port
        .ws_addr(None)
        .admin_addr(None)
        .data_dir(&data)
        .start()
        .await?;
    eprintln!(
        "network clients can connect to {}",
        server
            .local_addr(meridian_daemon::ListenerKind::Tcp)
            .unwrap()
    );

    // Two in-process clients: one listens, one publishes.
    let mut listener = server.client().client_id("listener").connect().await?;
    listener.subscribe("app/events/#", QoS::AtLeastOnce).await?;
    let mut app = server.client().client_id("app").connect().await?;
    app.publish(
        "app/events/started",
        "hello from the app",
        QoS::AtLeastOnce,
        false,
    )
    .await?;

    let msg = listener.recv().await?;
    eprintln!(
        "received on {}: {}",
        msg.topic,
        String::from_utf8_lossy(&msg.payload)
    );

    app.disconnect().await?;
    listener.disconnect().await?;
    server.shutdown().await?;
    let _ = std::fs::remove_dir_all(&data);
    Ok(())
}
