//! What the broker task logs: the broker's events, and a storage failure that stops it.

use meridian_core::Event;
use tracing::{debug, error, info, warn};

use crate::storage::StorageError;

/// Log what the broker reports.
pub fn event(event: &Event) {
    match event {
        Event::ClientConnected {
            conn,
            client_id,
            username,
            protocol,
            session_present,
        } => info!(
            conn = conn.0,
            client_id,
            username = username.as_deref(),
            protocol = ?protocol,
            session_present,
            "client connected"
        ),
        Event::ConnectRefused {
            conn,
            client_id,
            reason,
        } => {
            info!(conn = conn.0, client_id = client_id.as_deref(), reason = %format!("{:#04x}", reason.0), "connect refused")
        }
        Event::ClientDisconnected {
            conn,
            client_id,
            cause,
        } => info!(conn = conn.0, client_id, cause = ?cause, "client disconnected"),
        Event::ConnectionClosed {
            conn,
            reason,
            detail,
        } => {
            debug!(conn = conn.0, reason = %format!("{:#04x}", reason.0), detail, "connection closed")
        }
        Event::SessionEnded { client_id } => debug!(client_id, "session ended"),
        Event::SessionMoved { client_id, to } => {
            info!(client_id, %to, "session moved to the node that took its client id over")
        }
        Event::SessionArrived { client_id } => {
            info!(client_id, "session arrived from another node")
        }
        Event::RouteAdded { filter } => debug!(filter, "route added"),
        Event::RouteRemoved { filter } => debug!(filter, "route removed"),
        Event::PeerFault { peer, fault } => {
            warn!(%peer, fault = ?fault, "refused a frame from a peer (reported once per peer and kind; counted in peer_frames_refused)")
        }
        Event::PeerForgotten {
            peer,
            reason,
            routes,
            dropped_messages,
        } => {
            info!(%peer, reason = ?reason, routes, dropped_messages, "peer forgotten: its routes withdrawn, what waited for it dropped")
        }
    }
}

/// Log a fatal storage error (the broker stops rather than acknowledge what it cannot store).
pub fn storage_failure(e: &StorageError) {
    error!(error = %e, "storage failure: stopping the broker");
}
