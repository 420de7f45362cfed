//! What the broker hands back to the shell, as plain JS objects.

use meridian_core::broker::{
    ClientSummary, DisconnectCause, Durability, FigureValue, RestoreReport, Stats,
};
use meridian_core::link::EncodedFrame;
use meridian_core::routes::NodeId;
use meridian_core::{ConnId, Event, Output};
use wasm_bindgen::JsValue;

use crate::glue;
use crate::js::{self, Obj};
use crate::packet::version_level;

pub(crate) fn conn(id: ConnId) -> JsValue {
    js::num(id.0)
}

/// `{ type: "send", conn, data }`, `{ type: "close", conn }`,
/// `{ type: "persist", key, value, durability }`
/// `{ type: "event", event }`, or in cluster mode `{ type: "toPeer", peer, frame }` and
/// `{ type: "broadcast", frame }`.
pub(crate) fn output(o: &Output) -> JsValue {
    match o {
        // The two outputs of every packet: built by JS object literals (see `glue`).
        Output::Send { conn: c, data } => glue::send_output(c.0 as f64, data),
        Output::Close { conn: c } => glue::close_output(c.0 as f64),
        Output::Persist {
            key,
            value,
            durability,
        } => {
            let obj = Obj::tagged("persist");
            obj.set("key", js::u8array(key))
                .set(
                    "value",
                    value.as_ref().map_or(JsValue::NULL, |v| js::u8array(v)),
                )
                .set(
                    "durability",
                    match durability {
                        Durability::Now => "now",
                        Durability::WithNext => "withNext",
                    },
                );
            obj.into_js()
        }
        Output::Event(e) => {
            let obj = Obj::tagged("event");
            obj.set("event", event(e));
            obj.into_js()
        }
        Output::ToPeer { peer, frame } => frame_output("toPeer", Some(peer), frame),
        Output::Broadcast { frame } => frame_output("broadcast", None, frame),
        Output::CutPeer { peer } => {
            let o = Obj::tagged("cutPeer");
            o.set("peer", peer.as_str());
            o.into_js()
        }
    }
}

fn opt_str(s: Option<&str>) -> JsValue {
    s.map_or(JsValue::NULL, JsValue::from_str)
}

/// A broker event, tagged by `type` in camelCase.
pub(crate) fn event(e: &Event) -> JsValue {
    match e {
        Event::ClientConnected {
            conn: c,
            client_id,
            username,
            protocol,
            session_present,
        } => {
            let o = Obj::tagged("clientConnected");
            o.set("conn", conn(*c))
                .set("clientId", client_id.as_str())
                .set("username", opt_str(username.as_deref()))
                .set("protocolVersion", version_level(*protocol))
                .set("sessionPresent", *session_present);
            o.into_js()
        }
        Event::ConnectRefused {
            conn: c,
            client_id,
            reason,
        } => {
            let o = Obj::tagged("connectRefused");
            o.set("conn", conn(*c))
                .set("clientId", opt_str(client_id.as_deref()))
                .set("reasonCode", reason.0)
                .set("reason", reason.name());
            o.into_js()
        }
        Event::ClientDisconnected {
            conn: c,
            client_id,
            cause,
        } => {
            let o = Obj::tagged("clientDisconnected");
            let (kind, reason) = match cause {
                DisconnectCause::ByClient(r) => ("client", Some(r)),
                DisconnectCause::ConnectionLost => ("connectionLost", None),
                DisconnectCause::ByServer(r) => ("server", Some(r)),
            };
            o.set("conn", conn(*c))
                .set("clientId", client_id.as_str())
                .set("cause", kind)
                .set(
                    "reasonCode",
                    reason.map_or(JsValue::NULL, |r| JsValue::from(r.0)),
                )
                .set("reason", opt_str(reason.map(|r| r.name())))
                .set("publishesWill", cause.publishes_will());
            o.into_js()
        }
        Event::ConnectionClosed {
            conn: c,
            reason,
            detail,
        } => {
            let o = Obj::tagged("connectionClosed");
            o.set("conn", conn(*c))
                .set("reasonCode", reason.0)
                .set("reason", reason.name())
                .set("detail", *detail);
            o.into_js()
        }
        Event::SessionEnded { client_id } => {
            let o = Obj::tagged("sessionEnded");
            o.set("clientId", client_id.as_str());
            o.into_js()
        }
        Event::SessionMoved { client_id, to } => {
            let o = Obj::tagged("sessionMoved");
            o.set("clientId", client_id.as_str()).set("to", to.as_str());
            o.into_js()
        }
        Event::SessionArrived { client_id } => {
            let o = Obj::tagged("sessionArrived");
            o.set("clientId", client_id.as_str());
            o.into_js()
        }
        Event::RouteAdded { filter } => {
            let o = Obj::tagged("routeAdded");
            o.set("filter", filter.as_str());
            o.into_js()
        }
        Event::RouteRemoved { filter } => {
            let o = Obj::tagged("routeRemoved");
            o.set("filter", filter.as_str());
            o.into_js()
        }
        Event::PeerFault { peer, fault } => {
            let o = Obj::tagged("peerFault");
            o.set("peer", peer.as_str())
                .set("fault", format!("{fault:?}").as_str());
            o.into_js()
        }
        Event::PeerForgotten {
            peer,
            reason,
            routes,
            dropped_messages,
        } => {
            let o = Obj::tagged("peerForgotten");
            o.set("peer", peer.as_str())
                .set("reason", format!("{reason:?}").as_str())
                .set("routes", *routes as f64)
                .set("droppedMessages", *dropped_messages as f64);
            o.into_js()
        }
    }
}

/// Every figure of [`Stats`] (its table, [`Stats::FIGURES`]), named in camel case:
/// `droppedQueueFull`; figures by QoS as arrays of three.
pub(crate) fn stats(s: &Stats) -> JsValue {
    let o = Obj::new();
    for (figure, value) in s.figures() {
        let value = match value {
            FigureValue::One(n) => js::num(n),
            FigureValue::ByQos(by_qos) => js::array(by_qos.iter().map(|&n| js::num(n))),
        };
        o.set_named(&crate::config::camel(figure.field), value);
    }
    o.into_js()
}

pub(crate) fn client(c: &ClientSummary) -> JsValue {
    let o = Obj::new();
    o.set("clientId", c.client_id.as_str())
        .set("username", opt_str(c.username.as_deref()))
        .set("protocolVersion", version_level(c.protocol))
        .set("connected", c.connected)
        .set("conn", c.conn.map_or(JsValue::NULL, conn))
        .set(
            "subscriptions",
            js::array(c.subscriptions.iter().map(|(filter, qos)| {
                let s = Obj::new();
                s.set("filter", filter.as_str()).set("qos", *qos as u8);
                s.into_js()
            })),
        )
        .set("inflight", c.inflight)
        .set("queued", c.queued)
        .set("congested", c.congested);
    o.into_js()
}

pub(crate) fn restore_report(r: &RestoreReport) -> JsValue {
    let o = Obj::new();
    o.set("sessions", r.sessions)
        .set("subscriptions", r.subscriptions)
        .set("messages", r.messages)
        .set("retained", r.retained)
        .set(
            "unreadable",
            js::array(r.unreadable.iter().map(|(key, e)| {
                let u = Obj::new();
                u.set("key", js::u8array(key))
                    .set("kind", e.kind)
                    .set("detail", e.detail);
                u.into_js()
            })),
        );
    o.into_js()
}

/// A frame the core produced, as the bytes to write to a link (the core encoded it).
fn frame_output(ty: &'static str, peer: Option<&NodeId>, frame: &EncodedFrame) -> JsValue {
    let o = Obj::tagged(ty);
    o.opt("peer", peer.map(NodeId::as_str))
        .set("frame", js::u8array(frame.bytes()));
    o.into_js()
}
