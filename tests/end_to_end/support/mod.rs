//! What every end-to-end test shares: the target on a portal of each transport, sessions and
//! raw connections to it, the data patterns, CDBs and a backend that holds I/O.

mod gated;
pub(crate) mod raw;

pub(crate) use gated::{AsyncGated, Gated};
pub(crate) use raw::Raw;

use bytes::Bytes;
use riser::initiator::{Connector, Error, Session, SessionConfig, TcpConnector, discover_via};
use riser::iscsi::chap::ChapCredentials;
use riser::iscsi::login::InitiatorAuth;
use riser::scsi::sense::Sense;
use riser::target::backend::{BlockBackend, RamBackend};
use riser::target::lu::LogicalUnit;
use riser::target::server::{Node, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub(crate) const TARGET: &str = "iqn.2026-11.io.riser:e2e";
pub(crate) const ME: &str = "iqn.2026-11.io.riser:tester";
pub(crate) const OTHER: &str = "iqn.2026-11.io.riser:other-tester";
/// How long a test waits for an answer the target owes.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// The transport a test runs over; the tests in `on_every_transport!` run over each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transport {
    /// iSCSI over TCP on loopback.
    Tcp,
    /// iSER on the software iWARP RNIC (loopback TCP underneath).
    #[cfg(feature = "rdma")]
    Iser,
    // rdma-core: iSER over an rdma-core provider (a real RNIC, soft-RoCE rxe, soft-iWARP siw)
    // belongs here as a third variant (feature `rdma-core`, needing a device, so skipped where
    // there is none), with its arms below and a third instantiation in `on_every_transport!`.
    // Not implemented yet.
}

impl Transport {
    /// The transport as riser names it.
    pub(crate) fn iscsi(self) -> riser::iscsi::keys::Transport {
        match self {
            Self::Tcp => riser::iscsi::keys::Transport::Tcp,
            #[cfg(feature = "rdma")]
            Self::Iser => riser::iscsi::keys::Transport::Iser,
        }
    }

    /// The initiator's connections over this transport.
    pub(crate) fn connector(self) -> Arc<dyn Connector> {
        match self {
            Self::Tcp => Arc::new(TcpConnector::default()),
            #[cfg(feature = "rdma")]
            Self::Iser => Arc::new(riser::initiator::IserConnector::new(riser::iwarp::SoftRnic::default(), Default::default())),
        }
    }

    /// As [`connector`](Self::connector), sending unsolicited data as the Linux initiator does
    /// (over iSER: as Data-Out Sends, not only immediate data; TCP always does).
    pub(crate) fn linux_like_connector(self) -> Arc<dyn Connector> {
        match self {
            Self::Tcp => Arc::new(TcpConnector::default()),
            #[cfg(feature = "rdma")]
            Self::Iser => {
                let cfg = riser::iser::IserConfig::default().unsolicited_data_out(true);
                Arc::new(riser::initiator::IserConnector::new(riser::iwarp::SoftRnic::default(), cfg))
            }
        }
    }

    /// A session with `cfg`, its connections over this transport.
    pub(crate) async fn connect(self, addr: SocketAddr, mut cfg: SessionConfig) -> Result<Session, Error> {
        cfg.connector = self.connector();
        Session::connect(addr, cfg).await
    }

    /// [`ME`]'s session to [`TARGET`] with the defaults.
    pub(crate) async fn session(self, addr: SocketAddr) -> Session {
        self.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap()
    }

    /// SendTargets=All in a discovery session over this transport.
    pub(crate) async fn discover(
        self,
        addr: SocketAddr,
        initiator: &str,
        auth: InitiatorAuth,
    ) -> Result<Vec<(String, Vec<String>)>, Error> {
        discover_via(&*self.connector(), addr, initiator, auth).await
    }

    /// The target with [`TARGET`] on a 64 MiB RAM disk at LUN 0, the node and the configuration
    /// as `node` and `cfg` make them, on a portal of this transport.
    pub(crate) async fn start(self, node: impl FnOnce(&mut Node), cfg: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
        self.start_on(Arc::new(RamBackend::new(64 << 20, 512)), node, cfg).await
    }

    /// As [`start`](Self::start), with `backend` at LUN 0.
    pub(crate) async fn start_on(
        self,
        backend: Arc<dyn BlockBackend>,
        node: impl FnOnce(&mut Node),
        cfg: impl FnOnce(&mut TargetConfig),
    ) -> SocketAddr {
        self.start_with(Arc::new(LogicalUnit::new(backend, riser::target::lu::LuIdentity::random())), node, cfg).await
    }

    /// As [`start`](Self::start), with `lu` at LUN 0.
    pub(crate) async fn start_with(
        self,
        lu: Arc<LogicalUnit>,
        node: impl FnOnce(&mut Node),
        cfg: impl FnOnce(&mut TargetConfig),
    ) -> SocketAddr {
        let mut n = Node::new(TARGET).lun(lu);
        node(&mut n);
        let mut c = self.config().node(n);
        cfg(&mut c);
        self.serve(c).await.0
    }

    /// The target configuration tests start from on this transport (iSER: a window of 64, as
    /// each command in it costs a posted receive).
    pub(crate) fn config(self) -> TargetConfig {
        let c = TargetConfig::default();
        match self {
            Self::Tcp => c,
            #[cfg(feature = "rdma")]
            Self::Iser => c.queue_depth(64).iser_threads(2),
        }
    }

    /// A target configured as `cfg` says (its nodes included), on a portal of this transport:
    /// its address, and the target (for changes while it serves).
    pub(crate) async fn serve(self, c: TargetConfig) -> (SocketAddr, Arc<Target>) {
        let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
        match self {
            Self::Tcp => {
                let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                let addr = l.local_addr().unwrap();
                let target = Target::new(c);
                tokio::spawn(target.clone().serve(l));
                (addr, target)
            }
            #[cfg(feature = "rdma")]
            Self::Iser => {
                use riser::verbs::Provider;
                let rnic = riser::iwarp::SoftRnic::default();
                let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
                let addr = riser::verbs::Listener::local_addr(&l).unwrap();
                let target = Target::new(c);
                tokio::spawn(target.clone().serve_iser(rnic, l, riser::iser::IserConfig::default()));
                (addr, target)
            }
        }
    }

    /// A connection logged in to [`TARGET`] below the initiator library, with `op` and ISID
    /// `80 00 00 00 00 isid`, for tests that send PDUs the library never would.
    pub(crate) async fn raw(self, addr: SocketAddr, op: riser::iscsi::keys::OperationalConfig, isid: u8) -> Raw {
        Raw::login(self.connector(), addr, op, isid).await
    }
}

/// `len` bytes that differ with `seed` and along the buffer (a misplaced block shows).
pub(crate) fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect::<Vec<_>>().into()
}

pub(crate) fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials::new(u, s.as_bytes().to_vec()).unwrap()
}

/// WRITE(10) of `blocks` at `lba`.
pub(crate) fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let b = blocks.to_be_bytes();
    [0x2a, 0, l[0], l[1], l[2], l[3], 0, b[0], b[1], 0]
}

/// READ(10) of `blocks` at `lba`.
pub(crate) fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

/// The sense data of a SCSI Response's data segment (after its length).
pub(crate) fn sense(data: &[u8]) -> Sense {
    Sense::parse(&data[2..]).unwrap()
}

/// Wait until `done` holds, at most [`WAIT`].
pub(crate) async fn until(what: &str, done: impl Fn() -> bool) {
    let t0 = std::time::Instant::now();
    while !done() {
        assert!(t0.elapsed() < WAIT, "{what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
