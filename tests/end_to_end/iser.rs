//! What only iSER has: the RNIC's memory protection and registrations, receives the target
//! must keep posted, and commands that advertise no buffer for their data.

use crate::support::{ME, TARGET, Transport, pattern, read10, sense};
use riser::initiator::{IserConnector, Session, SessionConfig};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::TmfFunction;
use riser::iser::IserConfig;
use riser::iwarp::SoftRnic;
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, SenseKey, Status};
use std::sync::Arc;
use std::time::Duration;

const T: Transport = Transport::Iser;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_during_transfers_and_teardown_leave_no_registration_behind() {
    let addr = T.start(|_| {}, |_| {}).await;
    let rnic = SoftRnic::default();
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.connector = Arc::new(IserConnector::new(rnic.clone(), IserConfig::default()));
    let s = Session::connect(addr, cfg).await.unwrap();
    // Large transfers in flight while the LU is reset: each command either completes with its
    // data intact or fails; none hangs, and the session carries on.
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4 << 20);
            if s.write(Lun::ZERO, i * 8192, data.clone(), 512).await.is_ok()
                && let Ok(back) = s.read(Lun::ZERO, i * 8192, 8192, 512).await
            {
                assert_eq!(back, data);
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK_SET, 0).await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(30), t).await.expect("no command hangs").unwrap();
    }
    let data = pattern(99, 1 << 20);
    s.write(Lun::ZERO, 100_000, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 100_000, 2048, 512).await.unwrap(), data);
    assert!(rnic.registered_regions() > 0, "receive buffers are registered while connected");
    s.logout().await.unwrap();
    drop(s);
    // Every per-command registration was revoked and deregistered; with the connection gone
    // its receive buffers are too.
    let t0 = std::time::Instant::now();
    while rnic.registered_regions() != 0 {
        assert!(t0.elapsed() < Duration::from_secs(10), "{} regions still registered", rnic.registered_regions());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// READ(10) of 128 blocks (64 KiB) with EDTL 64 KiB, but only 4 KiB registered and advertised:
/// the target's RDMA Write runs past the region and the initiator's RNIC refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_smaller_than_the_command_says_is_protected_by_the_rnic() {
    let addr = T.start(|_| {}, |_| {}).await;
    let mut r = T.raw(addr, OperationalConfig::default().max_recv_data_segment_length(8192), 0x42).await;
    let h = r.command(0x42, &read10(0, 128), 65_536, false, true, false);
    r.submit(h, 4096, None).await;
    assert!(r.ends_within(Duration::from_secs(10)).await, "the out-of-bounds write ends the connection");
    // The target is unharmed: a well-behaved session works.
    let s = T.session(addr).await;
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

/// The Linux initiator offers InitialR2T=No with a 256 KiB FirstBurstLength and sends the
/// unsolicited part as 8 KiB Data-Out Sends, each needing a receive the target posted. By
/// default the target answers InitialR2T=Yes over iSER (as LIO), so a full window of writes
/// never outruns its receives; it used to accept, and ran out (Terminate: Send with no receive
/// posted) under a window of concurrent writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_writes_from_a_linux_like_initiator_never_outruns_the_targets_receives() {
    let addr = T.start(|_| {}, |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.operational.first_burst_length = 262_144;
    cfg.connector = T.linux_like_connector();
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(s.params().initial_r2t, "the target answers InitialR2T=Yes over iSER");
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 512 << 10);
            s.write(Lun::ZERO, i * 1024, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(Lun::ZERO, i * 1024, 1024, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.logout().await.unwrap();
}

/// A target granting a window far wider than the initiator's receives (1024 commands; riser's
/// initiator posts 128 by default): the initiator keeps no more commands outstanding than its
/// receives hold answers for (`max_outstanding_commands`, 112), nor more immediate requests
/// than the few kept beside them; the rest wait their turn, and every one is answered on the
/// one connection. It used to send the whole window (and every ping asked for): answers beyond
/// its receives ended the connection (Terminate: Send with no receive posted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_keeps_no_more_requests_outstanding_than_its_receives_hold_answers_for() {
    let addr = T.start(|_| {}, |c| c.queue_depth = 1024).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.connector = Arc::new(IserConnector::new(SoftRnic::default(), IserConfig::default()));
    let s = Session::connect(addr, cfg).await.unwrap();
    for round in 0..3u64 {
        let mut reads = Vec::new();
        let mut pings = Vec::new();
        for i in 0..1000u64 {
            let r = s.clone();
            reads.push(tokio::spawn(async move { r.read(Lun::ZERO, round * 1000 + i, 1, 512).await.map(|b| b.len()) }));
            if i % 4 == 0 {
                let p = s.clone();
                pings.push(tokio::spawn(async move { p.ping().await }));
            }
        }
        for t in reads {
            assert_eq!(t.await.unwrap().expect("every read answered"), 512);
        }
        for t in pings {
            t.await.unwrap().expect("every ping answered");
        }
    }
    s.logout().await.unwrap();
}

/// A read that advertised no read buffer (STag) gets CHECK CONDITION before the medium is read
/// (it was left unanswered: its read data had nowhere to go), with the whole length as
/// residual; the connection goes on. (The other contradictions of flags and CDB, on every
/// transport: `bad_input::a_command_whose_flags_contradict_its_cdb_gets_an_answer`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_without_a_buffer_gets_check_condition() {
    let addr = T.start(|_| {}, |_| {}).await;
    let mut r = T.raw(addr, OperationalConfig::default(), 0x41).await;
    // As a control PDU: no STag in the iSER header, whatever the flags say.
    let h = r.command(1, &read10(0, 1), 512, false, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(1, |_| {}).await;
    assert_eq!(
        (resp.status, sense(&d).key, sense(&d).asc),
        (Status::CHECK_CONDITION, SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR)
    );
    assert!(resp.underflow && resp.residual == 512, "{resp:?}");
    r.ping(9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_iser_portal_that_stops_serving_frees_its_address() {
    use riser::target::server::{Target, TargetConfig};
    use riser::verbs::{Listener, Provider};
    let rnic = SoftRnic::default();
    let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let target = Target::new(TargetConfig::default());
    let serving = tokio::spawn(target.clone().serve_iser(rnic.clone(), l, IserConfig::default()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    // A portal removed live (its task dropped): no request is waited for any more, and the
    // address can be listened on again at once (it used to stay bound until a next request).
    serving.abort();
    let t0 = std::time::Instant::now();
    let again = loop {
        match rnic.listen(addr) {
            Ok(l) => break l,
            Err(e) => {
                assert!(t0.elapsed() < Duration::from_secs(5), "the address stays bound: {e}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    assert_eq!(again.local_addr().unwrap(), addr);
}

/// A target that receives 64 KiB segments (riser's default on the software RNIC): writes up to
/// FirstBurstLength travel whole as immediate data in their command — sent by the initiator from
/// the caller's bytes, a message of two FPDUs — and larger ones carry 64 KiB of it and RDMA Read
/// the rest; every size around the boundaries lands intact, many at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_travel_as_immediate_data_up_to_the_targets_receive_segment() {
    use riser::target::backend::RamBackend;
    use riser::target::lu::{LogicalUnit, LuIdentity};
    use riser::target::server::{Node, Target};
    use riser::verbs::{Listener, Provider};
    let rnic = SoftRnic::default();
    let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(64 << 20, 512)), LuIdentity::random()));
    let target = Target::new(T.config().node(Node::new(TARGET).lun(lu)));
    tokio::spawn(target.clone().serve_iser(rnic, l, IserConfig::default().recv_dsl(64 << 10)));
    let s = T.session(addr).await;
    assert_eq!(s.params().target_recv_data_segment_length, 64 << 10);
    let sizes = [512usize, 8192, 8704, 32 << 10, (64 << 10) - 512, 64 << 10, (64 << 10) + 512, 200 << 10];
    let mut tasks = Vec::new();
    for round in 0..4u64 {
        for (i, &n) in sizes.iter().enumerate() {
            let s = s.clone();
            let lba = (round * sizes.len() as u64 + i as u64) * 512;
            tasks.push(tokio::spawn(async move {
                let data = pattern((round * 16 + i as u64) as u8, n);
                s.write(Lun::ZERO, lba, data.clone(), 512).await.unwrap();
                assert_eq!(s.read(Lun::ZERO, lba, (n / 512) as u32, 512).await.unwrap(), data, "{n} bytes");
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.logout().await.unwrap();
}

/// A RAM disk that tells on which thread each read and write ran, and how long it was.
#[derive(Debug)]
struct ReadThreads {
    ram: riser::target::backend::RamBackend,
    seen: std::sync::Mutex<Vec<(usize, String)>>,
    wrote: std::sync::Mutex<Vec<(usize, String)>>,
}

impl ReadThreads {
    fn saw(&self, len: usize) {
        let name = std::thread::current().name().unwrap_or_default().to_string();
        self.seen.lock().unwrap().push((len, name));
    }
}

impl riser::target::backend::BlockBackend for ReadThreads {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.saw(buf.len());
        self.ram.read(offset, buf)
    }
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
        self.saw(len);
        self.ram.read_into(offset, len, out)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.wrote.lock().unwrap().push((buf.len(), std::thread::current().name().unwrap_or_default().to_string()));
        self.ram.write(offset, buf)
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
    fn in_memory(&self) -> bool {
        true
    }
}

/// On a connection thread (`iser_threads`), every command runs on the connection's thread:
/// a small read in its receiving task, a large read and a large write in tasks of their own
/// there. (Large reads once ran on the portal's work-stealing runtime, to copy on another
/// core: with as many connections as cores that cost four sessions' 256 KiB reads about a
/// fifth of their rate, and one session gained nothing measurable.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_threads_commands_all_run_on_it() {
    use riser::target::lu::{LogicalUnit, LuIdentity};
    use riser::target::server::{Node, Target};
    use riser::verbs::{Listener, Provider};
    let rnic = SoftRnic::default();
    let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = l.local_addr().unwrap();
    let disk = Arc::new(ReadThreads {
        ram: riser::target::backend::RamBackend::new(16 << 20, 512),
        seen: Default::default(),
        wrote: Default::default(),
    });
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let target = Target::new(T.config().iser_threads(1).node(Node::new(TARGET).lun(lu)));
    tokio::spawn(target.clone().serve_iser(rnic, l, IserConfig::default()));
    let s = T.session(addr).await;
    let data = pattern(7, 1 << 20);
    s.write(Lun::ZERO, 0, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), data[..4096]);
    assert_eq!(s.read(Lun::ZERO, 0, 2048, 512).await.unwrap(), data);
    s.logout().await.unwrap();
    let seen = disk.seen.lock().unwrap().clone();
    let on =
        |len: usize| seen.iter().find(|(n, _)| *n == len).map(|(_, t)| t.clone()).unwrap_or_else(|| panic!("no {len}-byte read: {seen:?}"));
    assert_eq!(on(4096), "riser-iser-0", "a small read runs on the connection's thread");
    assert_eq!(on(1 << 20), "riser-iser-0", "a large read runs on the connection's thread too");
    let wrote = disk.wrote.lock().unwrap().clone();
    assert_eq!(wrote, [(1 << 20, "riser-iser-0".to_string())], "a large write stays on the connection's thread");
}

/// More commands given up on at once than an iSER initiator has room for immediate requests
/// (its receives bound what it may have outstanding: `recv_depth` 32 lets 16 commands and 8
/// more immediate requests out): the aborts beyond that room wait for it as earlier ones are
/// answered, instead of dropping the connection. Each command ends with its data or `Timeout`,
/// on the one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_commands_given_up_at_once_than_aborts_fit_wait_for_room() {
    use crate::support::Gated;
    use riser::target::lu::{LogicalUnit, LuIdentity};
    use riser::target::server::Node;
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, target) = T.serve(T.config().node(Node::new(TARGET).lun(lu))).await;
    let mut cfg = SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(2));
    cfg.connector = Arc::new(IserConnector::new(SoftRnic::default(), IserConfig::default().recv_depth(32)));
    let s = Session::connect(addr, cfg).await.unwrap();
    s.write(Lun::ZERO, 0, pattern(5, 16 * 512), 512).await.unwrap();
    disk.hold_reads(true);
    let reads: Vec<_> = (0..16u64)
        .map(|i| {
            let s = s.clone();
            tokio::spawn(async move { s.read(Lun::ZERO, i, 1, 512).await })
        })
        .collect();
    crate::support::until("the reads never all reached the store", || disk.reads_waiting() == 16).await;
    // Given up between 2 and 2.5 s: eight aborts go, the rest wait for room (each abort is
    // answered once its read is over at the target).
    tokio::time::sleep(Duration::from_secs(3)).await;
    disk.hold_reads(false);
    let want = pattern(5, 16 * 512);
    for (i, r) in reads.into_iter().enumerate() {
        match r.await.unwrap() {
            Ok(d) => assert_eq!(d, want[i * 512..(i + 1) * 512]),
            Err(riser::initiator::Error::Timeout) => {}
            Err(e) => panic!("read {i}: {e}"),
        }
    }
    assert_eq!(s.read(Lun::ZERO, 0, 16, 512).await.unwrap(), want);
    assert_eq!(target.stats().logins, 1, "the connection was dropped");
}
