//! The iSER portal (feature `iser`): each RDMA connection request becomes an iSER datamover over
//! a riser-verbs provider, then a session exactly as over TCP.

use super::threads::ConnectionThreads;
use super::{Portal, Target};
use riser_iscsi::keys::{DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, Transport};
use std::sync::Arc;
use tracing::warn;

/// Closes a listener when dropped (its `get_request` in another thread then returns).
struct CloseOnDrop<L: riser_verbs::Listener>(Arc<L>);

impl<L: riser_verbs::Listener> Drop for CloseOnDrop<L> {
    fn drop(&mut self) {
        self.0.close();
    }
}

impl Target {
    /// The threads iSER connections run on, started at the first call (when the first iSER
    /// portal starts serving; `None`: none asked for, or they could not be started: on the
    /// caller's runtime).
    fn iser_threads(&self) -> Option<&ConnectionThreads> {
        self.iser_threads
            .get_or_init(|| match self.config.iser_threads {
                0 => None,
                n => ConnectionThreads::start(n, self.config.max_connections, "riser-iser")
                    .inspect_err(|e| warn!("iSER connection threads not started ({e}): connections run on the portal's runtime"))
                    .ok(),
            })
            .as_ref()
    }

    /// Accept iSER connections on `listener` (an RDMA provider's listener) until the task is
    /// dropped: each connection request becomes an iSER datamover, then a session exactly as
    /// over TCP. `cfg.recv_depth` is raised above the CmdSN window so MaxCmdSN never opens
    /// beyond posted receives.
    #[cfg_attr(docsrs, doc(cfg(feature = "iser")))]
    pub async fn serve_iser<P: riser_verbs::Provider + Clone + 'static>(
        self: Arc<Self>,
        provider: P,
        listener: P::Listener,
        mut cfg: riser_iser::IserConfig,
    ) -> std::io::Result<()> {
        use riser_verbs::Listener as _;
        // A receive per command in the window, and per unsolicited Data-Out Send when those are
        // allowed, plus room for immediate PDUs (NOP-Out, task management, text, logout).
        let per_command = if self.config.iser_unsolicited_data {
            1 + self.config.login.operational.first_burst_length.div_ceil(cfg.recv_dsl.max(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH))
        } else {
            1
        };
        cfg.recv_depth = cfg.recv_depth.max(self.config.queue_depth.saturating_mul(per_command).saturating_add(16));
        let portal = listener.local_addr().map_err(std::io::Error::other)?;
        let _serving = self.serving(Portal::iser(portal));
        // The kept connection threads start with the portal, not with its first connection: a
        // fixed part of a serving portal (a runtime's epoll and waker descriptors each), not
        // something a connection leaves behind (a thread of its own, beyond them, ends with its
        // connection).
        self.iser_threads();
        // The provider's listener blocks: it runs on a thread of its own (not the blocking pool,
        // which a runtime waits for at shutdown) and hands requests over. When this future is
        // dropped the listener is closed: the thread's wait ends, and the address is free once
        // the thread has let go of the listener.
        let listener = Arc::new(listener);
        let _close = CloseOnDrop(listener.clone());
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        std::thread::Builder::new().name("iser-listen".into()).spawn(move || {
            loop {
                let r = listener.get_request();
                let failed = r.is_err();
                if tx.blocking_send(r).is_err() || failed && tx.is_closed() {
                    break;
                }
            }
        })?;
        while let Some(req) = rx.recv().await {
            let req = match req {
                Ok(r) => r,
                Err(e) => {
                    warn!("iSER connection request failed: {e}");
                    continue;
                }
            };
            use riser_verbs::ConnectionRequest as _;
            let Some(permit) = self.admit(req.peer()) else {
                req.reject(&[]);
                continue;
            };
            let (p, me) = (provider.clone(), self.clone());
            // Everything of the connection runs where this future does: the accept (on that
            // runtime's blocking pool) starts the software RNIC's engines on its runtime, and
            // the driver, the session and its commands are spawned on it.
            let connection = async move {
                match tokio::task::spawn_blocking(move || riser_iser::accept(&p, req, cfg)).await {
                    Ok(Ok((dm, peer))) => {
                        tokio::spawn(dm.driver());
                        me.connection(Arc::new(dm), Transport::Iser, peer, portal).await;
                        drop(permit);
                    }
                    Ok(Err(e)) => warn!("iSER accept failed: {e}"),
                    Err(e) => warn!("iSER accept failed: {e}"),
                }
            };
            match self.iser_threads() {
                Some(threads) => threads.spawn(connection),
                None => drop(tokio::spawn(connection)),
            }
        }
        Ok(())
    }
}
