//! What the configuration gives the parts a start builds: the core's cluster configuration,
//! the policy task's settings, a fresh seed.

use meridian_core::broker::{ClusterConfig, HomeRegion, PeerLimits};
use meridian_core::link::OutboxLimits;
use meridian_core::routes::NodeId;

use crate::config::DaemonConfig;
use crate::policy::{PolicySettings, Seed, SeedFiles};

/// What the policy task of a daemon with `config` needs; `peer_id` in cluster mode. The files
/// are read only when there is no saved document yet (they seed it).
pub(super) fn policy_settings(
    config: &DaemonConfig,
    peer_id: Option<String>,
    counters: std::sync::Arc<crate::mailbox::DaemonCounters>,
) -> anyhow::Result<PolicySettings> {
    let data_dir = config.storage.data_dir.clone();
    let files = SeedFiles {
        password_file: config.auth.password_file.clone().into(),
        acl: config.acl.clone(),
        admin_token_file: config.admin.token_file.clone(),
        edge_token_file: config.cluster.edge.token_file.clone(),
    };
    let seed = Seed::read(&data_dir, &files)?;
    Ok(PolicySettings {
        data_dir,
        node: config.node.name.clone(),
        region: if config.cluster.enabled {
            config.cluster.region.clone()
        } else {
            String::new()
        },
        peer_id,
        max_document_bytes: config.policy.max_document_bytes,
        history_retention_ms: config
            .policy
            .history_retention_days
            .saturating_mul(86_400_000),
        compact_after_changes: config.policy.compact_after_changes,
        compact_interval_ms: config.policy.compact_interval_ms,
        node_expiry_ms: config.cluster.peer_expiry_ms,
        seed,
        counters,
        operator_keys: crate::policy::operator::OperatorKeys::parse(&config.policy.operator_keys)?,
    })
}

/// The core's cluster configuration from `[cluster]` (the incarnation is set at start).
pub(super) fn core_cluster_config(
    c: &crate::config::ClusterSection,
    node: NodeId,
) -> ClusterConfig {
    let mut config = ClusterConfig::new(node, 0, c.region.clone());
    config.route_batch_ms = c.route_batch_ms;
    config.digest_interval_ms = c.digest_interval_ms;
    config.tombstone_budget = c.tombstone_budget;
    config.subscribe_fence = c.subscribe_fence;
    config.subscribe_fence_max_ms = c.subscribe_fence_max_ms;
    config.retained_tombstones_max = c.retained_tombstones_max;
    config.outbox = OutboxLimits {
        window: c.outbox_window,
        max_messages: c.outbox_max_messages,
        max_bytes: c.outbox_max_bytes,
    };
    config.outbox_stall_ms = c.outbox_stall_ms;
    config.peer_expiry_ms = c.peer_expiry_ms;
    config.leaf_expiry_ms = c.edge.leaf_expiry_ms;
    config.leaf_max_filters = c.edge.max_filters;
    config.max_nodes = c.max_nodes;
    // What this node wants stays within what it takes from a peer, which is what its peers,
    // configured alike, take from it.
    config.max_route_filters = c.peer_max_filters;
    config.max_clock_drift_ms = c.max_clock_drift_ms;
    config.peer_limits = PeerLimits {
        max_filters: c.peer_max_filters,
        max_pending_delta_bytes: c.peer_max_pending_delta_bytes,
        max_snapshot_bytes: c.peer_max_snapshot_bytes,
        max_retained_messages: c.peer_max_retained_messages,
        max_retained_bytes: c.peer_max_retained_bytes,
        max_claims: c.peer_max_claims,
        max_claim_bytes: c.peer_max_claim_bytes,
        max_transfer_bytes: c.peer_max_transfer_bytes,
    };
    config.session_transfer_wait_ms = c.session_transfer_wait_ms;
    config.session_order_wait_ms = c.session_order_wait_ms;
    config.home_regions = c
        .home
        .iter()
        .map(|h| HomeRegion {
            client_ids: h.client_ids.clone(),
            region: h.region.clone(),
        })
        .collect();
    config.home_wait_ms = c.home_wait_ms;
    config
}

/// 64 bits that differ between starts: OS-seeded hasher keys mixed with the time and pid.
pub(super) fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cluster_section_is_the_cores_default() {
        let config = crate::DaemonConfig::parse(crate::DEFAULT_CONFIG, "default").unwrap();
        let node = NodeId::new("n").unwrap();
        let from_file = core_cluster_config(&config.cluster, node.clone());
        assert_eq!(from_file, ClusterConfig::new(node, 0, "local"));
    }
}
