//! # riser-initiator — an async iSCSI initiator
//!
//! [`Session::connect`] logs in to a target (no authentication, or CHAP one-way or mutual)
//! over the iSCSI/TCP datamover; [`Session::command`] submits any CDB with its data and
//! returns status, sense and data; typed helpers cover the common commands. Any number of
//! commands may be in flight: the session keeps CmdSN within the target's window and matches
//! responses by task tag. [`discover`] runs a SendTargets discovery session.
//!
//! ```rust
//! # use riser_target::backend::RamBackend;
//! # use riser_target::lu::{LogicalUnit, LuIdentity};
//! # use riser_target::server::{Node, Target, TargetConfig};
//! # use std::sync::Arc;
//! use riser_initiator::{Lun, Session, SessionConfig};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), riser_initiator::Error> {
//! # // A riser target with a 1 MiB RAM LUN on 127.0.0.1, in this process.
//! # let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
//! # let target = Target::new(TargetConfig::default().node(Node::new("iqn.2026-11.io.riser:target0").lun(lu)));
//! # let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
//! # let addr = listener.local_addr().unwrap().to_string();
//! # tokio::spawn(target.serve(listener));
//! // `addr`: the target's portal, e.g. "192.0.2.10:3260".
//! let s = Session::connect(&addr, SessionConfig::new("iqn.2026-11.io.riser:me", "iqn.2026-11.io.riser:target0")).await?;
//! let lun = Lun::try_from(0u16).expect("single-level LUN");
//! let (blocks, block_size) = s.read_capacity(lun).await?;
//! assert_eq!((blocks, block_size), (2048, 512));
//! s.write(lun, 8, bytes::Bytes::from(vec![0xa5; 4096]), block_size).await?;
//! let data = s.read(lun, 8, 8, block_size).await?;
//! assert_eq!(&data[..], &[0xa5; 4096][..]);
//! s.logout().await?;
//! # Ok(()) }
//! ```
//!
//! The crate is a *driver* of the sans-IO session machine
//! [`riser_iscsi::session::InitiatorSession`]: the machine numbers requests (CmdSN inside the
//! target's window, task tags, ExpStatSN), matches what the target sends to tasks, decides
//! which commands a task management function ended and answers the target's pings; this
//! crate owns the I/O around it — the datamover, the callers waiting for their tasks,
//! timeouts and reconnection.
//!
//! [`Multipath`] reaches one logical unit through several portals (gateways exporting one
//! store, each its own target port group), following the ALUA access states and failing over
//! when a path dies.
//!
//! Modules: `session` (the driver: [`Session`]), `login` (connecting and logging in),
//! `discovery` ([`discover`]), `scsi` (the typed SCSI helpers of [`Session`]), `connector`
//! (how connections are made: [`TcpConnector`], [`IserConnector`]), [`alua`] (riser-scsi's
//! access states and REPORT TARGET PORT GROUPS data, re-exported), `multipath` ([`Multipath`]).
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod alua;
mod connector;
mod discovery;
mod login;
mod multipath;
mod scsi;
mod session;

pub use connector::Connector;
#[cfg(feature = "iser")]
#[cfg_attr(docsrs, doc(cfg(feature = "iser")))]
pub use connector::IserConnector;
#[cfg(not(feature = "tcp"))]
#[cfg_attr(docsrs, doc(cfg(not(feature = "tcp"))))]
pub use connector::NoConnector;
#[cfg(feature = "tcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
pub use connector::TcpConnector;
#[cfg(feature = "tcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
pub use discovery::discover;
pub use discovery::discover_via;
pub use multipath::{Multipath, MultipathConfig, MultipathError, MultipathStats, PathSpec, PathStatus};
pub use riser_iscsi::login::{InitiatorAuth, InitiatorLoginConfig};
pub use riser_scsi::lun::Lun;
pub use session::Session;

use bytes::Bytes;
use riser_datamover::DmError;
use riser_iscsi::chap::ChapCredentials;
use riser_iscsi::login::LoginFailure;
use riser_iscsi::wire::{Isid, RejectReason, TmfResponse};
use riser_scsi::sense::{Sense, Status};
use std::sync::Arc;
use std::time::Duration;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Connecting failed.
    #[error("cannot connect: {0}")]
    Connect(std::io::Error),
    /// The login failed.
    #[error("login failed: {0}")]
    Login(LoginFailure),
    /// The target redirected us.
    #[error("target redirects to {0:?}")]
    Redirected(Vec<String>),
    /// The connection ended.
    #[error("connection lost")]
    ConnectionLost,
    /// No answer in time. For a SCSI command: the target has ended it since (it answered an
    /// ABORT TASK for it), so nothing the command carried can land after this is reported.
    #[error("timed out")]
    Timeout,
    /// The target rejected a PDU.
    #[error("target rejected the request: {0:?}")]
    Rejected(RejectReason),
    /// A SCSI command ended with a status other than GOOD.
    #[error("SCSI status {status:?}{}", sense.as_ref().map(|s| format!(", sense {:?} {:?}", s.key, s.asc)).unwrap_or_default())]
    Scsi {
        /// Status.
        status: Status,
        /// Decoded sense, if any.
        sense: Option<Sense>,
    },
    /// A task management function was refused.
    #[error("task management refused: {0:?}")]
    TaskManagement(TmfResponse),
    /// The command was aborted by task management (ABORT TASK, ABORT/CLEAR TASK SET, LUN or
    /// target reset): the target sends it no response (RFC 7143 §11.5.1).
    #[error("command aborted by task management")]
    Aborted,
    /// A malformed answer.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The datamover could not do what the session asked.
    #[error("datamover: {0}")]
    Datamover(DmError),
}

/// How to log in, and how long the session's requests may take.
///
/// The login settings live in [`InitiatorLoginConfig`] (`login`); the session adds its command
/// timeout and how its connections are made.
///
/// ```
/// # use riser_initiator::SessionConfig;
/// # use std::time::Duration;
/// let mut cfg = SessionConfig::new("iqn.2026-11.io.riser:me", "iqn.2026-11.io.riser:target0").timeout(Duration::from_secs(10));
/// cfg.login.operational.max_recv_data_segment_length = 65_536;
/// cfg.login.isid = riser_iscsi::wire::Isid([0x80, 1, 2, 3, 4, 5]);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct SessionConfig {
    /// The login, and every login again after a connection loss: our name, the target's, the
    /// ISID (random-qualifier format by default), authentication, operational offers and the
    /// login timeout (it also bounds making the connection). Its `transport` is set per
    /// connection from `connector` (what is put there is ignored); `target_name` must name the
    /// target (`None` would make a discovery session: see [`discover_via`]),
    /// and `tsih`, `cid`, `cmd_sn`, `itt` and `exp_stat_sn` are a new session's: leave them at
    /// their defaults.
    pub login: InitiatorLoginConfig,
    /// How long a request (a command, a task management function, a ping, the logout) waits
    /// for its answer, and a command for room in the target's CmdSN window. A command still
    /// unanswered then is aborted (ABORT TASK, which waits for the command to be over at the
    /// target) and fails with [`Error::Timeout`] once that is answered: up to about two
    /// timeouts in all. Should the abort fail or go unanswered too, the connection is dropped
    /// (its commands are retried once on the next, as after any connection loss). The
    /// [`SessionConfig::timeout`] setter sets this and `login.login_timeout` together.
    pub timeout: Duration,
    /// How connections are made (default: iSCSI over TCP).
    pub connector: Arc<dyn Connector>,
}

impl SessionConfig {
    /// A session of `initiator_name` with `target_name`. Defaults: no authentication,
    /// riser's operational offers, a fresh random ISID, 30 s for the login and for each
    /// request, iSCSI over TCP.
    pub fn new(initiator_name: impl Into<String>, target_name: impl Into<String>) -> Self {
        const TIMEOUT: Duration = Duration::from_secs(30);
        Self {
            login: InitiatorLoginConfig::new(initiator_name, Some(target_name.into()), random_isid()).login_timeout(TIMEOUT),
            timeout: TIMEOUT,
            #[cfg(feature = "tcp")]
            connector: Arc::new(TcpConnector::default()),
            #[cfg(not(feature = "tcp"))]
            connector: Arc::new(NoConnector),
        }
    }

    /// Use CHAP (and mutual CHAP when `mutual` is given), offering SHA3-256, SHA-1 and MD5.
    ///
    /// SHA-256 (CHAP_A=7) is left out of the default offer: tgt (1.0.85) takes 7 to mean
    /// SHA-1 and then fails the login; offer it explicitly with
    /// [`SessionConfig::with_chap_algorithms`] for targets that implement it (LIO, riser).
    pub fn with_chap(self, credentials: ChapCredentials, mutual: Option<ChapCredentials>) -> Self {
        use riser_iscsi::chap::ChapAlgorithm::*;
        self.with_chap_algorithms(credentials, mutual, vec![Sha3_256, Sha1, Md5])
    }

    /// Use CHAP offering exactly these algorithms, in this preference order.
    pub fn with_chap_algorithms(
        mut self,
        credentials: ChapCredentials,
        mutual: Option<ChapCredentials>,
        algorithms: Vec<riser_iscsi::chap::ChapAlgorithm>,
    ) -> Self {
        self.login.auth = InitiatorAuth::Chap { credentials, algorithms, mutual };
        self
    }

    /// Log in with these settings (see the `login` field: `transport` is ignored).
    #[must_use]
    pub fn login(mut self, login: InitiatorLoginConfig) -> Self {
        self.login = login;
        self
    }

    /// The login timeout and the command timeout: `login.login_timeout` and `timeout` both.
    /// (Set the fields to tell them apart.)
    #[must_use]
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self.login.login_timeout = timeout;
        self
    }

    /// Make connections with this connector (iSER, say).
    #[must_use]
    pub fn connector(mut self, connector: impl Connector + 'static) -> Self {
        self.connector = Arc::new(connector);
        self
    }
}

/// The result of a SCSI command.
#[derive(Clone, Debug)]
pub struct CommandResult {
    /// SCSI status.
    pub status: Status,
    /// Sense data (raw), if any.
    pub sense: Option<Bytes>,
    /// Data-in received.
    pub data: Bytes,
    /// Residual count and whether it is an underflow (true) or overflow.
    pub residual: Option<(bool, u32)>,
}

impl CommandResult {
    /// `Ok(data)` for GOOD, otherwise an [`Error::Scsi`].
    pub fn into_good(self) -> Result<Bytes, Error> {
        if self.status == Status::GOOD || self.status == Status::CONDITION_MET {
            Ok(self.data)
        } else {
            Err(Error::Scsi { status: self.status, sense: self.sense.as_deref().and_then(|s| Sense::parse(s).ok()) })
        }
    }
}

/// A type 10b ISID (RFC 7143 §10.12.5: the B and C fields random, D a qualifier, here random
/// too) from the OS generator, so sessions of processes started together do not collide.
/// The ISID is no secret, only needs to be unique: where the OS generator fails, the clock and
/// the process id stand in rather than a constructor that fails.
fn random_isid() -> Isid {
    let mut b = [0u8; 5];
    if riser_iscsi::entropy::fill(&mut b).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        b.copy_from_slice(&(t ^ u64::from(std::process::id()) << 20).to_be_bytes()[3..]);
    }
    Isid([0x80, b[0], b[1], b[2], b[3], b[4]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isids_of_sessions_set_up_together_are_unrelated() {
        // ISIDs used to be the clock's nanoseconds (xor the process id): configurations made
        // together shared all but their low bits, and anyone could guess the next one. From the
        // OS generator, eight in a row sharing their first 16 random bits has odds of 2^-112.
        let isids: Vec<Isid> = (0..8).map(|_| SessionConfig::new("iqn.2026-11.io.riser:i", "iqn.2026-11.io.riser:t").login.isid).collect();
        assert!(isids.iter().all(|i| i.0[0] == 0x80), "type 10b (random) ISIDs");
        assert!(isids.iter().any(|i| i.0[1..3] != isids[0].0[1..3]), "ISIDs share their high bits: {isids:?}");
    }

    #[test]
    fn the_login_timeout_is_the_session_timeout_unless_set_apart() {
        let c = SessionConfig::new("iqn.2026-11.io.riser:i", "iqn.2026-11.io.riser:t");
        assert_eq!((c.timeout, c.login.login_timeout), (Duration::from_secs(30), Duration::from_secs(30)));
        assert_eq!(
            (c.login.initiator_name.as_str(), c.login.target_name.as_deref()),
            ("iqn.2026-11.io.riser:i", Some("iqn.2026-11.io.riser:t"))
        );
        let c = c.timeout(Duration::from_secs(5));
        assert_eq!((c.timeout, c.login.login_timeout), (Duration::from_secs(5), Duration::from_secs(5)));
    }
}
