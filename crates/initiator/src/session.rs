//! The session driver: [`Session`] runs an [`InitiatorSession`] over a datamover.
//!
//! The machine makes the protocol's decisions — CmdSN inside the target's window, task tags,
//! ExpStatSN, what each PDU from the target means for which task, which commands a task
//! management function ended, the answers to the target's pings. This driver holds it in the
//! shared state (a std mutex, never held across an await) next to what is I/O: the
//! connection's datamover, the callers waiting for their tasks (by task tag), timeouts and
//! reconnection (a fresh machine after each login).
//!
//! After every call into the machine the driver pumps it ([`Inner::pump`]): the events wake
//! the callers they concern, and the PDUs it queued go to Send_Control in order (one pump
//! sends at a time). SCSI commands are the exception: the machine numbers them and the driver
//! hands each to the datamover with its buffers (`send_command`).

use crate::login::{login, resolve};
use crate::{CommandResult, Connector, Error, SessionConfig};
use bytes::Bytes;
use hashbrown::HashMap;
use riser_datamover::{Attempt, ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::login::{InitiatorLoginConfig, LoginOutcome};
use riser_iscsi::session::{Busy, InitiatorEvent, InitiatorSession, Residual};
use riser_iscsi::wire::{AsyncEvent, Header, RejectReason, ScsiCommand, TmfFunction, TmfResponse, extended_cdb_ahs};
use riser_scsi::lun::Lun;
use riser_scsi::sense::{Sense, SenseKey, Status};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::net::ToSocketAddrs;
use tokio::sync::{Notify, oneshot};

/// What the caller of a task is woken with.
#[derive(Debug)]
enum Reply {
    Scsi(CommandResult),
    Aborted,
    Rejected(RejectReason),
    Pong,
    TaskManagement(TmfResponse),
    LoggedOut,
    /// No answer within the session's timeout (the reaper gave up on it).
    TimedOut,
}

/// A caller waiting for its task, and the reaper tick its request was registered at (or its
/// abort sent at).
struct Waiter {
    tx: oneshot::Sender<Reply>,
    tick: u32,
    /// A SCSI command's LUN: one given up on is aborted before its caller hears of it.
    lun: Option<Lun>,
    /// Its time is up and an ABORT TASK for it is on its way (see [`Session::abort_reaped`]):
    /// its caller gets [`Error::Timeout`] once the target has ended it.
    aborting: bool,
}

/// Reaper ticks per timeout: a request with no answer is given up between one timeout and
/// `1 + 1/REAPER_TICKS` timeouts after it was registered.
const REAPER_TICKS: u32 = 4;

/// How often an abort waiting for room for an immediate request looks again.
const ROOM_RECHECK: Duration = Duration::from_millis(20);

/// Who holds the send gate (see [`Inner::gate_open`]).
#[derive(Debug, Default)]
struct Gate {
    /// Commands between their numbering and the end of their send.
    shared: u32,
    /// A task management request (or a requested logout) holds it alone.
    exclusive: bool,
    /// Exclusive holders waiting: new commands wait behind them.
    exclusive_waiting: u32,
}

/// A connection as a request saw it: its datamover, and its generation (which says whether
/// the machine in [`State`] is still the one that numbered the request).
#[derive(Clone)]
struct Link {
    dm: SharedDatamover,
    generation: u32,
}

struct State {
    /// The connection's session machine.
    session: InitiatorSession,
    /// The connection it runs on.
    link: Link,
    /// The callers waiting for their tasks, by task tag.
    pending: HashMap<u32, Waiter>,
    /// The reaper's clock: ticks [`REAPER_TICKS`] times per timeout.
    tick: u32,
    /// The send gate: it outlives the connection (a holder may span a reconnection).
    gate: Gate,
    /// The connection is gone (its receiver ended): the next request logs in again.
    dead: bool,
    /// Logged out: no reconnection.
    closed: bool,
}

impl State {
    /// The state a completed login on `link` leaves us with.
    fn after_login(o: &LoginOutcome, link: Link, gate: Gate) -> Self {
        let mut session = InitiatorSession::new(o);
        // The transport's bound on commands outstanding (iSER: its posted receives), below
        // the window: beyond it an answer would find no receive and end the connection.
        session.set_task_limit(link.dm.max_outstanding_commands());
        Self { session, link, pending: HashMap::new(), tick: 0, gate, dead: false, closed: false }
    }

    /// Register the caller of task `itt` (a SCSI command's on `lun`).
    fn wait_for(&mut self, itt: u32, lun: Option<Lun>) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        self.pending.insert(itt, Waiter { tx, tick: self.tick, lun, aborting: false });
        rx
    }
}

struct Inner {
    connector: Arc<dyn Connector>,
    addr: std::net::SocketAddr,
    login: InitiatorLoginConfig,
    reconnecting: tokio::sync::Mutex<()>,
    params: NegotiatedParams,
    state: Mutex<State>,
    /// Notified when the CmdSN window opens or the connection is lost.
    window: Notify,
    timeout: Duration,
    /// The send gate ([`State::gate`]) opened. Commands hold the gate (shared) from their
    /// numbering to the end of their send, a task management request (exclusively) while it
    /// is numbered and sent: so the commands the machine counts as its victims (those numbered
    /// before it) are on their way before it, and none numbered after it can overtake it.
    /// (Ending a command the target goes on with would revoke memory it is about to access.)
    /// It lives in the state the machine does, so a command takes one lock to pass it and
    /// be numbered.
    gate_open: Notify,
    /// One pump sends at a time, so the machine's PDUs leave in the order it queued them.
    send_order: tokio::sync::Mutex<()>,
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

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The residual as [`CommandResult::residual`] carries it.
fn residual_pair(r: Residual) -> Option<(bool, u32)> {
    match r {
        Residual::None => None,
        Residual::Underflow(n) => Some((true, n)),
        Residual::Overflow(n) => Some((false, n)),
    }
}

impl Inner {
    /// After a call into the machine on `link`: wake the callers its events concern, then send
    /// what it queued, in order. Fails if the connection failed (or was replaced).
    async fn pump(&self, link: &Link) -> Result<(), Error> {
        self.deliver(link);
        self.send_queued(link).await
    }

    /// [`pump`](Self::pump) for the receive loop, which waits for no one's PDUs but those it
    /// made the machine queue: with nothing queued (the common case, a command's answer) it
    /// does not wait for a send in progress.
    async fn pump_received(&self, link: &Link) -> Result<(), Error> {
        self.deliver(link);
        {
            let s = lock(&self.state);
            if s.link.generation != link.generation {
                return Err(Error::ConnectionLost);
            }
            if !s.session.has_transmit() {
                return Ok(());
            }
        }
        self.send_queued(link).await
    }

    /// Send what the machine queued, in order; when it returns, everything queued before the
    /// call has left (or the connection failed).
    async fn send_queued(&self, link: &Link) -> Result<(), Error> {
        let _order = self.send_order.lock().await;
        loop {
            let next = {
                let mut s = lock(&self.state);
                if s.link.generation != link.generation {
                    return Err(Error::ConnectionLost);
                }
                s.session.poll_transmit()
            };
            let Some(t) = next else { return Ok(()) };
            link.dm.send_control(ControlPdu::new(t.header, t.data)).await.map_err(|_| Error::ConnectionLost)?;
        }
    }

    /// Hand each of the machine's events to the caller it concerns.
    fn deliver(&self, link: &Link) {
        let dm = &link.dm;
        loop {
            let (event, caller) = {
                let mut s = lock(&self.state);
                if s.link.generation != link.generation {
                    return;
                }
                let Some(e) = s.session.poll_event() else { return };
                let waiter = e.itt().and_then(|i| s.pending.remove(&i));
                (e, waiter)
            };
            let reply = match event {
                InitiatorEvent::CommandDone { itt, status, sense, residual } => {
                    // Cut to what the target sent before freezing: slicing a frozen vector
                    // would allocate to share it.
                    let data = dm
                        .take_read_data(itt)
                        .map(|mut b| {
                            b.truncate(residual.keep(b.len()));
                            b.freeze()
                        })
                        .unwrap_or_default();
                    Reply::Scsi(CommandResult { status, sense, data, residual: residual_pair(residual) })
                }
                InitiatorEvent::Aborted { itt } => {
                    // No response will come: release the buffers (registrations on iSER) here.
                    let _ = dm.take_read_data(itt);
                    dm.deallocate_task_resources(itt);
                    // Ended by the abort of a command whose time was up: its caller hears that.
                    if caller.as_ref().is_some_and(|w| w.aborting) { Reply::TimedOut } else { Reply::Aborted }
                }
                InitiatorEvent::Pong { .. } => Reply::Pong,
                InitiatorEvent::TaskManagementDone { response, .. } => Reply::TaskManagement(response),
                InitiatorEvent::LoggedOut { .. } => Reply::LoggedOut,
                InitiatorEvent::Rejected { itt, reason } => {
                    // A rejected command's buffers are the datamover's until taken back.
                    let _ = dm.take_read_data(itt);
                    Reply::Rejected(reason)
                }
                InitiatorEvent::WindowOpen => {
                    self.window.notify_waiters();
                    continue;
                }
                InitiatorEvent::Unexpected(Header::AsyncMessage(a)) => {
                    tracing::info!(event = a.event.0, "asynchronous message from the target");
                    continue;
                }
                InitiatorEvent::Unexpected(h) => {
                    tracing::warn!(opcode = ?h.opcode(), itt = h.itt(), "unexpected PDU from the target");
                    continue;
                }
                other => {
                    tracing::debug!(?other, "session event without a caller");
                    continue;
                }
            };
            if let Some(w) = caller {
                let _ = w.tx.send(reply);
            }
        }
    }
}

impl Session {
    /// Connect and log in.
    pub async fn connect(addr: impl ToSocketAddrs, cfg: SessionConfig) -> Result<Self, Error> {
        let addr = resolve(addr).await?;
        let (dm, o) = login(&*cfg.connector, addr, cfg.login.clone()).await?;
        let link = Link { dm, generation: 0 };
        let inner = Arc::new(Inner {
            connector: cfg.connector,
            addr,
            login: cfg.login,
            reconnecting: tokio::sync::Mutex::new(()),
            params: o.params.clone(),
            state: Mutex::new(State::after_login(&o, link.clone(), Gate::default())),
            window: Notify::new(),
            timeout: cfg.timeout,
            gate_open: Notify::new(),
            send_order: tokio::sync::Mutex::new(()),
        });
        tokio::spawn(Self::reaper(inner.clone(), link.generation));
        tokio::spawn(Self::receiver(inner.clone(), link));
        Ok(Self { inner })
    }

    /// The current connection's datamover.
    pub(crate) fn dm(&self) -> SharedDatamover {
        lock(&self.inner.state).link.dm.clone()
    }

    fn is_closed(&self) -> bool {
        lock(&self.inner.state).closed
    }

    /// End the current connection (if the receiver has not noticed its loss yet) and log in
    /// again.
    async fn force_reconnect(&self) -> Result<(), Error> {
        self.dm().terminate();
        for _ in 0..200 {
            if lock(&self.inner.state).dead {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.reconnect().await
    }

    /// The generation of the current connection: it goes up by one at every login again
    /// (each a session reinstatement: same ISID, TSIH 0).
    pub(crate) fn generation(&self) -> u32 {
        lock(&self.inner.state).link.generation
    }

    /// End the current connection (whatever its state) and log in again with the same ISID, so
    /// the target reinstates the session and ends the old connection's tasks. `Ok` means a login
    /// that began after this call did complete (ours, or a concurrent command's).
    pub(crate) async fn reinstate(&self) -> Result<(), Error> {
        self.dm().terminate();
        let until = Instant::now() + Duration::from_secs(5);
        while !lock(&self.inner.state).dead {
            if Instant::now() >= until {
                return Err(Error::Timeout);
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.reconnect().await
    }

    /// End the current connection abruptly, as a network failure would (for fault testing and
    /// soak runs): the commands in flight fail with [`Error::ConnectionLost`] (or are retried
    /// once, see [`Session::command`]) and the session logs in again at its next command.
    pub fn drop_connection(&self) {
        self.dm().terminate();
    }

    /// Log in again after a connection loss: a leading login with the same ISID and TSIH 0,
    /// which makes the target reinstate the session (ERL 0). Commands that were in flight have
    /// failed with [`Error::ConnectionLost`].
    pub async fn reconnect(&self) -> Result<(), Error> {
        let _one = self.inner.reconnecting.lock().await;
        if !lock(&self.inner.state).dead {
            return Ok(());
        }
        let (dm, o) = login(&*self.inner.connector, self.inner.addr, self.inner.login.clone()).await?;
        let link = {
            let mut s = lock(&self.inner.state);
            let link = Link { dm, generation: s.link.generation.wrapping_add(1) };
            let gate = std::mem::take(&mut s.gate);
            *s = State::after_login(&o, link.clone(), gate);
            link
        };
        tokio::spawn(Self::reaper(self.inner.clone(), link.generation));
        tokio::spawn(Self::receiver(self.inner.clone(), link));
        tracing::info!("session reinstated after a connection loss");
        Ok(())
    }

    /// The negotiated parameters.
    pub fn params(&self) -> &NegotiatedParams {
        &self.inner.params
    }

    /// Feed the connection's PDUs to the machine until the connection ends; then fail the
    /// callers still waiting (unless a newer connection has replaced this one).
    async fn receiver(inner: Arc<Inner>, link: Link) {
        // The target's request to log out is acted on once per connection: a target repeating
        // it (while the logout waits for the commands in flight) started a task each time.
        let mut logout_asked = false;
        loop {
            // What has arrived is taken without a future; only waiting for more takes one.
            let event = match link.dm.try_next_event() {
                Some(e) => e,
                None => link.dm.next_event().await,
            };
            match event {
                DmEvent::Control(p) => {
                    {
                        let mut s = lock(&inner.state);
                        if s.link.generation != link.generation {
                            break;
                        }
                        s.session.handle_pdu(&p.header, p.data);
                    }
                    if let Header::AsyncMessage(a) = p.header
                        && a.event == AsyncEvent::REQUEST_LOGOUT
                        && !std::mem::replace(&mut logout_asked, true)
                    {
                        let within = Duration::from_secs(u64::from(a.param3));
                        tracing::info!(?within, "the target asks for a logout: logging out, and in again at the next command");
                        let me = Self { inner: inner.clone() };
                        let link = link.clone();
                        tokio::spawn(async move { me.logout_on_request(link, within).await });
                    }
                    // Answers to the target's pings, text continuations; the callers' wake-ups.
                    if let Err(e) = inner.pump_received(&link).await {
                        tracing::debug!(%e, "the connection failed while answering the target");
                    }
                }
                DmEvent::Malformed { bhs, error } => {
                    // An initiator does not reject the target's PDUs: the connection ends
                    // (its tasks fail, and a command is retried once on a new one).
                    tracing::warn!(?error, opcode = bhs[0] & 0x3f, "malformed PDU from the target: dropping the connection");
                    link.dm.terminate();
                }
                DmEvent::Terminated(_) => break,
                _ => {}
            }
        }
        let mut s = lock(&inner.state);
        if s.link.generation == link.generation {
            s.dead = true;
            s.pending.clear();
            drop(s);
            inner.window.notify_waiters();
        }
    }

    /// Number a SCSI command inside the target's window (waiting for it to open), register
    /// its caller, and hold the send gate (shared) for its send.
    async fn start_command(
        &self,
        lun: Lun,
        cdb: &[u8],
        read_len: u32,
        write_len: u32,
    ) -> Result<(ScsiCommand, Link, oneshot::Receiver<Reply>, SharedGate<'_>), Error> {
        loop {
            let notified = self.inner.window.notified();
            let gate_open = self.inner.gate_open.notified();
            // Decide under the lock; await only after it is released.
            let (dead, gated) = {
                let mut s = lock(&self.inner.state);
                if s.closed {
                    return Err(Error::ConnectionLost);
                }
                if s.gate.exclusive || s.gate.exclusive_waiting > 0 {
                    (false, true)
                } else {
                    if !s.dead {
                        match s.session.start_command(lun, cdb, read_len, write_len) {
                            Ok(cmd) => {
                                let rx = s.wait_for(cmd.itt, Some(lun));
                                s.gate.shared += 1;
                                return Ok((cmd, s.link.clone(), rx, SharedGate(&self.inner)));
                            }
                            Err(Busy::WindowClosed | Busy::TaskLimit) => {}
                        }
                    }
                    (s.dead, false)
                }
            };
            if gated {
                // A task management request has the gate, or waits for it.
                gate_open.await;
                continue;
            }
            // Not holding the gate while waiting: a task management function may be what
            // frees the window.
            if dead {
                self.reconnect().await?;
                continue;
            }
            tokio::time::timeout(self.inner.timeout, notified).await.map_err(|_| Error::Timeout)?;
        }
    }

    /// Start an immediate request (outside the window) with `start` on the machine of the
    /// live connection (logging in again first if it is gone) and register its caller.
    async fn start_immediate(
        &self,
        mut start: impl FnMut(&mut InitiatorSession) -> u32,
        closing: bool,
    ) -> Result<(u32, Link, oneshot::Receiver<Reply>), Error> {
        loop {
            let notified = self.inner.window.notified();
            let full = {
                let mut s = lock(&self.inner.state);
                if s.closed {
                    return Err(Error::ConnectionLost);
                }
                if !s.dead && s.session.immediate_room() {
                    let itt = start(&mut s.session);
                    // A session logging out sends no new command after its Logout Request (as
                    // Linux's initiator in its LOGGING_OUT state): they fail at once instead.
                    s.closed |= closing;
                    let rx = s.wait_for(itt, None);
                    return Ok((itt, s.link.clone(), rx));
                }
                !s.dead
            };
            if full {
                // As many requests outstanding as the transport takes answers for (iSER's
                // receives): wait for one to end.
                tokio::time::timeout(self.inner.timeout, notified).await.map_err(|_| Error::Timeout)?;
                continue;
            }
            self.reconnect().await?;
        }
    }

    /// Send what the machine queued for request `itt`; if that fails, the request is given up.
    async fn send_request(&self, itt: u32, link: &Link) -> Result<(), Error> {
        let sent = self.inner.pump(link).await;
        if sent.is_err() {
            // A request not sent may leave a CmdSN gap behind it: the connection is done.
            link.dm.terminate();
            self.forget(itt, link);
        }
        sent
    }

    /// The caller of task `itt` gives up (not sent, or no answer in time): the machine forgets
    /// it and the datamover gives back its buffers.
    fn forget(&self, itt: u32, link: &Link) {
        {
            let mut s = lock(&self.inner.state);
            // A newer connection's machine numbers its tags afresh: its waiters are not ours.
            if s.link.generation == link.generation {
                s.pending.remove(&itt);
                s.session.forget(itt);
            }
        }
        // Room under the task limit, if it was reached (see the reaper).
        self.inner.window.notify_waiters();
        let _ = link.dm.take_read_data(itt);
    }

    /// The answer to a request; [`Error::Timeout`] once the reaper has given up on it.
    async fn wait(rx: oneshot::Receiver<Reply>) -> Result<Reply, Error> {
        match rx.await {
            Ok(Reply::TimedOut) => Err(Error::Timeout),
            Ok(r) => Ok(r),
            Err(_) => Err(Error::ConnectionLost),
        }
    }

    /// Give up on the requests of connection `generation` that have waited a whole timeout.
    /// A SCSI command is aborted first ([`abort_reaped`](Self::abort_reaped)): it keeps its
    /// place in the machine and its buffers (on iSER, the memory the target may still write)
    /// until the target has ended it, so nothing it carried lands after its caller was told,
    /// and its answer, should it come meanwhile, still finds it. Any other request is
    /// forgotten at once, its caller told [`Error::Timeout`]. One timer per connection
    /// instead of one per request. Ends with the connection.
    async fn reaper(inner: Arc<Inner>, generation: u32) {
        let period = (inner.timeout / REAPER_TICKS).max(Duration::from_millis(1));
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut expired, mut aborts) = (Vec::new(), Vec::new());
        loop {
            every.tick().await;
            let (dm, unanswered) = {
                let mut s = lock(&inner.state);
                if s.link.generation != generation || s.dead {
                    return;
                }
                s.tick = s.tick.wrapping_add(1);
                let now = s.tick;
                let mut unanswered = false;
                let State { pending, session, .. } = &mut *s;
                expired.extend(pending.extract_if(|itt, w| {
                    if now.wrapping_sub(w.tick) <= REAPER_TICKS {
                        return false;
                    }
                    match w.lun {
                        // Answered already (the machine has ended it), its answer not yet
                        // delivered: it is not ours to give up.
                        Some(_) if !session.has_task(*itt) => {}
                        Some(lun) if !w.aborting => {
                            (w.aborting, w.tick) = (true, now);
                            aborts.push((*itt, lun));
                        }
                        // Aborted a whole timeout ago and still there: the abort went
                        // unanswered too (its own request, reaped as long, ends the
                        // connection as well).
                        Some(_) => unanswered = true,
                        None => return true,
                    }
                    false
                }));
                for (itt, _) in &expired {
                    s.session.forget(*itt);
                }
                (s.link.dm.clone(), unanswered)
            };
            if unanswered {
                tracing::warn!("an aborted command is still unanswered: dropping the connection");
                dm.terminate();
            }
            if !expired.is_empty() {
                // Forgotten tasks make room under the task limit: requests waiting for it may
                // go (the machine's WindowOpen would wait for the next PDU to be delivered).
                inner.window.notify_waiters();
            }
            for (itt, w) in expired.drain(..) {
                let _ = dm.take_read_data(itt);
                let _ = w.tx.send(Reply::TimedOut);
            }
            for (itt, lun) in aborts.drain(..) {
                let me = Self { inner: inner.clone() };
                tokio::spawn(async move { me.abort_reaped(itt, lun, generation).await });
            }
        }
    }

    /// Abort command `itt` on `lun` of connection `generation`, whose time is up (RFC 7143
    /// §11.5.1, as an initiator's error handling does before it reports a command failed). The
    /// target answers only once the task is over. Function complete: the machine ends the
    /// command (its caller gets [`Error::Timeout`], see [`Inner::deliver`]). Task does not
    /// exist: the target holds no such task, and its answer, which would have come before
    /// this one, never will: the command is given up here. Any other outcome (refused,
    /// unanswered, not sent) leaves the task's fate unknown: the connection is dropped, which
    /// fails every command on it, and the next login reinstates the session, ending the old
    /// connection's tasks at the target (§6.3.5).
    async fn abort_reaped(&self, itt: u32, lun: Lun, generation: u32) {
        // Whether the command still waits for its abort on its connection (answered meanwhile,
        // perhaps not yet delivered, or gone with its connection or a logout: nothing to do).
        let waiting = |s: &State| {
            s.link.generation == generation
                && !s.dead
                && !s.closed
                && s.session.has_task(itt)
                && s.pending.get(&itt).is_some_and(|w| w.aborting)
        };
        // Room for one more immediate request: as many are outstanding as the transport takes
        // answers for (several commands given up at once while the target's store stalls, each
        // abort answered only once its command's I/O is over). Waited for, a timeout at most.
        let deadline = tokio::time::Instant::now() + self.inner.timeout;
        let started = loop {
            let notified = self.inner.window.notified();
            let room = {
                let s = lock(&self.inner.state);
                if !waiting(&s) {
                    return;
                }
                s.session.immediate_room()
            };
            if room {
                let gate = self.exclusive_gate().await;
                let mut s = lock(&self.inner.state);
                if !waiting(&s) {
                    return;
                }
                if s.session.immediate_room() {
                    let tmf = s.session.task_management(TmfFunction::ABORT_TASK, lun, itt);
                    // The command's second timeout runs from here, as the abort's own does.
                    let tick = s.tick;
                    if let Some(w) = s.pending.get_mut(&itt) {
                        w.tick = tick;
                    }
                    break Some((tmf, s.wait_for(tmf, None), s.link.clone(), gate));
                }
                continue;
            }
            // Woken when a task ends at the task limit; else looked at again shortly (room for
            // immediate requests may come back without the limit's event).
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break None;
            }
            let _ = tokio::time::timeout_at(deadline.min(now + ROOM_RECHECK), notified).await;
        };
        let answer = match started {
            Some((tmf, rx, link, gate)) => {
                let sent = self.send_request(tmf, &link).await;
                drop(gate);
                match sent {
                    Ok(()) => Self::wait(rx).await,
                    Err(e) => Err(e),
                }
            }
            None => Err(Error::Protocol("no room for the abort within the timeout".into())),
        };
        let (link, waiter) = {
            let mut s = lock(&self.inner.state);
            if s.link.generation != generation || !s.session.has_task(itt) || !s.pending.get(&itt).is_some_and(|w| w.aborting) {
                // Ended by the abort (or answered before it), or gone with its connection.
                return;
            }
            let waiter = matches!(answer, Ok(Reply::TaskManagement(TmfResponse::TASK_DOES_NOT_EXIST))).then(|| s.pending.remove(&itt));
            (s.link.clone(), waiter.flatten())
        };
        // Task does not exist: the target holds none, and its answer never comes. Given up here.
        if let Some(w) = waiter {
            self.forget(itt, &link);
            let _ = w.tx.send(Reply::TimedOut);
            return;
        }
        tracing::warn!(itt, ?answer, "a command whose time is up could not be aborted: dropping the connection");
        link.dm.terminate();
    }

    /// Take the send gate alone (waiting for the commands being sent to be on their way);
    /// commands that come meanwhile wait behind.
    async fn exclusive_gate(&self) -> ExclusiveGate<'_> {
        let mut waiting = None;
        loop {
            let opened = self.inner.gate_open.notified();
            {
                let mut s = lock(&self.inner.state);
                if !s.gate.exclusive && s.gate.shared == 0 {
                    s.gate.exclusive = true;
                    drop(s);
                    // Registered as waiting no longer (the drop takes the lock again).
                    drop(waiting);
                    return ExclusiveGate(&self.inner);
                }
                if waiting.is_none() {
                    s.gate.exclusive_waiting += 1;
                    waiting = Some(WaitingExclusive(&self.inner));
                }
            }
            opened.await;
        }
    }

    /// Submit a CDB to `lun` with optional write data, expecting up to `read_len` bytes back.
    /// A UNIT ATTENTION (power on, reset, parameters changed…) is reported once by targets and
    /// then cleared; the command is retried after it, as Linux's SCSI layer does.
    pub async fn command(&self, lun: Lun, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, Error> {
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
                && r.sense.as_deref().and_then(|s| Sense::parse(s).ok()).is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION);
            tries += 1;
            if !ua || tries > 4 {
                return Ok(r);
            }
            tracing::debug!("unit attention, retrying");
        }
    }

    /// As [`command`](Self::command), once: a UNIT ATTENTION comes back as the command's result
    /// and a lost connection as [`Error::ConnectionLost`] (for callers that must see them, such
    /// as tests of what a target reports).
    pub async fn command_once(&self, lun: Lun, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<CommandResult, Error> {
        self.command_on_link(lun, cdb, write, read_len, &mut |_| {}).await
    }

    /// As [`command_once`](Self::command_once), calling `numbered` with the generation of the
    /// connection the command is numbered on, just before it is sent (not at all if it never
    /// is): multipath needs it to know whether a later login (a session reinstatement, which
    /// ends the old connection's tasks at the target) has happened since.
    pub(crate) async fn command_on_link(
        &self,
        lun: Lun,
        cdb: &[u8],
        write: Option<Bytes>,
        read_len: u32,
        numbered: &mut (dyn FnMut(u32) + Send),
    ) -> Result<CommandResult, Error> {
        let write_len = write.as_ref().map_or(0, |w| w.len() as u32);
        let mut ahs = Vec::new();
        if cdb.len() > 16 {
            extended_cdb_ahs(&mut ahs, &cdb[16..]);
        }
        let (cmd, link, rx, gate) = self.start_command(lun, cdb, read_len, write_len).await?;
        numbered(link.generation);
        let sent = match link.dm.try_send_command(cmd, ahs.into(), read_len, write) {
            Attempt::Done(r) => r,
            Attempt::WouldWait(a) => link.dm.send_command(a.cmd, a.ahs, a.read_len, a.write).await,
        };
        if let Err(e) = sent {
            tracing::debug!(itt = cmd.itt, %e, "command not sent");
            // Its CmdSN is taken and the target would wait for it (ExpCmdSN stuck, task-set
            // functions unanswered): this connection is done, whatever the datamover's reason.
            link.dm.terminate();
            self.forget(cmd.itt, &link);
            return Err(Error::ConnectionLost);
        }
        drop(gate);
        match Self::wait(rx).await? {
            Reply::Scsi(r) => Ok(r),
            Reply::Aborted => Err(Error::Aborted),
            Reply::Rejected(r) => Err(Error::Rejected(r)),
            other => Err(Error::Protocol(format!("unexpected answer to a command: {other:?}"))),
        }
    }

    /// A task management function; `ref_itt` names the task for ABORT TASK (its RefCmdSN is
    /// that command's CmdSN). The commands it ends fail with [`Error::Aborted`].
    pub async fn task_management(&self, lun: Lun, function: TmfFunction, ref_itt: u32) -> Result<(), Error> {
        let gate = self.exclusive_gate().await;
        let (itt, link, rx) = self.start_immediate(|m| m.task_management(function, lun, ref_itt), false).await?;
        let sent = self.send_request(itt, &link).await;
        drop(gate);
        sent?;
        match Self::wait(rx).await? {
            Reply::TaskManagement(TmfResponse::COMPLETE) => Ok(()),
            Reply::TaskManagement(r) => Err(Error::TaskManagement(r)),
            Reply::Rejected(r) => Err(Error::Rejected(r)),
            other => Err(Error::Protocol(format!("unexpected answer to a task management request: {other:?}"))),
        }
    }

    /// NOP-Out ping; returns the round-trip time.
    pub async fn ping(&self) -> Result<Duration, Error> {
        let start = Instant::now();
        let (itt, link, rx) = self.start_immediate(|m| m.ping(Bytes::new()), false).await?;
        self.send_request(itt, &link).await?;
        match Self::wait(rx).await? {
            Reply::Pong => Ok(start.elapsed()),
            Reply::Rejected(r) => Err(Error::Rejected(r)),
            other => Err(Error::Protocol(format!("unexpected answer to a NOP-Out: {other:?}"))),
        }
    }

    /// The target asked this connection to log out within `within` (RFC 7143 §11.9.1, AsyncEvent
    /// 1: its gateway is draining, or an operator moved the session). New commands wait, those
    /// in flight end (for at most the time given, less a margin), the connection logs out, and the
    /// session logs in again at its next command — to wherever the address leads now.
    async fn logout_on_request(&self, link: Link, within: Duration) {
        let gate = self.exclusive_gate().await;
        let until = Instant::now() + within.saturating_sub(Duration::from_millis(500));
        loop {
            let busy = {
                let s = lock(&self.inner.state);
                s.link.generation == link.generation && !s.dead && s.session.tasks() > 0
            };
            if !busy || Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // On this connection only (never a fresh login for it).
        let started = {
            let mut s = lock(&self.inner.state);
            (s.link.generation == link.generation && !s.dead).then(|| {
                let itt = s.session.logout();
                (itt, s.wait_for(itt, None))
            })
        };
        if let Some((itt, rx)) = started
            && self.send_request(itt, &link).await.is_ok()
        {
            let _ = Self::wait(rx).await;
        }
        {
            let mut s = lock(&self.inner.state);
            if s.link.generation == link.generation {
                s.dead = true;
                s.pending.clear();
            }
        }
        link.dm.terminate();
        drop(gate);
        self.inner.window.notify_waiters();
    }

    /// Log out (close the session) and drop the connection.
    pub async fn logout(&self) -> Result<(), Error> {
        let (itt, link, rx) = self.start_immediate(|m| m.logout(), true).await?;
        self.send_request(itt, &link).await?;
        let r = Self::wait(rx).await;
        self.dm().terminate();
        match r? {
            Reply::LoggedOut => Ok(()),
            Reply::Rejected(r) => Err(Error::Rejected(r)),
            other => Err(Error::Protocol(format!("unexpected answer to a Logout: {other:?}"))),
        }
    }
}

/// A command's hold on the send gate, from its numbering to the end of its send.
struct SharedGate<'a>(&'a Inner);

impl Drop for SharedGate<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.gate.shared -= 1;
        if s.gate.shared == 0 && s.gate.exclusive_waiting > 0 {
            drop(s);
            self.0.gate_open.notify_waiters();
        }
    }
}

/// A task management request's (or a requested logout's) hold on the send gate.
struct ExclusiveGate<'a>(&'a Inner);

impl Drop for ExclusiveGate<'_> {
    fn drop(&mut self) {
        lock(&self.0.state).gate.exclusive = false;
        self.0.gate_open.notify_waiters();
    }
}

/// An exclusive holder waiting for the gate (counted while it waits, also if it gives up).
struct WaitingExclusive<'a>(&'a Inner);

impl Drop for WaitingExclusive<'_> {
    fn drop(&mut self) {
        let mut s = lock(&self.0.state);
        s.gate.exclusive_waiting -= 1;
        let open = s.gate.exclusive_waiting == 0 && !s.gate.exclusive;
        drop(s);
        if open {
            self.0.gate_open.notify_waiters();
        }
    }
}
