//! `meridian sim --scenario mesh-scale` at a tiny size: every figure is there, routes
//! converged after every burst, and neither the convergence time nor the bytes per route
//! change depend on how many filters the nodes already held. Virtual time is deterministic,
//! so the simulated figures are compared exactly; the wall-clock and memory figures are only
//! checked for presence.

use meridian_tools::mesh_scale::{self, MemoryMode, MeshScale};
use meridian_tools::sim::{SimArgs, sim_command};

fn tiny() -> MeshScale {
    MeshScale {
        nodes: vec![3, 12],
        filters: 12_000,
        base: vec![5, 50],
        burst: vec![1, 20],
        memory: MemoryMode::Here,
        ..MeshScale::default()
    }
}

#[test]
fn mesh_scale_measures_every_figure_at_a_tiny_size() {
    let options = tiny();
    let report = mesh_scale::run(&options, 1).unwrap();

    assert_eq!(report.memory.len(), 2);
    for (m, nodes) in report.memory.iter().zip([3, 12]) {
        let per_owner = 12_000 / nodes as u64;
        assert_eq!(m.nodes, nodes);
        assert_eq!(m.owners, nodes - 1);
        assert_eq!(m.filters_held, per_owner * (nodes as u64 - 1));
        assert_eq!(m.applied_changes, 20 * (nodes as u64 - 1));
        assert!(m.snapshot_frames >= m.owners as u64);
        // Each filter is 23 bytes on the wire plus its 2-byte length.
        assert!(m.snapshot_bytes > 25 * m.filters_held);
        if cfg!(target_os = "linux") {
            assert!(m.bytes_per_filter.is_some(), "{m:?}");
        }
        assert!(m.apply_us_per_change > 0.0 && m.lookup_ns > 0.0, "{m:?}");
        // An owner's whole set in one delta: more than its filters, far below the frame limit.
        assert!(m.restart_delta_bytes > 25 * per_owner, "{m:?}");
        assert!(m.restart_largest_frame_bytes < m.max_frame_bytes, "{m:?}");
        assert!(m.restart_delta_frames >= 1, "{m:?}");
    }

    // 2 sizes x 2 bases x 2 bursts.
    assert_eq!(report.bursts.len(), 8);
    for b in &report.bursts {
        let converged = b
            .converged_ms
            .unwrap_or_else(|| panic!("never converged: {b:?}"));
        assert!(converged >= b.floor_ms, "{b:?}");
        assert_eq!(b.changes, (b.nodes * b.burst_per_node) as u64);
        let peers = (b.nodes - 1) as u64;
        // One delta per owner to each peer, one acknowledgement back from each.
        assert_eq!(b.delta_frames, b.nodes as u64 * peers, "{b:?}");
        assert_eq!(b.ack_frames, b.nodes as u64 * peers, "{b:?}");
        assert_eq!((b.digest_bytes, b.snapshot_bytes), (0, 0), "{b:?}");
        // A change is at least its filter (23 bytes) and op byte, to every peer.
        assert!(b.bytes_per_change_per_peer > 24.0, "{b:?}");
        assert!(
            b.idle_bytes_per_s > 0.0,
            "digests go out when nothing changes"
        );
    }
    // The base the nodes held changes neither the convergence nor the bytes per change.
    for small in report.bursts.iter().filter(|b| b.base_per_node == 5) {
        let large = report
            .bursts
            .iter()
            .find(|b| {
                b.base_per_node == 50
                    && b.nodes == small.nodes
                    && b.burst_per_node == small.burst_per_node
            })
            .unwrap();
        assert_eq!(small.converged_ms, large.converged_ms);
        assert_eq!(small.bytes_per_change, large.bytes_per_change);
    }
    // Batching: a burst of 20 per node costs fewer bytes per change than one change alone.
    let per_change = |burst| {
        report
            .bursts
            .iter()
            .find(|b| b.nodes == 12 && b.base_per_node == 5 && b.burst_per_node == burst)
            .unwrap()
            .bytes_per_change_per_peer
    };
    assert!(per_change(20) < per_change(1));
}

#[test]
fn the_sim_command_prints_mesh_scale_tables_and_json() {
    let run = |json| {
        let args = SimArgs {
            topology: None,
            scenario: "mesh-scale:nodes=3:filters=3000:base=4:burst=2:memory=off".to_owned(),
            seed: 1,
            json,
            svg: None,
            html: None,
        };
        let mut out = Vec::new();
        sim_command(&args, &mut out).unwrap();
        String::from_utf8(out).unwrap()
    };
    let table = run(false);
    assert!(table.contains("converged_ms"), "{table}");
    assert!(table.contains("B/change/peer"), "{table}");
    let json = run(true);
    let rows: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{json}");
    assert_eq!(rows[0]["row"], "burst");
    assert_eq!(rows[0]["nodes"], 3);
    assert!(rows[0]["converged_ms"].as_u64().is_some(), "{json}");
    assert!(rows[0]["bytes_per_change"].as_f64().unwrap() > 0.0);

    let args = SimArgs {
        topology: None,
        scenario: "mesh-scale:nodes=1".to_owned(),
        seed: 1,
        json: false,
        svg: None,
        html: None,
    };
    assert!(sim_command(&args, &mut Vec::new()).is_err());
}
