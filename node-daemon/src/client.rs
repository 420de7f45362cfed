//! An in-process MQTT client: a virtual connection on the broker, without a socket.
//!
//! The client speaks MQTT 5.0 to the broker task through the same channel connection tasks
//! use, so everything a network client gets (sessions, QoS, retained messages, ACLs) applies.
//!
//! ```no_run
//! # async fn demo(server: &meridian_daemon::Server) -> anyhow::Result<()> {
//! use meridian_daemon::client::QoS;
//! let mut client = server.client().client_id("app").connect().await?;
//! client.subscribe("sensors/#", QoS::AtLeastOnce).await?;
//! client.publish("sensors/t1", "21.5", QoS::AtLeastOnce, false).await?;
//! let msg = client.recv().await?;
//! assert_eq!(msg.topic, "sensors/t1");
//! # Ok(()) }
//! ```

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use meridian_core::ConnInfo;
pub use meridian_core::codec::QoS;
use meridian_core::codec::{
    self, Ack, Connect, ConnectProperties, Disconnect, Packet, ProtocolVersion, Publish,
    PublishProperties, ReasonCode, Subscribe, SubscribeFilter, SubscribeProperties,
    SubscriptionOptions, Unsubscribe,
};

use crate::mailbox::{ConnEvent, EngineHandle, Outbox, ToEngine};

const V5: ProtocolVersion = ProtocolVersion::V5;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the broker is not running")]
    BrokerGone,
    #[error("the broker closed the connection")]
    Closed,
    #[error("refused with reason {0:#04x}")]
    Refused(u8),
    #[error("malformed packet from the broker: {0}")]
    Protocol(String),
}

/// A message delivered to an in-process client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Received {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
}

/// Settings for [`InProcessClient`]; from [`crate::Server::client`].
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    engine: EngineHandle,
    client_id: String,
    clean_start: bool,
    session_expiry_secs: u32,
    username: Option<String>,
}

impl ClientBuilder {
    pub fn new(engine: EngineHandle) -> Self {
        Self {
            engine,
            client_id: String::new(),
            clean_start: true,
            session_expiry_secs: 0,
            username: None,
        }
    }

    /// Empty (the default) lets the broker assign one.
    pub fn client_id(mut self, id: impl Into<String>) -> Self {
        self.client_id = id.into();
        self
    }

    /// Keep the session after disconnecting, for this long (MQTT 5.0 Session Expiry).
    pub fn persistent(mut self, session_expiry_secs: u32) -> Self {
        self.clean_start = false;
        self.session_expiry_secs = session_expiry_secs;
        self
    }

    pub fn username(mut self, username: impl Into<String>) -> Self {
        self.username = Some(username.into());
        self
    }

    pub async fn connect(self) -> Result<InProcessClient, ClientError> {
        let outbox = Outbox::new();
        let info = ConnInfo {
            remote_addr: Some("in-process".to_owned()),
            ..ConnInfo::default()
        };
        let conn = self
            .engine
            .accept(info, outbox.clone())
            .await
            .ok_or(ClientError::BrokerGone)?;
        let mut client = InProcessClient {
            engine: self.engine,
            conn,
            outbox,
            received: VecDeque::new(),
            buf: BytesMut::new(),
            next_id: 0,
            inbox: VecDeque::new(),
            closed: false,
        };
        client
            .send(&Packet::Connect(Connect {
                protocol: V5,
                clean_start: self.clean_start,
                keep_alive: 0,
                client_id: self.client_id,
                will: None,
                username: self.username,
                password: None,
                properties: ConnectProperties {
                    session_expiry_interval: Some(self.session_expiry_secs),
                    ..ConnectProperties::default()
                },
            }))
            .await?;
        let ack = client
            .wait_for(|p| match p {
                Packet::ConnAck(a) => Some(a.reason),
                _ => None,
            })
            .await?;
        if ack.is_error() {
            return Err(ClientError::Refused(ack.0));
        }
        Ok(client)
    }
}

/// A connected in-process client. Dropping it closes the virtual connection (like a lost
/// network connection: the will, if any, is published); [`InProcessClient::disconnect`] ends it
/// cleanly.
#[derive(Debug)]
pub struct InProcessClient {
    engine: EngineHandle,
    conn: meridian_core::ConnId,
    outbox: std::sync::Arc<Outbox>,
    /// Chunks taken from the outbox, not yet decoded.
    received: VecDeque<Bytes>,
    buf: BytesMut,
    next_id: u16,
    /// Messages that arrived while waiting for an acknowledgement.
    inbox: VecDeque<Received>,
    closed: bool,
}

impl InProcessClient {
    /// Publish; for QoS 1 and 2, returns once the broker acknowledged (and so stored) it.
    pub async fn publish(
        &mut self,
        topic: &str,
        payload: impl Into<Bytes>,
        qos: QoS,
        retain: bool,
    ) -> Result<(), ClientError> {
        let packet_id = (qos != QoS::AtMostOnce).then(|| self.packet_id());
        self.send(&Packet::Publish(Publish {
            dup: false,
            qos,
            retain,
            topic: topic.into(),
            packet_id,
            payload: payload.into(),
            properties: PublishProperties::default(),
        }))
        .await?;
        let Some(id) = packet_id else {
            return Ok(());
        };
        let reason = match qos {
            QoS::AtLeastOnce => {
                self.wait_for(|p| match p {
                    Packet::PubAck(a) if a.packet_id == id => Some(a.reason),
                    _ => None,
                })
                .await?
            }
            _ => {
                let rec = self
                    .wait_for(|p| match p {
                        Packet::PubRec(a) if a.packet_id == id => Some(a.reason),
                        _ => None,
                    })
                    .await?;
                if rec.is_error() {
                    return Err(ClientError::Refused(rec.0));
                }
                self.send(&Packet::PubRel(Ack::new(id))).await?;
                self.wait_for(|p| match p {
                    Packet::PubComp(a) if a.packet_id == id => Some(a.reason),
                    _ => None,
                })
                .await?
            }
        };
        if reason.is_error() {
            return Err(ClientError::Refused(reason.0));
        }
        Ok(())
    }

    /// Subscribe; returns the granted QoS.
    pub async fn subscribe(&mut self, filter: &str, qos: QoS) -> Result<QoS, ClientError> {
        let id = self.packet_id();
        self.send(&Packet::Subscribe(Subscribe {
            packet_id: id,
            filters: vec![SubscribeFilter {
                filter: filter.to_owned(),
                options: SubscriptionOptions {
                    qos,
                    ..SubscriptionOptions::default()
                },
            }],
            properties: SubscribeProperties::default(),
        }))
        .await?;
        let reason = self
            .wait_for(|p| match p {
                Packet::SubAck(a) if a.packet_id == id => a.reasons.first().copied(),
                _ => None,
            })
            .await?;
        match reason.0 {
            0 => Ok(QoS::AtMostOnce),
            1 => Ok(QoS::AtLeastOnce),
            2 => Ok(QoS::ExactlyOnce),
            r => Err(ClientError::Refused(r)),
        }
    }

    pub async fn unsubscribe(&mut self, filter: &str) -> Result<(), ClientError> {
        let id = self.packet_id();
        self.send(&Packet::Unsubscribe(Unsubscribe {
            packet_id: id,
            filters: vec![filter.to_owned()],
            user_properties: Vec::new(),
        }))
        .await?;
        self.wait_for(|p| matches!(p, Packet::UnsubAck(a) if a.packet_id == id).then_some(()))
            .await
    }

    /// The next message for this client (acknowledged to the broker as it is handed out).
    pub async fn recv(&mut self) -> Result<Received, ClientError> {
        loop {
            if let Some(m) = self.inbox.pop_front() {
                return Ok(m);
            }
            let packet = self.next_packet().await?;
            self.on_packet(packet).await?;
        }
    }

    /// DISCONNECT normally (no will) and close.
    pub async fn disconnect(mut self) -> Result<(), ClientError> {
        self.send(&Packet::Disconnect(Disconnect::new(
            ReasonCode::NORMAL_DISCONNECTION,
        )))
        .await?;
        // The broker closes the connection; wait for that so the session state is settled.
        while self.next_packet().await.is_ok() {}
        self.closed = true;
        Ok(())
    }

    fn packet_id(&mut self) -> u16 {
        self.next_id = self.next_id.checked_add(1).unwrap_or(1);
        self.next_id
    }

    async fn send(&mut self, packet: &Packet) -> Result<(), ClientError> {
        let mut out = BytesMut::new();
        codec::encode(packet, V5, &mut out).map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.outbox.handed(out.len());
        self.engine
            .tx
            .send(ToEngine::Conn(ConnEvent::Bytes {
                conn: self.conn,
                data: out.freeze(),
            }))
            .await
            .map_err(|_| ClientError::BrokerGone)
    }

    async fn next_packet(&mut self) -> Result<Packet, ClientError> {
        loop {
            match codec::decode(&mut self.buf, V5, u32::MAX) {
                Ok(Some(p)) => return Ok(p),
                Ok(None) => {}
                Err(e) => return Err(ClientError::Protocol(format!("{e:?}"))),
            }
            let end = self.outbox.take(&mut self.received);
            if self.received.is_empty() {
                if end.is_some() {
                    return Err(ClientError::Closed);
                }
                self.outbox.changed().await;
            }
            for data in self.received.drain(..) {
                self.outbox.written(data.len());
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// Handle a packet that is not what a caller waits for: deliveries and their handshakes.
    async fn on_packet(&mut self, packet: Packet) -> Result<(), ClientError> {
        match packet {
            Packet::Publish(p) => {
                match (p.qos, p.packet_id) {
                    (QoS::AtLeastOnce, Some(id)) => {
                        self.send(&Packet::PubAck(Ack::new(id))).await?;
                    }
                    (QoS::ExactlyOnce, Some(id)) => {
                        self.send(&Packet::PubRec(Ack::new(id))).await?;
                    }
                    _ => {}
                }
                self.inbox.push_back(Received {
                    topic: p.topic,
                    payload: p.payload,
                    qos: p.qos,
                    retain: p.retain,
                });
            }
            Packet::PubRel(a) => self.send(&Packet::PubComp(Ack::new(a.packet_id))).await?,
            Packet::Disconnect(d) => return Err(ClientError::Refused(d.reason.0)),
            _ => {}
        }
        Ok(())
    }

    async fn wait_for<T>(
        &mut self,
        mut want: impl FnMut(&Packet) -> Option<T>,
    ) -> Result<T, ClientError> {
        loop {
            let packet = self.next_packet().await?;
            if let Some(t) = want(&packet) {
                return Ok(t);
            }
            self.on_packet(packet).await?;
        }
    }
}

impl Drop for InProcessClient {
    fn drop(&mut self) {
        if !self.closed {
            let _ = self
                .engine
                .tx
                .try_send(ToEngine::Conn(ConnEvent::Closed { conn: self.conn }));
        }
    }
}
