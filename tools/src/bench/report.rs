//! What a run measured, as text or JSON.

use std::io::Write;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::client::{ClientResult, Tally, new_histogram};
use super::proc::ProcSample;

/// The result of one `meridian bench` run (the `--json` object).
#[derive(Debug, Serialize)]
pub struct Report {
    pub scenario: String,
    pub target: String,
    pub clients: usize,
    pub publishers: usize,
    pub subscribers: usize,
    pub qos: u8,
    /// Messages were published with the RETAIN flag.
    pub retain: bool,
    pub payload_bytes: usize,
    /// Messages per second per publisher; 0 = as fast as possible.
    pub rate_per_publisher: f64,
    pub connects: Connects,
    pub messages: Option<Flow>,
    pub broker: Option<Broker>,
    /// The first few distinct errors clients met.
    pub errors: Vec<String>,
}

/// Latency percentiles, microseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Percentiles {
    pub p50_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        #[allow(clippy::cast_precision_loss)]
        let us = |v: u64| v as f64 / 1e3;
        Self {
            p50_us: us(h.value_at_quantile(0.50)),
            p95_us: us(h.value_at_quantile(0.95)),
            p99_us: us(h.value_at_quantile(0.99)),
            max_us: us(h.max()),
        }
    }
}

/// Connecting (and subscribing).
#[derive(Debug, Serialize)]
pub struct Connects {
    pub ok: usize,
    pub failed: usize,
    /// From the first attempt until the last client was up (connected, and subscribed).
    pub all_up_secs: f64,
    /// TCP (TLS, WebSocket) connect until CONNACK.
    pub connack: Option<Percentiles>,
    /// Connect until SUBACK.
    pub suback: Option<Percentiles>,
}

impl Connects {
    pub fn from_results(
        results: &[ClientResult],
        ok: usize,
        failed: usize,
        all_up_secs: f64,
        subscribed: bool,
    ) -> Self {
        let hist = |f: &dyn Fn(&ClientResult) -> Option<u64>| {
            let mut h = new_histogram();
            for v in results.iter().filter_map(f) {
                h.saturating_record(v.max(1));
            }
            (!h.is_empty()).then(|| Percentiles::of(&h))
        };
        Self {
            ok,
            failed,
            all_up_secs,
            connack: hist(&|r| r.connect_ns),
            suback: if subscribed {
                hist(&|r| r.suback_ns)
            } else {
                None
            },
        }
    }
}

/// Messages.
#[derive(Debug, Serialize)]
pub struct Flow {
    /// PUBLISHes written by the publishers.
    pub sent: u64,
    /// PUBACKs (QoS 1) or PUBCOMPs (QoS 2) received by the publishers.
    pub acked: u64,
    /// Deliveries due: sent × subscribers each message reaches.
    pub expected: u64,
    pub received: u64,
    pub lost: u64,
    pub duplicates: u64,
    /// Deliveries that were not from this run's publishers.
    pub foreign: u64,
    /// From the start until the last PUBLISH was written.
    pub publish_secs: f64,
    pub sent_per_sec: f64,
    /// From the start until the last delivery.
    pub receive_secs: f64,
    pub received_per_sec: f64,
    /// Publisher's send time to the subscriber's receive time.
    pub latency: Option<Percentiles>,
    /// The first few deliveries counted in `lost`, by name.
    pub missing: Vec<Missing>,
}

/// A delivery that was due and did not arrive.
#[derive(Debug, Clone, Serialize)]
pub struct Missing {
    /// The subscriber's client id.
    pub subscriber: String,
    pub publisher: u32,
    /// The publisher's sequence number (0 is its first message).
    pub seq: u64,
}

fn per_sec(n: u64, secs: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    if secs > 0.0 { n as f64 / secs } else { 0.0 }
}

impl Flow {
    pub fn new(
        sent: u64,
        acked: u64,
        expected: u64,
        t: &Tally,
        publish_secs: f64,
        receive_secs: f64,
    ) -> Self {
        Self {
            sent,
            acked,
            expected,
            received: t.received,
            lost: expected.saturating_sub(t.unique),
            duplicates: t.duplicates,
            foreign: t.foreign,
            publish_secs,
            sent_per_sec: per_sec(sent, publish_secs),
            receive_secs,
            received_per_sec: per_sec(t.received - t.foreign, receive_secs),
            latency: t.latency_ns.as_ref().map(Percentiles::of),
            missing: Vec::new(),
        }
    }
}

/// The broker's use of the machine, from `--broker-pid` (summed over several).
#[derive(Debug, Serialize)]
pub struct Broker {
    pub pids: Vec<u32>,
    /// CPU time (user + system) during the measured phase.
    pub cpu_secs: f64,
    /// The part of `cpu_secs` spent in the kernel.
    pub cpu_system_secs: f64,
    /// CPU time per delivered message, microseconds.
    pub cpu_us_per_message: Option<f64>,
    pub rss_before_bytes: u64,
    pub rss_after_bytes: u64,
    /// RSS growth per connected client.
    pub rss_per_connection_bytes: Option<f64>,
    /// Bytes written to storage during the measured phase.
    pub storage_write_bytes: Option<u64>,
    /// Bytes written to storage per delivered message.
    pub storage_bytes_per_message: Option<f64>,
}

impl Broker {
    pub fn new(
        pids: &[u32],
        before: Option<ProcSample>,
        after: Option<ProcSample>,
        delivered: u64,
        connections: usize,
    ) -> Option<Self> {
        let (before, after) = (before?, after?);
        let cpu = (after.cpu_secs - before.cpu_secs).max(0.0);
        let written = after
            .write_bytes
            .zip(before.write_bytes)
            .map(|(a, b)| a.saturating_sub(b));
        #[allow(clippy::cast_precision_loss)]
        Some(Self {
            pids: pids.to_vec(),
            storage_write_bytes: written,
            storage_bytes_per_message: written
                .filter(|_| delivered > 0)
                .map(|w| w as f64 / delivered as f64),
            cpu_secs: cpu,
            cpu_system_secs: (after.system_secs - before.system_secs).clamp(0.0, cpu),
            cpu_us_per_message: (delivered > 0).then(|| cpu * 1e6 / delivered as f64),
            rss_before_bytes: before.rss_bytes,
            rss_after_bytes: after.rss_bytes,
            rss_per_connection_bytes: (delivered == 0 && connections > 0)
                .then(|| (after.rss_bytes as f64 - before.rss_bytes as f64) / connections as f64),
        })
    }
}

impl Report {
    pub fn write_json(&self, out: &mut impl Write) -> anyhow::Result<()> {
        serde_json::to_writer(&mut *out, self)?;
        writeln!(out)?;
        Ok(())
    }

    pub fn write_text(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let lat = |p: &Percentiles| {
            format!(
                "p50 {:.0} µs  p95 {:.0} µs  p99 {:.0} µs  max {:.0} µs",
                p.p50_us, p.p95_us, p.p99_us, p.max_us
            )
        };
        writeln!(
            out,
            "{} against {}: {} clients ({} publishers, {} subscribers), QoS {}{}",
            self.scenario,
            self.target,
            self.clients,
            self.publishers,
            self.subscribers,
            self.qos,
            if self.retain { ", retained" } else { "" }
        )?;
        let c = &self.connects;
        writeln!(
            out,
            "  clients up      {} ok, {} failed, all up in {:.3} s",
            c.ok, c.failed, c.all_up_secs
        )?;
        if let Some(p) = &c.connack {
            writeln!(out, "  connect→CONNACK {}", lat(p))?;
        }
        if let Some(p) = &c.suback {
            writeln!(out, "  connect→SUBACK  {}", lat(p))?;
        }
        if let Some(m) = &self.messages {
            writeln!(
                out,
                "  payload         {} bytes, {}",
                self.payload_bytes,
                if self.rate_per_publisher > 0.0 {
                    format!("{} msg/s per publisher", self.rate_per_publisher)
                } else {
                    "as fast as possible".to_owned()
                }
            )?;
            writeln!(
                out,
                "  sent            {} in {:.3} s = {:.0} msg/s ({} acknowledged)",
                m.sent, m.publish_secs, m.sent_per_sec, m.acked
            )?;
            writeln!(
                out,
                "  received        {} of {} in {:.3} s = {:.0} msg/s",
                m.received, m.expected, m.receive_secs, m.received_per_sec
            )?;
            writeln!(
                out,
                "  lost            {}   duplicates {}   foreign {}",
                m.lost, m.duplicates, m.foreign
            )?;
            if !m.missing.is_empty() {
                let shown: Vec<String> = m
                    .missing
                    .iter()
                    .map(|x| format!("{} from publisher {} #{}", x.subscriber, x.publisher, x.seq))
                    .collect();
                let more = if m.lost > shown.len() as u64 {
                    ", …"
                } else {
                    ""
                };
                writeln!(out, "  missing         {}{more}", shown.join(", "))?;
            }
            if let Some(p) = &m.latency {
                writeln!(out, "  latency         {}", lat(p))?;
            }
        }
        if let Some(b) = &self.broker {
            write!(
                out,
                "  broker pid {}    CPU {:.3} s ({:.3} s in the kernel)",
                b.pids
                    .iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join("+"),
                b.cpu_secs,
                b.cpu_system_secs
            )?;
            if let Some(us) = b.cpu_us_per_message {
                write!(out, " = {us:.2} µs per delivered message")?;
            }
            writeln!(
                out,
                ", RSS {:.1} → {:.1} MiB",
                b.rss_before_bytes as f64 / 1048576.0,
                b.rss_after_bytes as f64 / 1048576.0
            )?;
            if let Some(per) = b.rss_per_connection_bytes {
                writeln!(out, "  broker RSS per connection {:.0} bytes", per)?;
            }
            if let Some(written) = b.storage_write_bytes {
                write!(out, "  broker storage  {written} bytes written")?;
                match b.storage_bytes_per_message {
                    Some(per) => writeln!(out, " = {per:.0} bytes per delivered message")?,
                    None => writeln!(out)?,
                }
            }
        }
        for e in &self.errors {
            writeln!(out, "  error: {e}")?;
        }
        Ok(())
    }
}
