//! Several riser gateways exporting one RBD image: who is active/optimized, who is alive, and
//! fencing a dead owner, coordinated through the cluster.
//!
//! Every gateway of an image watches one RADOS object beside it, `riser.gw.<image id>`, and
//! talks to the others by notifications on it (text, `riser1 <what> ...`):
//!
//! * `ping`, every [`GatewayConfig::probe_interval`]: each live gateway acknowledges with
//!   `riser1 alive group=G addr=A ao=O` (its target port group, its client's address, the group
//!   it reports active/optimized). A gateway that does not acknowledge is not alive.
//! * `reset`, `ua AASQ`: a LOGICAL UNIT RESET, or a unit attention for every nexus, made on one
//!   gateway reaches the others' sessions ([`crate::lu::UnitEvents`]).
//! * `owner G`: the sender took the unit over; its group is active/optimized from now on.
//!
//! **Takeover fences the old owner, and only a dead one.** Writes are never a reason: a write
//! reaching a non-optimized gateway takes the image's exclusive lock from the owner
//! cooperatively (librbd's automatic lock transfer, which the owner answers once its own writes
//! are done), and nothing is fenced. Only when the gateway whose group is active/optimized has
//! not acknowledged a ping for [`GatewayConfig::takeover_after`] does another take over: it breaks
//! the dead gateway's lock on the image (librbd blocklists the lock's owner when it breaks it)
//! and blocklists its client explicitly, so none of its writes still in flight can land after
//! the takeover; only then does it report its own group active/optimized (every nexus gets
//! ASYMMETRIC ACCESS STATE CHANGED) and tell the others. An initiator may therefore re-issue the
//! writes it had in flight on the dead gateway's path once the surviving path reports
//! active/optimized (the riser initiator's multipath does exactly that).
//!
//! A gateway that finds itself blocklisted (fenced by another while it was hung) reports its
//! own group unavailable: its I/O fails, and initiators go to the path that owns the unit.
//!
//! **Persistent reservations are kept in the cluster**, in `riser.pr.<image id>` beside the
//! image: a PERSISTENT RESERVE OUT takes that object's exclusive lock (one at a time over every
//! gateway), applies the service action to the state read fresh from it, writes it back, and
//! tells the others, who read it before they acknowledge — so when the command returns GOOD,
//! every live gateway enforces the new state (one that answered late has it at its next probe,
//! within a second). APTPL is the cluster's to keep: a gateway that starts alone drops a state
//! without APTPL (a power-on), one that joins others takes theirs. RESERVE/RELEASE (SPC-2) are
//! refused on a coordinated unit ([`LogicalUnit::set_gateways`]): one gateway's would not
//! hold at the other.

use super::RbdStore;
use crate::lu::{AccessState, LogicalUnit, UnitEvents};
use riser_rbd::{Ioctx, Notify, PendingAck, Watch};
use riser_scsi::sense::AscAscq;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// How long a gateway told of another's LUN reset waits for the tasks the reset ended here to
/// stop writing before it acknowledges anyway (a backend write that hangs longer is the
/// cluster's to fence).
const REMOTE_RESET_WAIT: Duration = Duration::from_secs(3);

/// How long a reset's notification waits for the other gateways' acknowledgements: beyond
/// [`REMOTE_RESET_WAIT`] (the OSD counts whole seconds). The server answers the reset once it
/// returns (with a bound of its own for a thread stuck in the cluster).
const RESET_NOTIFY_TIMEOUT_MS: u64 = 4000;

/// How a gateway coordinates with the others.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GatewayConfig {
    /// This gateway's ALUA target port group (the one it serves the unit through).
    pub group: u16,
    /// How often the gateways are pinged (default 1 s; a ping waits at most 1 s for answers).
    pub probe_interval: Duration,
    /// How long the active/optimized gateway may go without answering before another fences it
    /// and takes the unit over (default 8 s).
    pub takeover_after: Duration,
}

impl GatewayConfig {
    /// Coordination for a gateway whose port group is `group`, with the default timings.
    pub fn new(group: u16) -> Self {
        Self { group, probe_interval: Duration::from_secs(1), takeover_after: Duration::from_secs(8) }
    }

    /// With this takeover time.
    #[must_use]
    pub fn takeover_after(mut self, d: Duration) -> Self {
        self.takeover_after = d;
        self
    }

    /// With this probe interval.
    #[must_use]
    pub fn probe_interval(mut self, d: Duration) -> Self {
        self.probe_interval = d;
        self
    }
}

/// What a gateway knows of the others, for the control plane and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayStatus {
    /// This gateway's group.
    pub group: u16,
    /// The group reported active/optimized.
    pub optimized: Option<u16>,
    /// The other gateways that answered the last pings: (group, address, seconds since).
    pub peers: Vec<(u16, String, u64)>,
    /// Takeovers this gateway made.
    pub takeovers: u64,
    /// Whether this gateway was fenced.
    pub fenced: bool,
}

#[derive(Debug, Clone)]
struct Peer {
    group: u16,
    addr: String,
    ao: Option<u16>,
    seen: Instant,
}

/// Messages for the other gateways, from the unit.
#[derive(Debug)]
enum Tell {
    /// A reset, and who waits until the others have it.
    Reset(tokio::sync::oneshot::Sender<()>),
    Ua(AscAscq),
}

/// The unit's side: resets and unit attentions go to the gateway's thread.
#[derive(Debug)]
struct Teller(Mutex<mpsc::Sender<Tell>>);

impl UnitEvents for Teller {
    fn reset(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).send(Tell::Reset(tx)).ok()?;
        Some(rx)
    }
    fn unit_attention(&self, asc: AscAscq) {
        let _ = self.0.lock().unwrap_or_else(|e| e.into_inner()).send(Tell::Ua(asc));
    }
}

#[derive(Debug)]
struct Inner {
    cfg: GatewayConfig,
    store: Arc<RbdStore>,
    unit: Weak<LogicalUnit>,
    ioctx: Ioctx,
    oid: String,
    /// This client's global id and blocklist address.
    me: u64,
    my_addr: String,
    peers: Mutex<HashMap<u64, Peer>>,
    /// The optimized group the gateways agreed on (a takeover, another's, or the one adopted at
    /// start), which outlives the configuration setting the unit's groups afresh.
    agreed: Mutex<Option<u16>>,
    takeovers: Mutex<u64>,
    stop: AtomicBool,
    fenced_reported: AtomicBool,
}

/// A running gateway coordination for one unit over an RBD image (see the module's docs).
/// Dropping it stops the coordination (its watch is removed: the others see it gone).
#[derive(Debug)]
pub struct Gateway {
    inner: Arc<Inner>,
    watch: Option<Watch>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn parse_group(v: Option<&str>) -> Option<u16> {
    v.and_then(|s| s.parse().ok()).filter(|&g| g > 0)
}

impl Inner {
    fn unit(&self) -> Option<Arc<LogicalUnit>> {
        self.unit.upgrade()
    }

    /// The group the unit reports active/optimized.
    fn optimized(&self) -> Option<u16> {
        let lu = self.unit()?;
        lu.port_groups().iter().find(|g| g.state == AccessState::ActiveOptimized).map(|g| g.id)
    }

    fn alive_payload(&self) -> Vec<u8> {
        let ao = self.optimized().map_or_else(|| "-".into(), |g| g.to_string());
        format!("riser1 alive group={} addr={} ao={ao}", self.cfg.group, self.my_addr).into_bytes()
    }

    /// A notification from another gateway (or our own, which only gets its answer):
    /// acknowledged once applied — a reset once the tasks it ended here can no longer write.
    fn on_notify(&self, n: Notify, ack: PendingAck) {
        if n.notifier_id != self.me
            && let Some(lu) = self.unit()
        {
            let text = String::from_utf8_lossy(&n.payload);
            let mut words = text.split_ascii_whitespace();
            if words.next() == Some("riser1") {
                match (words.next(), words.next()) {
                    (Some("reset"), _) => {
                        info!(unit = %lu.identity(), from = n.notifier_id, "a LUN reset on another gateway");
                        // The unit's tasks here end (SAM-5 §6.3.3: every task set of the
                        // unit), and the other gateway answers its reset only once their
                        // writes are over: waited for on a thread of its own, not librados'
                        // (which delivers this client's notifications, one at a time).
                        let ended = lu.remote_reset();
                        let (unit, payload) = (lu.identity().to_string(), self.alive_payload());
                        let waiter = std::thread::Builder::new().name("riser-rbd-reset".into()).spawn(move || {
                            if !ended.wait(REMOTE_RESET_WAIT) {
                                warn!(%unit, "a LUN reset on another gateway: tasks here still writing after {REMOTE_RESET_WAIT:?}, acknowledged anyway");
                            }
                            ack.ack(&payload);
                        });
                        if let Err(e) = waiter {
                            // The ack goes (empty) with the closure that could not run.
                            warn!(unit = %lu.identity(), "a LUN reset on another gateway, acknowledged at once: {e}");
                        }
                        return;
                    }
                    (Some("ua"), Some(code)) => {
                        if let Ok(v) = u16::from_str_radix(code, 16) {
                            lu.remote_unit_attention(AscAscq(v));
                        }
                    }
                    (Some("pr"), _) => self.load_reservations(&lu),
                    (Some("owner"), g) => {
                        if let Some(g) = parse_group(g) {
                            info!(unit = %lu.identity(), group = g, "another gateway owns the unit now");
                            *self.agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some(g);
                            if let Err(e) = lu.set_optimized(g) {
                                warn!(unit = %lu.identity(), group = g, "{e}");
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        ack.ack(&self.alive_payload());
    }

    /// The object the gateways keep the unit's persistent reservations in.
    fn pr_oid(&self) -> String {
        self.oid.replacen("riser.gw.", "riser.pr.", 1)
    }

    /// Read the shared reservation state and give it to the unit.
    fn load_reservations(&self, lu: &LogicalUnit) {
        match self.ioctx.read(&self.pr_oid(), PR_MAX_BYTES) {
            Ok(bytes) => {
                let text = bytes.map(|b| String::from_utf8_lossy(&b).into_owned());
                if let Err(e) = lu.load_shared_reservations(text.as_deref()) {
                    error!(unit = %lu.identity(), "the shared persistent reservation state is malformed: {e}");
                }
            }
            Err(e) => warn!(unit = %lu.identity(), "reading the shared persistent reservations: {e}"),
        }
    }

    fn notify(&self, what: &str, timeout_ms: u64) -> io::Result<riser_rbd::NotifyReplies> {
        self.ioctx.notify(&self.oid, format!("riser1 {what}").as_bytes(), timeout_ms).map_err(|e| {
            if e.is_blocklisted() {
                self.store.fenced.store(true, Ordering::Release);
            }
            super::to_io(e)
        })
    }

    /// Ping the others and note who answered. The first time, adopt the optimized group the
    /// live gateways report (a gateway that restarts after a takeover is not optimized).
    fn probe(&self, first: bool) {
        let replies = match self.notify("ping", 1000) {
            Ok(r) => r,
            Err(e) => {
                warn!(object = %self.oid, "pinging the other gateways: {e}");
                return;
            }
        };
        let now = Instant::now();
        let mut peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
        for ack in replies.acks.iter().filter(|a| a.gid != self.me) {
            let text = String::from_utf8_lossy(&ack.payload);
            let mut kv = text.split_ascii_whitespace().filter_map(|w| w.split_once('='));
            let (mut group, mut addr, mut ao) = (None, None, None);
            for (k, v) in kv.by_ref() {
                match k {
                    "group" => group = parse_group(Some(v)),
                    "addr" => addr = Some(v.to_string()),
                    "ao" => ao = parse_group(Some(v)),
                    _ => {}
                }
            }
            if let (Some(group), Some(addr)) = (group, addr) {
                peers.insert(ack.gid, Peer { group, addr, ao, seen: now });
            }
        }
        if first
            && let Some(ao) = peers.values().find_map(|p| p.ao)
            && let Some(lu) = self.unit()
            && self.optimized() != Some(ao)
        {
            info!(unit = %lu.identity(), group = ao, "the live gateways report another group optimized: adopted");
            *self.agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some(ao);
            let _ = lu.set_optimized(ao);
        }
    }

    /// Take the unit over if the gateway whose group is optimized has been silent too long.
    fn check_owner(&self, started: Instant) {
        let Some(ao) = self.optimized() else { return };
        if ao == self.cfg.group {
            return;
        }
        let owner = {
            let peers = self.peers.lock().unwrap_or_else(|e| e.into_inner());
            peers.iter().filter(|(_, p)| p.group == ao).max_by_key(|(_, p)| p.seen).map(|(gid, p)| (*gid, p.clone()))
        };
        let last = owner.as_ref().map_or(started, |(_, p)| p.seen);
        if last.elapsed() < self.cfg.takeover_after {
            return;
        }
        self.take_over(ao, owner);
    }

    /// Fence the silent owner (its lock broken, its client blocklisted), then report this
    /// gateway's group optimized and tell the others.
    fn take_over(&self, dead_group: u16, owner: Option<(u64, Peer)>) {
        let Some(lu) = self.unit() else { return };
        let image = self.store.image();
        warn!(unit = %lu.identity(), dead_group, silent = ?owner.as_ref().map(|(_, p)| p.seen.elapsed()), "the optimized gateway does not answer: fencing it and taking the unit over");
        // Whose lock to break: the silent gateway's (by its address), or, if it never answered
        // since this one started, whoever else holds the lock.
        let owners = match image.lock_get_owners() {
            Ok(o) => o,
            Err(e) => {
                error!(unit = %lu.identity(), "reading the image's lock owners: {e}; not taking over");
                return;
            }
        };
        let mut fence: Vec<String> = owner.iter().map(|(_, p)| p.addr.clone()).collect();
        if owner.is_none() {
            fence.extend(owners.iter().filter(|o| **o != self.my_addr).cloned());
        }
        for addr in &fence {
            if owners.contains(addr)
                && let Err(e) = image.lock_break(addr)
            {
                error!(unit = %lu.identity(), %addr, "breaking the silent gateway's lock: {e}; not taking over");
                return;
            }
            // The lock's break blocklisted it already (rbd_blocklist_on_break_lock); a client that
            // held no lock is blocklisted here, so that it cannot take one and write later.
            if let Err(e) = self.store.cluster().blocklist_add(addr, 0) {
                error!(unit = %lu.identity(), %addr, "blocklisting the silent gateway: {e}; not taking over");
                return;
            }
            info!(unit = %lu.identity(), %addr, "fenced");
        }
        if let Some((gid, _)) = &owner {
            self.peers.lock().unwrap_or_else(|e| e.into_inner()).remove(gid);
        }
        if let Err(e) = lu.set_optimized(self.cfg.group) {
            error!(unit = %lu.identity(), "{e}");
            return;
        }
        *self.agreed.lock().unwrap_or_else(|e| e.into_inner()) = Some(self.cfg.group);
        *self.takeovers.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        if let Err(e) = self.notify(&format!("owner {}", self.cfg.group), 2000) {
            warn!(unit = %lu.identity(), "telling the other gateways of the takeover: {e}");
        }
        info!(unit = %lu.identity(), group = self.cfg.group, "took the unit over: this gateway's group is active/optimized");
    }

    /// A gateway fenced by another reports its group unavailable.
    fn check_fenced(&self) {
        if self.store.fenced()
            && !self.fenced_reported.swap(true, Ordering::AcqRel)
            && let Some(lu) = self.unit()
        {
            error!(unit = %lu.identity(), "this gateway was fenced by another: its target port group is unavailable until it restarts");
            let _ = lu.set_access_state(self.cfg.group, AccessState::Unavailable);
        }
    }

    fn run(&self, rx: &mpsc::Receiver<Tell>) {
        let started = Instant::now();
        let mut next_probe = Instant::now() + self.cfg.probe_interval;
        while !self.stop.load(Ordering::Acquire) {
            let wait = next_probe.saturating_duration_since(Instant::now());
            match rx.recv_timeout(wait) {
                Ok(first) => {
                    // Everything queued goes now, in order, the resets in one notification at
                    // the first one's place (`None` below).
                    let (mut resets, mut order) = (Vec::new(), Vec::new());
                    for t in std::iter::once(first).chain(rx.try_iter()) {
                        match t {
                            Tell::Reset(done) => {
                                if resets.is_empty() {
                                    order.push(None);
                                }
                                resets.push(done);
                            }
                            Tell::Ua(asc) => order.push(Some(asc)),
                        }
                    }
                    for told in order {
                        // The others apply it before they acknowledge: once the notification
                        // returns, their sessions hold the unit attention, and a reset's tasks
                        // there have ended.
                        let (what, timeout) = match told {
                            None => ("reset".to_string(), RESET_NOTIFY_TIMEOUT_MS),
                            Some(asc) => (format!("ua {:04x}", asc.0), 2000),
                        };
                        if let Err(e) = self.notify(&what, timeout) {
                            warn!(object = %self.oid, "telling the other gateways ({what}): {e}");
                        }
                        if told.is_none() {
                            for done in resets.drain(..) {
                                let _ = done.send(());
                            }
                        }
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
            if self.unit().is_none() {
                return;
            }
            self.probe(false);
            // A gateway that missed a reservation change (it answered late) has it within a probe.
            if let Some(lu) = self.unit() {
                self.load_reservations(&lu);
            }
            self.check_fenced();
            if !self.store.fenced() {
                self.check_owner(started);
            }
            next_probe = Instant::now() + self.cfg.probe_interval;
        }
    }
}

/// How large the shared reservation state may grow (a registration is one line of ~300 bytes).
const PR_MAX_BYTES: usize = 1 << 20;

/// How long one PERSISTENT RESERVE OUT waits for another gateway's to end.
const PR_TURN_WAIT: Duration = Duration::from_secs(10);

/// How long a gateway's turn lasts at most if it dies holding it.
const PR_TURN_HOLD: Duration = Duration::from_secs(15);

/// The unit's persistent reservations, kept in a RADOS object beside the image: one PERSISTENT
/// RESERVE OUT at a time over the gateways (the object's exclusive lock), the state read fresh
/// under it, written, and every other gateway told (it reads the object before it answers)
/// before the turn ends.
#[derive(Debug)]
struct SharedPr(Weak<Inner>);

impl crate::lu::SharedReservations for SharedPr {
    fn update(&self, f: &mut dyn FnMut(Option<&str>) -> Option<String>) -> io::Result<()> {
        let inner = self.0.upgrade().ok_or_else(|| io::Error::other("the gateway coordination has stopped"))?;
        let oid = inner.pr_oid();
        let cookie = format!("{}-{:?}", inner.me, std::thread::current().id());
        let started = Instant::now();
        loop {
            match inner.ioctx.lock_exclusive(&oid, "riser-pr", &cookie, PR_TURN_HOLD) {
                Ok(()) => break,
                Err(e) if e.errno() == Some(-riser_rbd::EBUSY) && started.elapsed() < PR_TURN_WAIT => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(super::to_io(e)),
            }
        }
        let result = (|| {
            let text = inner.ioctx.read(&oid, PR_MAX_BYTES).map_err(super::to_io)?.map(|b| String::from_utf8_lossy(&b).into_owned());
            if let Some(next) = f(text.as_deref()) {
                if next.len() > PR_MAX_BYTES {
                    return Err(io::Error::new(io::ErrorKind::OutOfMemory, "the reservation state outgrows its object"));
                }
                inner.ioctx.write_full(&oid, next.as_bytes()).map_err(super::to_io)?;
                inner.notify("pr", 2000)?;
            }
            Ok(())
        })();
        let _ = inner.ioctx.unlock(&oid, "riser-pr", &cookie);
        result
    }
}

impl Gateway {
    /// Coordinate `unit` (over `store`) with the other gateways of its image: watch the image's
    /// coordination object, learn who is alive and optimized (one ping, answered before this
    /// returns), tell the others of this unit's resets and unit attentions, and take the unit
    /// over when the optimized gateway is dead. The unit's target port groups must be set
    /// first ([`LogicalUnit::set_port_groups`]), `cfg.group` among them.
    pub fn start(store: &Arc<RbdStore>, unit: &Arc<LogicalUnit>, cfg: GatewayConfig) -> io::Result<Self> {
        if !unit.port_groups().iter().any(|g| g.id == cfg.group) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("target port group {} is not the unit's", cfg.group)));
        }
        let cluster = store.cluster();
        let ioctx = store.ioctx().clone();
        let oid = format!("riser.gw.{}", store.image().id().map_err(super::to_io)?);
        // The object the gateways watch (its content is not used: a watch needs an object).
        ioctx.write_full(&oid, b"").map_err(super::to_io)?;
        let (tx, rx) = mpsc::channel();
        let inner = Arc::new(Inner {
            cfg,
            store: store.clone(),
            unit: Arc::downgrade(unit),
            ioctx: ioctx.clone(),
            oid: oid.clone(),
            me: cluster.instance_id(),
            my_addr: cluster.blocklist_address().map_err(super::to_io)?,
            peers: Mutex::default(),
            agreed: Mutex::default(),
            takeovers: Mutex::default(),
            stop: AtomicBool::new(false),
            fenced_reported: AtomicBool::new(false),
        });
        let weak = Arc::downgrade(&inner);
        let watch = ioctx
            .watch_acking_later(&oid, 0, move |n, ack| match weak.upgrade() {
                Some(i) => i.on_notify(n, ack),
                None => ack.ack(&[]),
            })
            .map_err(super::to_io)?;
        inner.probe(true);
        // The reservations the gateways share: a gateway that starts alone starts the unit
        // afresh (a power-on: only APTPL state survives it); one that joins others takes theirs.
        let alone = inner.peers.lock().unwrap_or_else(|e| e.into_inner()).is_empty();
        let pr_oid = inner.pr_oid();
        let shared = ioctx.read(&pr_oid, PR_MAX_BYTES).map_err(super::to_io)?.map(|b| String::from_utf8_lossy(&b).into_owned());
        match shared {
            Some(text) => {
                unit.load_shared_reservations(Some(&text))
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{pr_oid}: {e}")))?;
                if alone && !text.lines().any(|l| l == "aptpl 1") {
                    unit.load_shared_reservations(None).map_err(io::Error::other)?;
                    ioctx.write_full(&pr_oid, unit.shared_reservations_text().as_bytes()).map_err(super::to_io)?;
                }
            }
            None => ioctx.write_full(&pr_oid, unit.shared_reservations_text().as_bytes()).map_err(super::to_io)?,
        }
        unit.set_events(Arc::new(Teller(Mutex::new(tx))));
        unit.set_shared_reservations(Arc::new(SharedPr(Arc::downgrade(&inner))));
        unit.set_gateways(true);
        let i = inner.clone();
        let thread = std::thread::Builder::new().name("riser-rbd-gateway".into()).spawn(move || i.run(&rx))?;
        info!(unit = %unit.identity(), object = %oid, group = inner.cfg.group, optimized = ?inner.optimized(), "coordinating with the image's other gateways");
        Ok(Self { inner, watch: Some(watch), thread: Some(thread) })
    }

    /// What this gateway knows now.
    pub fn status(&self) -> GatewayStatus {
        let peers = self.inner.peers.lock().unwrap_or_else(|e| e.into_inner());
        GatewayStatus {
            group: self.inner.cfg.group,
            optimized: self.inner.optimized(),
            peers: peers.values().map(|p| (p.group, p.addr.clone(), p.seen.elapsed().as_secs())).collect(),
            takeovers: *self.inner.takeovers.lock().unwrap_or_else(|e| e.into_inner()),
            fenced: self.inner.store.fenced(),
        }
    }

    /// The unit's optimized group as the gateways last agreed it (a takeover, another
    /// gateway's announcement), set again after the configuration set the unit's groups afresh:
    /// a takeover outlives a reload.
    pub fn reassert(&self) {
        let agreed = *self.inner.agreed.lock().unwrap_or_else(|e| e.into_inner());
        if let (Some(g), Some(lu)) = (agreed, self.inner.unit()) {
            let _ = lu.set_optimized(g);
        }
        if self.inner.store.fenced()
            && let Some(lu) = self.inner.unit()
        {
            let _ = lu.set_access_state(self.inner.cfg.group, AccessState::Unavailable);
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        if let Some(lu) = self.inner.unit() {
            lu.set_gateways(false);
        }
        // The watch first: from here no callback runs, and the others see this gateway gone.
        drop(self.watch.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
