//! The measurements as tables or JSON rows.

use std::io::Write;

use anyhow::Context;
use serde_json::{Value, json};

use super::{
    CLIENT_RTT_MS, MeshScale, MeshScaleReport, REGIONS, RTT_MS, SAME_REGION_RTT_MS, filter_name,
};

/// The report's rows as JSON objects (`row`: `burst` or `memory`).
pub fn report_rows(report: &MeshScaleReport, scenario: &str, seed: u64) -> Vec<Value> {
    let with = |row: &str, value: Value| {
        let mut v = json!({ "scenario": scenario, "seed": seed, "row": row });
        if let (Some(object), Value::Object(fields)) = (v.as_object_mut(), value) {
            object.extend(fields);
        }
        v
    };
    let mut rows = Vec::new();
    for m in &report.memory {
        rows.push(with("memory", json!(m)));
    }
    for b in &report.bursts {
        rows.push(with("burst", json!(b)));
    }
    rows
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or_else(
        || "n/a".to_owned(),
        |b| format!("{:.0}", b as f64 / (1024.0 * 1024.0)),
    )
}

/// The report as tables, or one JSON object per row.
pub fn write_report(
    report: &MeshScaleReport,
    options: &MeshScale,
    seed: u64,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    let name = if options.memory_only {
        "mesh-scale-memory"
    } else {
        "mesh-scale"
    };
    if json {
        for row in report_rows(report, name, seed) {
            writeln!(out, "{row}").context("writing output")?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "{name} (seed {seed}): nodes in {} regions (node i in region i mod {}), RTT {}-{} ms between regions, {} ms within one; clients {} ms from their node; filters like {}",
        REGIONS.len(),
        REGIONS.len(),
        RTT_MS
            .iter()
            .flatten()
            .filter(|&&r| r > 0)
            .min()
            .unwrap_or(&0),
        RTT_MS.iter().flatten().max().unwrap_or(&0),
        SAME_REGION_RTT_MS,
        CLIENT_RTT_MS,
        filter_name(&options.filter, 1),
    )?;
    if !report.memory.is_empty() {
        writeln!(
            out,
            "\nreplicated route index of one node ({} filters in the deployment; resident memory: growth and process peak; wall clock):",
            options.filters
        )?;
        writeln!(
            out,
            "  {:>5} {:>6} {:>12} {:>8} {:>8} {:>8} {:>11} {:>9} {:>9} {:>15} {:>9} {:>16}",
            "nodes",
            "owners",
            "filters_held",
            "rss_MiB",
            "peak_MiB",
            "B/filter",
            "snapshot_MB",
            "install_s",
            "applied",
            "apply_us/change",
            "lookup_ns",
            "restart_deltas"
        )?;
        for m in &report.memory {
            let rss = m
                .rss_before_bytes
                .zip(m.rss_after_bytes)
                .map(|(b, a)| a - b.min(a));
            writeln!(
                out,
                "  {:>5} {:>6} {:>12} {:>8} {:>8} {:>8} {:>11.1} {:>9.1} {:>9} {:>15.2} {:>9.0} {:>16}",
                m.nodes,
                m.owners,
                m.filters_held,
                format!("+{}", mib(rss)),
                mib(m.rss_peak_bytes),
                m.bytes_per_filter
                    .map_or_else(|| "n/a".to_owned(), |b| format!("{b:.0}")),
                m.snapshot_bytes as f64 / 1e6,
                m.install_ms as f64 / 1e3,
                m.applied_changes,
                m.apply_us_per_change,
                m.lookup_ns,
                format!(
                    "{:.1} MB in {} (largest {} kB{})",
                    m.restart_delta_bytes as f64 / 1e6,
                    m.restart_delta_frames,
                    m.restart_largest_frame_bytes / 1000,
                    if m.restart_largest_frame_bytes > m.max_frame_bytes + 4 {
                        ", too large"
                    } else {
                        ""
                    }
                )
            )?;
        }
    }
    if !report.bursts.is_empty() {
        writeln!(
            out,
            "\nbursts of route changes (simulated, virtual time; encoded route-frame bytes):"
        )?;
        writeln!(
            out,
            "  {:>5} {:>9} {:>10} {:>8} {:>12} {:>8} {:>12} {:>10} {:>9} {:>15} {:>11}",
            "nodes",
            "base/node",
            "burst/node",
            "changes",
            "converged_ms",
            "floor_ms",
            "delta_bytes",
            "ack_bytes",
            "B/change",
            "B/change/peer",
            "idle_B/s"
        )?;
        for b in &report.bursts {
            writeln!(
                out,
                "  {:>5} {:>9} {:>10} {:>8} {:>12} {:>8} {:>12} {:>10} {:>9.0} {:>15.1} {:>11.0}",
                b.nodes,
                b.base_per_node,
                b.burst_per_node,
                b.changes,
                b.converged_ms
                    .map_or_else(|| "never".to_owned(), |v| v.to_string()),
                b.floor_ms,
                b.delta_bytes,
                b.ack_bytes,
                b.bytes_per_change,
                b.bytes_per_change_per_peer,
                b.idle_bytes_per_s
            )?;
        }
    }
    Ok(())
}
