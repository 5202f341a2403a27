//! The iSCSI/TCP portal (feature `tcp`): each accepted connection becomes a TCP datamover, then
//! a session.

use super::{Portal, Target};
use riser_iscsi::keys::{Role, Transport};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tracing::warn;

impl Target {
    /// Accept connections on `listener` until the task is dropped. Accept errors (out of file
    /// descriptors, a connection reset before it was accepted) are logged and retried after a
    /// pause that grows to a second; they never end the portal.
    ///
    /// Target nodes without portal groups of their own are reached through every portal served
    /// so, and list it in SendTargets while it is served.
    #[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let _serving = self.serving(Portal::tcp(listener.local_addr()?));
        let mut pause = Duration::from_millis(10);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => {
                    pause = Duration::from_millis(10);
                    c
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?pause, "accept failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(permit) = self.admit(peer) else { continue };
            let local = stream.local_addr().unwrap_or(peer);
            let me = self.clone();
            tokio::spawn(async move {
                let options = riser_tcp::SocketOptions::default().busy_poll(me.config.busy_poll);
                let (dm, driver) = riser_tcp::datamover_with(stream, Role::Target, options);
                dm.set_segment_timeout(me.config.data_timeout);
                tokio::spawn(driver);
                me.connection(Arc::new(dm), Transport::Tcp, peer, local).await;
                drop(permit);
            });
        }
    }
}
