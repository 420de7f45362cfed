//! Home regions: client ids pinned to a region, for deployments that want one node serving a
//! client at any moment, at the cost of a round trip on CONNECT.
//!
//! A client id that matches a pattern of [`ClusterConfig::home_regions`] is decided by one
//! node of its home region: the one with the smallest node id among the nodes of that region
//! this node reaches (itself included). A node the client connects to asks it
//! ([`Frame::ClaimRequest`]) and answers CONNACK only once it granted. Before granting, the
//! deciding node has the node that serves the client now close its connection
//! ([`Frame::Revoke`], answered [`Frame::Revoked`]); if that node cannot be reached, or the
//! home region cannot, the client is refused with 0x88 (Server unavailable; 3.1.1: return
//! code 3) rather than served twice. A client of another user is refused with 0x87. Once
//! granted, the client's claim and its session follow as for any other client
//! ([`super::claims`]).
//!
//! [`ClusterConfig::home_regions`]: super::ClusterConfig::home_regions

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::broker::connect::HomeGranted;
use crate::broker::connection::{ConnState, HomeWait};
use crate::broker::io::{ConnId, DisconnectCause, Timestamp};
use crate::broker::{Authenticator, Authorizer, Broker, Timer};
use crate::codec::{Connect, ReasonCode};
use crate::link::{Claim, Frame, FrameKind};
use crate::retained::Hlc;

use super::trust::PeerFault;
use crate::routes::NodeId;

/// Client ids pinned to a region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HomeRegion {
    /// A client-id pattern: `*` stands for any run of characters (`plant-eu-*`).
    pub client_ids: String,
    /// The region that decides who serves those clients.
    pub region: String,
}

impl HomeRegion {
    /// Whether `client_id` matches the pattern.
    pub fn covers(&self, client_id: &str) -> bool {
        glob(&self.client_ids, client_id)
    }
}

/// Whether `text` matches `pattern`, where `*` stands for any run of characters.
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or("");
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        // No `*`: the whole text is the pattern.
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// Revocations a deciding node waits for at once; past it, requests get 0x89 (Server busy).
const REVOKING_MAX: usize = 100_000;

/// A grant the deciding node waits to give: the node serving the client must close first.
#[derive(Debug)]
struct Revoking {
    requester: NodeId,
    client_id: String,
    request_token: u64,
    /// The node asked to close the client's connection.
    holder: NodeId,
    deadline: Timestamp,
}

/// What the deciding node of a home region keeps.
#[derive(Debug, Default)]
pub(super) struct Homes {
    /// Revocations waited for, by token.
    revoking: BTreeMap<u64, Revoking>,
    /// Grants given whose claim has not arrived yet: client id → (node, until).
    granted: BTreeMap<String, (NodeId, Timestamp)>,
    next_token: u64,
}

impl<A: Authenticator, Z: Authorizer> Broker<A, Z> {
    /// The home region of `client_id`, if it is pinned to one.
    pub(in crate::broker) fn home_region_of(&self, client_id: &str) -> Option<String> {
        let c = self.cluster.as_ref()?;
        c.config
            .home_regions
            .iter()
            .find(|h| h.covers(client_id))
            .map(|h| h.region.clone())
    }

    /// The node that decides for `region`'s clients, as this node sees it.
    fn home_authority(&self, region: &str) -> Option<NodeId> {
        let c = self.cluster.as_ref()?;
        let me = (c.config.region == region).then(|| c.owner.node.clone());
        let peers = c.peers.iter().filter(|(n, p)| {
            p.connected && !c.leaves.is_leaf(n) && p.region.as_deref() == Some(region)
        });
        me.into_iter().chain(peers.map(|(n, _)| n.clone())).min()
    }

    /// A CONNECT whose client id is pinned to `region` waits for that region's grant:
    /// CONNACK comes with the answer.
    pub(in crate::broker) fn wait_for_home(
        &mut self,
        conn: ConnId,
        connect: Connect,
        assigned: bool,
        username: Option<String>,
        region: &str,
    ) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let token = c.homes.next_token;
        c.homes.next_token += 1;
        let deadline = now.plus_ms(c.config.home_wait_ms);
        let client_id = connect.client_id.clone();
        let user = username.clone();
        let proof = self.authenticator.claim_proof(conn, &client_id);
        let authority = self.home_authority(region);
        let me = self.node_id().cloned();
        let Some(conn_state) = self.conns.get_mut(&conn) else {
            return;
        };
        conn_state.state = ConnState::AwaitingHome(Box::new(HomeWait {
            connect,
            assigned,
            username,
            token,
            authority: authority.clone().filter(|a| Some(a) != me.as_ref()),
            proof: proof.clone(),
        }));
        self.timers.insert((deadline, Timer::HomeAnswer(conn)));
        match authority {
            None => self.home_answered(conn, token, ReasonCode::SERVER_UNAVAILABLE.0, None),
            Some(authority) => {
                if Some(&authority) == me.as_ref() {
                    self.decide_home(authority, client_id, user, token);
                } else {
                    self.send_to_peer(
                        authority,
                        Frame::ClaimRequest {
                            client_id,
                            user,
                            proof,
                            token,
                        },
                    );
                }
            }
        }
    }

    /// The deciding node's answer for the connection waiting with `token`: CONNACK now.
    pub(super) fn home_answered(&mut self, conn: ConnId, token: u64, reason: u8, hlc: Option<Hlc>) {
        let now = self.now;
        let Some(state) = self.conns.get_mut(&conn) else {
            return;
        };
        let ConnState::AwaitingHome(w) = &state.state else {
            return;
        };
        if w.token != token {
            return;
        }
        let ConnState::AwaitingHome(w) = std::mem::replace(&mut state.state, ConnState::Closed)
        else {
            return;
        };
        let w = *w;
        if reason != 0 {
            self.stats.connects_home_refused += 1;
            return self.refuse(conn, Some(w.connect.client_id), ReasonCode(reason));
        }
        if let (Some(c), Some(hlc)) = (&mut self.cluster, hlc) {
            c.hlc.observe(hlc, now.as_millis());
        }
        let granted = HomeGranted { proof: w.proof };
        self.complete_connect(conn, w.connect, w.assigned, w.username, Some(granted));
        // Packets the client pipelined after CONNECT were held back: handle them now, or
        // they would wait for the client's next bytes (a PUBLISH for its acknowledgement).
        self.on_bytes(conn, &[]);
    }

    /// A connection still waiting for its home region when the wait is over is refused.
    pub(in crate::broker) fn home_wait_over(&mut self, conn: ConnId) {
        let token = match self.conns.get(&conn).map(|c| &c.state) {
            Some(ConnState::AwaitingHome(w)) => w.token,
            _ => return,
        };
        self.home_answered(conn, token, ReasonCode::SERVER_UNAVAILABLE.0, None);
    }

    /// `peer` asks whether it may serve `client_id`.
    pub(super) fn on_claim_request(
        &mut self,
        peer: &NodeId,
        client_id: String,
        user: Option<String>,
        proof: Option<Bytes>,
        token: u64,
    ) {
        // Only a pinned client id's home region decides it: a request for another client id,
        // or to a node outside its home region, is no request a node makes.
        let ours = self.home_region_of(&client_id).is_some_and(|region| {
            self.cluster
                .as_ref()
                .is_some_and(|c| c.config.region == region)
        });
        if !ours {
            return self.peer_fault(peer, PeerFault::NotOwner(FrameKind::ClaimRequest));
        }
        // As a claim: only with the authorizer's word that the client logged in there as the
        // user it names (with operator keys, a proof), or any member could have any pinned
        // client's connection closed.
        let claim = Claim {
            user,
            resume: true,
            persistent: true,
            proof,
        };
        if !self.authorizer.vouches(&client_id, peer, &claim) {
            self.stats.claims_unproven += 1;
            self.peer_fault(peer, PeerFault::NotOwner(FrameKind::ClaimRequest));
            return self.answer_home(peer, client_id, token, ReasonCode::NOT_AUTHORIZED.0);
        }
        self.decide_home(peer.clone(), client_id, claim.user, token);
    }

    /// Decide whether `requester` may serve `client_id` now: another user's client id is
    /// refused; the node serving it now is made to close its connection first.
    fn decide_home(
        &mut self,
        requester: NodeId,
        client_id: String,
        user: Option<String>,
        token: u64,
    ) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let me = c.owner.node.clone();
        c.homes.granted.retain(|_, (_, until)| *until > now);
        if self.claim_refuses_for(&requester, &client_id, user.as_deref()) {
            return self.answer_home(&requester, client_id, token, ReasonCode::NOT_AUTHORIZED.0);
        }
        let Some(c) = &mut self.cluster else { return };
        // Who serves it now: a grant not claimed yet, or the live claim.
        let granted = c
            .homes
            .granted
            .get(&client_id)
            .filter(|(_, until)| *until > now)
            .map(|(n, _)| n.clone());
        let holder = granted.or_else(|| c.claims.live(&client_id).map(|(s, _)| s.node.clone()));
        match holder {
            Some(holder) if holder != requester && holder != me => {
                if c.homes.revoking.len() >= REVOKING_MAX {
                    return self.answer_home(
                        &requester,
                        client_id,
                        token,
                        ReasonCode::SERVER_BUSY.0,
                    );
                }
                if !c.peers.get(&holder).is_some_and(|p| p.connected) {
                    // It may be serving the client still: no second owner.
                    return self.answer_home(
                        &requester,
                        client_id,
                        token,
                        ReasonCode::SERVER_UNAVAILABLE.0,
                    );
                }
                let revoke = c.homes.next_token;
                c.homes.next_token += 1;
                let deadline = now.plus_ms(c.config.home_wait_ms);
                c.homes.revoking.insert(
                    revoke,
                    Revoking {
                        requester,
                        client_id: client_id.clone(),
                        request_token: token,
                        holder: holder.clone(),
                        deadline,
                    },
                );
                self.timers.insert((deadline, Timer::HomeRevoke));
                self.send_to_peer(
                    holder,
                    Frame::Revoke {
                        client_id,
                        token: revoke,
                    },
                );
            }
            _ => {
                // Nobody, the requester itself, or this node (which closes its own first).
                if holder.as_ref() == Some(&me) && requester != me {
                    self.revoke_here(&client_id);
                }
                self.grant_home(requester, client_id, token);
            }
        }
    }

    fn grant_home(&mut self, requester: NodeId, client_id: String, token: u64) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let until = now.plus_ms(c.config.home_wait_ms);
        c.homes
            .granted
            .insert(client_id.clone(), (requester.clone(), until));
        self.answer_home(&requester, client_id, token, 0);
    }

    fn answer_home(&mut self, requester: &NodeId, client_id: String, token: u64, reason: u8) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let hlc = c.hlc.tick(now.as_millis());
        if *requester == c.owner.node {
            // The connection waiting here: find it by its token.
            let conn = self.conns.iter().find_map(|(id, conn)| match &conn.state {
                ConnState::AwaitingHome(w) if w.token == token => Some(*id),
                _ => None,
            });
            if let Some(conn) = conn {
                self.home_answered(conn, token, reason, Some(hlc));
            }
        } else {
            self.send_to_peer(
                requester.clone(),
                Frame::ClaimAnswer {
                    client_id,
                    token,
                    reason,
                    hlc,
                },
            );
        }
    }

    /// The deciding node's answer to a request of this node's (from the node asked only).
    pub(super) fn on_claim_answer(&mut self, peer: &NodeId, token: u64, reason: u8, hlc: Hlc) {
        // The clock reading moves this node's clock: one far ahead is refused, as for claims
        // and retained writes (the client waits for the wait to run out).
        let now = self.now;
        if let Some(c) = &self.cluster
            && hlc.wall_ms.saturating_sub(now.as_millis()) > c.config.max_clock_drift_ms
        {
            return self.peer_fault(peer, PeerFault::ClockAhead);
        }
        let conn = self.conns.iter().find_map(|(id, conn)| match &conn.state {
            ConnState::AwaitingHome(w)
                if w.token == token && w.authority.as_ref() == Some(peer) =>
            {
                Some(*id)
            }
            _ => None,
        });
        if let Some(conn) = conn {
            self.home_answered(conn, token, reason, Some(hlc));
        }
    }

    /// Close this node's connection of `client_id`, if it has one (its session stays).
    fn revoke_here(&mut self, client_id: &str) {
        let conn = self
            .by_client_id
            .get(client_id)
            .and_then(|&sid| self.session(sid)?.conn);
        if let Some(conn) = conn {
            self.close_conn(
                conn,
                DisconnectCause::ByServer(ReasonCode::SESSION_TAKEN_OVER),
            );
        }
    }

    /// The deciding node of `client_id`'s home region has another node serve it next.
    pub(super) fn on_revoke(&mut self, peer: &NodeId, client_id: String, token: u64) {
        // Only a node of a pinned client id's home region (the region it named on its link)
        // closes its connection here. Which of them decides may look different from here
        // while links are cut, so any of them may.
        let from_home = self.home_region_of(&client_id).is_some_and(|region| {
            self.cluster.as_ref().is_some_and(|c| {
                c.peers.get(peer).is_some_and(|p| {
                    !c.leaves.is_leaf(peer) && p.region.as_deref() == Some(&region)
                })
            })
        });
        if !from_home {
            return self.peer_fault(peer, PeerFault::NotOwner(FrameKind::Revoke));
        }
        self.revoke_here(&client_id);
        self.send_to_peer(peer.clone(), Frame::Revoked { client_id, token });
    }

    /// The node that served a client closed its connection: the waiting request is granted.
    pub(super) fn on_revoked(&mut self, peer: &NodeId, token: u64) {
        let Some(c) = &mut self.cluster else { return };
        if c.homes
            .revoking
            .get(&token)
            .is_none_or(|r| r.holder != *peer)
        {
            return;
        }
        let Some(r) = c.homes.revoking.remove(&token) else {
            return;
        };
        self.grant_home(r.requester, r.client_id, r.request_token);
    }

    /// Revocations not answered in time: their requests are refused (the holder may serve
    /// the client still).
    pub(in crate::broker) fn home_revokes_over(&mut self) {
        let now = self.now;
        let Some(c) = &mut self.cluster else { return };
        let late: Vec<u64> = c
            .homes
            .revoking
            .iter()
            .filter(|(_, r)| r.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for token in late {
            let Some(c) = &mut self.cluster else { return };
            if let Some(r) = c.homes.revoking.remove(&token) {
                self.answer_home(
                    &r.requester,
                    r.client_id,
                    r.request_token,
                    ReasonCode::SERVER_UNAVAILABLE.0,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn patterns_match_runs_of_characters() {
        assert!(glob("plant-eu-*", "plant-eu-7"));
        assert!(glob("plant-eu-*", "plant-eu-"));
        assert!(!glob("plant-eu-*", "plant-us-7"));
        assert!(glob("*-eu-*", "plant-eu-7"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("a*b*c", "aXXcYYb"));
        assert!(glob("exact", "exact"));
        assert!(!glob("exact", "exactly"));
        assert!(glob("*", ""));
    }
}
