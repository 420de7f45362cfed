//! The hash of a live route set, identical on every node and every build: FNV-1a (64 bit) per
//! filter, combined with XOR so that it does not depend on order and updates in O(1) per change.

/// FNV-1a of one filter pattern. Never zero, so that a set's hash changes with every member.
pub fn filter_hash(filter: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in filter.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// The hash of a set of filter patterns.
pub fn set_hash<'a>(filters: impl IntoIterator<Item = &'a str>) -> u64 {
    filters.into_iter().fold(0, |h, f| h ^ filter_hash(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_hash_ignores_order_and_tracks_membership() {
        assert_eq!(set_hash(["a/#", "b/+", "c"]), set_hash(["c", "a/#", "b/+"]));
        assert_ne!(set_hash(["a/#", "b/+"]), set_hash(["a/#"]));
        assert_eq!(set_hash([]), 0);
        // Known FNV-1a value, so that every build agrees.
        assert_eq!(filter_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }
}
