//! `meridian sim`: runs a simulated deployment (the core's deterministic simulator) and prints
//! a table, or one JSON object per row.

use std::io::Write;

use anyhow::{Context, bail};
use meridian_core::sim::{HKG_CPT_RTT_MS, geo_writeup};

/// Run a built-in scenario. `geo-writeup`: the EMQX geo-distribution write-up's
/// connect-and-subscribe workloads on Frankfurt, Hong Kong and Cape Town nodes.
pub fn sim_command(
    scenario: &str,
    seed: u64,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    if scenario != "geo-writeup" {
        bail!("unknown scenario {scenario:?} (known: geo-writeup)");
    }
    let rows = geo_writeup(seed);
    if json {
        for row in &rows {
            let emqx: serde_json::Map<String, serde_json::Value> = row
                .emqx
                .iter()
                .map(|(setup, secs)| ((*setup).to_owned(), serde_json::json!(secs)))
                .collect();
            let line = serde_json::json!({
                "scenario": "geo-writeup",
                "seed": seed,
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
