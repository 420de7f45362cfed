//! `meridian sim --html FILE`: a simulated run as one standalone page — the deployment drawn
//! as the status page draws a live one (regions around a circle, each pair of regions joined by
//! its round trip, each node in its region), the run's timeline (the `--svg` drawing) and the
//! report's table. Nothing is fetched from elsewhere.

use std::fmt::Write as _;

use meridian_core::sim::Report;

/// The page for `report`, whose text table is `table` (`meridian sim`'s own output).
pub fn render(report: &Report, table: &str) -> String {
    let mut page = String::new();
    let title = format!("{} (seed {})", report.scenario, report.seed);
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>Meridian sim · {}</title>\n<style>\n{STYLE}</style>\n</head>\n<body>\n\
         <header><h1>Meridian sim · {}</h1><span class=\"meta\">{} nodes in {} regions · \
         {} ms of virtual time</span></header>\n<main>\n",
        escape(&title),
        escape(&title),
        report.nodes.len(),
        report.regions.len(),
        report.duration_ms
    );
    page.push_str("<section><h2>Deployment</h2>\n");
    page.push_str(&topology_svg(report));
    page.push_str("</section>\n<section><h2>Timeline</h2>\n");
    page.push_str(&crate::timeline_svg::render(report));
    let _ = write!(
        page,
        "</section>\n<section><h2>Report</h2>\n<pre>{}</pre>\n</section>\n</main>\n</body>\n</html>\n",
        escape(table)
    );
    page
}

const STYLE: &str = "body { margin: 0; font: 14px/1.45 system-ui, sans-serif; background: #f6f7f9; \
color: #1d2330; }\nheader { padding: 14px 24px; background: #1d2330; color: #fff; display: flex; \
gap: 16px; align-items: baseline; }\nheader h1 { font-size: 18px; margin: 0; }\n.meta { color: \
#b9c0cf; }\nmain { padding: 16px 24px; display: grid; gap: 16px; }\nsection { background: #fff; \
border: 1px solid #d9dde5; border-radius: 8px; padding: 12px 16px; overflow-x: auto; }\nh2 { \
font-size: 15px; margin: 0 0 8px; }\npre { font-size: 12px; }\nsvg text { font-size: 12px; }\n";

/// Regions around a circle, joined by their round trips; nodes beside their region.
fn topology_svg(report: &Report) -> String {
    let (w, h, cx, cy, r) = (720.0, 420.0, 360.0, 210.0, 150.0);
    let n = report.regions.len().max(1) as f64;
    let at = |i: usize| {
        let a = std::f64::consts::TAU * i as f64 / n - std::f64::consts::FRAC_PI_2;
        (cx + 1.6 * r * a.cos(), cy + r * a.sin())
    };
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"regions and round trips\">\n"
    );
    for (i, _) in report.regions.iter().enumerate() {
        for j in i + 1..report.regions.len() {
            let ((x1, y1), (x2, y2)) = (at(i), at(j));
            let rtt = report
                .rtt_ms
                .get(i)
                .and_then(|row| row.get(j))
                .copied()
                .unwrap_or(0);
            let _ = writeln!(
                svg,
                "<g class=\"link\"><line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" \
                 y2=\"{y2:.1}\" stroke=\"#1f9d55\" stroke-width=\"2\"/><text x=\"{:.1}\" \
                 y=\"{:.1}\" text-anchor=\"middle\" fill=\"#6b7385\">{rtt} ms</text></g>",
                (x1 + x2) / 2.0,
                (y1 + y2) / 2.0 - 4.0
            );
        }
    }
    for (i, region) in report.regions.iter().enumerate() {
        let (x, y) = at(i);
        let nodes: Vec<&str> = report
            .nodes
            .iter()
            .filter(|node| node.region == *region)
            .map(|node| node.name.as_str())
            .collect();
        let _ = writeln!(
            svg,
            "<g class=\"region\" data-region=\"{}\"><circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"44\" \
             fill=\"#1d2330\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" \
             fill=\"#fff\" font-weight=\"600\" font-size=\"11\">{}</text><text x=\"{x:.1}\" y=\"{:.1}\" \
             text-anchor=\"middle\" fill=\"#6b7385\">{}</text></g>",
            escape(region),
            y + 4.0,
            escape(region),
            y + 60.0,
            escape(&nodes.join(", "))
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
