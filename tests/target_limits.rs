//! The target under a faulty or hostile initiator: every resource a peer can claim is bounded,
//! every command is answered, an aborted write never lands after its abort is answered. The
//! initiator here is raw PDUs over a socket (the login done with riser's sans-IO machine), so
//! a test controls exactly what is sent and when the socket is read.

use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginOutcome};
use riser::iscsi::wire::{
    DataOut, Header, Isid, LoginRequest, NopOut, Pdu, R2t, RejectReason, ScsiCommand, ScsiResponse, TaskMgmtRequest, TmfFunction,
    TmfResponse,
};
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, Sense, SenseKey, Status};
use riser::target::backend::{BlockBackend, RamBackend};
use riser::target::lu::LogicalUnit;
use riser::target::server::{Node, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const TARGET: &str = "iqn.2026-11.io.riser:limits";
const ME: &str = "iqn.2026-11.io.riser:limits-tester";
const WAIT: Duration = Duration::from_secs(10);

/// A RAM disk on the blocking pool (not in memory, as a file would be) whose writes can be held
/// at a gate, and which counts reads running at once.
#[derive(Debug)]
struct Gated {
    ram: RamBackend,
    hold: Mutex<bool>,
    moved: Condvar,
    writes_waiting: AtomicUsize,
    writes_done: AtomicUsize,
    reads_now: AtomicUsize,
    reads_max: AtomicUsize,
    read_pause: Duration,
}

impl Gated {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            ram: RamBackend::new(64 << 20, 512),
            hold: Mutex::new(false),
            moved: Condvar::new(),
            writes_waiting: AtomicUsize::new(0),
            writes_done: AtomicUsize::new(0),
            reads_now: AtomicUsize::new(0),
            reads_max: AtomicUsize::new(0),
            read_pause: Duration::from_millis(150),
        })
    }
    fn hold(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.moved.notify_all();
    }
}

impl BlockBackend for Gated {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let now = self.reads_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.reads_max.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.read_pause);
        self.reads_now.fetch_sub(1, Ordering::SeqCst);
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.writes_waiting.fetch_add(1, Ordering::SeqCst);
        let mut held = self.hold.lock().unwrap();
        while *held {
            held = self.moved.wait(held).unwrap();
        }
        drop(held);
        self.writes_waiting.fetch_sub(1, Ordering::SeqCst);
        let r = self.ram.write(offset, buf);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.unmap(offset, len)
    }
    fn is_mapped(&self, offset: u64) -> bool {
        self.ram.is_mapped(offset)
    }
    fn thin(&self) -> bool {
        false
    }
}

async fn start_with(backend: Arc<dyn BlockBackend>, cfg: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    let lu = Arc::new(LogicalUnit::new(backend, Lun::ZERO, 3));
    let n = Node::new(TARGET).lun(lu);
    let mut c = TargetConfig::default().node(n);
    cfg(&mut c);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Target::new(c).serve(l));
    addr
}

async fn start(cfg: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
    start_with(Arc::new(RamBackend::new(64 << 20, 512)), cfg).await
}

/// A logged-in connection driven PDU by PDU.
struct Raw {
    sock: TcpStream,
    o: LoginOutcome,
    cmd_sn: u32,
    /// Statuses of other commands that arrived while waiting for one (any order is right).
    stash: Vec<(ScsiResponse, Vec<u8>)>,
}

async fn write_pdu(sock: &mut TcpStream, h: Header, data: &[u8]) {
    let mut bytes = Vec::new();
    Pdu::new(h, &[][..], data).encode(&mut bytes);
    sock.write_all(&bytes).await.unwrap();
}

async fn read_pdu(sock: &mut TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut bhs = [0u8; 48];
    sock.read_exact(&mut bhs).await.ok()?;
    let dsl = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
    let mut rest = vec![0u8; bhs[4] as usize * 4 + dsl.div_ceil(4) * 4];
    sock.read_exact(&mut rest).await.ok()?;
    let mut all = bhs.to_vec();
    all.extend_from_slice(&rest);
    let (p, _) = Pdu::parse(&all).ok()?;
    Some((p.header, p.data.to_vec()))
}

impl Raw {
    async fn login(addr: SocketAddr, op: OperationalConfig, isid: [u8; 6]) -> Self {
        let mut sock = TcpStream::connect(addr).await.unwrap();
        let mut cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), Isid(isid));
        cfg.operational = op;
        let mut l = InitiatorLogin::new(cfg, Duration::ZERO, [5; 32]);
        loop {
            while let Some(p) = l.poll_transmit() {
                write_pdu(&mut sock, Header::LoginRequest(p.header), &p.data).await;
            }
            if let Some(InitiatorLoginEvent::Complete(o)) = l.poll_event() {
                return Self { sock, cmd_sn: o.exp_cmd_sn, o, stash: Vec::new() };
            }
            let (h, d) = tokio::time::timeout(WAIT, read_pdu(&mut sock)).await.unwrap().expect("login answer");
            l.handle_pdu(Duration::ZERO, &h, &d);
        }
    }
    async fn send(&mut self, h: Header, data: &[u8]) {
        write_pdu(&mut self.sock, h, data).await;
    }
    /// The next PDU, within `t` (None: nothing came, or the connection ended).
    async fn next_within(&mut self, t: Duration) -> Option<(Header, Vec<u8>)> {
        tokio::time::timeout(t, read_pdu(&mut self.sock)).await.ok().flatten()
    }
    async fn next(&mut self) -> (Header, Vec<u8>) {
        self.next_within(WAIT).await.expect("an answer from the target")
    }
    /// A SCSI command with the next CmdSN (or an immediate one with the current).
    fn command(&mut self, itt: u32, cdb: &[u8], edtl: u32, write: bool, final_: bool, immediate: bool) -> Header {
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        let h = Header::ScsiCommand(ScsiCommand {
            immediate,
            final_,
            read: !write && edtl > 0,
            write,
            attr: 1,
            lun: Lun::ZERO,
            itt,
            expected_data_len: edtl,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.o.stat_sn,
            cdb: c,
        });
        if !immediate {
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
        }
        h
    }
    /// Wait for the status of `itt` — a SCSI Response, or a Data-In carrying it (phase
    /// collapse); other PDUs are passed to `seen`.
    async fn response(&mut self, itt: u32, mut seen: impl FnMut(&Header)) -> (ScsiResponse, Vec<u8>) {
        if let Some(i) = self.stash.iter().position(|(r, _)| r.itt == itt) {
            return self.stash.swap_remove(i);
        }
        loop {
            let (h, d) = self.next().await;
            match h {
                Header::ScsiResponse(r) if r.itt == itt => return (r, d),
                Header::ScsiResponse(r) => self.stash.push((r, d)),
                Header::DataIn(i) if i.status_present => {
                    let r = ScsiResponse {
                        itt: i.itt,
                        status: i.status,
                        underflow: i.underflow,
                        overflow: i.overflow,
                        residual: i.residual,
                        stat_sn: i.stat_sn,
                        exp_cmd_sn: i.exp_cmd_sn,
                        max_cmd_sn: i.max_cmd_sn,
                        ..ScsiResponse::default()
                    };
                    if i.itt == itt {
                        return (r, Vec::new());
                    }
                    self.stash.push((r, Vec::new()));
                }
                Header::DataIn(_) => {}
                other => seen(&other),
            }
        }
    }
    /// Read everything the target sent; whether the connection then ended (EOF or reset)
    /// within [`WAIT`].
    async fn drains_to_eof(&mut self) -> bool {
        let mut buf = vec![0u8; 1 << 20];
        tokio::time::timeout(WAIT, async {
            loop {
                if matches!(self.sock.read(&mut buf).await, Ok(0) | Err(_)) {
                    return;
                }
            }
        })
        .await
        .is_ok()
    }
    async fn ping(&mut self, itt: u32) -> u32 {
        let p = NopOut { immediate: true, lun: Lun::ZERO, itt, ttt: u32::MAX, cmd_sn: self.cmd_sn, exp_stat_sn: self.o.stat_sn };
        self.send(Header::NopOut(p), &[]).await;
        loop {
            if let (Header::NopIn(n), _) = self.next().await
                && n.itt == itt
            {
                return n.max_cmd_sn;
            }
        }
    }
}

fn write10(lba: u32, blocks: u16) -> [u8; 10] {
    let l = lba.to_be_bytes();
    let b = blocks.to_be_bytes();
    [0x2a, 0, l[0], l[1], l[2], l[3], 0, b[0], b[1], 0]
}

fn read10(lba: u32, blocks: u16) -> [u8; 10] {
    let mut c = write10(lba, blocks);
    c[0] = 0x28;
    c
}

fn sense(data: &[u8]) -> Sense {
    Sense::parse(&data[2..]).unwrap()
}

/// Commands held in the target keep their window slots: MaxCmdSN moves when they end, not when
/// they arrive (it used to slide on arrival, so queue_depth bounded nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_slides_when_commands_end_not_when_they_arrive() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |c| c.queue_depth = 4).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 1]).await;
    let first_max = r.o.max_cmd_sn;
    assert_eq!(first_max, r.o.exp_cmd_sn.wrapping_add(3));
    gated.hold(true);
    for i in 0..4u32 {
        let h = r.command(0x100 + i, &write10(i, 1), 512, true, true, false);
        r.send(h, &[0xaa; 512]).await;
    }
    // All four are in the target, held at the backend: no room opened.
    let t0 = std::time::Instant::now();
    while gated.writes_waiting.load(Ordering::SeqCst) < 4 && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(r.ping(1).await, first_max, "MaxCmdSN while four commands are held");
    // A fifth, beyond MaxCmdSN, is ignored (RFC 7143 §4.2.2.1).
    let h = r.command(0x200, &write10(9, 1), 512, true, true, false);
    r.send(h, &[0xbb; 512]).await;
    // (PDUs are handled in order: once this ping is answered the fifth was seen and ignored.)
    r.ping(2).await;
    gated.hold(false);
    let mut maxes = Vec::new();
    for i in 0..4u32 {
        let (resp, _) = r.response(0x100 + i, |_| {}).await;
        assert_eq!(resp.status, Status::GOOD);
        maxes.push(resp.max_cmd_sn);
    }
    assert_eq!(*maxes.iter().max().unwrap(), first_max.wrapping_add(4), "each ended command opens one slot: {maxes:?}");
    assert!(r.next_within(Duration::from_millis(300)).await.is_none(), "the command beyond the window was ignored");
}

/// Immediate commands do not count in the window: they have an allowance of their own, past
/// which the RFC's Immediate Command Reject answers them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_commands_beyond_their_allowance_are_rejected() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |c| c.max_immediate_commands = 2).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 2]).await;
    gated.hold(true);
    for i in 0..3u32 {
        let h = r.command(0x300 + i, &write10(i, 1), 512, true, true, true);
        r.send(h, &[1; 512]).await;
    }
    match r.next().await {
        (Header::Reject(j), bhs) => {
            assert_eq!(j.reason, RejectReason::IMMEDIATE_COMMAND_REJECTED);
            let (p, _) = Pdu::parse(&bhs).unwrap();
            assert!(matches!(p.header, Header::ScsiCommand(c) if c.itt == 0x302));
        }
        other => panic!("expected an Immediate Command Reject, got {other:?}"),
    }
    gated.hold(false);
    for i in 0..2u32 {
        assert_eq!(r.response(0x300 + i, |_| {}).await.0.status, Status::GOOD);
    }
}

/// A session holds at most `max_session_bytes` of command data: further reads wait for room
/// before their memory is taken (it used to allocate every read's whole transfer at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_memory_budget_holds_reads_back() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |c| c.max_session_bytes = 1 << 20).await;
    let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 3]).await;
    for i in 0..4u32 {
        let h = r.command(0x400 + i, &read10(i * 2048, 2048), 1 << 20, false, true, false);
        r.send(h, &[]).await;
    }
    for i in 0..4u32 {
        assert_eq!(r.response(0x400 + i, |_| {}).await.0.status, Status::GOOD);
    }
    assert_eq!(gated.reads_max.load(Ordering::SeqCst), 1, "four 1 MiB reads under a 1 MiB budget ran one at a time");
}

/// The target-wide budget holds across sessions: two sessions, each within its own budget,
/// together wait for the target's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_target_memory_budget_holds_reads_of_all_sessions_back() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |c| c.max_target_bytes = 1 << 20).await;
    let mut a = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 0x31]).await;
    let mut b = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 0x32]).await;
    for (i, r) in [&mut a, &mut b].into_iter().enumerate() {
        for j in 0..2u32 {
            let n = i as u32 * 2 + j;
            let h = r.command(0x600 + n, &read10(n * 2048, 2048), 1 << 20, false, true, false);
            r.send(h, &[]).await;
        }
    }
    for j in 0..2u32 {
        assert_eq!(a.response(0x600 + j, |_| {}).await.0.status, Status::GOOD);
        assert_eq!(b.response(0x602 + j, |_| {}).await.0.status, Status::GOOD);
    }
    assert_eq!(gated.reads_max.load(Ordering::SeqCst), 1, "four 1 MiB reads of two sessions under a 1 MiB target budget ran one at a time");
}

/// An initiator that stops reading cannot hold the target: a response the transport has not
/// taken within `send_timeout` ends the connection (the keepalive could not even ping it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_stops_reading_is_dropped_after_the_send_timeout() {
    let addr = start(|c| {
        c.send_timeout = Duration::from_millis(500);
        c.nop_interval = None;
    })
    .await;
    let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 4]).await;
    // 64 MiB of reads nobody reads: the socket buffers fill, the target's sends block.
    for i in 0..8u32 {
        let h = r.command(0x500 + i, &read10(i * 16384, 16384), 8 << 20, false, true, false);
        r.send(h, &[]).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    // By now the target has given up: draining the socket ends in EOF.
    assert!(r.drains_to_eof().await, "the target dropped the connection");
}

/// The keepalive fires even when the send side is stuck: an initiator that stops reading is
/// dropped once its ping goes unanswered for `nop_timeout`, long before a generous
/// `send_timeout` (the ping used to wait in line behind the stuck Data-In, and the connection's
/// receive loop with it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_keepalive_fires_while_the_send_side_is_stuck() {
    let addr = start(|c| {
        c.send_timeout = Duration::from_secs(60);
        c.nop_interval = Some(Duration::from_millis(300));
        c.nop_timeout = Duration::from_millis(600);
    })
    .await;
    let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 18]).await;
    for i in 0..8u32 {
        let h = r.command(0x600 + i, &read10(i * 16384, 16384), 8 << 20, false, true, false);
        r.send(h, &[]).await;
    }
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(r.drains_to_eof().await, "the target dropped the connection");
    assert!(started.elapsed() < Duration::from_secs(14), "dropped by the keepalive, not the send timeout");
}

/// A peer that announces a data segment and stalls is dropped at the data timeout — in login and
/// in full feature phase (the receiver used to wait for the bytes forever, even after the login
/// timed out, and the socket stayed open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_data_segment_ends_the_connection() {
    let addr = start(|c| {
        c.data_timeout = Duration::from_millis(500);
        c.login_timeout = Duration::from_millis(800);
        c.nop_interval = None;
    })
    .await;
    let eof_within = |mut sock: TcpStream, t: Duration| async move {
        let mut b = [0u8; 4096];
        tokio::time::timeout(t, async {
            loop {
                match sock.read(&mut b).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    };
    // Login: a Login Request announcing 1000 bytes, 10 sent.
    let mut sock = TcpStream::connect(addr).await.unwrap();
    let mut bytes = Vec::new();
    let req = LoginRequest { transit: false, itt: 1, isid: Isid([0x80, 0, 0, 0, 0, 5]), ..LoginRequest::default() };
    Pdu::new(Header::LoginRequest(req), &[][..], &[b'x'; 1000][..]).encode(&mut bytes);
    sock.write_all(&bytes[..58]).await.unwrap();
    assert!(eof_within(sock, Duration::from_secs(5)).await, "a stalled login PDU is dropped");
    // Full feature phase: a command announcing 4096 bytes of immediate data, 100 sent.
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 6]).await;
    let h = r.command(0x600, &write10(0, 8), 4096, true, true, false);
    let mut bytes = Vec::new();
    Pdu::new(h, &[][..], &[7u8; 4096][..]).encode(&mut bytes);
    r.sock.write_all(&bytes[..148]).await.unwrap();
    assert!(eof_within(r.sock, Duration::from_secs(5)).await, "a stalled command PDU is dropped");
}

/// The target serves at most `max_connections`; one more is closed at once, and a place freed
/// is a place for the next.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed() {
    let addr = start(|c| c.max_connections = 2).await;
    let a = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 7]).await;
    let _b = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 8]).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(WAIT, third.read(&mut b)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "the third connection is closed");
    drop(a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut again = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 9]).await;
    again.ping(5).await;
}

/// ABORT TASK and LUN RESET are answered only once the aborted write's backend I/O is over (a
/// write on the blocking pool cannot be stopped; answering earlier let a stale write land on
/// blocks the initiator had rewritten since).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_management_waits_for_the_aborted_writes_backend_io() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |_| {}).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 10]).await;
    for (i, function) in [TmfFunction::ABORT_TASK, TmfFunction::LOGICAL_UNIT_RESET].into_iter().enumerate() {
        gated.hold(true);
        let itt = 0x700 + i as u32;
        let h = r.command(itt, &write10(0, 1), 512, true, true, false);
        let ref_cmd_sn = r.cmd_sn.wrapping_sub(1);
        r.send(h, &[3; 512]).await;
        let t0 = std::time::Instant::now();
        while gated.writes_waiting.load(Ordering::SeqCst) == 0 && t0.elapsed() < WAIT {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let done_before = gated.writes_done.load(Ordering::SeqCst);
        let t = TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::ZERO,
            itt: 0x7f0 + i as u32,
            ref_task_tag: itt,
            cmd_sn: r.cmd_sn,
            exp_stat_sn: r.o.stat_sn,
            ref_cmd_sn,
            ..TaskMgmtRequest::default()
        };
        r.send(Header::TaskMgmtRequest(t), &[]).await;
        assert!(r.next_within(Duration::from_millis(400)).await.is_none(), "{function:?} answered while the write still runs");
        gated.hold(false);
        match r.next().await {
            (Header::TaskMgmtResponse(t), _) => assert_eq!(t.response, TmfResponse::COMPLETE),
            other => panic!("{other:?}"),
        }
        assert_eq!(gated.writes_done.load(Ordering::SeqCst), done_before + 1, "the write ended before the answer");
        // (A LUN RESET leaves a UNIT ATTENTION: collect it before the next round.)
        let h = r.command(0x7e0 + i as u32, &[0; 6], 0, false, true, false);
        r.send(h, &[]).await;
        let _ = r.response(0x7e0 + i as u32, |_| {}).await;
    }
}

/// A SANITIZE goes on across task management (SBC-4; libiscsi's Sanitize.Reset checks it): task
/// management answers at once and does not wait for it, as it waits for a write. The LU fences
/// the medium meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_management_does_not_wait_for_a_sanitize() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |_| {}).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 0x41]).await;
    gated.hold(true);
    // SANITIZE OVERWRITE without IMMED: one pass of one 512-byte pattern.
    let cdb = [0x48, 0x01, 0, 0, 0, 0, 0, 0x02, 0x04, 0];
    let mut params = vec![0x01, 0, 0x02, 0x00];
    params.extend_from_slice(&[0x5a; 512]);
    let h = r.command(0xc00, &cdb, params.len() as u32, true, true, false);
    r.send(h, &params).await;
    let t0 = std::time::Instant::now();
    while gated.writes_waiting.load(Ordering::SeqCst) == 0 && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(gated.writes_waiting.load(Ordering::SeqCst) > 0, "the sanitize is writing");
    let t = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK_SET,
        lun: Lun::ZERO,
        itt: 0xc01,
        cmd_sn: r.cmd_sn,
        exp_stat_sn: r.o.stat_sn,
        ..TaskMgmtRequest::default()
    };
    r.send(Header::TaskMgmtRequest(t), &[]).await;
    let answer = r.next_within(Duration::from_secs(3)).await;
    // Let the sanitize go before judging (a held blocking thread would hold the test's runtime).
    gated.hold(false);
    match answer {
        Some((Header::TaskMgmtResponse(t), _)) => assert_eq!(t.response, TmfResponse::COMPLETE),
        other => panic!("ABORT TASK SET waited for the sanitize: {other:?}"),
    }
}

/// Session reinstatement: the new session runs nothing before the old one's backend I/O is over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reinstatement_waits_for_the_old_sessions_write() {
    let gated = Gated::new();
    let addr = start_with(gated.clone(), |_| {}).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let isid = [0x80, 0, 0, 0, 0, 11];
    let mut old = Raw::login(addr, op.clone(), isid).await;
    gated.hold(true);
    let h = old.command(0x800, &write10(0, 1), 512, true, true, false);
    old.send(h, &[4; 512]).await;
    let t0 = std::time::Instant::now();
    while gated.writes_waiting.load(Ordering::SeqCst) == 0 && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Same initiator, same ISID: the old session is reinstated. The held write is let go after
    // 600 ms; the new session's first answer must come after that.
    let released = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let release = {
        let (g, released) = (gated.clone(), released.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(600)).await;
            released.store(true, Ordering::SeqCst);
            g.hold(false);
        })
    };
    let mut new = Raw::login(addr, op, isid).await;
    let h = new.command(0x801, &[0; 6], 0, false, true, false);
    new.send(h, &[]).await;
    let _ = new.response(0x801, |_| {}).await;
    assert!(released.load(Ordering::SeqCst), "the new session answered while the old session's write was still held");
    release.await.unwrap();
    assert_eq!(gated.writes_done.load(Ordering::SeqCst), 1);
}

/// A write whose expected length is far beyond its CDB, with the smallest MaxBurstLength: the
/// target solicits only what the CDB uses (it used to plan an R2T per 512 bytes of the expected
/// length, millions, and then left the command unanswered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_max_burst_with_a_huge_edtl_solicits_only_what_the_cdb_needs() {
    let small = OperationalConfig::default().initial_r2t(true).immediate_data(false).max_burst_length(512).first_burst_length(512);
    let addr = start(|c| c.operational = small.clone()).await;
    let mut r = Raw::login(addr, small.clone(), [0x80, 0, 0, 0, 0, 12]).await;
    assert_eq!(r.o.params.max_burst_length, 512);
    let edtl = 60 << 20;
    let h = r.command(0x900, &write10(0, 1), edtl, true, true, false);
    r.send(h, &[]).await;
    let r2t = match r.next().await {
        (Header::R2t(t), _) => t,
        other => panic!("{other:?}"),
    };
    assert_eq!((r2t.buffer_offset, r2t.desired_len), (0, 512));
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0x900, ttt: r2t.ttt, data_sn: 0, buffer_offset: 0, ..DataOut::default() };
    r.send(Header::DataOut(d), &[9; 512]).await;
    let (resp, _) = r.response(0x900, |h| assert!(!matches!(h, Header::R2t(R2t { .. })), "a second R2T: {h:?}")).await;
    assert_eq!(resp.status, Status::GOOD);
    assert!(resp.underflow && resp.residual == edtl - 512, "{resp:?}");
}

/// Every command gets an answer: an expected length beyond any task buffer, immediate data
/// longer than the expected length (both were left unanswered).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_write_lengths_get_check_condition() {
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let addr = start(|_| {}).await;
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 13]).await;
    let h = r.command(0xa00, &write10(0, 1), 1 << 30, true, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(0xa00, |_| {}).await;
    assert_eq!(resp.status, Status::CHECK_CONDITION);
    assert_eq!(sense(&d).key, SenseKey::ILLEGAL_REQUEST);
    let h = r.command(0xa01, &write10(0, 1), 512, true, true, false);
    r.send(h, &[5; 1024]).await;
    let (resp, d) = r.response(0xa01, |_| {}).await;
    assert_eq!(resp.status, Status::CHECK_CONDITION);
    assert_eq!((sense(&d).key, sense(&d).asc), (SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR));
    r.ping(0xa02).await;
}

/// The unsolicited burst is FirstBurstLength or the whole transfer: one that ends early (F=1
/// short of it) would leave bytes nobody sent between it and the first R2T, and the reused
/// buffer's stale contents reached the medium with GOOD status. F=0 under InitialR2T=Yes is the
/// same hole. Both now fail the task, and the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsolicited_burst_ended_early_fails_the_task() {
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65536);
    let addr = start(|c| c.operational = op.clone()).await;
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 14]).await;
    assert_eq!(r.o.params.first_burst_length, 65536);
    // 128 KiB write: 8 KiB immediate, then Data-Out 8..16 KiB with F=1 (FirstBurstLength is 64 KiB).
    let h = r.command(0xb00, &write10(100, 256), 131_072, true, false, false);
    r.send(h, &[1; 8192]).await;
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0xb00, ttt: u32::MAX, data_sn: 0, buffer_offset: 8192, ..DataOut::default() };
    r.send(Header::DataOut(d), &[2; 8192]).await;
    let (resp, d) = r.response(0xb00, |_| {}).await;
    assert_eq!(resp.status, Status::CHECK_CONDITION);
    assert_eq!(sense(&d).asc, AscAscq::DATA_PHASE_ERROR);
    r.ping(0xb01).await;

    let strict = OperationalConfig::default().initial_r2t(true).immediate_data(true);
    let addr = start(|c| c.operational = strict.clone()).await;
    let mut r = Raw::login(addr, strict, [0x80, 0, 0, 0, 0, 15]).await;
    assert!(r.o.params.initial_r2t);
    let h = r.command(0xb10, &write10(0, 64), 32768, true, false, false);
    r.send(h, &[3; 8192]).await;
    let (resp, _) = r.response(0xb10, |_| {}).await;
    assert_eq!(resp.status, Status::CHECK_CONDITION);
    r.ping(0xb11).await;
}

/// Every command gets an answer whatever its flags say against its CDB (as over iSER, see
/// `iser_end_to_end`): data the CDB wants but the flags do not announce is refused; flags
/// announcing data the CDB does not move end GOOD with the whole length as residual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_flags_contradict_its_cdb_gets_an_answer() {
    let addr = start(|_| {}).await;
    let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 17]).await;
    // A WRITE CDB with R instead of W, then with neither.
    for (itt, edtl) in [(0xd00, 512), (0xd01, 0)] {
        let h = r.command(itt, &write10(0, 1), edtl, false, true, false);
        r.send(h, &[]).await;
        let (resp, d) = r.response(itt, |_| {}).await;
        assert_eq!(
            (resp.status, sense(&d).key, sense(&d).asc),
            (Status::CHECK_CONDITION, SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB)
        );
    }
    // A READ CDB with W (and no data sent, F=1): nothing moves, the whole length is residual.
    let h = r.command(0xd02, &read10(0, 1), 512, true, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(0xd02, |h| panic!("no data moves: {h:?}")).await;
    assert_eq!((resp.status, d.len(), resp.underflow, resp.residual), (Status::GOOD, 0, true, 512), "{resp:?}");
    r.ping(0xd03).await;
}

/// Write data the target asked for and never got: after `data_timeout` the command ends with
/// CHECK CONDITION; the connection stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_data_that_never_comes_ends_the_command_not_the_session() {
    let op = OperationalConfig::default().initial_r2t(true).immediate_data(false);
    let addr = start(|c| {
        c.operational = op.clone();
        c.data_timeout = Duration::from_millis(500);
    })
    .await;
    let mut r = Raw::login(addr, op, [0x80, 0, 0, 0, 0, 16]).await;
    let h = r.command(0xc00, &write10(0, 8), 4096, true, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(0xc00, |h| assert!(matches!(h, Header::R2t(_)), "{h:?}")).await;
    assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    r.ping(0xc01).await;
}

/// A portal survives accept errors (here: out of file descriptors) and serves again once
/// descriptors are free. Runs in a child process with a small RLIMIT_NOFILE (set by the shell).
#[test]
fn accept_errors_do_not_stop_the_portal() {
    if std::env::var_os("RISER_LIMITS_CHILD").is_some() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg("ulimit -n 48 && exec \"$0\" --exact accept_errors_child --nocapture --test-threads 1")
        .arg(&me)
        .env("RISER_LIMITS_CHILD", "1")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.contains("1 passed"), "{text}");
}

#[test]
fn accept_errors_child() {
    if std::env::var_os("RISER_LIMITS_CHILD").is_none() {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let addr = start(|c| c.max_connections = 1000).await;
        // Use up the descriptors: accept() then fails with EMFILE for the connections beyond.
        let mut held = Vec::new();
        for _ in 0..60 {
            match TcpStream::connect(addr).await {
                Ok(s) => held.push(s),
                Err(_) => break,
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop(held);
        tokio::time::sleep(Duration::from_millis(1500)).await;
        // The portal still serves.
        let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 17]).await;
        r.ping(1).await;
    });
}

/// A header that is well framed but holds an impossible field (here a Login Request with both
/// the T and C bits, RFC 7143 §11.12.2) gets a Reject carrying it (Invalid PDU Field), and the
/// session goes on: the datamover hands the decode error to the session, which acts on its
/// reaction. It used to end the connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_with_an_impossible_field_is_rejected_and_the_session_goes_on() {
    let addr = start(|_| {}).await;
    let mut r = Raw::login(addr, OperationalConfig::default(), [0x80, 0, 0, 0, 0, 18]).await;
    let bad = Header::LoginRequest(LoginRequest { transit: true, cont: true, itt: 77, cmd_sn: r.cmd_sn, ..LoginRequest::default() });
    let mut sent = Vec::new();
    Pdu::new(bad, &[][..], &b"junk"[..]).encode(&mut sent);
    r.sock.write_all(&sent).await.unwrap();
    match r.next().await {
        (Header::Reject(j), bhs) => {
            assert_eq!(j.reason, RejectReason::INVALID_PDU_FIELD);
            assert_eq!(bhs, sent[..48], "the Reject carries the offending header as sent");
        }
        other => panic!("expected a Reject, got {other:?}"),
    }
    // Its data segment was skipped, not taken for a header: the connection still works.
    r.ping(2).await;
    let (resp, _) = {
        let c = r.command(3, &read10(0, 1), 512, false, true, false);
        r.send(c, &[]).await;
        r.response(3, |_| {}).await
    };
    assert_eq!(resp.status, Status::GOOD);
}
