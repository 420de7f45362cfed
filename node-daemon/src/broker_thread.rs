//! The broker thread: one thread, with a runtime of its own, for everything a message between
//! plain TCP clients or across regions goes through: the broker task, and in cluster mode the
//! region mesh (the swarm, its connections and the link sessions).
//!
//! A forward crosses three tasks on each node (the broker task, the link session, the
//! connection's), and an acknowledgement crosses them back. On one thread each hand-off is a
//! call in the same run queue. On a multi-thread runtime it may wake another thread, and
//! does whenever one sleeps: across two regions at 2,000 QoS 1 messages a second the
//! receiving node made 0.9 futex calls per message that way, against 0.001–0.002 on one
//! thread (docs/benchmarks.md, "Across regions"). The broker task is one task whatever the threads,
//! so it gains nothing from the others. TLS and WebSocket connections, which compute per
//! byte, stay on the runtime's workers (`runtime.worker_threads`), as do listeners and admin
//! HTTP.

use std::thread::JoinHandle;

use anyhow::Context;
use tokio::runtime::{Handle, RuntimeMetrics};
use tokio::sync::oneshot;

/// The thread and its runtime. Dropping it stops the runtime: the tasks on it are dropped
/// where they stand, as a crash would leave them ([`crate::server::Server::shutdown`] ends
/// them in order first).
#[derive(Debug)]
pub struct BrokerThread {
    handle: Handle,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl BrokerThread {
    /// Start the thread, named `meridian-broker`.
    pub fn start() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start the broker thread's runtime")?;
        let handle = runtime.handle().clone();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("meridian-broker".to_owned())
            .spawn(move || {
                // Runs the tasks spawned on it until told to stop (or its owner is gone).
                runtime.block_on(async {
                    let _ = stopped.await;
                });
            })
            .context("cannot start the broker thread")?;
        Ok(Self {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The runtime's handle: spawn on it, or enter it to register IO with it.
    pub fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The runtime's metrics (one worker: the thread).
    pub fn metrics(&self) -> RuntimeMetrics {
        self.handle.metrics()
    }
}

impl Drop for BrokerThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.thread().id() != std::thread::current().id()
        {
            // Its tasks are dropped before it returns: the store is closed after this.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_run_on_the_thread_and_stop_with_it() {
        let thread = BrokerThread::start().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let (held_tx, mut held_rx) = oneshot::channel::<()>();
        thread.handle().spawn(async move {
            tx.send(std::thread::current().name().map(str::to_owned))
                .unwrap();
            // Never answered: the task stands until the runtime drops it.
            let _held = held_tx;
            std::future::pending::<()>().await;
        });
        assert_eq!(rx.recv().unwrap().as_deref(), Some("meridian-broker"));
        drop(thread);
        // The task, and the sender it held, were dropped with the runtime.
        assert_eq!(
            held_rx.try_recv(),
            Err(tokio::sync::oneshot::error::TryRecvError::Closed)
        );
    }
}
