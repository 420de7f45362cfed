//! Topology files for `meridian sim`: a deployment (nodes, regions, the RTT matrix between
//! regions), its clients and workload, and the faults to inject, as TOML. The format is
//! documented in `docs/geo.md`; `examples/topologies/` holds examples.
//!
//! Every error names the key and the line: syntax and type errors come with the `toml`
//! crate's spans, and the simulator's own checks (unknown nodes, a matrix that is not
//! square or not symmetric, ...) are mapped back to the span of the key they name.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;

use meridian_core::codec::QoS;
use meridian_core::sim::{ClientGroup, Fault, FaultKind, NodeSpec, PublishPlan, Scenario};
use serde::Deserialize;
use toml::Spanned;

/// A topology file that cannot be used, with the line it is about.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("{source_name}: line {line}: {message}")]
    Invalid {
        source_name: String,
        line: usize,
        message: String,
    },
    #[error("cannot read {path}: {error}")]
    Read { path: String, error: std::io::Error },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    name: Option<String>,
    duration_ms: Spanned<u64>,
    #[serde(default)]
    jitter_ms: u64,
    #[serde(default = "default_batch")]
    route_batch_ms: u64,
    #[serde(default)]
    subscribe_fence: bool,
    regions: Spanned<Vec<String>>,
    rtt_ms: Spanned<Vec<Spanned<Vec<Spanned<u64>>>>>,
    nodes: Vec<Spanned<NodeEntry>>,
    #[serde(default)]
    clients: Vec<Spanned<ClientEntry>>,
    #[serde(default)]
    publish: Vec<Spanned<PublishEntry>>,
    #[serde(default)]
    fault: Vec<Spanned<FaultEntry>>,
}

fn default_batch() -> u64 {
    20
}

fn one() -> usize {
    1
}

fn five() -> u64 {
    5
}

fn qos_one() -> Spanned<u8> {
    Spanned::new(0..0, 1)
}

fn payload_default() -> usize {
    256
}

fn zero() -> Spanned<u64> {
    Spanned::new(0..0, 0)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeEntry {
    name: Spanned<String>,
    region: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    name: Spanned<String>,
    node: Spanned<String>,
    #[serde(default = "one")]
    count: usize,
    #[serde(default = "five")]
    rtt_ms: u64,
    #[serde(default)]
    connect_at_ms: u64,
    #[serde(default)]
    subscribe: Vec<Spanned<String>>,
    #[serde(default = "qos_one")]
    qos: Spanned<u8>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PublishEntry {
    clients: Spanned<String>,
    topic: Spanned<String>,
    #[serde(default = "qos_one")]
    qos: Spanned<u8>,
    #[serde(default)]
    retain: bool,
    #[serde(default)]
    start_ms: u64,
    #[serde(default = "zero")]
    interval_ms: Spanned<u64>,
    #[serde(default = "one_u64")]
    count: u64,
    #[serde(default = "payload_default")]
    payload_bytes: usize,
}

fn one_u64() -> u64 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultEntry {
    partition: Option<Spanned<String>>,
    crash: Option<Spanned<String>>,
    at_ms: u64,
    duration_ms: u64,
}

/// Spans of the keys the simulator's checks may name, by its field paths.
#[derive(Default)]
struct Spans(BTreeMap<String, Range<usize>>);

impl Spans {
    fn put(&mut self, field: String, span: Range<usize>) {
        self.0.insert(field, span);
    }

    /// The span of `field`, or of the closest enclosing field that has one.
    fn find(&self, field: &str) -> Option<Range<usize>> {
        let mut f = field;
        loop {
            if let Some(span) = self.0.get(f) {
                return Some(span.clone());
            }
            let cut = f.rfind(['.', '['])?;
            f = &f[..cut];
        }
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parse a topology file's text into a scenario the simulator can run.
pub fn parse(text: &str, source_name: &str) -> Result<Scenario, TopologyError> {
    let invalid = |span: Option<Range<usize>>, message: String| TopologyError::Invalid {
        source_name: source_name.to_owned(),
        line: span.map_or(1, |s| line_of(text, s.start)),
        message,
    };
    let file: File =
        toml::from_str(text).map_err(|e| invalid(e.span(), e.message().trim_end().to_owned()))?;
    let mut spans = Spans::default();
    let qos = |v: &Spanned<u8>, key: String| match *v.get_ref() {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        2 => Ok(QoS::ExactlyOnce),
        n => Err(invalid(
            Some(v.span()),
            format!("{key}: QoS must be 0, 1 or 2, not {n}"),
        )),
    };
    spans.put("duration_ms".into(), file.duration_ms.span());
    spans.put("regions".into(), file.regions.span());
    spans.put("rtt_ms".into(), file.rtt_ms.span());
    let mut rtt_ms = Vec::new();
    for (i, row) in file.rtt_ms.get_ref().iter().enumerate() {
        spans.put(format!("rtt_ms[{i}]"), row.span());
        let mut values = Vec::new();
        for (j, v) in row.get_ref().iter().enumerate() {
            spans.put(format!("rtt_ms[{i}][{j}]"), v.span());
            values.push(*v.get_ref());
        }
        rtt_ms.push(values);
    }
    let mut nodes = Vec::new();
    for (i, n) in file.nodes.iter().enumerate() {
        spans.put(format!("nodes[{i}]"), n.span());
        let n = n.get_ref();
        spans.put(format!("nodes[{i}].name"), n.name.span());
        spans.put(format!("nodes[{i}].region"), n.region.span());
        nodes.push(NodeSpec {
            name: n.name.get_ref().clone(),
            region: n.region.get_ref().clone(),
        });
    }
    let mut clients = Vec::new();
    for (i, c) in file.clients.iter().enumerate() {
        spans.put(format!("clients[{i}]"), c.span());
        let c = c.get_ref();
        spans.put(format!("clients[{i}].name"), c.name.span());
        spans.put(format!("clients[{i}].node"), c.node.span());
        for (k, f) in c.subscribe.iter().enumerate() {
            spans.put(format!("clients[{i}].subscribe[{k}]"), f.span());
        }
        clients.push(ClientGroup {
            name: c.name.get_ref().clone(),
            node: c.node.get_ref().clone(),
            count: c.count,
            rtt_ms: c.rtt_ms,
            connect_at_ms: c.connect_at_ms,
            subscribe: c.subscribe.iter().map(|f| f.get_ref().clone()).collect(),
            qos: qos(&c.qos, format!("clients[{i}].qos"))?,
        });
    }
    let mut publishes = Vec::new();
    for (i, p) in file.publish.iter().enumerate() {
        spans.put(format!("publish[{i}]"), p.span());
        let p = p.get_ref();
        spans.put(format!("publish[{i}].clients"), p.clients.span());
        spans.put(format!("publish[{i}].topic"), p.topic.span());
        spans.put(format!("publish[{i}].interval_ms"), p.interval_ms.span());
        publishes.push(PublishPlan {
            clients: p.clients.get_ref().clone(),
            topic: p.topic.get_ref().clone(),
            qos: qos(&p.qos, format!("publish[{i}].qos"))?,
            retain: p.retain,
            start_ms: p.start_ms,
            interval_ms: *p.interval_ms.get_ref(),
            count: p.count,
            payload_bytes: p.payload_bytes,
        });
    }
    let mut faults = Vec::new();
    for (i, f) in file.fault.iter().enumerate() {
        let span = f.span();
        spans.put(format!("fault[{i}]"), span.clone());
        let f = f.get_ref();
        let kind = match (&f.partition, &f.crash) {
            (Some(target), None) => {
                spans.put(format!("fault[{i}].target"), target.span());
                FaultKind::Partition {
                    target: target.get_ref().clone(),
                }
            }
            (None, Some(node)) => {
                spans.put(format!("fault[{i}].node"), node.span());
                FaultKind::Crash {
                    node: node.get_ref().clone(),
                }
            }
            _ => {
                return Err(invalid(
                    Some(span),
                    format!("fault[{i}]: give exactly one of `partition` or `crash`"),
                ));
            }
        };
        faults.push(Fault {
            kind,
            at_ms: f.at_ms,
            duration_ms: f.duration_ms,
        });
    }
    let scenario = Scenario {
        name: file.name.unwrap_or_else(|| {
            Path::new(source_name)
                .file_stem()
                .map_or_else(|| "topology".to_owned(), |s| s.to_string_lossy().into())
        }),
        nodes,
        regions: file.regions.into_inner(),
        rtt_ms,
        jitter_ms: file.jitter_ms,
        route_batch_ms: file.route_batch_ms,
        subscribe_fence: file.subscribe_fence,
        clients,
        publishes,
        faults,
        duration_ms: file.duration_ms.into_inner(),
    };
    scenario
        .validate()
        .map_err(|e| invalid(spans.find(&e.field), e.to_string()))?;
    Ok(scenario)
}

/// Read and parse a topology file.
pub fn load(path: &Path) -> Result<Scenario, TopologyError> {
    let text = std::fs::read_to_string(path).map_err(|error| TopologyError::Read {
        path: path.display().to_string(),
        error,
    })?;
    parse(&text, &path.display().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
duration_ms = 10_000
regions = ["eu", "ap"]
rtt_ms = [
  [2, 200],
  [200, 2],
]

[[nodes]]
name = "fra"
region = "eu"

[[nodes]]
name = "hkg"
region = "ap"

[[clients]]
name = "sub"
node = "fra"
subscribe = ["t/#"]

[[clients]]
name = "pub"
node = "hkg"

[[publish]]
clients = "pub"
topic = "t/%n"
start_ms = 1000
interval_ms = 10
count = 5

[[fault]]
partition = "ap"
at_ms = 2000
duration_ms = 1000
"#;

    #[test]
    fn a_good_file_becomes_a_scenario() {
        let s = parse(GOOD, "good.toml").unwrap();
        assert_eq!(s.name, "good");
        assert_eq!(s.nodes.len(), 2);
        assert_eq!(s.rtt_ms, vec![vec![2, 200], vec![200, 2]]);
        assert_eq!(s.clients[0].subscribe, vec!["t/#".to_owned()]);
        assert_eq!(s.publishes[0].count, 5);
        assert_eq!(
            s.faults[0].kind,
            FaultKind::Partition {
                target: "ap".into()
            }
        );
    }

    fn error(text: &str) -> String {
        parse(text, "t.toml").unwrap_err().to_string()
    }

    #[test]
    fn errors_name_the_key_and_the_line() {
        let e = error(&GOOD.replace("node = \"hkg\"", "node = \"nowhere\""));
        assert!(
            e.contains("line 24") && e.contains("clients[1].node"),
            "{e}"
        );
        let e = error(&GOOD.replace("[200, 2],", "[201, 2],"));
        assert!(e.contains("line 5") && e.contains("rtt_ms[0][1]"), "{e}");
        let e = error(&GOOD.replace("count = 5", "count = 5\ncolour = 1"));
        assert!(e.contains("line 32") && e.contains("colour"), "{e}");
        let e = error(&GOOD.replace("partition = \"ap\"", "partition = \"mars\""));
        assert!(
            e.contains("line 34") && e.contains("fault[0].target"),
            "{e}"
        );
        let e = error(&GOOD.replace("subscribe = [\"t/#\"]", "subscribe = [\"t/#/x\"]"));
        assert!(e.contains("line 20") && e.contains("subscribe[0]"), "{e}");
        let e = error(&GOOD.replace("count = 5", "count = 5\nqos = 3"));
        assert!(e.contains("line 32") && e.contains("publish[0].qos"), "{e}");
    }
}
