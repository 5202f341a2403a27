//! How a session's connections are made: a transport connection and its datamover.

use crate::Error;
use riser_datamover::{BoxFuture, SharedDatamover};
use riser_iscsi::keys::{Role, Transport};
use std::sync::Arc;
use tokio::net::TcpStream;

/// Makes the connections of a session: a transport connection and its datamover, ready for
/// the first Login Request.
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// Connect to `addr`.
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>>;
    /// The transport (it selects the login key set: digests on TCP, RDMAExtensions on iSER).
    fn transport(&self) -> Transport;
}

/// iSER over an RDMA provider (the software iWARP RNIC, or rdma-core).
#[derive(Debug)]
pub struct IserConnector<P: riser_verbs::Provider> {
    provider: P,
    config: riser_iser::IserConfig,
}

impl<P: riser_verbs::Provider + Clone + 'static> IserConnector<P> {
    /// Connections through `provider` with `config` (each with a protection domain of its own).
    pub fn new(provider: P, config: riser_iser::IserConfig) -> Self {
        Self { provider, config }
    }
}

impl<P: riser_verbs::Provider + Clone + 'static> Connector for IserConnector<P> {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let (p, cfg) = (self.provider.clone(), self.config);
            let dm = tokio::task::spawn_blocking(move || riser_iser::connect(&p, addr, cfg))
                .await
                .map_err(|e| Error::Connect(std::io::Error::other(e)))?
                .map_err(|e| Error::Connect(std::io::Error::other(e)))?;
            tokio::spawn(dm.driver());
            Ok(Arc::new(dm) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Iser
    }
}

/// iSCSI over TCP.
#[derive(Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await.map_err(Error::Connect)?;
            let (dm, driver) = riser_tcp::datamover(stream, Role::Initiator);
            tokio::spawn(driver);
            Ok(Arc::new(dm) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
}
