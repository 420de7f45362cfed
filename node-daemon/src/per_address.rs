//! Connections open at once per client address, bounded: one host cannot take every place a
//! listener has (the admin API's connections, the edge-link listener's handshakes).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};

/// The places taken per address, and how many one address may take.
#[derive(Debug, Clone)]
pub struct PerAddress {
    open: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
    /// Loopback clients (the node's own tools) are not counted.
    exempt_loopback: bool,
}

/// One connection's place, given back when dropped.
#[derive(Debug)]
pub struct AddressSlot(Option<(PerAddress, IpAddr)>);

impl PerAddress {
    /// At most `max` places per address; `exempt_loopback`: loopback addresses take none.
    pub fn new(max: usize, exempt_loopback: bool) -> Self {
        Self {
            open: Arc::default(),
            max,
            exempt_loopback,
        }
    }

    /// A place for one more connection from `ip`, if it has fewer than its bound.
    pub fn take(&self, ip: IpAddr) -> Option<AddressSlot> {
        if self.exempt_loopback && ip.is_loopback() {
            return Some(AddressSlot(None));
        }
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let n = open.entry(ip).or_default();
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(AddressSlot(Some((self.clone(), ip))))
    }
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        if let Some((per_address, ip)) = self.0.take() {
            let mut open = per_address
                .open
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = open.get_mut(&ip) {
                *n -= 1;
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_takes_at_most_its_places_and_gets_them_back() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let places = PerAddress::new(2, false);
        let first = places.take(a).unwrap();
        let _second = places.take(a).unwrap();
        assert!(places.take(a).is_none());
        assert!(places.take(b).is_some(), "another address has its own");
        drop(first);
        assert!(places.take(a).is_some());
        let local: IpAddr = "127.0.0.1".parse().unwrap();
        let counted = PerAddress::new(1, false);
        let _one = counted.take(local).unwrap();
        assert!(counted.take(local).is_none());
        let exempt = PerAddress::new(1, true);
        let _x = exempt.take(local).unwrap();
        assert!(exempt.take(local).is_some());
    }
}
