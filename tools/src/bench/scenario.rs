//! Building a run's clients from a scenario, and the controller that starts, watches and ends
//! the run.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use tokio::sync::{mpsc, watch};

use super::client::{self, ClientResult, ClientSpec, Gate, Ready, RunCfg, Shared, Tally, Target};
use super::proc::{self, ProcSample};
use super::report::{Broker, Connects, Flow, Missing, Report};
use super::{Common, Load, Scenario};

/// Who publishes where and who subscribes to what.
struct Plan {
    name: &'static str,
    clients: Vec<ClientSpec>,
    publishers: usize,
    subscribers: usize,
    /// Subscribers that receive each published message.
    receivers: u64,
}

fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:05x}", std::process::id(), nanos & 0xfffff)
}

fn spec(
    common: &Common,
    run: &str,
    index: usize,
    subscribe: Option<String>,
    publish: Option<(String, u32)>,
) -> ClientSpec {
    ClientSpec {
        index,
        client_id: format!("{}-{run}-{index}", common.client_prefix),
        subscribe,
        publish,
        hears: None,
    }
}

fn flow_plan(name: &'static str, a: &super::FlowArgs, run: &str) -> anyhow::Result<Plan> {
    let n = a.clients.unwrap_or(if name == "pairs" { 1 } else { 20 });
    anyhow::ensure!(n > 0, "--clients must be at least 1");
    let c = &a.common;
    let base = format!("{}/{run}", a.prefix);
    let idx = |i: usize| u32::try_from(i).unwrap_or(u32::MAX);
    let mut clients = Vec::new();
    let (publishers, subscribers, receivers) = match name {
        "pairs" => {
            for i in 0..n {
                let t = format!("{base}/pairs/{i}");
                let mut sub = spec(c, run, 2 * i, Some(t.clone()), None);
                sub.hears = Some(idx(i));
                clients.push(sub);
                clients.push(spec(c, run, 2 * i + 1, None, Some((t, idx(i)))));
            }
            (n, n, 1)
        }
        "fan-in" => {
            clients.push(spec(c, run, 0, Some(format!("{base}/fanin/+")), None));
            for i in 0..n {
                let t = format!("{base}/fanin/{i}");
                clients.push(spec(c, run, i + 1, None, Some((t, idx(i)))));
            }
            (n, 1, 1)
        }
        "fan-out" => {
            let t = format!("{base}/fanout");
            for i in 0..n {
                clients.push(spec(c, run, i, Some(t.clone()), None));
            }
            clients.push(spec(c, run, n, None, Some((t, 0))));
            (1, n, n as u64)
        }
        _ => {
            let t = format!("{base}/mesh");
            for i in 0..n {
                clients.push(spec(c, run, i, Some(t.clone()), Some((t.clone(), idx(i)))));
            }
            (n, n, n as u64)
        }
    };
    Ok(Plan {
        name,
        clients,
        publishers,
        subscribers,
        receivers,
    })
}

/// Run a scenario and report what it measured.
pub async fn run(scenario: Scenario) -> anyhow::Result<Report> {
    let run = run_id();
    match scenario {
        Scenario::Conn(a) => {
            let clients = (0..a.clients)
                .map(|i| spec(&a.common, &run, i, None, None))
                .collect();
            connect_only("conn", &a.common, clients, 0, a.hold).await
        }
        Scenario::Sub(a) => {
            let clients = (0..a.clients)
                .map(|i| {
                    spec(
                        &a.common,
                        &run,
                        i,
                        Some(a.topic.replace("%i", &i.to_string())),
                        None,
                    )
                })
                .collect();
            connect_only("sub", &a.common, clients, a.qos, a.hold).await
        }
        Scenario::Pub(a) => {
            anyhow::ensure!(a.clients > 0, "--clients must be at least 1");
            let clients = (0..a.clients)
                .map(|i| {
                    let t = a.topic.replace("%i", &i.to_string());
                    spec(
                        &a.common,
                        &run,
                        i,
                        None,
                        Some((t, u32::try_from(i).unwrap_or(0))),
                    )
                })
                .collect();
            let plan = Plan {
                name: "pub",
                clients,
                publishers: a.clients,
                subscribers: 0,
                receivers: 0,
            };
            flow(plan, &a.common, &a.load).await
        }
        Scenario::Pairs(a) => flow(flow_plan("pairs", &a, &run)?, &a.common, &a.load).await,
        Scenario::FanIn(a) => flow(flow_plan("fan-in", &a, &run)?, &a.common, &a.load).await,
        Scenario::FanOut(a) => flow(flow_plan("fan-out", &a, &run)?, &a.common, &a.load).await,
        Scenario::Mesh(a) => flow(flow_plan("mesh", &a, &run)?, &a.common, &a.load).await,
    }
}

struct Started {
    cfg: Arc<RunCfg>,
    start: watch::Sender<bool>,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<ClientResult>>,
    ready: mpsc::UnboundedReceiver<Ready>,
}

fn start_clients(
    common: &Common,
    load: Option<&Load>,
    qos: u8,
    plan: &Plan,
) -> anyhow::Result<Started> {
    let target = Target::new(common)?;
    let sub_target = target.subscribers(common)?;
    let (start_tx, start) = watch::channel(false);
    let (stop_tx, stop) = watch::channel(false);
    let cfg = Arc::new(RunCfg {
        target,
        sub_target,
        gate: Gate::new(common.concurrency, common.connect_rate),
        qos: client::qos(qos),
        size: load.map_or(0, |l| l.size),
        rate: load.map_or(0.0, |l| l.rate),
        count: load.map_or(0, |l| l.count),
        duration: Duration::from_secs_f64(load.map_or(0.0, |l| l.duration)),
        inflight: load.map_or(100, |l| l.inflight),
        retain: load.is_some_and(|l| l.retain),
        publishers: plan.publishers,
        connect_timeout: Duration::from_secs_f64(common.timeout),
        shared: Arc::new(Shared::new()),
        start,
        stop,
    });
    let (ready_tx, ready) = mpsc::unbounded_channel();
    let tasks = plan
        .clients
        .iter()
        .cloned()
        .map(|s| tokio::spawn(client::run_client(s, cfg.clone(), ready_tx.clone())))
        .collect();
    Ok(Started {
        cfg,
        start: start_tx,
        stop: stop_tx,
        tasks,
        ready,
    })
}

/// The wait between the last SUBACK and the first PUBLISH when subscribers are at another
/// broker (`--sub-port`, `--sub-ws`): a few route batches and link crossings.
const CROSSING_SETTLE: Duration = Duration::from_millis(500);

/// Where the run's clients connect, as the report names it.
fn describe(common: &Common) -> anyhow::Result<String> {
    let target = Target::new(common)?;
    Ok(match target.subscribers(common)? {
        Some(subs) => format!("{} (subscribers at {})", target.describe(), subs.describe()),
        None => target.describe(),
    })
}

fn progress(common: &Common, len: u64, what: &str) -> ProgressBar {
    let bar = if common.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
    };
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{elapsed_precise}] {wide_bar} {pos}/{len}")
            .expect("valid template"),
    );
    bar.set_message(what.to_owned());
    bar
}

/// Wait for every client to report connected (and subscribed) or failed, within the deadline.
async fn wait_ready(
    s: &mut Started,
    n: usize,
    deadline: Instant,
    bar: &ProgressBar,
) -> (usize, Vec<String>) {
    let (mut up, mut failed) = (0, Vec::new());
    while up + failed.len() < n {
        match tokio::time::timeout_at(deadline.into(), s.ready.recv()).await {
            Ok(Some(Ready::Up)) => up += 1,
            Ok(Some(Ready::Failed(e))) => failed.push(e),
            Ok(None) | Err(_) => break,
        }
        bar.set_position((up + failed.len()) as u64);
    }
    (up, failed)
}

/// The brokers' readings, summed (`None` without a pid).
fn sample(pids: &[u32]) -> anyhow::Result<Option<ProcSample>> {
    if pids.is_empty() {
        return Ok(None);
    }
    let samples = pids
        .iter()
        .map(|pid| proc::sample(*pid))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Some(ProcSample::sum(&samples)))
}

async fn finish(s: Started) -> Vec<ClientResult> {
    let _ = s.stop.send(true);
    let mut results = Vec::with_capacity(s.tasks.len());
    for t in s.tasks {
        if let Ok(r) = t.await {
            results.push(r);
        }
    }
    results
}

/// Deliveries listed by name in a report.
const MISSING_SHOWN: usize = 10;

/// The first `limit` deliveries due and not received: subscriber, publisher, sequence number.
fn missing(results: &[ClientResult], limit: usize) -> Vec<Missing> {
    let publishers: Vec<(u32, u64)> = results
        .iter()
        .filter_map(|r| r.publisher.map(|p| (p, r.sent)))
        .collect();
    let mut out = Vec::new();
    for sub in results.iter().filter(|r| r.subscriber) {
        for &(publisher, sent) in &publishers {
            if sub.hears.is_some_and(|h| h != publisher) {
                continue;
            }
            for seq in sub.tally.missing(publisher as usize, sent) {
                if out.len() == limit {
                    return out;
                }
                out.push(Missing {
                    subscriber: sub.client_id.clone(),
                    publisher,
                    seq,
                });
            }
        }
    }
    out
}

fn first_errors(failed: &[String], results: &[ClientResult]) -> Vec<String> {
    let mut errors: Vec<String> = Vec::new();
    for e in failed
        .iter()
        .chain(results.iter().filter_map(|r| r.error.as_ref()))
    {
        if errors.len() >= 5 {
            break;
        }
        if !errors.contains(e) {
            errors.push(e.clone());
        }
    }
    errors
}

async fn connect_only(
    name: &'static str,
    common: &Common,
    clients: Vec<ClientSpec>,
    qos: u8,
    hold: f64,
) -> anyhow::Result<Report> {
    anyhow::ensure!(!clients.is_empty(), "--clients must be at least 1");
    let n = clients.len();
    let plan = Plan {
        name,
        clients,
        publishers: 0,
        subscribers: if name == "sub" { n } else { 0 },
        receivers: 0,
    };
    let before = sample(&common.broker_pid)?;
    let t0 = Instant::now();
    let mut s = start_clients(common, None, qos, &plan)?;
    let bar = progress(
        common,
        n as u64,
        if name == "sub" {
            "subscribed"
        } else {
            "connected"
        },
    );
    let deadline = t0 + Duration::from_secs_f64(common.timeout);
    let (up, failed) = wait_ready(&mut s, n, deadline, &bar).await;
    let all_secs = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if hold > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(hold)).await;
    }
    let after = sample(&common.broker_pid)?;
    let results = finish(s).await;
    let connects = Connects::from_results(&results, up, failed.len(), all_secs, name == "sub");
    let broker = Broker::new(&common.broker_pid, before, after, 0, up);
    Ok(Report {
        scenario: name.to_owned(),
        target: describe(common)?,
        clients: n,
        publishers: 0,
        subscribers: plan.subscribers,
        qos,
        retain: false,
        payload_bytes: 0,
        rate_per_publisher: 0.0,
        connects,
        messages: None,
        broker,
        errors: first_errors(&failed, &results),
    })
}

async fn flow(plan: Plan, common: &Common, load: &Load) -> anyhow::Result<Report> {
    anyhow::ensure!(
        load.size >= client::HEADER,
        "--size must be at least {} bytes (send time, publisher, sequence number)",
        client::HEADER
    );
    anyhow::ensure!(
        load.rate >= 0.0 && load.duration > 0.0,
        "--rate and --duration must be positive"
    );
    let n = plan.clients.len();
    let t0 = Instant::now();
    let hard_end = t0 + Duration::from_secs_f64(common.timeout);
    let mut s = start_clients(common, Some(load), load.qos, &plan)?;
    let bar = progress(common, n as u64, "connected");
    let (up, failed) = wait_ready(&mut s, n, hard_end, &bar).await;
    let connect_secs = t0.elapsed().as_secs_f64();
    bar.finish_and_clear();
    if up < n {
        let results = finish(s).await;
        anyhow::bail!(
            "{} of {n} clients could not connect/subscribe: {}",
            n - up,
            first_errors(&failed, &results).join("; ")
        );
    }

    if s.cfg.sub_target.is_some() {
        // Subscribers at another broker: their subscriptions reach the publishers' broker a
        // route batch and a link later than their SUBACKs. Publishing starts after that.
        tokio::time::sleep(CROSSING_SETTLE).await;
    }
    let shared = s.cfg.shared.clone();
    let before = sample(&common.broker_pid)?;
    let start_ns = shared.now_ns();
    let _ = s.start.send(true);
    let per_pub = if load.rate > 0.0 {
        load.count.min((load.rate * load.duration).ceil() as u64)
    } else {
        load.count
    };
    let planned = per_pub * plan.publishers as u64 * plan.receivers.max(1);
    let bar = progress(
        common,
        planned,
        if plan.receivers > 0 {
            "received"
        } else {
            "sent"
        },
    );
    let drain = Duration::from_secs_f64(load.drain);
    let publish_end = Instant::now() + Duration::from_secs_f64(load.duration);
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    loop {
        tick.tick().await;
        let sent = shared.sent.load(Ordering::Relaxed);
        let received = shared.received.load(Ordering::Relaxed);
        bar.set_position(if plan.receivers > 0 { received } else { sent });
        let now = Instant::now();
        if now >= hard_end {
            break;
        }
        let publishing = shared.publishers_done.load(Ordering::Relaxed) < plan.publishers;
        if publishing {
            // QoS 1/2 acknowledgements may lag the end of publishing; bounded by `drain`.
            if now >= publish_end + drain {
                break;
            }
            continue;
        }
        let expected = sent * plan.receivers;
        if received >= expected {
            break;
        }
        let last = shared
            .last_recv_ns
            .load(Ordering::Relaxed)
            .max(shared.last_sent_ns.load(Ordering::Relaxed));
        if shared.now_ns().saturating_sub(last)
            >= u64::try_from(drain.as_nanos()).unwrap_or(u64::MAX)
        {
            break;
        }
    }
    bar.finish_and_clear();
    let after = sample(&common.broker_pid)?;
    let results = finish(s).await;

    let mut tally = Tally::default();
    let (mut sent, mut acked) = (0, 0);
    for r in &results {
        tally.merge(&r.tally);
        sent += r.sent;
        acked += r.acked;
    }
    let secs = |end_ns: u64| end_ns.saturating_sub(start_ns) as f64 / 1e9;
    let publish_secs = secs(shared.last_sent_ns.load(Ordering::Relaxed));
    let recv_secs = secs(shared.last_recv_ns.load(Ordering::Relaxed));
    let expected = sent * plan.receivers;
    let mut flow = Flow::new(sent, acked, expected, &tally, publish_secs, recv_secs);
    flow.missing = missing(&results, MISSING_SHOWN);
    let delivered = tally.unique;
    let broker = Broker::new(&common.broker_pid, before, after, delivered, up);
    Ok(Report {
        scenario: plan.name.to_owned(),
        target: describe(common)?,
        clients: n,
        publishers: plan.publishers,
        subscribers: plan.subscribers,
        qos: load.qos,
        retain: load.retain,
        payload_bytes: load.size,
        rate_per_publisher: load.rate,
        connects: Connects::from_results(
            &results,
            up,
            failed.len(),
            connect_secs,
            plan.subscribers > 0,
        ),
        messages: Some(flow),
        broker,
        errors: first_errors(&failed, &results),
    })
}
