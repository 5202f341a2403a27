//! Connection threads ([`TargetConfig::iser_threads`](super::TargetConfig::iser_threads)):
//! threads that each run a single-threaded runtime, and the connections placed on them, one
//! connection's tasks all on one thread.
//!
//! An iSER connection is several tasks that hand each message on: the queue pair's receive
//! and transmit engines (on the software RNIC), the datamover's driver, the session, the
//! commands that wait for data. On a work-stealing runtime they spread over its workers, and
//! every hand-off between two of them is a cross-thread wake-up (a parked worker woken through
//! the kernel, the state they share moving between caches). Kept on one thread, a hand-off is
//! a task queued on the same thread; the connections spread over the threads instead.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tracing::warn;

/// One thread and its runtime.
#[derive(Debug)]
struct Worker {
    handle: tokio::runtime::Handle,
    /// Connections placed here and not yet ended.
    load: Arc<AtomicUsize>,
    /// Dropped (or sent) to stop the thread: its runtime shuts down without waiting for
    /// blocking work (a store's operation on the blocking pool runs to its end on its own).
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// Threads for connections, each with a single-threaded runtime; dropped, they stop (their
/// connections' tasks are dropped with their runtimes).
#[derive(Debug)]
pub(crate) struct ConnectionThreads {
    workers: Vec<Worker>,
}

/// Counts a connection on its thread until its future ends or is dropped.
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// Start `n` threads named `{name}-0`… (at least one).
    pub(crate) fn start(n: usize, name: &str) -> std::io::Result<Self> {
        let workers = (0..n.max(1))
            .map(|i| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let handle = rt.handle().clone();
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                std::thread::Builder::new().name(format!("{name}-{i}")).spawn(move || {
                    // Until stopped: sent, or the sender dropped.
                    let _ = rt.block_on(stopped);
                    rt.shutdown_background();
                })?;
                Ok(Worker { handle, load: Arc::new(AtomicUsize::new(0)), _stop: stop })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Self { workers })
    }

    /// Run `connection` on the thread with the fewest connections (the first of them).
    pub(crate) fn spawn<F: Future<Output = ()> + Send + 'static>(&self, connection: F) {
        let Some(w) = self.workers.iter().min_by_key(|w| w.load.load(Ordering::Relaxed)) else {
            warn!("no connection thread: the connection runs on the caller's runtime");
            tokio::spawn(connection);
            return;
        };
        w.load.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(w.load.clone());
        w.handle.spawn(async move {
            let _placed = placed;
            connection.await;
        });
    }

    /// Connections on each thread now.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        self.workers.iter().map(|w| w.load.load(Ordering::Relaxed)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Where a future ran, told once it has started.
    async fn started_on(threads: &ConnectionThreads) -> (String, tokio::sync::oneshot::Sender<()>) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (end, ended) = tokio::sync::oneshot::channel::<()>();
        threads.spawn(async move {
            let _ = tx.send(std::thread::current().name().unwrap_or_default().to_string());
            let _ = ended.await;
        });
        (rx.await.unwrap(), end)
    }

    #[tokio::test]
    async fn connections_go_to_the_least_loaded_thread_and_leave_it_when_they_end() {
        let threads = ConnectionThreads::start(2, "conn").unwrap();
        let (a, end_a) = started_on(&threads).await;
        let (b, _keep_b) = started_on(&threads).await;
        assert_eq!((a.as_str(), b.as_str()), ("conn-0", "conn-1"), "one connection per thread first");
        assert_eq!(threads.loads(), [1, 1]);
        drop(end_a);
        // The ended connection's count goes once its future has finished on its thread.
        for _ in 0..200 {
            if threads.loads() == [0, 1] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(threads.loads(), [0, 1]);
        let (c, _keep_c) = started_on(&threads).await;
        assert_eq!(c, "conn-0", "the thread a connection left takes the next one");
    }

    #[tokio::test]
    async fn dropped_threads_drop_their_connections() {
        let threads = ConnectionThreads::start(1, "conn").unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (up, is_up) = tokio::sync::oneshot::channel::<()>();
        threads.spawn(async move {
            // Held until the future is dropped: its end closes `rx`.
            let _tx = tx;
            let _ = up.send(());
            std::future::pending::<()>().await;
        });
        is_up.await.unwrap();
        drop(threads);
        assert!(tokio::time::timeout(Duration::from_secs(5), rx).await.is_ok(), "the connection's future was dropped");
    }
}
