//! Multipath: one logical unit reached through several portals ([`Multipath`]).

mod select;

use crate::alua::{AccessState, SenseAction, TargetPortGroups, rtpg_cdb, sense_action};
use crate::{CommandResult, Error, Session, SessionConfig};
use bytes::Bytes;
use riser_scsi::cdb::{Cdb, CdbSize, Rw};
use riser_scsi::inquiry::{association, designator_type, parse_device_identification, vpd};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;
use select::{Alua, Failure, Selector};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// One way to the unit: a portal, the target name there, and the LUN the unit has there.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathSpec {
    /// The portal, `host:port`.
    pub portal: String,
    /// The target's name (IQN).
    pub target_name: String,
    /// The unit's LUN through this portal.
    pub lun: Lun,
}

impl PathSpec {
    /// A path to `lun` of `target_name` at `portal` (`host:port`).
    pub fn new(portal: impl Into<String>, target_name: impl Into<String>, lun: Lun) -> Self {
        Self { portal: portal.into(), target_name: target_name.into(), lun }
    }
}

/// How a [`Multipath`] handle logs in and fails over.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct MultipathConfig {
    /// The session settings of every path. Its target name is replaced by each path's; its
    /// ISID is varied per path (the path's index is added to its last two bytes), so that no two
    /// paths' sessions share an I_T nexus even where two paths lead to one target portal group.
    /// Each path keeps its ISID across logins again, so a login again reinstates the session.
    pub session: SessionConfig,
    /// How long a command may wait for a usable path, and a write that was in flight on a failed
    /// path for it to be safe to send again, before it fails (default 30 s).
    pub failover_timeout: Duration,
    /// The first pause between attempts to bring a failed path back (default 100 ms); it doubles
    /// up to `reconnect_max`.
    pub reconnect_min: Duration,
    /// The longest pause between attempts to bring a failed path back (default 5 s).
    pub reconnect_max: Duration,
    /// How often a command is retried after UNIT ATTENTION or an ALUA transition (default 10).
    pub max_retries: u32,
}

impl MultipathConfig {
    /// Paths logged in with `session`; defaults for the rest.
    pub fn new(session: SessionConfig) -> Self {
        Self {
            session,
            failover_timeout: Duration::from_secs(30),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            max_retries: 10,
        }
    }

    /// With this failover timeout.
    #[must_use]
    pub fn failover_timeout(mut self, timeout: Duration) -> Self {
        self.failover_timeout = timeout;
        self
    }

    /// With these pauses between attempts to bring a failed path back.
    #[must_use]
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.reconnect_min = min;
        self.reconnect_max = max.max(min);
        self
    }

    /// With this many retries after UNIT ATTENTION or an ALUA transition.
    #[must_use]
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }
}

/// What can go wrong with a [`Multipath`] handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MultipathError {
    /// No path was given.
    #[error("no paths given")]
    NoPaths,
    /// No path could log in and reach the unit.
    #[error("no path logged in: {}", .0.iter().map(|(p, e)| format!("{p}: {e}")).collect::<Vec<_>>().join("; "))]
    NoPathUp(Vec<(String, Error)>),
    /// A path's unit has no NAA designator (VPD page 0x83) to tell it by.
    #[error("the unit at {portal} has no NAA designator in its Device Identification page: cannot tell it is the same unit")]
    NoIdentity {
        /// The path's portal.
        portal: String,
    },
    /// Two paths lead to different units (their NAA designators differ): refused.
    #[error("paths lead to different units: {first} has NAA {first_naa}, {other} has NAA {other_naa}")]
    DifferentUnits {
        /// The portal of the first path.
        first: String,
        /// Its NAA designator, in hex.
        first_naa: String,
        /// The portal of the path that differs.
        other: String,
        /// Its NAA designator, in hex.
        other_naa: String,
    },
    /// No path could take the command within the failover timeout (all down, or in states that
    /// take no I/O).
    #[error("no usable path to the unit within {0:?}")]
    NoPath(Duration),
    /// A command that changes the unit (a write) was in flight on a path that failed, and
    /// within the failover timeout nothing made it safe to send it again: neither did that
    /// path log in again (which ends its tasks at the target), nor did a REPORT TARGET PORT
    /// GROUPS issued after the failure show another port group owning the unit. Whether it
    /// reached the medium is unknown.
    #[error(
        "a write in flight on failed path {portal} was not sent again within {timeout:?}: nothing showed its first attempt ended (no login again on that path, no other port group took the unit over); it may or may not have reached the medium"
    )]
    WriteInDoubt {
        /// The failed path's portal.
        portal: String,
        /// The failover timeout.
        timeout: Duration,
    },
    /// A command failed on a path (not a path failure: a rejection, an abort, a malformed
    /// answer…).
    #[error("on path {portal}: {error}")]
    Command {
        /// The path's portal.
        portal: String,
        /// What happened.
        #[source]
        error: Error,
    },
    /// A SCSI command ended with a status other than GOOD.
    #[error("{0}")]
    Scsi(Error),
    /// The handle was closed.
    #[error("the multipath handle is closed")]
    Closed,
}

/// A path as [`Multipath::paths`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PathStatus {
    /// Its portal.
    pub portal: String,
    /// The target name there.
    pub target_name: String,
    /// The unit's LUN there.
    pub lun: Lun,
    /// Logged in and usable.
    pub up: bool,
    /// Its target port group (VPD 0x83), if the unit names one.
    pub group: Option<u16>,
    /// Its relative target port identifier (VPD 0x83), if named.
    pub relative_port: Option<u16>,
    /// Its access state: active/optimized when the target does not support REPORT TARGET PORT
    /// GROUPS (or it has not been read yet); `None` when the report does not place the path.
    pub state: Option<AccessState>,
    /// Commands sent on it and not yet answered.
    pub in_flight: usize,
}

/// Counters of a [`Multipath`] handle.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MultipathStats {
    /// Path failures seen by commands (a broken connection, a timeout).
    pub path_failures: u64,
    /// Read-only commands sent again on another path after a path failure.
    pub reissued_reads: u64,
    /// Writes sent again after a path failure, once that was safe (at once when the session
    /// had aborted them).
    pub reissued_writes: u64,
    /// Writes that failed with [`MultipathError::WriteInDoubt`].
    pub writes_in_doubt: u64,
    /// REPORT TARGET PORT GROUPS answered.
    pub alua_reports: u64,
    /// Paths brought back after a failure.
    pub paths_restored: u64,
}

#[derive(Default)]
struct Counters {
    path_failures: AtomicU64,
    reissued_reads: AtomicU64,
    reissued_writes: AtomicU64,
    writes_in_doubt: AtomicU64,
    alua_reports: AtomicU64,
    paths_restored: AtomicU64,
}

struct PathEntry {
    spec: PathSpec,
    /// The path's session settings (its target name and ISID).
    cfg: SessionConfig,
    /// Its session, once one logged in.
    session: Mutex<Option<Session>>,
}

struct Shared {
    paths: Vec<PathEntry>,
    sel: Mutex<Selector>,
    /// Notified at every change of a path's state or of the access states.
    changed: Notify,
    cfg: MultipathConfig,
    /// The unit's NAA designator: every path must lead to it.
    naa: Vec<u8>,
    /// One REPORT TARGET PORT GROUPS at a time.
    rtpg: tokio::sync::Mutex<()>,
    closed: AtomicBool,
    counters: Counters,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // The sessions' receivers would keep their connections open: end them.
        for p in &self.paths {
            if let Some(s) = lock(&p.session).as_ref() {
                s.drop_connection();
            }
        }
    }
}

/// A handle on one logical unit reached through several paths (portals of gateways that export
/// one shared store under one identity, each its own target portal group and ALUA target port
/// group), with failover.
///
/// [`Multipath::connect`] logs in on every path, checks that all reach the same unit (equal NAA
/// designators in VPD page 0x83; otherwise it refuses), learns each path's target port group
/// (VPD 0x83 designator type 5h, or its relative port's place in the report) and the access
/// states from REPORT TARGET PORT GROUPS. A target that answers that with ILLEGAL REQUEST is
/// taken as active/active: every path active/optimized.
///
/// Commands go round robin to the active/optimized paths that are up, to active/non-optimized
/// ones only when no optimized path is up. UNIT ATTENTION 2Ah/06h (asymmetric access state
/// changed) or 3Fh/0Eh, and NOT READY 04h/0Ah–0Ch (transitioning, standby, unavailable), make
/// the handle read the states again and retry the command (at most
/// [`MultipathConfig::max_retries`] times); other unit attentions are retried too.
///
/// A path fails when its connection breaks or a command on it times out (the session's timeout,
/// then as long again for the command's abort: a path whose target stops answering without
/// closing the connection is noticed after about two timeouts): it is marked down and
/// brought back in the background (logging in again with the same ISID, pausing between tries
/// from [`MultipathConfig::reconnect_min`] up to [`MultipathConfig::reconnect_max`]); once back
/// and checked to lead to the same unit, it takes I/O again per its access state. The commands
/// that were in flight on it are sent again on another path — at once if they only read (READ,
/// VERIFY, INQUIRY, READ CAPACITY, MODE SENSE, REPORT LUNS, …), and at once too if the path
/// failed by its time running out: the session reports [`Error::Timeout`] for a command only
/// once the target has ended it (answered its ABORT TASK *Function complete*, which a target
/// gives only when nothing of the task can still reach the medium, or *Task does not exist*).
/// Anything else (writes and every command not known to be read-only, caught in flight by a
/// lost connection) is sent again only once it is safe, that is once
///
/// (a) the failed path has logged in again with the same ISID: the target reinstated the
///     session, which ends the old session's tasks (riser's target waits for their backend I/O
///     before the login completes; a restarted gateway has none left), or
///
/// (b) a REPORT TARGET PORT GROUPS issued after the failure, answered through another path that
///     is up, reports that path's group active/optimized and the failed path's group not
///     active/optimized.
///
/// (b) rests on a contract with the gateways: **a target port group is reported
/// active/optimized only by the gateway that owns the unit, and a gateway takes ownership only
/// after fencing the former owner, so that no write the former owner accepted can reach the
/// medium afterwards**. Gateways that report several groups optimized at once (active/active)
/// give no such guarantee, and (b) then never holds. Until (a) or (b) holds the write waits, for
/// at most [`MultipathConfig::failover_timeout`]; then it fails with
/// [`MultipathError::WriteInDoubt`] — never silently.
///
/// Dropping the handle ends its connections (without logging out) and its background tasks;
/// [`Multipath::close`] logs out.
#[derive(Clone)]
pub struct Multipath {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Multipath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Multipath").field("paths", &self.paths()).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What VPD page 0x83 tells of a path: the unit's NAA designator, the port's target port group
/// and relative port.
#[derive(Debug)]
struct Probe {
    naa: Option<Vec<u8>>,
    group: Option<u16>,
    relative_port: Option<u16>,
}

async fn probe(session: &Session, lun: Lun) -> Result<Probe, Error> {
    let body = session.vpd(lun, vpd::DEVICE_IDENTIFICATION).await?;
    let ds = parse_device_identification(&body).map_err(|e| Error::Protocol(format!("VPD page 0x83: {e}")))?;
    let port_field = |kind: u8| {
        ds.iter()
            .find(|d| d.association == association::TARGET_PORT && d.kind == kind && d.value.len() >= 4)
            .map(|d| u16::from_be_bytes([d.value[2], d.value[3]]))
    };
    Ok(Probe {
        naa: ds.iter().find(|d| d.association == association::LOGICAL_UNIT && d.kind == designator_type::NAA).map(|d| d.value.clone()),
        group: port_field(designator_type::TARGET_PORT_GROUP),
        relative_port: port_field(designator_type::RELATIVE_TARGET_PORT),
    })
}

/// Commands that neither change the unit nor its state: safe to send again anywhere.
fn is_read_only(cdb: &[u8]) -> bool {
    matches!(
        cdb.first(),
        Some(
            0x00 // TEST UNIT READY
            | 0x03 // REQUEST SENSE
            | 0x08 // READ (6)
            | 0x12 // INQUIRY
            | 0x1a // MODE SENSE (6)
            | 0x25 // READ CAPACITY (10)
            | 0x28 // READ (10)
            | 0x2f // VERIFY (10)
            | 0x4d // LOG SENSE
            | 0x5a // MODE SENSE (10)
            | 0x5e // PERSISTENT RESERVE IN
            | 0x88 // READ (16)
            | 0x8f // VERIFY (16)
            | 0x9e // SERVICE ACTION IN (16): READ CAPACITY (16), GET LBA STATUS
            | 0xa0 // REPORT LUNS
            | 0xa3 // MAINTENANCE IN: the REPORT commands
            | 0xa8 // READ (12)
            | 0xaf // VERIFY (12)
        )
    )
}

/// Errors that mean the path failed (rather than the command).
fn is_path_failure(e: &Error) -> bool {
    matches!(e, Error::ConnectionLost | Error::Timeout | Error::Connect(_) | Error::Login(_) | Error::Redirected(_) | Error::Datamover(_))
}

/// Largest REPORT TARGET PORT GROUPS answer asked for.
const RTPG_MAX_ALLOC: u32 = 64 * 1024;
/// How often a waiting command looks again even without a notification.
const TICK: Duration = Duration::from_millis(200);

/// Counts a command in flight on a path from its numbering (just before it is sent) for as
/// long as it lives, and keeps the generation of the connection it was numbered on.
struct InFlight<'a> {
    shared: &'a Shared,
    path: usize,
    ran_on: Option<u32>,
}

impl<'a> InFlight<'a> {
    fn new(shared: &'a Shared, path: usize) -> Self {
        Self { shared, path, ran_on: None }
    }

    fn numbered(&mut self, generation: u32) {
        if self.ran_on.replace(generation).is_none()
            && let Some(p) = lock(&self.shared.sel).paths.get_mut(self.path)
        {
            p.in_flight += 1;
        }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.ran_on.is_some()
            && let Some(p) = lock(&self.shared.sel).paths.get_mut(self.path)
        {
            p.in_flight = p.in_flight.saturating_sub(1);
        }
    }
}

impl Multipath {
    /// Log in on every path (at once), check they reach one unit, and read the access states.
    /// Paths that cannot log in now are brought up in the background (and checked then); at
    /// least one must log in now.
    pub async fn connect(paths: Vec<PathSpec>, cfg: MultipathConfig) -> Result<Self, MultipathError> {
        if paths.is_empty() {
            return Err(MultipathError::NoPaths);
        }
        let entries: Vec<PathEntry> = paths
            .into_iter()
            .enumerate()
            .map(|(i, spec)| {
                let mut c = cfg.session.clone();
                c.login.target_name = Some(spec.target_name.clone());
                let isid = &mut c.login.isid.0;
                let tail = u16::from_be_bytes([isid[4], isid[5]]).wrapping_add(i as u16);
                isid[4..6].copy_from_slice(&tail.to_be_bytes());
                PathEntry { spec, cfg: c, session: Mutex::new(None) }
            })
            .collect();
        let mut logins = tokio::task::JoinSet::new();
        for (i, p) in entries.iter().enumerate() {
            let (portal, c, lun) = (p.spec.portal.clone(), p.cfg.clone(), p.spec.lun);
            logins.spawn(async move {
                let r = async {
                    let s = Session::connect(portal.as_str(), c).await?;
                    let probe = probe(&s, lun).await;
                    Ok::<_, Error>((s, probe))
                }
                .await;
                (i, r)
            });
        }
        let mut up = Vec::new();
        let mut failed = Vec::new();
        while let Some(r) = logins.join_next().await {
            let Ok((i, r)) = r else { continue };
            match r {
                Ok((s, Ok(probe))) => up.push((i, s, probe)),
                Ok((s, Err(e))) => {
                    let _ = s.logout().await;
                    failed.push((i, e));
                }
                Err(e) => failed.push((i, e)),
            }
        }
        up.sort_by_key(|(i, ..)| *i);
        let Some((first, _, first_probe)) = up.first() else {
            failed.sort_by_key(|(i, _)| *i);
            return Err(MultipathError::NoPathUp(failed.into_iter().map(|(i, e)| (entries[i].spec.portal.clone(), e)).collect()));
        };
        let Some(naa) = first_probe.naa.clone() else {
            return Err(MultipathError::NoIdentity { portal: entries[*first].spec.portal.clone() });
        };
        for (i, _, p) in &up {
            match &p.naa {
                None => return Err(MultipathError::NoIdentity { portal: entries[*i].spec.portal.clone() }),
                Some(n) if *n != naa => {
                    for (_, s, _) in &up {
                        let _ = s.logout().await;
                    }
                    return Err(MultipathError::DifferentUnits {
                        first: entries[*first].spec.portal.clone(),
                        first_naa: hex(&naa),
                        other: entries[*i].spec.portal.clone(),
                        other_naa: hex(n),
                    });
                }
                Some(_) => {}
            }
        }
        let mut sel = Selector::new(entries.len());
        for (i, s, p) in up {
            sel.path_up(i, s.generation(), p.group, p.relative_port);
            *lock(&entries[i].session) = Some(s);
        }
        for (i, e) in &failed {
            tracing::warn!(portal = %entries[*i].spec.portal, error = %e, "path not up: trying again in the background");
        }
        let shared = Arc::new(Shared {
            paths: entries,
            sel: Mutex::new(sel),
            changed: Notify::new(),
            cfg,
            naa,
            rtpg: tokio::sync::Mutex::new(()),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
        });
        for (i, _) in failed {
            Shared::spawn_reconnect(&shared, i);
        }
        let mp = Self { shared };
        // Errors other than ILLEGAL REQUEST leave the states unknown (all paths optimized) until
        // the next look.
        if let Err(e) = mp.shared.refresh_after(0).await {
            tracing::warn!(error = %e, "REPORT TARGET PORT GROUPS failed: taking every path as optimized for now");
        }
        Ok(mp)
    }

    /// Submit a CDB to the unit, with optional write data, expecting up to `read_len` bytes
    /// back, on the path the policy picks; see [`Multipath`] for retries and failover. A status
    /// other than GOOD comes back in the result (see [`CommandResult::into_good`]).
    pub async fn command(&self, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, MultipathError> {
        self.shared.submit(cdb, write, read_len).await
    }

    /// Run a CDB value; GOOD or an error.
    pub async fn run(&self, cdb: &Cdb, write: Option<Bytes>, read_len: u32) -> Result<Bytes, MultipathError> {
        self.command(&cdb.to_vec(), write, read_len).await?.into_good().map_err(MultipathError::Scsi)
    }

    /// READ (16) of `blocks` blocks at `lba`.
    pub async fn read(&self, lba: u64, blocks: u32, block_size: u32) -> Result<Bytes, MultipathError> {
        let cdb = Cdb::Read(Rw { size: CdbSize::Sixteen, lba, blocks, ..Rw::default() });
        self.run(&cdb, None, blocks.saturating_mul(block_size)).await
    }

    /// WRITE (16) of `data` (whole blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes, block_size: u32) -> Result<(), MultipathError> {
        let blocks = (data.len() / block_size.max(1) as usize) as u32;
        let cdb = Cdb::Write(Rw { size: CdbSize::Sixteen, lba, blocks, ..Rw::default() });
        self.run(&cdb, Some(data), 0).await.map(drop)
    }

    /// READ CAPACITY (16): (number of blocks, block size).
    pub async fn read_capacity(&self) -> Result<(u64, u32), MultipathError> {
        let d = self.run(&Cdb::ReadCapacity16 { lba: 0, alloc_len: 32, pmi: false, control: 0 }, None, 32).await?;
        let c = riser_scsi::capacity::Capacity16::parse(&d).map_err(|e| MultipathError::Scsi(Error::Protocol(e.to_string())))?;
        Ok((c.last_lba + 1, c.block_len))
    }

    /// SYNCHRONIZE CACHE (16) of the whole unit.
    pub async fn sync(&self) -> Result<(), MultipathError> {
        self.run(&Cdb::SynchronizeCache(Rw { size: CdbSize::Sixteen, ..Rw::default() }), None, 0).await.map(drop)
    }

    /// Read the access states again now (REPORT TARGET PORT GROUPS through a path that is up).
    pub async fn refresh_alua(&self) -> Result<(), MultipathError> {
        let now = lock(&self.shared.sel).rtpg_issued();
        self.shared.refresh_after(now).await
    }

    /// Whether the target supports REPORT TARGET PORT GROUPS (`None`: not known yet).
    pub fn alua_supported(&self) -> Option<bool> {
        match lock(&self.shared.sel).alua {
            Alua::Unknown => None,
            Alua::Unsupported => Some(false),
            Alua::Known { .. } => Some(true),
        }
    }

    /// The last REPORT TARGET PORT GROUPS answer, if any.
    pub fn alua_report(&self) -> Option<TargetPortGroups> {
        match &lock(&self.shared.sel).alua {
            Alua::Known { report, .. } => Some(report.clone()),
            _ => None,
        }
    }

    /// The unit's NAA designator (VPD page 0x83), which every path reaches.
    pub fn naa(&self) -> &[u8] {
        &self.shared.naa
    }

    /// The paths, in the order given, and their state.
    pub fn paths(&self) -> Vec<PathStatus> {
        let sel = lock(&self.shared.sel);
        self.shared
            .paths
            .iter()
            .zip(&sel.paths)
            .enumerate()
            .map(|(i, (e, p))| PathStatus {
                portal: e.spec.portal.clone(),
                target_name: e.spec.target_name.clone(),
                lun: e.spec.lun,
                up: p.up,
                group: p.group,
                relative_port: p.relative_port,
                state: sel.state_of(i),
                in_flight: p.in_flight,
            })
            .collect()
    }

    /// The handle's counters.
    pub fn stats(&self) -> MultipathStats {
        let c = &self.shared.counters;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        MultipathStats {
            path_failures: r(&c.path_failures),
            reissued_reads: r(&c.reissued_reads),
            reissued_writes: r(&c.reissued_writes),
            writes_in_doubt: r(&c.writes_in_doubt),
            alua_reports: r(&c.alua_reports),
            paths_restored: r(&c.paths_restored),
        }
    }

    /// Stop bringing paths back, fail waiting commands with [`MultipathError::Closed`], and log
    /// out every path that is up.
    pub async fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.changed.notify_waiters();
        for p in &self.shared.paths {
            let s = lock(&p.session).clone();
            if let Some(s) = s {
                let _ = tokio::time::timeout(p.cfg.timeout, s.logout()).await;
            }
        }
    }
}

impl Shared {
    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn session(&self, path: usize) -> Option<Session> {
        lock(&self.paths.get(path)?.session).clone()
    }

    /// Wait (at most the failover timeout) for a path that may take I/O.
    async fn pick_path(self: &Arc<Self>) -> Result<usize, MultipathError> {
        let deadline = Instant::now() + self.cfg.failover_timeout;
        let mut looked = Instant::now();
        loop {
            let changed = self.changed.notified();
            if self.is_closed() {
                return Err(MultipathError::Closed);
            }
            let (picked, look_again) = {
                let mut sel = lock(&self.sel);
                (sel.pick(), matches!(sel.alua, Alua::Known { .. }) && sel.any_up())
            };
            if let Some(p) = picked {
                return Ok(p);
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(MultipathError::NoPath(self.cfg.failover_timeout));
            }
            // Paths up, none in a state for I/O: the states may have moved on.
            if look_again && now >= looked {
                looked = now + TICK;
                let t = lock(&self.sel).rtpg_issued();
                let _ = self.refresh_after(t).await;
                continue;
            }
            let _ = tokio::time::timeout(TICK.min(deadline - now), changed).await;
        }
    }

    /// A command on `path` failed with a path failure; `ran_on` is the connection generation it
    /// was numbered on (`None`: it was never sent). Marks the path down, starts bringing it
    /// back, and returns the failure a write it carried waits on.
    fn path_error(self: &Arc<Self>, path: usize, ran_on: Option<u32>, error: &Error) -> Option<Failure> {
        tracing::warn!(portal = %self.paths[path].spec.portal, %error, "path failure");
        self.counters.path_failures.fetch_add(1, Ordering::Relaxed);
        let (failure, spawn) = {
            let mut sel = lock(&self.sel);
            let f = match ran_on {
                Some(g) => Some(sel.path_failed(path, g)),
                None => {
                    sel.path_down(path);
                    None
                }
            };
            (f, sel.claim_reconnect(path))
        };
        if spawn {
            Self::spawn_reconnect(self, path);
        }
        self.changed.notify_waiters();
        failure
    }

    /// Bring `path` back in the background: log in again (or for the first time), check it
    /// reaches the unit, then mark it up; pause between attempts.
    fn spawn_reconnect(me: &Arc<Self>, path: usize) {
        let weak: Weak<Self> = Arc::downgrade(me);
        let (min, max) = (me.cfg.reconnect_min, me.cfg.reconnect_max);
        lock(&me.sel).paths[path].reconnecting = true;
        tokio::spawn(async move {
            let mut pause = min;
            loop {
                let Some(me) = weak.upgrade() else { return };
                if me.is_closed() {
                    lock(&me.sel).reconnect_ended(path);
                    return;
                }
                match me.bring_up(path).await {
                    Ok(true) => return,
                    Ok(false) => {
                        lock(&me.sel).reconnect_ended(path);
                        return;
                    }
                    Err(e) => tracing::debug!(portal = %me.paths[path].spec.portal, error = %e, retry_in = ?pause, "path still down"),
                }
                drop(me);
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(max);
            }
        });
    }

    /// One attempt at bringing `path` back: `Ok(true)` up, `Ok(false)` refused for good (it
    /// leads to another unit).
    async fn bring_up(self: &Arc<Self>, path: usize) -> Result<bool, Error> {
        let entry = &self.paths[path];
        let session = match self.session(path) {
            Some(s) => {
                // Bounded: the login is, but not the wait for the old connection to end.
                tokio::time::timeout(entry.cfg.login.login_timeout + Duration::from_secs(10), s.reinstate())
                    .await
                    .map_err(|_| Error::Timeout)??;
                s
            }
            None => {
                let s = Session::connect(entry.spec.portal.as_str(), entry.cfg.clone()).await?;
                *lock(&entry.session) = Some(s.clone());
                s
            }
        };
        let p = probe(&session, entry.spec.lun).await?;
        if p.naa.as_deref() != Some(&self.naa[..]) {
            tracing::error!(
                portal = %entry.spec.portal,
                naa = p.naa.as_deref().map(hex),
                expected = hex(&self.naa),
                "path came back leading to another unit: not using it"
            );
            let _ = session.logout().await;
            return Ok(false);
        }
        lock(&self.sel).path_up(path, session.generation(), p.group, p.relative_port);
        self.counters.paths_restored.fetch_add(1, Ordering::Relaxed);
        tracing::info!(portal = %entry.spec.portal, "path back up");
        self.changed.notify_waiters();
        // Its group's state may be news.
        let t = lock(&self.sel).rtpg_issued();
        let _ = self.refresh_after(t).await;
        Ok(true)
    }

    /// Make sure the access states held come from a REPORT TARGET PORT GROUPS issued after
    /// event-clock value `min` (one is issued unless another caller's already did, or the
    /// target does not support it).
    async fn refresh_after(self: &Arc<Self>, min: u64) -> Result<(), MultipathError> {
        let _one = self.rtpg.lock().await;
        let candidates: Vec<usize> = {
            let sel = lock(&self.sel);
            match sel.alua {
                Alua::Unsupported => return Ok(()),
                Alua::Known { issued_at, .. } if issued_at > min => return Ok(()),
                _ => {}
            }
            (0..sel.paths.len()).filter(|&i| sel.paths[i].up).collect()
        };
        let mut last = MultipathError::NoPath(Duration::ZERO);
        for path in candidates {
            let Some(session) = self.session(path) else { continue };
            let ticket = lock(&self.sel).rtpg_issued();
            let mut ran_on = None;
            match rtpg(&session, self.paths[path].spec.lun, &mut ran_on).await {
                Ok(Some(report)) => {
                    self.counters.alua_reports.fetch_add(1, Ordering::Relaxed);
                    lock(&self.sel).rtpg_answered(ticket, report);
                    self.changed.notify_waiters();
                    return Ok(());
                }
                Ok(None) => {
                    tracing::info!("the target does not support REPORT TARGET PORT GROUPS: all paths active/optimized");
                    lock(&self.sel).rtpg_unsupported();
                    self.changed.notify_waiters();
                    return Ok(());
                }
                Err(e) => {
                    if is_path_failure(&e) {
                        self.path_error(path, ran_on, &e);
                    }
                    last = MultipathError::Command { portal: self.paths[path].spec.portal.clone(), error: e };
                }
            }
        }
        Err(last)
    }

    /// Wait until a write in flight on a failed path may be sent again (see [`Multipath`]).
    async fn wait_until_safe(self: &Arc<Self>, f: &Failure) -> Result<(), MultipathError> {
        let deadline = Instant::now() + self.cfg.failover_timeout;
        let mut looked = Instant::now();
        loop {
            let changed = self.changed.notified();
            if self.is_closed() {
                return Err(MultipathError::Closed);
            }
            let (safe, look) = {
                let sel = lock(&self.sel);
                (sel.write_may_be_reissued(f), matches!(sel.alua, Alua::Known { .. } | Alua::Unknown) && sel.any_up())
            };
            if safe {
                return Ok(());
            }
            let now = Instant::now();
            if now >= deadline {
                self.counters.writes_in_doubt.fetch_add(1, Ordering::Relaxed);
                return Err(MultipathError::WriteInDoubt {
                    portal: self.paths[f.path].spec.portal.clone(),
                    timeout: self.cfg.failover_timeout,
                });
            }
            // A report newer than any seen, through a surviving path, may show a takeover.
            if look && now >= looked {
                looked = now + TICK;
                let t = lock(&self.sel).rtpg_issued();
                let _ = self.refresh_after(t.max(f.at)).await;
                continue;
            }
            let _ = tokio::time::timeout(TICK.min(deadline - now), changed).await;
        }
    }

    async fn submit(self: &Arc<Self>, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, MultipathError> {
        let read_only = is_read_only(cdb);
        let max_failovers = 4 * self.paths.len() + 4;
        let (mut retries, mut failovers) = (0u32, 0usize);
        loop {
            let path = self.pick_path().await?;
            let Some(session) = self.session(path) else {
                lock(&self.sel).path_down(path);
                continue;
            };
            let lun = self.paths[path].spec.lun;
            let (r, ran_on) = {
                let mut counted = InFlight::new(self, path);
                let r = session.command_on_link(lun, cdb, write.clone(), read_len, &mut |g| counted.numbered(g)).await;
                (r, counted.ran_on)
            };
            match r {
                Ok(r) => {
                    let action = if r.status == Status::CHECK_CONDITION { sense_action(r.sense.as_deref()) } else { SenseAction::None };
                    if retries >= self.cfg.max_retries || !matches!(action, SenseAction::Reread | SenseAction::Retry) {
                        return Ok(r);
                    }
                    retries += 1;
                    if action == SenseAction::Reread {
                        tracing::debug!(portal = %self.paths[path].spec.portal, "access states changed or in transition: reading them again");
                        let t = lock(&self.sel).rtpg_issued();
                        let _ = self.refresh_after(t).await;
                        // NOT READY (transitioning): give the transition a moment.
                        tokio::time::sleep(Duration::from_millis(20 * u64::from(retries))).await;
                    }
                }
                Err(e) if is_path_failure(&e) => {
                    let failure = self.path_error(path, ran_on, &e);
                    failovers += 1;
                    if failovers > max_failovers {
                        return Err(MultipathError::Command { portal: self.paths[path].spec.portal.clone(), error: e });
                    }
                    match failure {
                        // Never sent: nothing to wait for.
                        None => {}
                        Some(_) if read_only => {
                            self.counters.reissued_reads.fetch_add(1, Ordering::Relaxed);
                        }
                        // Aborted by its session, which says so only once the target has ended
                        // it: nothing of the first attempt can land after the second.
                        Some(_) if matches!(e, Error::Timeout) => {
                            self.counters.reissued_writes.fetch_add(1, Ordering::Relaxed);
                        }
                        Some(f) => {
                            self.wait_until_safe(&f).await?;
                            self.counters.reissued_writes.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Err(e) => return Err(MultipathError::Command { portal: self.paths[path].spec.portal.clone(), error: e }),
            }
        }
    }
}

/// REPORT TARGET PORT GROUPS on one path: `Ok(None)` when the target does not support it
/// (ILLEGAL REQUEST in both formats). `ran_on` gets the generation of the connection it was
/// sent on, if it was.
async fn rtpg(session: &Session, lun: Lun, ran_on: &mut Option<u32>) -> Result<Option<TargetPortGroups>, Error> {
    let (mut extended, mut alloc) = (true, 4096u32);
    for _ in 0..6 {
        let cdb = rtpg_cdb(alloc, extended);
        let r = session.command_on_link(lun, &cdb, None, alloc, &mut |g| *ran_on = Some(g)).await?;
        if r.status == Status::GOOD {
            if let Ok(full) = TargetPortGroups::required_len(&r.data)
                && full > r.data.len()
                && alloc < RTPG_MAX_ALLOC
            {
                alloc = u32::try_from(full).unwrap_or(RTPG_MAX_ALLOC).min(RTPG_MAX_ALLOC);
                continue;
            }
            return TargetPortGroups::parse(&r.data).map(Some).map_err(|e| Error::Protocol(e.to_string()));
        }
        match sense_action(r.sense.as_deref()) {
            SenseAction::Illegal if extended => extended = false,
            SenseAction::Illegal => return Ok(None),
            SenseAction::Retry | SenseAction::Reread => {}
            SenseAction::None => return r.into_good().map(|_| None),
        }
    }
    Err(Error::Protocol("REPORT TARGET PORT GROUPS kept asking to be retried".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_commands_known_not_to_change_the_unit_are_read_only() {
        for op in [0x28u8, 0x88, 0x08, 0xa8, 0x12, 0x9e, 0xa0, 0xa3, 0x00] {
            assert!(is_read_only(&[op, 0]), "{op:#x}");
        }
        // WRITE (10/16), WRITE SAME, UNMAP, SYNCHRONIZE CACHE, COMPARE AND WRITE, PERSISTENT
        // RESERVE OUT, an unknown one, none at all.
        for op in [0x2au8, 0x8a, 0x93, 0x42, 0x91, 0x89, 0x5f, 0xc0] {
            assert!(!is_read_only(&[op, 0]), "{op:#x}");
        }
        assert!(!is_read_only(&[]));
    }
}
