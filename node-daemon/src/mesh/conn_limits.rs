//! How many p2p connections strangers can make a node hold: every connection in, from
//! handshake to close, counts against its source address (IPv4, or the IPv6 /64), at most
//! `cluster.max_peer_connections_per_address`; libp2p's own limits hold the totals
//! (`cluster.max_peer_connections` established, a quarter of that mid-handshake). A
//! connection past a bound is refused before its handshake costs anything more, and counted
//! (`meridian_p2p_refused_connections_total{reason="limit"}`).

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::task::{Context, Poll};

use libp2p::core::Endpoint;
use libp2p::core::transport::PortUse;
use libp2p::multiaddr::Protocol;
use libp2p::swarm::{
    ConnectionClosed, ConnectionDenied, ConnectionId, FromSwarm, ListenFailure, NetworkBehaviour,
    THandler, THandlerInEvent, THandlerOutEvent, ToSwarm, dummy,
};
use libp2p::{Multiaddr, PeerId};

/// Why a connection was refused: its address holds its share.
#[derive(Debug, thiserror::Error)]
#[error("{address} holds {max} p2p connections already (cluster.max_peer_connections_per_address)")]
pub struct AddressFull {
    address: IpAddr,
    max: usize,
}

/// Counts the connections in per source address and refuses those past `max`.
#[derive(Debug)]
pub struct PerAddress {
    max: usize,
    by_address: HashMap<IpAddr, usize>,
    of: HashMap<ConnectionId, IpAddr>,
}

impl PerAddress {
    pub fn new(max: usize) -> Self {
        Self {
            max,
            by_address: HashMap::new(),
            of: HashMap::new(),
        }
    }

    fn release(&mut self, id: ConnectionId) {
        if let Some(address) = self.of.remove(&id)
            && let Some(n) = self.by_address.get_mut(&address)
        {
            *n -= 1;
            if *n == 0 {
                self.by_address.remove(&address);
            }
        }
    }
}

/// The address a connection comes from, as one host: an IPv4 address, or an IPv6 /64.
pub(super) fn source(addr: &Multiaddr) -> Option<IpAddr> {
    addr.iter().find_map(|p| match p {
        Protocol::Ip4(ip) => Some(IpAddr::V4(ip)),
        Protocol::Ip6(ip) => Some(match ip.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(ip) & !((1u128 << 64) - 1)).into()),
        }),
        _ => None,
    })
}

impl NetworkBehaviour for PerAddress {
    type ConnectionHandler = dummy::ConnectionHandler;
    type ToSwarm = Infallible;

    fn handle_pending_inbound_connection(
        &mut self,
        id: ConnectionId,
        _local: &Multiaddr,
        remote: &Multiaddr,
    ) -> Result<(), ConnectionDenied> {
        let Some(address) = source(remote) else {
            return Ok(());
        };
        let n = self.by_address.entry(address).or_default();
        if *n >= self.max {
            return Err(ConnectionDenied::new(AddressFull {
                address,
                max: self.max,
            }));
        }
        *n += 1;
        self.of.insert(id, address);
        Ok(())
    }

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(dummy::ConnectionHandler)
    }

    fn on_swarm_event(&mut self, event: FromSwarm) {
        match event {
            FromSwarm::ConnectionClosed(ConnectionClosed { connection_id, .. })
            | FromSwarm::ListenFailure(ListenFailure { connection_id, .. }) => {
                self.release(connection_id);
            }
            _ => {}
        }
    }

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, _: &mut Context<'_>) -> Poll<ToSwarm<Self::ToSwarm, THandlerInEvent<Self>>> {
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_count_against_their_host_until_they_end() {
        let mut limits = PerAddress::new(2);
        let local: Multiaddr = "/ip4/127.0.0.1/tcp/7000".parse().unwrap();
        let a: Multiaddr = "/ip4/10.0.0.1/tcp/5000".parse().unwrap();
        let a2: Multiaddr = "/ip4/10.0.0.1/tcp/5001".parse().unwrap();
        let b: Multiaddr = "/ip6/2001:db8::1/tcp/5000".parse().unwrap();
        let b_same_64: Multiaddr = "/ip6/2001:db8::ffff/tcp/5000".parse().unwrap();
        let ids: Vec<ConnectionId> = (0..6)
            .map(|_| ConnectionId::new_unchecked(rand_id()))
            .collect();
        assert!(
            limits
                .handle_pending_inbound_connection(ids[0], &local, &a)
                .is_ok()
        );
        assert!(
            limits
                .handle_pending_inbound_connection(ids[1], &local, &a2)
                .is_ok()
        );
        assert!(
            limits
                .handle_pending_inbound_connection(ids[2], &local, &a)
                .is_err()
        );
        assert!(
            limits
                .handle_pending_inbound_connection(ids[3], &local, &b)
                .is_ok()
        );
        assert!(
            limits
                .handle_pending_inbound_connection(ids[4], &local, &b_same_64)
                .is_ok()
        );
        assert!(
            limits
                .handle_pending_inbound_connection(ids[5], &local, &b)
                .is_err()
        );
        limits.release(ids[0]);
        assert!(
            limits
                .handle_pending_inbound_connection(ids[2], &local, &a)
                .is_ok()
        );
        // A refused connection was never counted: releasing it changes nothing.
        limits.release(ids[5]);
        assert_eq!(limits.by_address.values().sum::<usize>(), 4);
    }

    fn rand_id() -> usize {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    }
}
