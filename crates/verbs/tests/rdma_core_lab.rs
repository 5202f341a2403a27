//! The rdma-core provider on real devices: the driver traps of `shared/spec/RDMA-CORE-NOTES.md`,
//! each reproduced against the guard riser puts in front of it.
//!
//! These need RDMA devices, which the development machines lack: they are ignored by `cargo
//! test` and run by `cargo xtask lab` inside the lab VM (soft-RoCE `rxe0` on 10.233.0.1,
//! soft-iWARP `siw0` on 10.233.1.1; override with RISER_LAB_RXE / RISER_LAB_SIW), one at a time
//! (`--test-threads 1`: one of them lowers RLIMIT_MEMLOCK).
#![cfg(feature = "rdma-core")]

use riser_verbs::rdma_core::{KeyMode, RcCq, RcMr, RcPd, RcQp, RdmaCore, RdmaCoreConfig, Transport};
use riser_verbs::{
    Access, CompletionQueue, ConnParam, ConnectionRequest, Error, Invalid, Listener, MemoryRegion, ProtectionDomain, Provider, QpCaps,
    QueuePair, RecvWr, RegistrationError, SendOp, SendWr, Sge, Wc, WcOpcode, WcStatus,
};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

fn rxe() -> std::net::IpAddr {
    std::env::var("RISER_LAB_RXE").unwrap_or_else(|_| "10.233.0.1".into()).parse().unwrap()
}
fn siw() -> std::net::IpAddr {
    std::env::var("RISER_LAB_SIW").unwrap_or_else(|_| "10.233.1.1".into()).parse().unwrap()
}

static PORT: AtomicU16 = AtomicU16::new(20_000);

/// One end of a connection.
struct End {
    dev: RdmaCore,
    pd: Arc<RcPd>,
    cq: Arc<RcCq>,
    qp: Arc<RcQp>,
    recv: Arc<RcMr>,
}

impl End {
    fn post_recv(&self) {
        self.qp.post_recv(RecvWr { wr_id: 1000, sg_list: vec![sge(&self.recv)].into() }).unwrap();
    }
    /// The next completion (waiting up to 20 s: the lab VM is emulated).
    fn next(&self) -> Wc {
        for _ in 0..200 {
            if let Some(wc) = self.cq.poll(1).pop() {
                return wc;
            }
            self.cq.wait_blocking(Duration::from_millis(100));
        }
        panic!("no completion within 20 s");
    }
    fn send(&self, op: SendOp, sg: Vec<Sge>) -> Wc {
        self.qp.post_send(SendWr { wr_id: 7, op, sg_list: sg.into(), unregistered: None, signaled: true }).unwrap();
        self.next()
    }
}

fn sge(mr: &RcMr) -> Sge {
    Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() }
}

fn config(keys: KeyMode) -> RdmaCoreConfig {
    RdmaCoreConfig { keys, setup_timeout: Duration::from_secs(60), ..RdmaCoreConfig::default() }
}

/// A connected pair over the device owning `ip`: (server, client, what the server saw in the
/// request, what the client saw in the reply).
fn pair(ip: std::net::IpAddr, keys: KeyMode, client_pd: &[u8], server_pd: &[u8]) -> (End, End, Vec<u8>, Vec<u8>) {
    let addr = SocketAddr::new(ip, PORT.fetch_add(1, Ordering::Relaxed));
    let sdev = RdmaCore::for_address(ip, config(keys)).unwrap();
    let listener = sdev.listen(addr).unwrap();
    let reply = server_pd.to_vec();
    let server = std::thread::spawn(move || {
        let mut req = listener.get_request().unwrap();
        let seen = req.private_data().to_vec();
        let pd = sdev.alloc_pd().unwrap();
        let cq = sdev.create_cq(64).unwrap();
        let qp = req.create_qp(&pd, &cq, &cq, QpCaps { max_send_wr: 32, max_recv_wr: 8, max_sge: 2 }).unwrap();
        let recv = pd.register(vec![0; 4096], Access::LOCAL_WRITE).unwrap();
        let end = End { dev: sdev, pd, cq, qp, recv };
        end.post_recv();
        req.accept(&ConnParam { private_data: reply, responder_resources: 4, initiator_depth: 4 }).unwrap();
        (end, seen)
    });
    let cdev = RdmaCore::for_destination(addr, config(keys)).unwrap();
    let pd = cdev.alloc_pd().unwrap();
    let cq = cdev.create_cq(64).unwrap();
    let qp = cdev.create_qp(addr, &pd, &cq, &cq, QpCaps { max_send_wr: 32, max_recv_wr: 8, max_sge: 2 }).unwrap();
    let recv = pd.register(vec![0; 4096], Access::LOCAL_WRITE).unwrap();
    let client = End { dev: cdev, pd, cq, qp, recv };
    client.post_recv();
    let est = client
        .dev
        .connect(&client.qp, &ConnParam { private_data: client_pd.to_vec(), responder_resources: 4, initiator_depth: 4 })
        .unwrap();
    let (server, seen) = server.join().unwrap();
    (server, client, seen, est.private_data)
}

/// siw fills only the first element of a 2-element RDMA Read and reports success: riser never
/// posts more elements than the device's max_sge_rd, and says why.
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn siw_rdma_read_takes_one_element_and_more_are_refused() {
    let (server, client, ..) = pair(siw(), KeyMode::Auto, &[], &[]);
    assert_eq!(server.dev.transport(), Transport::Iwarp);
    assert_eq!(server.dev.max_sge_rd(), 1, "siw places one element per RDMA Read");
    let src = client.pd.register((0..8192u32).map(|i| i as u8).collect(), Access::REMOTE_READ).unwrap();
    let a = server.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::READ_SINK).unwrap();
    let b = server.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::READ_SINK).unwrap();
    let read = SendOp::RdmaRead { remote_addr: src.addr(), rkey: src.rkey() };
    let two =
        server.qp.post_send(SendWr { wr_id: 1, op: read, sg_list: vec![sge(&a), sge(&b)].into(), unregistered: None, signaled: true });
    match two {
        Err(Error::Invalid(Invalid::TooManyReadSge { got: 2, max: 1, .. })) => {}
        other => panic!("a 2-element RDMA Read on siw must be refused, got {other:?}"),
    }
    // One element per read: both halves arrive.
    for (i, sink) in [&a, &b].into_iter().enumerate() {
        let wc = server.send(SendOp::RdmaRead { remote_addr: src.addr() + 4096 * i as u64, rkey: src.rkey() }, vec![sge(sink)]);
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::RdmaRead));
        sink.read(&mut |d| assert!(d.iter().enumerate().all(|(j, &x)| x == (4096 * i + j) as u8), "half {i} wrong"));
    }
}

/// The target's Send with Invalidate must revoke exactly the key it names. siw's library takes
/// that key from the RDMA fields, not from the invalidation field: riser sets both, so after the
/// Send the peer's key is dead and a write with it fails.
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn siw_send_with_invalidate_revokes_the_named_key() {
    let (server, client, ..) = pair(siw(), KeyMode::PerRegion, &[], &[]);
    let sink = client.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let data = server.pd.register(vec![0x5a; 4096], Access::empty()).unwrap();
    let msg = server.pd.register(vec![1; 64], Access::empty()).unwrap();
    let wc = server.send(SendOp::RdmaWrite { remote_addr: sink.addr(), rkey: sink.rkey() }, vec![sge(&data)]);
    assert_eq!(wc.status, WcStatus::Success);
    let wc = server.send(SendOp::SendWithInvalidate { rkey: sink.rkey() }, vec![sge(&msg)]);
    assert_eq!(wc.status, WcStatus::Success);
    let got = client.next();
    assert_eq!((got.status, got.opcode), (WcStatus::Success, WcOpcode::Recv));
    sink.read(&mut |d| assert!(d.iter().all(|&x| x == 0x5a)));
    // siw does not report the invalidation to the receiver (so riser's initiator does not offer
    // remote invalidation with plain registrations); the key is dead all the same. On iWARP a
    // write completes at the sender once sent: the refusal shows at the receiver, whose
    // connection ends with a Terminate (its posted receive is flushed), its memory untouched.
    client.post_recv();
    let other = server.pd.register(vec![0x77; 4096], Access::empty()).unwrap();
    let _ = server.send(SendOp::RdmaWrite { remote_addr: sink.addr(), rkey: sink.rkey() }, vec![sge(&other)]);
    let wc = client.next();
    assert_ne!(wc.status, WcStatus::Success, "a write with the invalidated key must end the connection");
    sink.read(&mut |d| assert!(d.iter().all(|&x| x == 0x5a), "the invalidated region was written"));
}

/// rxe: memory windows give a fresh key per region; the peer's Send with Invalidate revokes it
/// and the receiver learns which key (rxe reports it in flag bit 2, not IBV_WC_WITH_INV).
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn rxe_windows_fresh_keys_and_remote_invalidation_reported() {
    let (server, client, ..) = pair(rxe(), KeyMode::Auto, &[], &[]);
    assert_eq!(client.dev.key_mode(), KeyMode::MemoryWindows);
    assert!(client.dev.remote_invalidation());
    let a = client.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let b = client.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    assert_ne!(a.rkey(), b.rkey(), "a fresh key per region");
    let data = server.pd.register(vec![0x33; 4096], Access::empty()).unwrap();
    let msg = server.pd.register(vec![1; 64], Access::empty()).unwrap();
    assert_eq!(server.send(SendOp::RdmaWrite { remote_addr: a.addr(), rkey: a.rkey() }, vec![sge(&data)]).status, WcStatus::Success);
    assert_eq!(server.send(SendOp::SendWithInvalidate { rkey: a.rkey() }, vec![sge(&msg)]).status, WcStatus::Success);
    let got = client.next();
    assert_eq!(got.status, WcStatus::Success);
    assert_eq!(got.invalidated_rkey, Some(a.rkey()), "the receiver learns the invalidated key");
    a.read(&mut |d| assert!(d.iter().all(|&x| x == 0x33)));
    // Revoking an already invalidated window posts nothing (a second invalidation would break
    // rxe's queue pair); the other window still works.
    a.invalidate();
    assert_eq!(server.send(SendOp::RdmaWrite { remote_addr: b.addr(), rkey: b.rkey() }, vec![sge(&data)]).status, WcStatus::Success);
    // A key revoked locally is dead too.
    b.invalidate();
    std::thread::sleep(Duration::from_millis(500));
    server
        .qp
        .post_send(SendWr {
            wr_id: 9,
            op: SendOp::RdmaWrite { remote_addr: b.addr(), rkey: b.rkey() },
            sg_list: vec![sge(&data)].into(),
            unregistered: None,
            signaled: true,
        })
        .unwrap();
    assert_ne!(server.next().status, WcStatus::Success, "a write with a revoked window key must fail");
}

/// rxe cannot invalidate a plain registration (the receiver's completion fails and the
/// connection breaks while the sender sees success): with registrations per region or a
/// fixed-key pool riser's provider says the peer may not invalidate, so an iSER initiator sets
/// the 0x40 bit and revokes its keys itself.
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn rxe_plain_registrations_are_never_offered_for_remote_invalidation() {
    for keys in [KeyMode::PerRegion, KeyMode::FixedPool] {
        let dev = RdmaCore::for_address(rxe(), config(keys)).unwrap();
        assert!(!dev.remote_invalidation(), "{keys:?}");
    }
    // And the trap itself, so the guard is known to matter: the receiver's completion fails.
    let (server, client, ..) = pair(rxe(), KeyMode::PerRegion, &[], &[]);
    let sink = client.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let msg = server.pd.register(vec![1; 64], Access::empty()).unwrap();
    let _ = server.send(SendOp::SendWithInvalidate { rkey: sink.rkey() }, vec![sge(&msg)]);
    assert_ne!(client.next().status, WcStatus::Success, "rxe: remote invalidation of a plain MR breaks the receive");
}

/// Private data reaches the peer first in what it receives; rxe pads it (56 bytes in the
/// request, 196 in the reply), siw does not.
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn private_data_arrives_first_whatever_the_padding() {
    for ip in [rxe(), siw()] {
        let (_s, _c, seen_req, seen_rep) = pair(ip, KeyMode::Auto, &[0x80, 0, 0, 0], &[0xc0, 0, 0, 0]);
        assert!(seen_req.len() >= 4 && seen_req[..4] == [0x80, 0, 0, 0], "{ip}: request {seen_req:?}");
        assert!(seen_rep.len() >= 4 && seen_rep[..4] == [0xc0, 0, 0, 0], "{ip}: reply {seen_rep:?}");
        eprintln!("{ip}: request private data {} bytes, reply {} bytes", seen_req.len(), seen_rep.len());
    }
}

/// siw counts registered memory against RLIMIT_MEMLOCK even for root: the error names the
/// limit and `ulimit -l`.
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn siw_memlock_limit_error_names_ulimit() {
    let dev = RdmaCore::for_address(siw(), config(KeyMode::Auto)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    // util-linux's prlimit changes this process's limit (and puts it back) without unsafe code.
    let me = std::process::id().to_string();
    let prlimit = |arg: &str| {
        let out =
            std::process::Command::new("prlimit").args(["--pid", &me, arg, "--noheadings", "--output", "SOFT,HARD"]).output().unwrap();
        assert!(out.status.success(), "prlimit {arg}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect::<Vec<_>>()
    };
    let old = prlimit("--memlock");
    let hard = old.get(1).cloned().unwrap_or_else(|| "unlimited".into());
    prlimit(&format!("--memlock=262144:{hard}"));
    let r = pd.register(vec![1u8; 8 << 20], Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    prlimit(&format!("--memlock={}:{hard}", old.first().cloned().unwrap_or_else(|| "unlimited".into())));
    match r {
        Err(e @ Error::Registration(RegistrationError::RegMr { memlock_kib: Some(256), .. })) => {
            assert!(e.to_string().contains("ulimit -l") && e.to_string().contains("RLIMIT_MEMLOCK"), "{e}");
        }
        other => panic!("8 MiB under a 256 KiB memlock limit on siw must fail clearly, got {other:?}"),
    }
}

/// siw completes an RDMA Read when its response has arrived, after Sends posted later have
/// completed: both completions must reach the consumer, each with its own id and kind (riser
/// once assumed send-queue order and dropped the Read's, which hung an iSER write).
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn siw_read_completing_after_a_later_send_is_not_lost() {
    let (server, client, ..) = pair(siw(), KeyMode::Auto, &[], &[]);
    let src = client.pd.register((0..(4u32 << 20)).map(|i| (i % 251) as u8).collect(), Access::REMOTE_READ).unwrap();
    let sink = server.pd.register(vec![0; 4 << 20], Access::LOCAL_WRITE | Access::READ_SINK).unwrap();
    let msg = server.pd.register(vec![7; 64], Access::empty()).unwrap();
    let read = SendOp::RdmaRead { remote_addr: src.addr(), rkey: src.rkey() };
    server.qp.post_send(SendWr { wr_id: 41, op: read, sg_list: vec![sge(&sink)].into(), unregistered: None, signaled: true }).unwrap();
    server
        .qp
        .post_send(SendWr { wr_id: 42, op: SendOp::Send, sg_list: vec![sge(&msg)].into(), unregistered: None, signaled: true })
        .unwrap();
    let (a, b) = (server.next(), server.next());
    eprintln!("completion order: {} then {}", a.wr_id, b.wr_id);
    let mut got = [(a.wr_id, a.opcode, a.status), (b.wr_id, b.opcode, b.status)];
    got.sort_by_key(|g| g.0);
    assert_eq!(got, [(41, WcOpcode::RdmaRead, WcStatus::Success), (42, WcOpcode::Send, WcStatus::Success)]);
    sink.read(&mut |d| assert!(d.iter().enumerate().all(|(i, &x)| x == (i % 251) as u8)));
    assert_eq!(client.next().opcode, WcOpcode::Recv);
}

/// siw transmits a large request posted unsignaled from the registered memory itself
/// (sendpage), and counts it complete once handed to TCP: its pages may still wait — in the
/// peer's socket backlog while the peer is sending itself — when a later request's completion
/// says it is done, so memory reused then arrived with its new bytes (an iSER target recycles
/// read data that way; a lab run read back 256 KiB of another command's data). riser signals
/// such requests on siw (siw then copies them) and keeps their completions to itself: the
/// consumer's rule holds — an unsignaled request's memory is free once a later request has
/// completed. The receiving side sends all the while (RDMA Writes the other way).
#[test]
#[ignore = "needs an RDMA device: run in the lab VM (cargo xtask lab)"]
fn siw_unsignaled_memory_is_free_once_a_later_request_completed() {
    const K: usize = 16;
    const LEN: usize = 256 << 10;
    const NOISE: u64 = 500;
    let (server, client, ..) = pair(siw(), KeyMode::Auto, &[], &[]);
    let sink = server.pd.register(vec![0; K * LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let noise = server.pd.register(vec![5; LEN], Access::empty()).unwrap();
    let scratch = client.pd.register(vec![0; LEN], Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
    let bufs: Vec<_> = (0..K).map(|_| client.pd.register(vec![0; LEN], Access::empty()).unwrap()).collect();
    let msg = client.pd.register(vec![7; 64], Access::empty()).unwrap();
    let ack = server.pd.register(vec![9; 64], Access::empty()).unwrap();
    let byte = |round: usize, k: usize, i: usize| (round * 31 + k * 7 + i / 4096) as u8;
    let (mut rounds, mut corrupt) = (0usize, Vec::new());
    let start = std::time::Instant::now();
    while rounds < 200 && start.elapsed() < Duration::from_secs(40) {
        // The receiving side keeps its socket busy sending.
        for n in 0..K as u64 {
            let op = SendOp::RdmaWrite { remote_addr: scratch.addr(), rkey: scratch.rkey() };
            server
                .qp
                .post_send(SendWr {
                    wr_id: NOISE + n,
                    op,
                    sg_list: vec![sge(&noise)].into(),
                    unregistered: None,
                    signaled: n + 1 == K as u64,
                })
                .unwrap();
        }
        for (k, b) in bufs.iter().enumerate() {
            b.write(&mut |d| d.iter_mut().enumerate().for_each(|(i, x)| *x = byte(rounds, k, i)));
            let op = SendOp::RdmaWrite { remote_addr: sink.addr() + (k * LEN) as u64, rkey: sink.rkey() };
            client
                .qp
                .post_send(SendWr { wr_id: 100 + k as u64, op, sg_list: vec![sge(b)].into(), unregistered: None, signaled: false })
                .unwrap();
        }
        let wc = client.send(SendOp::Send, vec![sge(&msg)]);
        assert_eq!((wc.wr_id, wc.status), (7, WcStatus::Success), "only the signaled request completes: {wc:?}");
        // Done, by the rule: the buffers are reused at once.
        bufs.iter().for_each(|b| b.write(&mut |d| d.fill(0xee)));
        let mut got = [server.next(), server.next()].map(|wc| (wc.opcode, wc.status, wc.wr_id));
        got.sort_by_key(|g| g.2);
        assert_eq!(got, [(WcOpcode::RdmaWrite, WcStatus::Success, NOISE + K as u64 - 1), (WcOpcode::Recv, WcStatus::Success, 1000)]);
        server.post_recv();
        sink.read(&mut |d| {
            let bad = d.iter().enumerate().filter(|&(i, &x)| x != byte(rounds, i / LEN, i % LEN)).count();
            if bad > 0 {
                corrupt.push((rounds, bad));
            }
        });
        assert_eq!(server.send(SendOp::Send, vec![sge(&ack)]).status, WcStatus::Success);
        assert_eq!(client.next().opcode, WcOpcode::Recv);
        client.post_recv();
        rounds += 1;
    }
    eprintln!("{rounds} rounds of {K} unsignaled {} KiB RDMA Writes in {:?}", LEN >> 10, start.elapsed());
    assert!(corrupt.is_empty(), "rounds with bytes changed after completion (round, bytes): {corrupt:?}");
}
