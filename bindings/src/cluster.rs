//! The broker as a node of a deployment, for JavaScript shells: peer links carry the core's
//! link frames as bytes.
//!
//! `enableCluster` once, then per peer link: `handlePeerUp`, `handlePeerBytes` for what the
//! link delivers (whole frames or any pieces of the stream), `handlePeerDown`. Outputs
//! `{ type: "toPeer", peer, frame }` and `{ type: "broadcast", frame }` are frames to write to
//! one peer's link or to every peer's. Frames are self-delimiting (a 4-byte length prefix),
//! so a byte stream and a message transport (one WebSocket message per frame) both work.

use bytes::BytesMut;
use meridian_core::Input;
use meridian_core::broker::{ClusterConfig, HomeRegion, PeerSummary};
use meridian_core::link::{DEFAULT_MAX_FRAME_LEN, FrameReader};
use meridian_core::routes::NodeId;
use wasm_bindgen::prelude::*;

use crate::broker::{JsBroker, now};
use crate::js::{self, Fields, Obj};

fn node_id(value: &JsValue, what: &str) -> Result<NodeId, JsValue> {
    let s = js::string(value, what)?;
    NodeId::new(&s).map_err(|e| js::type_error(&format!("{what}: {e}")))
}

/// `ClusterConfig` (see `types.d.ts`) to the core's.
fn cluster_config(value: &JsValue) -> Result<ClusterConfig, JsValue> {
    let mut f = Fields::new(value, "cluster")?;
    let node_path = f.path_of("node");
    let node = node_id(&f.required("node")?, &node_path)?;
    let inc_path = f.path_of("incarnation");
    let incarnation = js::uint(&f.required("incarnation")?, js::MAX_SAFE_INTEGER, &inc_path)?;
    let region_path = f.path_of("region");
    let region = js::string(&f.required("region")?, &region_path)?;
    let mut c = ClusterConfig::new(node, incarnation, region);
    if let Some(ms) = f.uint("routeBatchMs", js::MAX_SAFE_INTEGER)? {
        c.route_batch_ms = ms;
    }
    if let Some(ms) = f.uint("digestIntervalMs", js::MAX_SAFE_INTEGER)? {
        c.digest_interval_ms = ms;
    }
    if let Some(n) = f.usize("tombstoneBudget")? {
        c.tombstone_budget = n;
    }
    if let Some(n) = f.usize("snapshotChunkFilters")? {
        c.snapshot_chunk_filters = n;
    }
    if let Some(n) = f.usize("outboxWindow")? {
        c.outbox.window = n;
    }
    if let Some(n) = f.usize("outboxMaxMessages")? {
        c.outbox.max_messages = n;
    }
    if let Some(n) = f.usize("outboxMaxBytes")? {
        c.outbox.max_bytes = n;
    }
    if let Some(ms) = f.uint("outboxStallMs", js::MAX_SAFE_INTEGER)? {
        c.outbox_stall_ms = ms;
    }
    if let Some(n) = f.usize("maxNodes")? {
        c.max_nodes = n;
    }
    if let Some(ms) = f.uint("peerExpiryMs", js::MAX_SAFE_INTEGER)? {
        c.peer_expiry_ms = ms;
    }
    if let Some(ms) = f.uint("leafExpiryMs", js::MAX_SAFE_INTEGER)? {
        c.leaf_expiry_ms = ms;
    }
    if let Some(n) = f.usize("leafMaxFilters")? {
        c.leaf_max_filters = n;
    }
    if let Some(n) = f.usize("maxRouteFilters")? {
        c.max_route_filters = n;
    }
    if let Some(ms) = f.uint("maxClockDriftMs", js::MAX_SAFE_INTEGER)? {
        c.max_clock_drift_ms = ms;
    }
    if let Some(ms) = f.uint("sessionTransferWaitMs", js::MAX_SAFE_INTEGER)? {
        c.session_transfer_wait_ms = ms;
    }
    if let Some(ms) = f.uint("sessionOrderWaitMs", js::MAX_SAFE_INTEGER)? {
        c.session_order_wait_ms = ms;
    }
    if let Some(ms) = f.uint("homeWaitMs", js::MAX_SAFE_INTEGER)? {
        c.home_wait_ms = ms;
    }
    let homes_path = f.path_of("homeRegions");
    if let Some(homes) = f.get("homeRegions")? {
        for (i, home) in js::elements(&homes, &homes_path)?.iter().enumerate() {
            let mut h = Fields::new(home, format!("{homes_path}[{i}]"))?;
            let ids_path = h.path_of("clientIds");
            let region_path = h.path_of("region");
            c.home_regions.push(HomeRegion {
                client_ids: js::string(&h.required("clientIds")?, &ids_path)?,
                region: js::string(&h.required("region")?, &region_path)?,
            });
            h.finish()?;
        }
    }
    let limits = &mut c.peer_limits;
    for (name, field) in [
        ("peerMaxFilters", &mut limits.max_filters),
        (
            "peerMaxPendingDeltaBytes",
            &mut limits.max_pending_delta_bytes,
        ),
        ("peerMaxSnapshotBytes", &mut limits.max_snapshot_bytes),
        ("peerMaxRetainedMessages", &mut limits.max_retained_messages),
        ("peerMaxRetainedBytes", &mut limits.max_retained_bytes),
        ("peerMaxClaims", &mut limits.max_claims),
        ("peerMaxClaimBytes", &mut limits.max_claim_bytes),
        ("peerMaxTransferBytes", &mut limits.max_transfer_bytes),
    ] {
        if let Some(n) = f.usize(name)? {
            *field = n;
        }
    }
    f.finish()?;
    Ok(c)
}

fn peer_summary(p: &PeerSummary) -> JsValue {
    let o = Obj::new();
    o.set("node", p.node.as_str())
        .set("connected", p.connected)
        .set(
            "region",
            p.region.as_deref().map_or(JsValue::NULL, JsValue::from_str),
        )
        .set("incarnation", js::num(p.incarnation))
        .set("routes", p.routes)
        .set("routeVersion", js::num(p.route_version))
        .set("announcedVersion", js::num(p.announced_version))
        .set("outboxMessages", p.outbox_messages)
        .set("outboxBytes", p.outbox_bytes)
        .set("forwardedTo", js::num(p.forwarded_to))
        .set("forwardedFrom", js::num(p.forwarded_from))
        .set("leaf", p.leaf)
        .set(
            "upSinceMs",
            p.up_since
                .map_or(JsValue::NULL, |t| JsValue::from_f64(t.as_millis() as f64)),
        );
    o.into_js()
}

#[wasm_bindgen(js_class = Broker)]
impl JsBroker {
    /// Makes this broker a node of a deployment: `{ node, incarnation, region, ... }`
    /// (`incarnation` must grow on every start). Call before `restore` and the first `accept`.
    #[wasm_bindgen(js_name = enableCluster)]
    pub fn enable_cluster(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "ClusterConfig")] config: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let config = cluster_config(&config)?;
        let now = now(now_ms)?;
        self.inner.enable_cluster(now, config);
        Ok(())
    }

    /// The link to node `peer` is up.
    #[wasm_bindgen(js_name = handlePeerUp)]
    pub fn handle_peer_up(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let peer = node_id(&peer, "peer")?;
        let now = now(now_ms)?;
        self.peer_readers.remove(peer.as_str());
        self.inner.handle_input(now, Input::PeerUp { peer });
        self.collect_hook_errors();
        Ok(())
    }

    /// Bytes from node `peer`'s link: whole frames, or any pieces of the frame stream. The
    /// frames they complete are one input (their acknowledgements of forwards leave as one per
    /// origin). Throws on a malformed frame (after feeding the frames before it): close that
    /// link and call `handlePeerDown`.
    #[wasm_bindgen(js_name = handlePeerBytes)]
    pub fn handle_peer_bytes(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(unchecked_param_type = "Uint8Array")] data: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let peer = node_id(&peer, "peer")?;
        let now = now(now_ms)?;
        let mut bytes = BytesMut::new();
        js::append_bytes(&data, &mut bytes, "data")?;
        let read = self
            .peer_readers
            .entry(peer.as_str().to_owned())
            .or_insert_with(|| FrameReader::new(DEFAULT_MAX_FRAME_LEN))
            .read(&bytes);
        if !read.frames.is_empty() {
            self.inner.handle_input(
                now,
                Input::PeerFrames {
                    peer: peer.clone(),
                    frames: read.frames,
                },
            );
        }
        if self
            .peer_readers
            .get(peer.as_str())
            .is_some_and(|r| r.buffered() == 0)
        {
            // Nothing held between reads for a peer whose frames come whole.
            self.peer_readers.remove(peer.as_str());
        }
        self.collect_hook_errors();
        match read.error {
            None => Ok(()),
            Some(e) => Err(js::error(&format!(
                "malformed frame from peer {peer}: {e}; close the link and call handlePeerDown"
            ))),
        }
    }

    /// The link to node `peer` is down.
    #[wasm_bindgen(js_name = handlePeerDown)]
    pub fn handle_peer_down(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let peer = node_id(&peer, "peer")?;
        let now = now(now_ms)?;
        self.peer_readers.remove(peer.as_str());
        self.inner.handle_input(now, Input::PeerDown { peer });
        self.collect_hook_errors();
        Ok(())
    }

    /// The link to node `peer` carries less than is sent on it (its writer's buffer passed the
    /// app's mark): QoS 0 forwards to it are dropped, and counted in
    /// `stats().droppedPeerCongested`, until `handlePeerDrained` or its next `handlePeerUp`.
    #[wasm_bindgen(js_name = handlePeerCongested)]
    pub fn handle_peer_congested(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let peer = node_id(&peer, "peer")?;
        self.inner
            .handle_input(now(now_ms)?, Input::PeerCongested { peer });
        Ok(())
    }

    /// The link to node `peer`, reported congested, has written its backlog: QoS 0 forwards
    /// to it resume.
    #[wasm_bindgen(js_name = handlePeerDrained)]
    pub fn handle_peer_drained(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let peer = node_id(&peer, "peer")?;
        self.inner
            .handle_input(now(now_ms)?, Input::PeerDrained { peer });
        Ok(())
    }

    /// Forget node `peer`, which left the deployment for good: its routes are withdrawn, the
    /// messages queued for it dropped, and a `broadcast` output tells the other nodes. Throws
    /// for an unknown node or one whose link is up.
    #[wasm_bindgen(js_name = forgetPeer, unchecked_return_type = "ForgottenPeer")]
    pub fn forget_peer(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] peer: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<JsValue, JsValue> {
        let peer = node_id(&peer, "peer")?;
        let now = now(now_ms)?;
        let forgotten = self
            .inner
            .forget_peer(now, &peer)
            .map_err(|e| js::error(&format!("forgetPeer: {e}")))?;
        let o = Obj::new();
        o.set("routes", forgotten.routes)
            .set("droppedMessages", forgotten.dropped_messages);
        Ok(o.into_js())
    }

    /// Make node `leaf` a leaf of this one (an edge broker hanging off it outside the mesh):
    /// call before its `handlePeerUp`. Its interest joins this node's route set, it is told
    /// what the rest of the deployment wants, and messages go on between it and the mesh.
    /// Outputs of kind `broadcast` are for mesh peers: a leaf gets its frames as `toPeer`.
    /// Throws for this node's own name or a mesh member's.
    #[wasm_bindgen(js_name = addLeaf)]
    pub fn add_leaf(
        &mut self,
        #[wasm_bindgen(unchecked_param_type = "string")] leaf: JsValue,
        #[wasm_bindgen(js_name = nowMs)] now_ms: f64,
    ) -> Result<(), JsValue> {
        let leaf = node_id(&leaf, "leaf")?;
        let now = now(now_ms)?;
        self.inner
            .add_leaf(now, &leaf)
            .map_err(|e| js::error(&format!("addLeaf: {e}")))
    }

    /// The peer nodes this node knows (empty unless `enableCluster` was called).
    #[wasm_bindgen(unchecked_return_type = "PeerSummary[]")]
    pub fn peers(&self) -> JsValue {
        js::array(self.inner.peers().iter().map(peer_summary))
    }
}
