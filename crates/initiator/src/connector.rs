//! How a session's connections are made: a transport connection and its datamover.

use crate::Error;
use riser_datamover::{BoxFuture, SharedDatamover};
use riser_iscsi::keys::Transport;

/// Makes the connections of a session: a transport connection and its datamover, ready for
/// the first Login Request.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// Connect to `addr`.
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>>;
    /// The transport (it selects the login key set: digests on TCP, RDMAExtensions on iSER).
    fn transport(&self) -> Transport;
}

/// iSER over an RDMA provider (the software iWARP RNIC, or rdma-core).
#[cfg(feature = "iser")]
#[derive(Debug)]
pub struct IserConnector<P: riser_verbs::Provider> {
    provider: P,
    config: riser_iser::IserConfig,
}

#[cfg(feature = "iser")]
impl<P: riser_verbs::Provider + Clone + 'static> IserConnector<P> {
    /// Connections through `provider` with `config` (each with a protection domain of its own).
    pub fn new(provider: P, config: riser_iser::IserConfig) -> Self {
        Self { provider, config }
    }
}

#[cfg(feature = "iser")]
impl<P: riser_verbs::Provider + Clone + 'static> Connector for IserConnector<P> {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let (p, cfg) = (self.provider.clone(), self.config);
            let dm = tokio::task::spawn_blocking(move || riser_iser::connect(&p, addr, cfg))
                .await
                .map_err(|e| Error::Connect(std::io::Error::other(e)))?
                .map_err(|e| Error::Connect(std::io::Error::other(e)))?;
            tokio::spawn(dm.driver());
            Ok(std::sync::Arc::new(dm) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Iser
    }
}

/// iSCSI over TCP.
///
/// ```
/// # use riser_initiator::TcpConnector;
/// # use std::time::Duration;
/// // Poll each connection's socket for 50 µs before sleeping (see `busy_poll`).
/// let connector = TcpConnector::default().busy_poll(Some(Duration::from_micros(50)));
/// ```
#[cfg(feature = "tcp")]
#[derive(Clone, Copy, Debug, Default)]
pub struct TcpConnector {
    options: riser_tcp::SocketOptions,
}

#[cfg(feature = "tcp")]
impl TcpConnector {
    /// Busy polling on each connection's socket ([`riser_tcp::SocketOptions::busy_poll`]): a
    /// connection whose stream runs dry keeps looking for the next bytes for up to `budget`
    /// before it sleeps, which takes the wake-up out of a low-queue-depth round trip at the
    /// price of CPU while waiting. Default: `None` (sleep at once).
    pub fn busy_poll(mut self, budget: Option<std::time::Duration>) -> Self {
        self.options = self.options.busy_poll(budget);
        self
    }
}

#[cfg(feature = "tcp")]
impl Connector for TcpConnector {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.map_err(Error::Connect)?;
            let (dm, driver) = riser_tcp::datamover_with(stream, riser_iscsi::keys::Role::Initiator, self.options);
            tokio::spawn(driver);
            Ok(std::sync::Arc::new(dm) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
}

/// The connector of a [`crate::SessionConfig`] in a build without the `tcp` feature: every
/// connection fails until the embedder sets one (an [`IserConnector`] or its own).
#[cfg(not(feature = "tcp"))]
#[derive(Debug, Default)]
pub struct NoConnector;

#[cfg(not(feature = "tcp"))]
impl Connector for NoConnector {
    fn connect(&self, _: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async {
            Err(Error::Connect(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "built without the tcp feature: set SessionConfig::connector",
            )))
        })
    }
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
}
