//! Connection threads ([`TargetConfig::iser_threads`](super::TargetConfig::iser_threads)):
//! threads that each run a single-threaded runtime, and the connections placed on them, one
//! connection's tasks all on one thread.
//!
//! A connection goes to a kept thread that has none; once every kept thread has one, it gets
//! a thread of its own, which ends with it (up to a bound, then the kept thread with the
//! fewest). Two connections sharing a thread queue every hand-off behind the other's tasks:
//! on the 2-core development VM, given a thread each instead of two shared, four sessions'
//! 4 KiB reads over iSER were 1.10× as fast, eight sessions' 1.16×, four sessions' 256 KiB
//! reads 1.09×; 64 KiB writes unchanged (medians of interleaved runs).
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
    /// The kept threads.
    workers: Vec<Worker>,
    /// The kept threads' name, before their number (own threads add `o`).
    name: String,
    /// Threads of their own running now (see [`ConnectionThreads::spawn`]), each counted until
    /// it has ended.
    own: Arc<AtomicUsize>,
    /// The most threads of their own at once.
    own_max: usize,
    /// Dropped with this: every thread of its own stops (its receivers see the channel close).
    stop_own: tokio::sync::watch::Sender<()>,
}

/// How long a thread of its own waits, once its connection has ended, for the tasks the
/// connection spawned there (the software RNIC's engines, the datamover's driver) to end
/// before its runtime drops them.
const OWN_THREAD_WIND_DOWN: std::time::Duration = std::time::Duration::from_secs(1);

/// Counts a connection on a kept thread until its future ends or is dropped; a thread of its
/// own, until the thread ends.
struct Placed(Arc<AtomicUsize>);

impl Drop for Placed {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ConnectionThreads {
    /// Start `n` threads named `{name}-0`… (at least one) that are kept, and allow up to
    /// `own_max` more at once, each for one connection.
    pub(crate) fn start(n: usize, own_max: usize, name: &str) -> std::io::Result<Self> {
        let workers = (0..n.max(1))
            .map(|i| {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
                let handle = rt.handle().clone();
                let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
                spawn_with(format!("{name}-{i}"), rt, move |rt| {
                    // Until stopped: sent, or the sender dropped.
                    let _ = rt.block_on(stopped);
                    rt.shutdown_background();
                })
                .map_err(|(e, rt)| {
                    rt.shutdown_background();
                    e
                })?;
                Ok(Worker { handle, load: Arc::new(AtomicUsize::new(0)), _stop: stop })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let (stop_own, _) = tokio::sync::watch::channel(());
        Ok(Self { workers, name: name.to_string(), own: Arc::new(AtomicUsize::new(0)), own_max, stop_own })
    }

    /// Run `connection` on a kept thread that has none; else on a thread of its own, while
    /// fewer than `own_max` run (one that cannot be started is warned of); else on the kept
    /// thread with the fewest connections (the first of them).
    pub(crate) fn spawn<F: Future<Output = ()> + Send + 'static>(&self, connection: F) {
        let Some(w) = self.workers.iter().min_by_key(|w| w.load.load(Ordering::Relaxed)) else {
            warn!("no connection thread: the connection runs on the caller's runtime");
            tokio::spawn(connection);
            return;
        };
        // A place among the threads of their own, taken at once (two portals may place
        // connections together).
        let own_room = || self.own.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < self.own_max).then_some(n + 1)).is_ok();
        let connection = if w.load.load(Ordering::Relaxed) > 0 && own_room() {
            match self.spawn_own(connection) {
                Ok(()) => return,
                Err((e, connection)) => {
                    warn!("no thread of its own for a connection ({e}): it shares one");
                    connection
                }
            }
        } else {
            connection
        };
        w.load.fetch_add(1, Ordering::Relaxed);
        let placed = Placed(w.load.clone());
        w.handle.spawn(async move {
            let _placed = placed;
            connection.await;
        });
    }

    /// Run `connection` on a new thread of its own (its place in `own` already taken), which
    /// ends once the connection's future and the tasks it spawned there have (those still
    /// running a second after it are dropped), or when these threads are dropped. Gives the
    /// connection back (and the place) if the thread or its runtime cannot be started.
    #[allow(clippy::result_large_err)]
    fn spawn_own<F: Future<Output = ()> + Send + 'static>(&self, connection: F) -> Result<(), (std::io::Error, F)> {
        let placed = Placed(self.own.clone());
        let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
            Ok(rt) => rt,
            Err(e) => return Err((e, connection)),
        };
        let mut stop = self.stop_own.subscribe();
        let started = spawn_with(format!("{}-o", self.name), (rt, connection, placed), move |(rt, connection, _placed)| {
            rt.block_on(async {
                // A task, as on a kept thread: a panic in it ends the connection, not the thread.
                let connection = tokio::spawn(connection);
                tokio::select! {
                    _ = connection => {}
                    // `Err`: the threads were dropped.
                    _ = stop.changed() => return,
                }
                let tasks = tokio::runtime::Handle::current().metrics();
                let deadline = tokio::time::Instant::now() + OWN_THREAD_WIND_DOWN;
                while tasks.num_alive_tasks() > 0 && tokio::time::Instant::now() < deadline {
                    tokio::select! {
                        _ = tokio::time::sleep(std::time::Duration::from_millis(10)) => {}
                        _ = stop.changed() => return,
                    }
                }
            });
            rt.shutdown_background();
        });
        started.map_err(|(e, (rt, connection, _placed))| {
            rt.shutdown_background();
            (e, connection)
        })
    }

    /// Threads of their own running now.
    #[cfg(test)]
    fn own_running(&self) -> usize {
        self.own.load(Ordering::Relaxed)
    }

    /// Connections on each thread now.
    #[cfg(test)]
    fn loads(&self) -> Vec<usize> {
        self.workers.iter().map(|w| w.load.load(Ordering::Relaxed)).collect()
    }
}

/// Start a thread named `name` running `body(value)`; `value` back if the thread cannot be
/// started (a runtime in it is then the caller's to shut down: dropped in an async context it
/// would panic).
#[allow(clippy::result_large_err)]
fn spawn_with<T: Send + 'static>(name: String, value: T, body: impl FnOnce(T) + Send + 'static) -> Result<(), (std::io::Error, T)> {
    // Through a slot: `spawn` drops its closure, and what it holds, when it fails.
    let slot = Arc::new(std::sync::Mutex::new(Some(value)));
    let theirs = slot.clone();
    let started = std::thread::Builder::new().name(name).spawn(move || {
        let value = theirs.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(value) = value {
            body(value);
        }
    });
    match started {
        Ok(_) => Ok(()),
        Err(e) => match slot.lock().unwrap_or_else(|e| e.into_inner()).take() {
            Some(value) => Err((e, value)),
            None => unreachable!("a thread that never started took the value"),
        },
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
        let threads = ConnectionThreads::start(2, 0, "conn").unwrap();
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
        let threads = ConnectionThreads::start(1, 1, "conn").unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let (up, is_up) = tokio::sync::oneshot::channel::<()>();
        threads.spawn(async move {
            // Held until the future is dropped: its end closes `rx`.
            let _tx = tx;
            let _ = up.send(());
            std::future::pending::<()>().await;
        });
        is_up.await.unwrap();
        // The second goes to a thread of its own, the third shares the kept one.
        let (own, own_end) = tokio::sync::oneshot::channel::<()>();
        let (own_up, own_is_up) = tokio::sync::oneshot::channel::<String>();
        threads.spawn(async move {
            let _own = own;
            let _ = own_up.send(std::thread::current().name().unwrap_or_default().to_string());
            std::future::pending::<()>().await;
        });
        assert_eq!(own_is_up.await.unwrap(), "conn-o");
        let (c, _keep_c) = started_on(&threads).await;
        assert_eq!(c, "conn-0", "beyond own_max, the kept thread with the fewest");
        drop(threads);
        assert!(tokio::time::timeout(Duration::from_secs(5), rx).await.is_ok(), "the connection's future was dropped");
        assert!(tokio::time::timeout(Duration::from_secs(5), own_end).await.is_ok(), "the own thread's connection was dropped");
    }

    /// Once every kept thread has a connection, the next gets a thread of its own, which ends
    /// with it — after the tasks it spawned there, given up to a second.
    #[tokio::test]
    async fn a_connection_beyond_the_kept_threads_gets_a_thread_that_ends_with_it() {
        let threads = ConnectionThreads::start(1, 4, "conn").unwrap();
        let (a, _keep_a) = started_on(&threads).await;
        assert_eq!(a, "conn-0");
        let (task_done, task_ended) = tokio::sync::oneshot::channel::<String>();
        let (b, end_b) = {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let (end, ended) = tokio::sync::oneshot::channel::<()>();
            threads.spawn(async move {
                let _ = tx.send(std::thread::current().name().unwrap_or_default().to_string());
                // A task of the connection's, outliving it briefly (as the RNIC's engines do).
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    let _ = task_done.send(std::thread::current().name().unwrap_or_default().to_string());
                });
                let _ = ended.await;
            });
            (rx.await.unwrap(), end)
        };
        assert_eq!(b, "conn-o");
        assert_eq!((threads.loads(), threads.own_running()), (vec![1], 1));
        drop(end_b);
        assert_eq!(task_ended.await.unwrap(), "conn-o", "the connection's task ran to its end on its thread");
        for _ in 0..400 {
            if threads.own_running() == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(threads.own_running(), 0, "the thread ended with its connection");
    }
}
