//! # riser-initiator — an async iSCSI initiator
//!
//! [`Session::connect`] logs in to a target (no authentication, or CHAP one-way or mutual)
//! over the iSCSI/TCP datamover; [`Session::command`] submits any CDB with its data and
//! returns status, sense and data; typed helpers cover the common commands. Any number of
//! commands may be in flight: the session keeps CmdSN within the target's window and matches
//! responses by task tag. [`discover`] runs a SendTargets discovery session.
//!
//! ```no_run
//! # async fn f() -> Result<(), riser_initiator::Error> {
//! use riser_initiator::{Session, SessionConfig};
//! let s = Session::connect("127.0.0.1:3260", SessionConfig::new("iqn.2026-11.io.riser:me", "iqn.2026-11.io.riser:target0")).await?;
//! let (blocks, block_size) = s.read_capacity(0).await?;
//! let data = s.read(0, 0, 8, block_size).await?;
//! s.logout().await?;
//! # let _ = (blocks, data); Ok(()) }
//! ```

use bytes::{Bytes, BytesMut};
use riser_datamover::{BoxFuture, ConnectionResources, ControlPdu, DmError, DmEvent, SharedDatamover};
use riser_iscsi::chap::ChapCredentials;
use riser_iscsi::keys::{NegotiatedParams, OperationalConfig, Role, Transport};
use riser_iscsi::login::{InitiatorAuth, InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginFailure};
use riser_iscsi::serial::SerialNumber;
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::*;
use riser_scsi::cdb::{Cdb, CdbSize, Rw};
use riser_scsi::lun::Lun;
use riser_scsi::sense::{Sense, Status};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::{TcpStream, ToSocketAddrs};
use tokio::sync::{Notify, oneshot};

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
    /// No answer in time.
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

/// How to log in.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// Our iSCSI name.
    pub initiator_name: String,
    /// Target name.
    pub target_name: String,
    /// Authentication.
    pub auth: InitiatorAuth,
    /// Operational offers.
    pub operational: OperationalConfig,
    /// ISID (6 bytes, random-qualifier format by default).
    pub isid: Isid,
    /// Login and command timeout.
    pub timeout: Duration,
    /// How connections are made (default: iSCSI over TCP).
    pub connector: Arc<dyn Connector>,
}

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

impl SessionConfig {
    /// Defaults: no authentication, riser's operational offers, a fresh ISID.
    pub fn new(initiator_name: impl Into<String>, target_name: impl Into<String>) -> Self {
        Self {
            initiator_name: initiator_name.into(),
            target_name: target_name.into(),
            auth: InitiatorAuth::None,
            operational: OperationalConfig::default(),
            isid: random_isid(),
            timeout: Duration::from_secs(30),
            connector: Arc::new(TcpConnector),
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
        self.auth = InitiatorAuth::Chap { credentials, algorithms, mutual };
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

enum Reply {
    Scsi(CommandResult),
    Pdu(Header),
    Aborted,
}

struct State {
    cmd_sn: SerialNumber,
    max_cmd_sn: SerialNumber,
    exp_stat_sn: u32,
    pending: HashMap<u32, oneshot::Sender<Reply>>,
    /// LUN of each outstanding SCSI command (what task management may abort).
    luns: HashMap<u32, u16>,
    dead: bool,
    /// Logged out: no reconnection.
    closed: bool,
}

impl State {
    /// The sequence numbers a completed login leaves us with.
    fn after_login(o: &riser_iscsi::login::LoginOutcome) -> Self {
        Self {
            cmd_sn: SerialNumber(o.exp_cmd_sn),
            max_cmd_sn: SerialNumber(o.max_cmd_sn),
            exp_stat_sn: o.stat_sn,
            pending: HashMap::new(),
            luns: HashMap::new(),
            dead: false,
            closed: false,
        }
    }
}

struct Inner {
    dm: Mutex<SharedDatamover>,
    connector: Arc<dyn Connector>,
    /// Connection generation; a receiver only reports the loss of its own connection.
    generation: AtomicU32,
    addr: std::net::SocketAddr,
    login: InitiatorLoginConfig,
    reconnecting: tokio::sync::Mutex<()>,
    params: NegotiatedParams,
    state: Mutex<State>,
    window: Notify,
    next_itt: AtomicU32,
    timeout: Duration,
    /// Commands hold it (shared) from their registration to the end of their send, a task
    /// management request (exclusively) while it picks the commands it concerns and is sent:
    /// so exactly the commands sent before it are the ones it aborts, as the target sees it.
    /// (Ending a command the target goes on with would revoke memory it is about to access.)
    send_gate: tokio::sync::RwLock<()>,
}

/// A logged-in session (one connection).
#[derive(Clone)]
pub struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("target", &self.inner.params.target_name).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A type 10b ISID (RFC 7143 §10.12.5: the B and C fields random, D a qualifier, here random
/// too) from the OS generator, so sessions of processes started together do not collide.
/// The ISID is no secret, only needs to be unique: where the OS generator fails, the clock and
/// the process id stand in rather than a constructor that fails.
fn random_isid() -> Isid {
    use rand::TryRngCore as _;
    let mut b = [0u8; 5];
    if rand::rngs::OsRng.try_fill_bytes(&mut b).is_err() {
        let t = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_nanos() as u64;
        b.copy_from_slice(&(t ^ u64::from(std::process::id()) << 20).to_be_bytes()[3..]);
    }
    Isid([0x80, b[0], b[1], b[2], b[3], b[4]])
}

/// The login's seed for CHAP identifiers and mutual CHAP challenges, from the OS generator.
/// There is no fallback: a predictable challenge would let a recorded response be replayed.
fn entropy() -> Result<[u8; 32], Error> {
    use rand::TryRngCore as _;
    let mut seed = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut seed)
        .map_err(|e| Error::Connect(std::io::Error::other(format!("no OS random generator for the login: {e}"))))?;
    Ok(seed)
}

/// Log in on a fresh connection; returns the datamover and the outcome.
async fn login(
    connector: &dyn Connector,
    addr: std::net::SocketAddr,
    mut cfg: InitiatorLoginConfig,
    timeout: Duration,
) -> Result<(SharedDatamover, riser_iscsi::login::LoginOutcome), Error> {
    cfg.transport = connector.transport();
    let seed = entropy()?;
    let dm = tokio::time::timeout(timeout, connector.connect(addr)).await.map_err(|_| Error::Timeout)??;
    if let Some(m) = dm.max_recv_data_segment_length() {
        cfg.operational.max_recv_data_segment_length = cfg.operational.max_recv_data_segment_length.min(m);
    }
    let start = Instant::now();
    let mut l = InitiatorLogin::new(cfg, Duration::ZERO, seed);
    loop {
        while let Some(p) = l.poll_transmit() {
            tracing::debug!(csg = p.header.csg.0, transit = p.header.transit, nsg = p.header.nsg.0, keys = %login_keys(&p.data), "Login Request");
            // The end of login is explicit (RFC 5047 §7): resources before the request that
            // may be answered by the final Login Response, the negotiated values and
            // Enable_Datamover once that response is in.
            if p.asks_for_full_feature()
                && let Err(e) = dm.allocate_connection_resources(ConnectionResources::default())
            {
                dm.terminate();
                return Err(Error::Datamover(e));
            }
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.map_err(|_| Error::ConnectionLost)?;
        }
        match l.poll_event() {
            Some(InitiatorLoginEvent::Complete(o)) => {
                dm.notice_key_values(&o.params);
                dm.enable();
                return Ok((dm, o));
            }
            Some(InitiatorLoginEvent::Failed(f)) => {
                dm.terminate();
                return Err(Error::Login(f));
            }
            Some(InitiatorLoginEvent::Redirect { addresses, .. }) => {
                dm.terminate();
                return Err(Error::Redirected(addresses));
            }
            Some(_) | None => {}
        }
        let left = timeout.saturating_sub(start.elapsed());
        match tokio::time::timeout(left, dm.next_event()).await {
            Ok(DmEvent::Control(p)) => {
                if let Header::LoginResponse(r) = &p.header {
                    tracing::debug!(csg = r.csg.0, transit = r.transit, nsg = r.nsg.0, status = r.status_class, keys = %login_keys(&p.data), "Login Response");
                }
                l.handle_pdu(start.elapsed(), &p.header, &p.data)
            }
            Ok(_) => {
                return Err(Error::ConnectionLost);
            }
            Err(_) => {
                dm.terminate();
                return Err(Error::Timeout);
            }
        }
    }
}

/// Login text for the log: `key=value` pairs, CHAP values left out.
fn login_keys(data: &[u8]) -> String {
    data.split(|&b| b == 0)
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            match kv.split_once('=') {
                Some((k, _)) if k.starts_with("CHAP_") => format!("{k}=..."),
                _ => kv.into_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn resolve(addr: impl ToSocketAddrs) -> Result<std::net::SocketAddr, Error> {
    tokio::net::lookup_host(addr).await.map_err(Error::Connect)?.next().ok_or_else(|| Error::Connect(std::io::ErrorKind::NotFound.into()))
}

/// SendTargets discovery over TCP: the targets and their addresses (`host:port,tpgt`).
pub async fn discover(addr: impl ToSocketAddrs, initiator_name: &str, auth: InitiatorAuth) -> Result<Vec<(String, Vec<String>)>, Error> {
    discover_via(&TcpConnector, resolve(addr).await?, initiator_name, auth).await
}

/// SendTargets discovery over any transport (a discovery session on iSER runs over iSER).
pub async fn discover_via(
    connector: &dyn Connector,
    addr: std::net::SocketAddr,
    initiator_name: &str,
    auth: InitiatorAuth,
) -> Result<Vec<(String, Vec<String>)>, Error> {
    let mut cfg = InitiatorLoginConfig::new(initiator_name, None, SessionConfig::new(initiator_name, "").isid);
    cfg.auth = auth;
    let timeout = Duration::from_secs(15);
    let (dm, o) = login(connector, addr, cfg, timeout).await?;
    let mut text = TextBuilder::new();
    text.push("SendTargets", "All");
    let req = TextRequest {
        immediate: true,
        final_: true,
        itt: 1,
        ttt: RESERVED_TAG,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn: o.stat_sn,
        ..TextRequest::default()
    };
    dm.send_control(ControlPdu::new(Header::TextRequest(req), text.into_bytes().into())).await.map_err(|_| Error::ConnectionLost)?;
    let mut all = Vec::new();
    let mut exp_stat_sn;
    loop {
        let ev = tokio::time::timeout(timeout, dm.next_event()).await.map_err(|_| Error::Timeout)?;
        let DmEvent::Control(p) = ev else { return Err(Error::ConnectionLost) };
        match p.header {
            Header::TextResponse(r) => {
                all.extend_from_slice(&p.data);
                exp_stat_sn = r.stat_sn.wrapping_add(1);
                if !r.cont {
                    break;
                }
                let more = TextRequest {
                    immediate: true,
                    final_: true,
                    itt: 1,
                    ttt: r.ttt,
                    cmd_sn: o.exp_cmd_sn,
                    exp_stat_sn: r.stat_sn.wrapping_add(1),
                    ..TextRequest::default()
                };
                dm.send_control(ControlPdu::new(Header::TextRequest(more), Bytes::new())).await.map_err(|_| Error::ConnectionLost)?;
            }
            Header::Reject(r) => return Err(Error::Rejected(r.reason)),
            _ => {}
        }
    }
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CLOSE_SESSION,
        itt: 2,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn,
        ..LogoutRequest::default()
    };
    if dm.send_control(ControlPdu::new(Header::LogoutRequest(logout), Bytes::new())).await.is_ok() {
        // The target answers before it closes; a short wait, the list is ours anyway.
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            while let DmEvent::Control(p) = dm.next_event().await {
                if matches!(p.header, Header::LogoutResponse(_)) {
                    break;
                }
            }
        })
        .await;
    }
    dm.terminate();
    let pairs = parse_pairs(&all).map_err(|e| Error::Protocol(e.to_string()))?;
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for (k, v) in pairs {
        match k {
            "TargetName" => out.push((v.to_string(), Vec::new())),
            "TargetAddress" => {
                if let Some(last) = out.last_mut() {
                    last.1.push(v.to_string());
                }
            }
            _ => {}
        }
    }
    Ok(out)
}

impl Inner {
    fn dm(&self) -> SharedDatamover {
        lock(&self.dm).clone()
    }
}

impl Session {
    /// Connect and log in.
    pub async fn connect(addr: impl ToSocketAddrs, cfg: SessionConfig) -> Result<Self, Error> {
        let mut lc = InitiatorLoginConfig::new(cfg.initiator_name.clone(), Some(cfg.target_name.clone()), cfg.isid);
        lc.auth = cfg.auth.clone();
        lc.operational = cfg.operational.clone();
        lc.login_timeout = cfg.timeout;
        let addr = resolve(addr).await?;
        let (dm, o) = login(&*cfg.connector, addr, lc.clone(), cfg.timeout).await?;
        let inner = Arc::new(Inner {
            dm: Mutex::new(dm),
            connector: cfg.connector.clone(),
            generation: AtomicU32::new(0),
            addr,
            login: lc,
            reconnecting: tokio::sync::Mutex::new(()),
            params: o.params.clone(),
            state: Mutex::new(State::after_login(&o)),
            window: Notify::new(),
            next_itt: AtomicU32::new(0x100),
            timeout: cfg.timeout,
            send_gate: tokio::sync::RwLock::new(()),
        });
        tokio::spawn(Self::receiver(inner.clone(), 0));
        Ok(Self { inner })
    }

    fn is_closed(&self) -> bool {
        lock(&self.inner.state).closed
    }

    /// End the current connection (if the receiver has not noticed its loss yet) and log in
    /// again.
    async fn force_reconnect(&self) -> Result<(), Error> {
        self.inner.dm().terminate();
        for _ in 0..200 {
            if lock(&self.inner.state).dead {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.reconnect().await
    }

    /// End the current connection abruptly, as a network failure would (for fault testing and
    /// soak runs): the commands in flight fail with [`Error::ConnectionLost`] (or are retried
    /// once, see [`Session::command`]) and the session logs in again at its next command.
    pub fn drop_connection(&self) {
        self.inner.dm().terminate();
    }

    /// Log in again after a connection loss: a leading login with the same ISID and TSIH 0,
    /// which makes the target reinstate the session (ERL 0). Commands that were in flight have
    /// failed with [`Error::ConnectionLost`].
    pub async fn reconnect(&self) -> Result<(), Error> {
        let _one = self.inner.reconnecting.lock().await;
        if !lock(&self.inner.state).dead {
            return Ok(());
        }
        let (dm, o) = login(&*self.inner.connector, self.inner.addr, self.inner.login.clone(), self.inner.timeout).await?;
        let generation = self.inner.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *lock(&self.inner.dm) = dm;
        *lock(&self.inner.state) = State::after_login(&o);
        tokio::spawn(Self::receiver(self.inner.clone(), generation));
        tracing::info!("session reinstated after a connection loss");
        Ok(())
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &NegotiatedParams {
        &self.inner.params
    }

    async fn receiver(inner: Arc<Inner>, generation: u32) {
        let dm = inner.dm();
        loop {
            let p = match dm.next_event().await {
                DmEvent::Control(p) => p,
                DmEvent::Terminated(_) => break,
                _ => continue,
            };
            Self::note_window(&inner, &p.header);
            match p.header {
                Header::ScsiResponse(r) => {
                    let sense = (p.data.len() > 2).then(|| {
                        let n = usize::from(u16::from_be_bytes([p.data[0], p.data[1]])).min(p.data.len() - 2);
                        p.data.slice(2..2 + n)
                    });
                    Self::finish(&inner, &dm, r.itt, r.status, sense, (r.underflow, r.overflow, r.residual));
                }
                Header::DataIn(d) if d.status_present => {
                    Self::finish(&inner, &dm, d.itt, d.status, None, (d.underflow, d.overflow, d.residual));
                }
                Header::NopIn(n) if n.ttt != RESERVED_TAG => {
                    // A target ping: answer with the same TTT, immediately.
                    let (cmd_sn, exp) = {
                        let s = lock(&inner.state);
                        (s.cmd_sn.0, s.exp_stat_sn)
                    };
                    let out = NopOut { immediate: true, lun: n.lun, itt: RESERVED_TAG, ttt: n.ttt, cmd_sn, exp_stat_sn: exp };
                    let _ = dm.send_control(ControlPdu::new(Header::NopOut(out), p.data.clone())).await;
                }
                Header::Reject(_) => {
                    // The rejected header is the data segment: fail that task.
                    if p.data.len() >= BHS_LEN
                        && let Ok(h) = Header::parse(&Bhs::new_unchecked(&p.data[..]))
                    {
                        Self::complete(&inner, h.itt(), Reply::Pdu(p.header));
                    }
                }
                h => {
                    let itt = h.itt();
                    Self::complete(&inner, itt, Reply::Pdu(h));
                }
            }
        }
        if inner.generation.load(Ordering::Acquire) == generation {
            let mut s = lock(&inner.state);
            s.dead = true;
            s.pending.clear();
            drop(s);
            inner.window.notify_waiters();
        }
    }

    /// A command ended (SCSI Response, or Data-In with status): hand its data and status to
    /// the waiting caller.
    fn finish(
        inner: &Inner,
        dm: &SharedDatamover,
        itt: u32,
        status: Status,
        sense: Option<Bytes>,
        (underflow, overflow, count): (bool, bool, u32),
    ) {
        let data = dm.take_read_data(itt).map(BytesMut::freeze).unwrap_or_default();
        let residual = if underflow {
            Some((true, count))
        } else if overflow {
            Some((false, count))
        } else {
            None
        };
        let data = Self::trim(data, residual);
        Self::complete(inner, itt, Reply::Scsi(CommandResult { status, sense, data, residual }));
    }

    fn trim(data: Bytes, residual: Option<(bool, u32)>) -> Bytes {
        match residual {
            Some((true, r)) => {
                let keep = data.len().saturating_sub(r as usize);
                data.slice(..keep)
            }
            _ => data,
        }
    }

    fn note_window(inner: &Inner, h: &Header) {
        let (stat_sn, exp, max, advances) = match *h {
            Header::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::DataIn(d) if d.status_present => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, true),
            Header::NopIn(n) => (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
            Header::TaskMgmtResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::LogoutResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::AsyncMessage(a) => (a.stat_sn, a.exp_cmd_sn, a.max_cmd_sn, true),
            Header::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, false),
            _ => return,
        };
        let mut s = lock(&inner.state);
        if advances && SerialNumber(stat_sn).ge(SerialNumber(s.exp_stat_sn)) {
            s.exp_stat_sn = stat_sn.wrapping_add(1);
        }
        // RFC 7143 §4.2.2.1: ignore a MaxCmdSN below ExpCmdSN - 1, and never move it back.
        let (exp, max) = (SerialNumber(exp), SerialNumber(max));
        if max.ge(exp.sub(1)) && max.gt(s.max_cmd_sn) {
            s.max_cmd_sn = max;
            drop(s);
            inner.window.notify_waiters();
        }
    }

    fn complete(inner: &Inner, itt: u32, r: Reply) {
        if let Some(tx) = lock(&inner.state).pending.remove(&itt) {
            let _ = tx.send(r);
        }
    }

    /// Reserve a CmdSN inside the target's window (waiting for it to open) and register the
    /// task tag. Immediate PDUs take the current CmdSN without consuming it.
    async fn slot(&self, immediate: bool) -> Result<(u32, u32, u32, oneshot::Receiver<Reply>), Error> {
        loop {
            let notified = self.inner.window.notified();
            // Decide under the lock; await only after it is released.
            let dead = {
                let mut s = lock(&self.inner.state);
                if s.closed {
                    return Err(Error::ConnectionLost);
                }
                if !s.dead && (immediate || s.cmd_sn.le(s.max_cmd_sn)) {
                    let itt = self.inner.next_itt.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
                    let cmd_sn = s.cmd_sn.0;
                    if !immediate {
                        s.cmd_sn = s.cmd_sn.add(1);
                    }
                    let (tx, rx) = oneshot::channel();
                    s.pending.insert(itt, tx);
                    return Ok((itt, cmd_sn, s.exp_stat_sn, rx));
                }
                s.dead
            };
            if dead {
                self.reconnect().await?;
                continue;
            }
            tokio::time::timeout(self.inner.timeout, notified).await.map_err(|_| Error::Timeout)?;
        }
    }

    async fn wait(&self, itt: u32, rx: oneshot::Receiver<Reply>) -> Result<Reply, Error> {
        match tokio::time::timeout(self.inner.timeout, rx).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(_)) => Err(Error::ConnectionLost),
            Err(_) => {
                lock(&self.inner.state).pending.remove(&itt);
                let _ = self.inner.dm().take_read_data(itt);
                Err(Error::Timeout)
            }
        }
    }

    /// Submit a CDB to `lun` with optional write data, expecting up to `read_len` bytes back.
    /// A UNIT ATTENTION (power on, reset, parameters changed…) is reported once by targets and
    /// then cleared; the command is retried after it, as Linux's SCSI layer does.
    pub async fn command(&self, lun: u16, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, Error> {
        let mut tries = 0;
        loop {
            let r = match self.command_once(lun, cdb, write.clone(), read_len).await {
                // The connection died under the command: reinstate the session and retry once
                // (ERL 0 loses the task; block commands are safe to repeat).
                Err(Error::ConnectionLost) if tries == 0 && !self.is_closed() => {
                    tries += 1;
                    self.force_reconnect().await?;
                    continue;
                }
                r => r?,
            };
            let ua = r.status == Status::CHECK_CONDITION
                && r.sense
                    .as_deref()
                    .and_then(|s| Sense::parse(s).ok())
                    .is_some_and(|s| s.key == riser_scsi::sense::SenseKey::UNIT_ATTENTION);
            tries += 1;
            if !ua || tries > 4 {
                return Ok(r);
            }
            tracing::debug!("unit attention, retrying");
        }
    }

    async fn command_once(&self, lun: u16, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, Error> {
        let (itt, cmd_sn, exp_stat_sn, rx) = self.slot(false).await?;
        let gate = self.inner.send_gate.read().await;
        lock(&self.inner.state).luns.insert(itt, lun);
        let mut c = [0u8; 16];
        let n = cdb.len().min(16);
        c[..n].copy_from_slice(&cdb[..n]);
        let mut ahs = Vec::new();
        if cdb.len() > 16 {
            extended_cdb_ahs(&mut ahs, &cdb[16..]);
        }
        let wlen = write.as_ref().map_or(0, |w| w.len() as u32);
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: read_len > 0,
            write: wlen > 0,
            attr: 1,
            lun: Lun::from_number(lun).unwrap_or_default(),
            itt,
            expected_data_len: read_len.max(wlen),
            cmd_sn,
            exp_stat_sn,
            cdb: c,
        };
        if let Err(e) = self.inner.dm().send_command(cmd, ahs.into(), read_len, write).await {
            tracing::debug!(itt, %e, "command not sent");
            lock(&self.inner.state).pending.remove(&itt);
            lock(&self.inner.state).luns.remove(&itt);
            return Err(Error::ConnectionLost);
        }
        drop(gate);
        let reply = self.wait(itt, rx).await;
        lock(&self.inner.state).luns.remove(&itt);
        match reply? {
            Reply::Scsi(r) => Ok(r),
            Reply::Aborted => Err(Error::Aborted),
            Reply::Pdu(Header::Reject(r)) => Err(Error::Rejected(r.reason)),
            Reply::Pdu(h) => Err(Error::Protocol(format!("unexpected {:?} for a command", h.opcode()))),
        }
    }

    /// Run a CDB value.
    pub async fn run(&self, lun: u16, cdb: &Cdb, write: Option<Bytes>, read_len: u32) -> Result<Bytes, Error> {
        self.command(lun, &cdb.to_vec(), write, read_len).await?.into_good()
    }

    /// TEST UNIT READY.
    pub async fn test_unit_ready(&self, lun: u16) -> Result<(), Error> {
        self.run(lun, &Cdb::TestUnitReady { control: 0 }, None, 0).await.map(drop)
    }

    /// Standard INQUIRY data.
    pub async fn inquiry(&self, lun: u16) -> Result<riser_scsi::inquiry::StandardInquiry, Error> {
        let d = self.run(lun, &Cdb::Inquiry { evpd: false, page_code: 0, alloc_len: 255, control: 0 }, None, 255).await?;
        riser_scsi::inquiry::StandardInquiry::parse(&d).map_err(|e| Error::Protocol(e.to_string()))
    }

    /// A VPD page's body.
    pub async fn vpd(&self, lun: u16, page: u8) -> Result<Bytes, Error> {
        let d = self.run(lun, &Cdb::Inquiry { evpd: true, page_code: page, alloc_len: 4096, control: 0 }, None, 4096).await?;
        let (_, body) = riser_scsi::inquiry::parse_vpd(&d).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok(d.slice_ref(body))
    }

    /// READ CAPACITY (16): (number of blocks, block size).
    pub async fn read_capacity(&self, lun: u16) -> Result<(u64, u32), Error> {
        let d = self.run(lun, &Cdb::ReadCapacity16 { lba: 0, alloc_len: 32, pmi: false, control: 0 }, None, 32).await?;
        let c = riser_scsi::capacity::Capacity16::parse(&d).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok((c.last_lba + 1, c.block_len))
    }

    /// READ (16) of `blocks` blocks at `lba`.
    pub async fn read(&self, lun: u16, lba: u64, blocks: u32, block_size: u32) -> Result<Bytes, Error> {
        let cdb = Cdb::Read(Rw { size: CdbSize::Sixteen, lba, blocks, ..Rw::default() });
        self.run(lun, &cdb, None, blocks * block_size).await
    }

    /// Hand back the data of a finished read once it is consumed: later reads reuse the memory
    /// (a large buffer from the allocator is a fresh mapping, page-faulted in per command).
    /// Ignored unless `data` is the only handle on its buffer.
    pub fn recycle(&self, data: Bytes) {
        if let Ok(buf) = data.try_into_mut() {
            self.inner.dm().release_task_buffer(riser_datamover::TaskBuffer { data: buf });
        }
    }

    /// WRITE (16) of `data` (whole blocks) at `lba`.
    pub async fn write(&self, lun: u16, lba: u64, data: Bytes, block_size: u32) -> Result<(), Error> {
        let cdb = Cdb::Write(Rw { size: CdbSize::Sixteen, lba, blocks: (data.len() / block_size as usize) as u32, ..Rw::default() });
        self.run(lun, &cdb, Some(data), 0).await.map(drop)
    }

    /// SYNCHRONIZE CACHE (16) of the whole LU.
    pub async fn sync(&self, lun: u16) -> Result<(), Error> {
        self.run(lun, &Cdb::SynchronizeCache(Rw { size: CdbSize::Sixteen, ..Rw::default() }), None, 0).await.map(drop)
    }

    /// UNMAP one extent.
    pub async fn unmap(&self, lun: u16, lba: u64, blocks: u32) -> Result<(), Error> {
        let list = riser_scsi::unmap::to_bytes(&[riser_scsi::unmap::UnmapDescriptor { lba, blocks }]);
        let cdb = Cdb::Unmap { anchor: false, group: 0, param_len: list.len() as u16, control: 0 };
        self.run(lun, &cdb, Some(list.into()), 0).await.map(drop)
    }

    /// A task management function; `ref_itt` for ABORT TASK.
    pub async fn task_management(&self, lun: u16, function: TmfFunction, ref_itt: u32) -> Result<(), Error> {
        let gate = self.inner.send_gate.write().await;
        let victims = self.victims(lun, function, ref_itt);
        let (itt, cmd_sn, exp_stat_sn, rx) = self.slot(true).await?;
        let h = TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::from_number(lun).unwrap_or_default(),
            itt,
            ref_task_tag: ref_itt,
            cmd_sn,
            exp_stat_sn,
            ref_cmd_sn: cmd_sn,
            exp_data_sn: 0,
        };
        self.inner.dm().send_control(ControlPdu::new(Header::TaskMgmtRequest(h), Bytes::new())).await.map_err(|_| Error::ConnectionLost)?;
        drop(gate);
        match self.wait(itt, rx).await? {
            Reply::Pdu(Header::TaskMgmtResponse(r)) if r.response == TmfResponse::COMPLETE => {
                self.aborted(&victims);
                Ok(())
            }
            Reply::Pdu(Header::TaskMgmtResponse(r)) => Err(Error::TaskManagement(r.response)),
            _ => Err(Error::Protocol("unexpected answer to a task management request".into())),
        }
    }

    /// The commands sent so far that a task management function on `lun` concerns.
    fn victims(&self, lun: u16, function: TmfFunction, ref_itt: u32) -> Vec<u32> {
        let hit = |itt: u32, l: u16| match function {
            TmfFunction::ABORT_TASK => itt == ref_itt,
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET | TmfFunction::LOGICAL_UNIT_RESET => l == lun,
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => true,
            _ => false,
        };
        lock(&self.inner.state).luns.iter().filter(|&(&i, &l)| hit(i, l)).map(|(&i, _)| i).collect()
    }

    /// After a completed task management function: the commands it aborted get no response, so
    /// end them here ([`Error::Aborted`]) and release their buffers (registrations on iSER).
    fn aborted(&self, victims: &[u32]) {
        let doomed: Vec<(u32, oneshot::Sender<Reply>)> = {
            let mut s = lock(&self.inner.state);
            victims
                .iter()
                .filter_map(|&i| {
                    s.luns.remove(&i);
                    s.pending.remove(&i).map(|tx| (i, tx))
                })
                .collect()
        };
        let dm = self.inner.dm();
        for (itt, tx) in doomed {
            let _ = dm.take_read_data(itt);
            dm.deallocate_task_resources(itt);
            let _ = tx.send(Reply::Aborted);
        }
    }

    /// NOP-Out ping; returns the round-trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        let (itt, cmd_sn, exp_stat_sn, rx) = self.slot(true).await?;
        let h = NopOut { immediate: true, lun: Lun::ZERO, itt, ttt: RESERVED_TAG, cmd_sn, exp_stat_sn };
        self.inner.dm().send_control(ControlPdu::new(Header::NopOut(h), Bytes::new())).await.map_err(|_| Error::ConnectionLost)?;
        match self.wait(itt, rx).await? {
            Reply::Pdu(Header::NopIn(_)) => Ok(start.elapsed()),
            _ => Err(Error::Protocol("unexpected answer to a NOP-Out".into())),
        }
    }

    /// Log out (close the session) and drop the connection.
    pub async fn logout(&self) -> Result<(), Error> {
        let (itt, cmd_sn, exp_stat_sn, rx) = self.slot(true).await?;
        let h = LogoutRequest { immediate: true, reason: LogoutReason::CLOSE_SESSION, itt, cid: 0, cmd_sn, exp_stat_sn };
        self.inner.dm().send_control(ControlPdu::new(Header::LogoutRequest(h), Bytes::new())).await.map_err(|_| Error::ConnectionLost)?;
        let r = self.wait(itt, rx).await;
        lock(&self.inner.state).closed = true;
        self.inner.dm().terminate();
        match r? {
            Reply::Pdu(Header::LogoutResponse(_)) => Ok(()),
            _ => Err(Error::Protocol("unexpected answer to a Logout".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn isids_of_sessions_set_up_together_are_unrelated() {
        // ISIDs used to be the clock's nanoseconds (xor the process id): configurations made
        // together shared all but their low bits, and anyone could guess the next one. From the
        // OS generator, eight in a row sharing their first 16 random bits has odds of 2^-112.
        let isids: Vec<Isid> = (0..8).map(|_| SessionConfig::new("iqn.2026-11.io.riser:i", "iqn.2026-11.io.riser:t").isid).collect();
        assert!(isids.iter().all(|i| i.0[0] == 0x80), "type 10b (random) ISIDs");
        assert!(isids.iter().any(|i| i.0[1..3] != isids[0].0[1..3]), "ISIDs share their high bits: {isids:?}");
    }

    #[test]
    fn login_seeds_come_fresh_from_the_os() {
        // This shows only that seeds differ and are not mostly zero, not that they are
        // unpredictable: that rests on the OS generator.
        let a = entropy().unwrap();
        let b = entropy().unwrap();
        assert_ne!(a, b);
        assert!(a.iter().filter(|&&x| x != 0).count() > 16);
    }
}
