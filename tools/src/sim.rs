//! `meridian sim`: runs a simulated deployment (the core's deterministic simulator) from a
//! topology file or a built-in scenario, and prints a table, or one JSON object per row;
//! `--svg FILE` draws the run's timeline.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, bail};
use meridian_core::sim::{HKG_CPT_RTT_MS, Report, geo_writeup, geo_writeup_reports};
use serde_json::{Value, json};

use crate::mesh_scale::{self, MeshScale};

/// What `meridian sim` was asked to do.
#[derive(Debug, Clone)]
pub struct SimArgs {
    /// A topology file; without one, the built-in `scenario` runs.
    pub topology: Option<PathBuf>,
    pub scenario: String,
    pub seed: u64,
    pub json: bool,
    pub svg: Option<PathBuf>,
    /// Write the run as a standalone page: the deployment, the timeline, the report.
    pub html: Option<PathBuf>,
}

/// Run a topology file or a built-in scenario. `geo-writeup`: the EMQX geo-distribution
/// write-up's connect-and-subscribe workloads on Frankfurt, Hong Kong and Cape Town nodes,
/// then cross-region publish latency, a 60 s partition of one region under QoS 1 traffic, and
/// the subscription fence off and on (its `--svg` draws the partition run). `mesh-scale`
/// (with options, see [`crate::mesh_scale`]): route convergence, link bytes per route change
/// and memory per replicated filter for meshes of 10, 25 and 50 nodes.
pub fn sim_command(args: &SimArgs, out: &mut impl Write) -> anyhow::Result<()> {
    if let Some(path) = &args.topology {
        let scenario = crate::topology::load(path)?;
        let report = scenario
            .run(args.seed)
            .with_context(|| format!("{}", path.display()))?;
        write_report(&report, args.json, out)?;
        if let Some(svg) = &args.svg {
            write_svg(&report, svg)?;
        }
        if let Some(html) = &args.html {
            write_html(&report, html)?;
        }
        return Ok(());
    }
    // Each memory figure of mesh-scale is measured in a fresh process of this executable.
    let exe = std::env::current_exe().ok();
    if let Some(options) = MeshScale::parse(&args.scenario, exe)? {
        if args.svg.is_some() || args.html.is_some() {
            bail!(
                "--svg and --html draw geo-writeup and topology-file runs, not {}",
                args.scenario
            );
        }
        let report = mesh_scale::run(&options, args.seed)?;
        return mesh_scale::write_report(&report, &options, args.seed, args.json, out);
    }
    if args.scenario != "geo-writeup" {
        bail!(
            "unknown scenario {:?} (known: geo-writeup, mesh-scale; or give a topology file)",
            args.scenario
        );
    }
    geo_writeup_command(args.seed, args.json, out)?;
    let reports = geo_writeup_reports(args.seed);
    for report in &reports {
        if !args.json {
            writeln!(out)?;
        }
        write_report(report, args.json, out)?;
    }
    if let Some(partition) = reports.iter().find(|r| r.scenario == "partition-60s") {
        if let Some(svg) = &args.svg {
            write_svg(partition, svg)?;
        }
        if let Some(html) = &args.html {
            write_html(partition, html)?;
        }
    }
    Ok(())
}

fn write_html(report: &Report, path: &PathBuf) -> anyhow::Result<()> {
    let mut table = Vec::new();
    write_report(report, false, &mut table)?;
    let page = crate::sim_html::render(report, &String::from_utf8_lossy(&table));
    std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))
}

fn write_svg(report: &Report, path: &PathBuf) -> anyhow::Result<()> {
    std::fs::write(path, crate::timeline_svg::render(report))
        .with_context(|| format!("writing {}", path.display()))
}

fn qos_number(q: meridian_core::codec::QoS) -> u8 {
    q as u8
}

/// The rows of one report as JSON objects.
pub fn report_rows(report: &Report) -> Vec<Value> {
    let base = |row: &str| {
        json!({
            "scenario": report.scenario,
            "seed": report.seed,
            "row": row,
        })
    };
    let mut rows = Vec::new();
    if let Some(s) = &report.subscribe {
        let mut v = base("subscribe");
        v["subscribers"] = json!(s.subscribers);
        v["missing_subacks"] = json!(s.missing_subacks);
        v["all_subacks_ms"] = json!(s.all_subacks_ms);
        v["routes_converged_ms"] = json!(s.routes_converged_ms);
        rows.push(v);
    }
    for d in &report.delivery {
        let mut v = base("delivery");
        v["qos"] = json!(qos_number(d.qos));
        v["published"] = json!(d.published);
        v["acknowledged"] = json!(d.acknowledged);
        v["expected"] = json!(d.expected);
        v["delivered"] = json!(d.delivered);
        v["lost"] = json!(d.lost);
        v["duplicated"] = json!(d.duplicated);
        rows.push(v);
    }
    for l in &report.latency {
        let mut v = base("latency");
        v["from_region"] = json!(l.from_region);
        v["to_region"] = json!(l.to_region);
        v["messages"] = json!(l.messages);
        v["p50_ms"] = json!(l.p50_ms);
        v["p99_ms"] = json!(l.p99_ms);
        v["max_ms"] = json!(l.max_ms);
        rows.push(v);
    }
    rows
}

/// A report as a table, or as one JSON object per row.
pub fn write_report(report: &Report, json: bool, out: &mut impl Write) -> anyhow::Result<()> {
    if json {
        for row in report_rows(report) {
            writeln!(out, "{row}").context("writing output")?;
        }
        return Ok(());
    }
    let nodes: Vec<String> = report
        .nodes
        .iter()
        .map(|n| format!("{} ({})", n.name, n.region))
        .collect();
    writeln!(
        out,
        "{} (seed {}): nodes {}; {} ms of virtual time",
        report.scenario,
        report.seed,
        nodes.join(", "),
        report.duration_ms
    )?;
    if let Some(s) = &report.subscribe {
        writeln!(
            out,
            "  {:>11} {:>15} {:>14} {:>19}",
            "subscribers", "missing_subacks", "all_subacks_ms", "routes_converged_ms"
        )?;
        let converged = s
            .routes_converged_ms
            .map_or_else(|| "never".to_owned(), |v| v.to_string());
        writeln!(
            out,
            "  {:>11} {:>15} {:>14} {:>19}",
            s.subscribers, s.missing_subacks, s.all_subacks_ms, converged
        )?;
    }
    if !report.delivery.is_empty() {
        writeln!(
            out,
            "  {:>3} {:>9} {:>12} {:>8} {:>9} {:>5} {:>10}",
            "qos", "published", "acknowledged", "expected", "delivered", "lost", "duplicated"
        )?;
        for d in &report.delivery {
            writeln!(
                out,
                "  {:>3} {:>9} {:>12} {:>8} {:>9} {:>5} {:>10}",
                qos_number(d.qos),
                d.published,
                d.acknowledged,
                d.expected,
                d.delivered,
                d.lost,
                d.duplicated
            )?;
        }
    }
    if !report.latency.is_empty() {
        writeln!(
            out,
            "  {:<12} {:<12} {:>8} {:>7} {:>7} {:>7}",
            "from", "to", "messages", "p50_ms", "p99_ms", "max_ms"
        )?;
        for l in &report.latency {
            writeln!(
                out,
                "  {:<12} {:<12} {:>8} {:>7} {:>7} {:>7}",
                l.from_region, l.to_region, l.messages, l.p50_ms, l.p99_ms, l.max_ms
            )?;
        }
    }
    Ok(())
}

/// The write-up's connect-and-subscribe rows.
fn geo_writeup_command(seed: u64, json: bool, out: &mut impl Write) -> anyhow::Result<()> {
    let rows = geo_writeup(seed);
    if json {
        for row in &rows {
            let emqx: serde_json::Map<String, Value> = row
                .emqx
                .iter()
                .map(|(setup, secs)| ((*setup).to_owned(), json!(secs)))
                .collect();
            let line = json!({
                "scenario": "geo-writeup",
                "seed": seed,
                "row": "connect-subscribe",
                "clients": row.clients,
                "filter": row.filter,
                "all_subacks_ms": row.all_subacks_ms,
                "routes_converged_ms": row.routes_converged_ms,
                "emqx_seconds": emqx,
            });
            writeln!(out, "{line}").context("writing output")?;
        }
        return Ok(());
    }
    writeln!(
        out,
        "geo-writeup (seed {seed}): nodes fra, hkg, cpt; RTT fra-cpt 160 ms, fra-hkg 200 ms, hkg-cpt {HKG_CPT_RTT_MS} ms; clients at hkg (5 ms RTT)\n"
    )?;
    writeln!(
        out,
        "{:>7}  {:<24} {:>15} {:>20}   EMQX (write-up)",
        "clients", "filter", "all_subacks_ms", "routes_converged_ms"
    )?;
    for row in &rows {
        let emqx: Vec<String> = row
            .emqx
            .iter()
            .map(|(setup, secs)| format!("{setup}: {secs} s"))
            .collect();
        writeln!(
            out,
            "{:>7}  {:<24} {:>15} {:>20}   {}",
            row.clients,
            row.filter,
            row.all_subacks_ms,
            row.routes_converged_ms,
            emqx.join("; ")
        )?;
    }
    Ok(())
}
