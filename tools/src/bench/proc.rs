//! The broker's CPU time, memory and storage writes, from `/proc/PID/stat`, `/proc/PID/status`
//! and `/proc/PID/io`.

use anyhow::Context;
use serde::Serialize;

/// One reading of a process.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ProcSample {
    /// User + system CPU time of all its threads, in seconds.
    pub cpu_secs: f64,
    /// The part of `cpu_secs` spent in the kernel on its behalf (system calls, the network
    /// stack, page faults), in seconds.
    pub system_secs: f64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
    /// Bytes it caused to be written to storage (`write_bytes` of `/proc/PID/io`; `None` where
    /// that cannot be read).
    pub write_bytes: Option<u64>,
}

impl ProcSample {
    /// The sum of several processes' readings (a deployment of several brokers).
    pub fn sum(samples: &[Self]) -> Self {
        Self {
            cpu_secs: samples.iter().map(|s| s.cpu_secs).sum(),
            system_secs: samples.iter().map(|s| s.system_secs).sum(),
            rss_bytes: samples.iter().map(|s| s.rss_bytes).sum(),
            write_bytes: samples.iter().map(|s| s.write_bytes).sum(),
        }
    }
}

/// Read `pid`'s CPU time and resident memory.
pub fn sample(pid: u32) -> anyhow::Result<ProcSample> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("cannot read /proc/{pid}/stat (is the broker running?)"))?;
    // The command name is in parentheses and may hold spaces; fields follow the last ')'.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("unexpected /proc/PID/stat format")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime), counted from 1 over the whole line: here 11 and 12
    // after the state (field 3 is fields[0]).
    let ticks = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .context("short /proc/PID/stat")?
            .parse::<u64>()
            .context("bad /proc/PID/stat field")
    };
    let (user_ticks, system_ticks) = (ticks(11)?, ticks(12)?);
    #[allow(clippy::cast_precision_loss)]
    let secs = |t: u64| t as f64 / rustix::param::clock_ticks_per_second() as f64;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    // Readable for the process's own user (or root) only.
    let write_bytes = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .ok()
        .and_then(|io| {
            io.lines()
                .find_map(|l| l.strip_prefix("write_bytes:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        });
    Ok(ProcSample {
        cpu_secs: secs(user_ticks + system_ticks),
        system_secs: secs(system_ticks),
        rss_bytes: rss_kib * 1024,
        write_bytes,
    })
}

/// Raise this process's open-file limit to its hard limit (many clients need many sockets).
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut limit = getrlimit(Resource::Nofile);
    if limit.current < limit.maximum {
        limit.current = limit.maximum;
        let _ = setrlimit(Resource::Nofile, limit);
    }
}
