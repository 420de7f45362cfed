//! `link-proxy LISTEN_PORT TARGET_PORT ONE_WAY_MS [BYTES_PER_SEC]`: relays
//! 127.0.0.1:LISTEN_PORT to 127.0.0.1:TARGET_PORT, adding ONE_WAY_MS of latency each way and,
//! with BYTES_PER_SEC, carrying at most that many bytes a second each way, until interrupted.
//! `run.sh --latency MS --bandwidth BYTES_PER_SEC` puts one between every two regions.

use anyhow::Context;
use meridian_tools::link_proxy::LinkProxy;

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (listen, target, ms, rate) = match args.as_slice() {
        [listen, target, ms] => (listen, target, ms, None),
        [listen, target, ms, rate] => (listen, target, ms, Some(rate)),
        _ => anyhow::bail!("usage: link-proxy LISTEN_PORT TARGET_PORT ONE_WAY_MS [BYTES_PER_SEC]"),
    };
    let listen: u16 = listen.parse().context("LISTEN_PORT")?;
    let target: u16 = target.parse().context("TARGET_PORT")?;
    let ms: u64 = ms.parse().context("ONE_WAY_MS")?;
    let rate: u64 = rate.map_or(Ok(0), |r| r.parse()).context("BYTES_PER_SEC")?;
    let proxy = LinkProxy::start_on(listen, target)
        .await
        .with_context(|| format!("cannot listen on 127.0.0.1:{listen}"))?;
    proxy.set_one_way_latency(ms);
    proxy.set_bandwidth(rate);
    tokio::signal::ctrl_c().await?;
    Ok(())
}
