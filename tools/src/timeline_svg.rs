//! `meridian sim --svg FILE`: the run's timeline as a standalone SVG. Time runs left to right;
//! each node is a lane (labelled with its region); link frames are lines from the sending
//! lane at the send time to the receiving lane at the arrival time (messages blue, route
//! changes green, route snapshots orange, retained messages brown); SUBACKs are purple dots; a link that is down
//! shades both its nodes' lanes red, a crashed node grey; dashed green lines mark the moments
//! when every node's routes agree again.

use std::collections::BTreeMap;
use std::fmt::Write;

use meridian_core::link::FrameKind;
use meridian_core::routes::NodeId;
use meridian_core::sim::{Report, TimelineKind};

const LEFT: f64 = 190.0;
const PLOT_W: f64 = 1000.0;
const TOP: f64 = 70.0;
const LANE_H: f64 = 56.0;
const BOTTOM: f64 = 60.0;
/// Most frame lines and SUBACK dots drawn; beyond, an even sample is drawn and the count said.
const MAX_MARKS: usize = 4_000;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// What the drawing marks, each in its colour (the legend lists them in this order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mark {
    Forward,
    RouteDelta,
    RouteSnapshot,
    Retained,
    Suback,
    LinkDown,
    NodeDown,
}

impl Mark {
    const ALL: [Mark; 7] = [
        Mark::Forward,
        Mark::RouteDelta,
        Mark::RouteSnapshot,
        Mark::Retained,
        Mark::Suback,
        Mark::LinkDown,
        Mark::NodeDown,
    ];

    /// The mark of a frame the timeline records.
    fn of(frame: FrameKind) -> Self {
        match frame {
            FrameKind::Forward => Mark::Forward,
            FrameKind::RouteDelta => Mark::RouteDelta,
            FrameKind::Retained | FrameKind::RetainedSnapshot => Mark::Retained,
            _ => Mark::RouteSnapshot,
        }
    }

    fn color(self) -> &'static str {
        match self {
            Mark::Forward => "#1f77b4",
            Mark::RouteDelta => "#2ca02c",
            Mark::RouteSnapshot => "#ff7f0e",
            Mark::Retained => "#8c564b",
            Mark::Suback => "#9467bd",
            Mark::LinkDown => "#d62728",
            Mark::NodeDown => "#7f7f7f",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Mark::Forward => "message forward",
            Mark::RouteDelta => "route delta",
            Mark::RouteSnapshot => "route snapshot",
            Mark::Retained => "retained message",
            Mark::Suback => "SUBACK",
            Mark::LinkDown => "link down",
            Mark::NodeDown => "node down",
        }
    }
}

/// A tick step of 1, 2 or 5 times a power of ten giving about ten ticks over `end_ms`.
fn tick_step(end_ms: f64) -> f64 {
    let raw = (end_ms / 10.0).max(1.0);
    let pow = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * pow)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * pow)
}

fn fmt_time(ms: f64, end_ms: f64) -> String {
    if end_ms >= 5_000.0 {
        format!("{} s", ms / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

/// Render the report's timeline.
pub fn render(report: &Report) -> String {
    let t = &report.timeline;
    let lane: BTreeMap<&str, usize> = report
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.name.as_str(), i))
        .collect();
    let lane_y = |node: &str| TOP + LANE_H * (lane.get(node).copied().unwrap_or(0) as f64 + 0.5);
    let last = t.events.iter().map(|e| e.at_ms).max().unwrap_or(0);
    let end = ((last as f64) * 1.05).max(10.0);
    let x = |ms: u64| LEFT + (ms as f64 / end).min(1.0) * PLOT_W;
    let height = TOP + LANE_H * report.nodes.len() as f64 + BOTTOM;
    let width = LEFT + PLOT_W + 30.0;

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect width="100%" height="100%" fill="white"/><text x="10" y="20" font-size="15" font-weight="bold">{} (seed {})</text>"#,
        esc(&report.scenario),
        report.seed
    );
    // Legend.
    for (i, mark) in Mark::ALL.iter().enumerate() {
        let lx = 10.0 + i as f64 * 145.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{lx}" y="34" width="12" height="12" fill="{}"/><text x="{}" y="44">{}</text>"#,
            mark.color(),
            lx + 16.0,
            mark.label()
        );
    }
    // Lanes.
    for (i, n) in report.nodes.iter().enumerate() {
        let y = TOP + LANE_H * i as f64;
        let fill = if i % 2 == 0 { "#f7f7f7" } else { "#ffffff" };
        let _ = writeln!(
            svg,
            r##"<rect x="{LEFT}" y="{y}" width="{PLOT_W}" height="{LANE_H}" fill="{fill}"/><text x="10" y="{}">{} <tspan fill="#777">({})</tspan></text>"##,
            y + LANE_H / 2.0 + 4.0,
            esc(&n.name),
            esc(&n.region)
        );
    }
    // Links and nodes down.
    let mut down: BTreeMap<(NodeId, NodeId), u64> = BTreeMap::new();
    let mut crashed: BTreeMap<NodeId, u64> = BTreeMap::new();
    let mut bands: Vec<(NodeId, u64, u64, Mark, String)> = Vec::new();
    for e in &t.events {
        match &e.kind {
            TimelineKind::LinkDown { a, b } => {
                down.insert((a.clone(), b.clone()), e.at_ms);
            }
            TimelineKind::LinkUp { a, b } => {
                if let Some(from) = down.remove(&(a.clone(), b.clone())) {
                    for n in [a, b] {
                        bands.push((
                            n.clone(),
                            from,
                            e.at_ms,
                            Mark::LinkDown,
                            format!("link {a}-{b} down"),
                        ));
                    }
                }
            }
            TimelineKind::Crash { node } => {
                crashed.insert(node.clone(), e.at_ms);
            }
            TimelineKind::Restart { node } => {
                if let Some(from) = crashed.remove(node) {
                    bands.push((
                        node.clone(),
                        from,
                        e.at_ms,
                        Mark::NodeDown,
                        format!("{node} down"),
                    ));
                }
            }
            _ => {}
        }
    }
    let end_ms = end as u64;
    for ((a, b), from) in down {
        for n in [&a, &b] {
            bands.push((
                n.clone(),
                from,
                end_ms,
                Mark::LinkDown,
                format!("link {a}-{b} down"),
            ));
        }
    }
    for (node, from) in crashed {
        bands.push((
            node.clone(),
            from,
            end_ms,
            Mark::NodeDown,
            format!("{node} down"),
        ));
    }
    for (node, from, to, mark, what) in &bands {
        let y = lane_y(node.as_str()) - LANE_H / 2.0;
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{y}" width="{:.1}" height="{LANE_H}" fill="{}" fill-opacity="0.15"><title>{} from {} to {}</title></rect>"#,
            x(*from),
            (x(*to) - x(*from)).max(1.0),
            mark.color(),
            esc(what),
            fmt_time(*from as f64, end),
            fmt_time(*to as f64, end)
        );
    }
    // Frames and SUBACKs, sampled evenly if there are many.
    let frames: Vec<_> = t
        .events
        .iter()
        .filter(|e| matches!(e.kind, TimelineKind::Frame { .. }))
        .collect();
    let every = frames.len().div_ceil(MAX_MARKS).max(1);
    for e in frames.iter().step_by(every) {
        if let TimelineKind::Frame {
            from,
            to,
            sent_ms,
            frame,
        } = &e.kind
        {
            let _ = writeln!(
                svg,
                r#"<line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="{}" stroke-opacity="0.5"/>"#,
                x(*sent_ms),
                lane_y(from.as_str()),
                x(e.at_ms),
                lane_y(to.as_str()),
                Mark::of(*frame).color()
            );
        }
    }
    let subacks: Vec<_> = t
        .events
        .iter()
        .filter(|e| matches!(e.kind, TimelineKind::Suback { .. }))
        .collect();
    let every_suback = subacks.len().div_ceil(MAX_MARKS).max(1);
    for e in subacks.iter().step_by(every_suback) {
        if let TimelineKind::Suback { node, .. } = &e.kind {
            let _ = writeln!(
                svg,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{}"/>"#,
                x(e.at_ms),
                lane_y(node.as_str()) - LANE_H / 4.0,
                Mark::Suback.color()
            );
        }
    }
    let lanes_bottom = TOP + LANE_H * report.nodes.len() as f64;
    for e in &t.events {
        if matches!(e.kind, TimelineKind::RoutesConverged) {
            let _ = writeln!(
                svg,
                r##"<line x1="{0:.1}" y1="{TOP}" x2="{0:.1}" y2="{lanes_bottom}" stroke="#2ca02c" stroke-dasharray="4 3"><title>routes converged at {1}</title></line>"##,
                x(e.at_ms),
                fmt_time(e.at_ms as f64, end)
            );
        }
    }
    // Time axis.
    let step = tick_step(end);
    let mut tick = 0.0;
    while tick <= end {
        let tx = LEFT + tick / end * PLOT_W;
        let _ = writeln!(
            svg,
            r##"<line x1="{tx:.1}" y1="{lanes_bottom}" x2="{tx:.1}" y2="{}" stroke="#333"/><text x="{tx:.1}" y="{}" text-anchor="middle">{}</text>"##,
            lanes_bottom + 5.0,
            lanes_bottom + 18.0,
            fmt_time(tick, end)
        );
        tick += step;
    }
    let mut note = format!(
        "virtual time; {} link frames, {} SUBACKs",
        frames.len(),
        subacks.len()
    );
    if every > 1 || every_suback > 1 {
        let _ = write!(
            note,
            "; 1 in {every} frames and 1 in {every_suback} SUBACKs drawn"
        );
    }
    if t.dropped > 0 {
        let _ = write!(note, "; {} later events not recorded", t.dropped);
    }
    let _ = writeln!(
        svg,
        r##"<line x1="{LEFT}" y1="{lanes_bottom}" x2="{}" y2="{lanes_bottom}" stroke="#333"/><text x="{LEFT}" y="{}" fill="#555">{}</text>"##,
        LEFT + PLOT_W,
        lanes_bottom + 40.0,
        esc(&note)
    );
    svg.push_str("</svg>\n");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_steps_are_round() {
        assert_eq!(tick_step(1_000.0), 100.0);
        assert_eq!(tick_step(95_000.0), 10_000.0);
        assert_eq!(tick_step(300.0), 50.0);
    }

    #[test]
    fn a_run_draws_lanes_subacks_frames_and_convergence() {
        let report = meridian_core::sim::subscribe_fence(true).run(1).unwrap();
        let svg = render(&report);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        for node in ["fra", "hkg", "cpt"] {
            assert!(svg.contains(&format!(">{node} <tspan")), "lane for {node}");
        }
        assert!(svg.contains("#9467bd\"/>"), "a SUBACK dot");
        assert!(svg.contains("stroke=\"#1f77b4\""), "a forwarded message");
        assert!(svg.contains("routes converged at"));
    }
}
