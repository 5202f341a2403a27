//! Unit tests of the PDU datamover: login-phase reads over a loopback link, and the sends
//! that need no waiting (the seam's `try_` calls) over a socket.

use super::*;
use crate::loopback::{RawEnd, pair};
use riser_datamover::{DataInError, Terminated, Violation};
use riser_iscsi::wire::{BHS_LEN, DataIn, DecodeError, LoginRequest, NopIn, NopOut, Pdu, RESERVED_TAG, Stage};

/// A target datamover on one end of a loopback link, the other end driven by hand.
fn target() -> (PduDatamover, RawEnd) {
    let ((a_rx, a_tx), (b_rx, b_tx)) = pair();
    let (dm, driver) = PduDatamover::new(Role::Target, Box::new(a_rx), Box::new(a_tx));
    tokio::spawn(driver);
    (dm, RawEnd { rx: b_rx, tx: b_tx })
}

fn final_login() -> Header {
    Header::LoginRequest(LoginRequest { transit: true, nsg: Stage::FULL_FEATURE, ..LoginRequest::default() })
}

fn ping_with(len: usize) -> (Header, Bytes) {
    (Header::NopOut(NopOut { immediate: true, itt: 5, ttt: RESERVED_TAG, ..NopOut::default() }), Bytes::from(vec![7u8; len]))
}

#[tokio::test]
async fn nothing_is_read_ahead_of_login_so_the_first_full_feature_pdu_gets_the_new_limits() {
    let (dm, peer) = target();
    // The initiator's first full-feature PDU follows the final login PDU at once, with a
    // data segment beyond the login phase's 8 KiB limit but within the negotiated one.
    peer.send(final_login(), Bytes::new()).unwrap();
    let (h, d) = ping_with(16_384);
    peer.send(h, d.clone()).unwrap();
    assert!(matches!(dm.next_event().await, DmEvent::Control(p) if matches!(p.header, Header::LoginRequest(_))));
    let p = NegotiatedParams { target_recv_data_segment_length: 65_536, ..NegotiatedParams::default() };
    dm.notice_key_values(&p);
    dm.enable();
    match dm.next_event().await {
        DmEvent::Control(p) => assert_eq!((p.header, p.data), (h, d)),
        other => panic!("expected the NOP-Out, got {other:?}"),
    }
}

#[tokio::test]
async fn the_login_limit_holds_until_new_values_are_noticed() {
    let (dm, peer) = target();
    peer.send(final_login(), Bytes::new()).unwrap();
    let (h, d) = ping_with(16_384);
    peer.send(h, d).unwrap();
    assert!(matches!(dm.next_event().await, DmEvent::Control(_)));
    dm.enable();
    let expected = DmError::Decode(DecodeError::DataSegmentTooLong { len: 16_384, max: 8192 });
    match dm.next_event().await {
        DmEvent::Terminated(Terminated::Error(e)) => assert_eq!(e, expected),
        other => panic!("expected the connection to end, got {other:?}"),
    }
}

/// The receive loop reads no further ahead of the iSCSI layer than the command window and
/// `BACKLOG_SLACK` PDUs: a peer that keeps sending while the session waits (a task management
/// function waiting for a backend write, say) waits in turn, as TCP makes it, instead of
/// having everything it sends queued. Once events are taken the rest is read, in order.
#[tokio::test(flavor = "current_thread")]
async fn a_target_reads_no_further_ahead_than_its_window_and_a_few_immediate_pdus() {
    use riser_datamover::BACKLOG_SLACK;
    let (dm, peer) = target();
    peer.send(final_login(), Bytes::new()).unwrap();
    assert!(matches!(dm.next_event().await, DmEvent::Control(_)));
    dm.allocate_connection_resources(ConnectionResources { commands: 16 }).unwrap();
    dm.enable();
    let sent = 500u32;
    for itt in 0..sent {
        let ping = NopOut { immediate: true, itt, ttt: RESERVED_TAG, ..NopOut::default() };
        peer.send(Header::NopOut(ping), Bytes::new()).unwrap();
    }
    // The receive loop runs while this task sleeps (one thread: nothing runs while it takes).
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut got = Vec::new();
    while let Some(e) = dm.try_next_event() {
        got.push(e);
    }
    assert_eq!(got.len(), 16 + BACKLOG_SLACK, "read ahead at most the window and the slack");
    while got.len() < sent as usize {
        got.push(tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.expect("the rest is read"));
    }
    let itts: Vec<u32> = got.iter().map(|e| if let DmEvent::Control(p) = e { p.header.itt() } else { panic!("{e:?}") }).collect();
    assert_eq!(itts, (0..sent).collect::<Vec<_>>());
}

/// A command reusing the tag of a write the datamover holds takes nothing, and its discard
/// (Task in progress) leaves the write alone; but the write's own end (here an abort handled
/// before the reusing command, which waited behind it) frees it whatever was counted — it
/// stayed until the connection ended, and a peer could repeat it for 64 MiB a time.
#[tokio::test(flavor = "current_thread")]
async fn an_aborted_write_is_freed_though_a_command_reusing_its_tag_waits_behind_the_abort() {
    let (dm, peer) = target();
    peer.send(final_login(), Bytes::new()).unwrap();
    assert!(matches!(dm.next_event().await, DmEvent::Control(_)));
    dm.enable();
    let write =
        |itt| Header::ScsiCommand(ScsiCommand { itt, write: true, final_: true, expected_data_len: 65536, ..ScsiCommand::default() });
    let read = |itt| Header::ScsiCommand(ScsiCommand { itt, read: true, final_: true, expected_data_len: 512, ..ScsiCommand::default() });
    for h in [write(7), read(7), write(8), read(8)] {
        peer.send(h, Bytes::new()).unwrap();
        assert!(matches!(next_event_soon(&dm).await, DmEvent::Control(_)));
    }
    let held = |itt| lock(&dm.shared.writes).contains_key(&itt);
    assert!(held(7) && held(8));
    // 7: aborted before its duplicate is seen (which the session then takes as a new task).
    dm.deallocate_task_resources(7);
    assert!(!held(7), "the aborted write's buffer is freed");
    // 8: the duplicate is discarded first (Task in progress): the write stays, until its end.
    dm.discard_command(8);
    assert!(held(8), "the running write keeps its buffer");
    dm.deallocate_task_resources(8);
    assert!(!held(8));
}

/// A sending half that records the framing each PDU went out with.
struct RecordingTx(Arc<StdMutex<Vec<(u8, LinkParams)>>>, LinkParams);

impl LinkTx for RecordingTx {
    fn queue_pdu(&mut self, header: &Header, _: &[u8], _: Bytes) -> Result<bool, DmError> {
        self.0.lock().unwrap().push((header.opcode().0, self.1));
        Ok(false)
    }
    fn poll_flush(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), DmError>> {
        std::task::Poll::Ready(Ok(()))
    }
    fn set_params(&mut self, p: LinkParams) {
        self.1 = p;
    }
    fn shutdown(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

#[tokio::test]
async fn values_noticed_before_the_final_login_response_frame_only_what_follows_enable() {
    let ((a_rx, _a_tx), _peer) = pair();
    let sent = Arc::new(StdMutex::new(Vec::new()));
    let tx = RecordingTx(sent.clone(), LinkParams::default());
    let (dm, driver) = PduDatamover::new(Role::Target, Box::new(a_rx), Box::new(tx));
    tokio::spawn(driver);
    let digests = NegotiatedParams {
        header_digest: riser_iscsi::keys::Digest::Crc32c,
        data_digest: riser_iscsi::keys::Digest::Crc32c,
        ..NegotiatedParams::default()
    };
    // The target's order: resources and values, the final Login Response, then Enable.
    dm.notice_key_values(&digests);
    let last = riser_iscsi::wire::LoginResponse { transit: true, nsg: Stage::FULL_FEATURE, ..Default::default() };
    dm.send_control(ControlPdu::new(Header::LoginResponse(last), Bytes::new())).await.unwrap();
    dm.enable();
    let nop = NopIn { itt: 1, ..Default::default() };
    dm.send_control(ControlPdu::new(Header::NopIn(nop), Bytes::new())).await.unwrap();
    let sent = sent.lock().unwrap().clone();
    assert_eq!(sent[0].1.header_digest, riser_iscsi::keys::Digest::None, "the final Login Response is framed as login");
    assert_eq!(sent[1].1.header_digest, riser_iscsi::keys::Digest::Crc32c, "the first full-feature PDU has the digests");
}

#[tokio::test]
async fn terminating_during_login_ends_a_waiting_next_event() {
    let (dm, _peer) = target();
    let waiting = tokio::spawn({
        let dm = dm.clone();
        async move { dm.next_event().await }
    });
    tokio::task::yield_now().await;
    dm.terminate();
    let ev = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("next_event ends").unwrap();
    assert!(matches!(ev, DmEvent::Terminated(Terminated::Local)), "{ev:?}");
}

#[tokio::test]
async fn a_peer_closing_during_login_is_reported() {
    let (dm, peer) = target();
    drop(peer);
    assert!(matches!(dm.next_event().await, DmEvent::Terminated(Terminated::PeerClosed)));
}

/// An initiator over a real socket, enabled (full feature phase), and the target's end as a
/// plain non-blocking socket.
async fn initiator_on_socket() -> (PduDatamover, std::net::TcpStream) {
    initiator_on_socket_polling(None).await
}

/// [`initiator_on_socket`] with busy polling.
async fn initiator_on_socket_polling(busy_poll: Option<Duration>) -> (PduDatamover, std::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (r, w) = client.into_split();
    let (dm, driver) =
        PduDatamover::new(Role::Initiator, Box::new(crate::TcpRx::new(r).busy_poll(busy_poll)), Box::new(crate::TcpTx::new(w)));
    tokio::spawn(driver);
    dm.enable();
    let server = server.into_std().unwrap();
    server.set_nonblocking(true).unwrap();
    (dm, server)
}

/// Bytes that have arrived at `s` (without waiting).
fn arrived(s: &mut std::net::TcpStream) -> usize {
    use std::io::Read;
    let mut buf = [0u8; 64 << 10];
    let mut n = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return n,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return n,
            Err(e) => panic!("{e}"),
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn an_initiators_commands_leave_every_flush_every_and_the_rest_once_its_tasks_have_run() {
    let (dm, mut target) = initiator_on_socket().await;
    let cmd = |itt| ScsiCommand { itt, read: true, ..ScsiCommand::default() };
    // One runtime thread, and no await that yields: the flusher cannot run meanwhile.
    for itt in 0..FLUSH_EVERY as u32 - 1 {
        dm.send_command(cmd(itt), Bytes::new(), 0, None).await.unwrap();
    }
    assert_eq!(arrived(&mut target), 0, "commands left before FLUSH_EVERY were gathered");
    dm.send_command(cmd(99), Bytes::new(), 0, None).await.unwrap();
    assert_eq!(arrived(&mut target), FLUSH_EVERY * BHS_LEN, "FLUSH_EVERY commands leave together, at once");
    dm.send_command(cmd(100), Bytes::new(), 0, None).await.unwrap();
    assert_eq!(arrived(&mut target), 0);
    // The flusher writes the rest once the ready tasks (this one) let it run.
    let mut n = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        n += arrived(&mut target);
        if n > 0 {
            break;
        }
    }
    assert_eq!(n, BHS_LEN);
}

/// Busy polling keeps looking for the next PDU for its budget without holding up the runtime's
/// other tasks (one runtime thread here), then sleeps until bytes arrive: a PDU that comes
/// during the budget and one that comes long after it are both received.
#[tokio::test(flavor = "current_thread")]
async fn a_polling_receiver_lets_other_tasks_run_and_still_sleeps_when_the_budget_is_spent() {
    use std::io::Write;
    use std::sync::atomic::{AtomicU64, Ordering};
    let budget = Duration::from_secs(2);
    let (dm, mut target) = initiator_on_socket_polling(Some(budget)).await;
    let nop = |ttt| {
        let mut v = Vec::new();
        let h = Header::NopIn(NopIn { itt: RESERVED_TAG, ttt, stat_sn: 1, exp_cmd_sn: 1, max_cmd_sn: 2, ..NopIn::default() });
        Pdu::new(h, &[][..], &[][..]).encode(&mut v);
        v
    };
    let ticks = Arc::new(AtomicU64::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                ticks.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    for (ttt, after) in [(5, Duration::from_millis(20)), (6, budget + Duration::from_millis(500))] {
        // The receiver is polling (or, past its budget, asleep) meanwhile; the ticker and this
        // task's timer go on: the sleep ends long before the budget would have.
        let (before, t0) = (ticks.load(Ordering::Relaxed), std::time::Instant::now());
        tokio::time::sleep(after).await;
        assert!(t0.elapsed() < after + budget / 2, "the receiver held up the runtime for {:?}", t0.elapsed());
        assert!(ticks.load(Ordering::Relaxed) > before + 10, "other tasks ran while the receiver polled");
        target.write_all(&nop(ttt)).unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.expect("the NOP-In is received");
        assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::NopIn(n), .. }) if n.ttt == ttt), "{ev:?}");
    }
    ticker.abort();
}

/// A target that ends a connection while the initiator still sends (here a NOP-Out after the
/// end) and has not yet read what the target sent: every byte the target sent arrives, then the
/// end of the stream — not a reset, which would have thrown away what was still queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_the_target_ends_delivers_everything_it_sent_before_closing() {
    use std::io::{Read, Write};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (dm, driver) = crate::datamover(server, Role::Target);
    tokio::spawn(driver);
    dm.enable();
    // More than the peer's receive buffer takes before it reads: most of it is still queued on
    // the target's side when the connection ends.
    let (pdus, len) = (24u32, 64usize << 10);
    for k in 0..pdus {
        let nop = NopIn { itt: k, ttt: RESERVED_TAG, stat_sn: k, ..NopIn::default() };
        dm.send_control(ControlPdu::new(Header::NopIn(nop), Bytes::from(vec![k as u8; len]))).await.unwrap();
    }
    dm.terminate();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The peer had more to say: it arrives after the end, unread.
    let ping = NopOut { immediate: true, itt: 99, ttt: RESERVED_TAG, ..NopOut::default() };
    let mut bytes = Vec::new();
    Pdu::new(Header::NopOut(ping), &[][..], &[][..]).encode(&mut bytes);
    peer.write_all(&bytes).unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    drop(dm);
    let got = tokio::task::spawn_blocking(move || {
        let mut all = Vec::new();
        let end = peer.read_to_end(&mut all);
        (all.len(), end.map(|_| ()).map_err(|e| e.kind()))
    })
    .await
    .unwrap();
    assert_eq!(got, (pdus as usize * (BHS_LEN + len), Ok(())), "everything the target sent, then the end of the stream");
}

/// A target over a real socket, enabled with `params` noticed, and the initiator's end as a
/// plain non-blocking socket.
async fn target_on_socket(params: &NegotiatedParams) -> (PduDatamover, std::net::TcpStream) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (server, _) = listener.accept().await.unwrap();
    let (dm, driver) = crate::datamover(server, Role::Target);
    tokio::spawn(driver);
    dm.notice_key_values(params);
    dm.enable();
    client.set_nonblocking(true).unwrap();
    (dm, client)
}

/// The PDUs in `bytes` (no digests), as (header, data length).
fn pdus_in(mut bytes: &[u8]) -> Vec<(Header, usize)> {
    let mut out = Vec::new();
    while bytes.len() >= BHS_LEN {
        let bhs = riser_iscsi::wire::Bhs::new_unchecked(&bytes[..BHS_LEN]);
        let layout = riser_iscsi::wire::PduLayout::of(&bhs, u32::MAX).unwrap();
        out.push((Header::parse(&bhs).unwrap(), layout.data_len));
        bytes = &bytes[BHS_LEN + layout.ahs_len + riser_iscsi::wire::pad4(layout.data_len)..];
    }
    out
}

/// A target's sends without a future (`try_send_control`, `try_put_data`,
/// `try_release_sends`): while its session gathers, a response and a read's data (one Data-In,
/// the status collapsed into it) are taken at once and leave together, in order, at the
/// release; outside a turn, before the negotiated framing applies, and for data beyond one
/// Data-In, nothing is sent and everything comes back for the waiting call.
#[tokio::test(flavor = "current_thread")]
async fn a_targets_sends_without_waiting_join_the_turn_and_leave_at_its_release() {
    use std::io::Read;
    let params = NegotiatedParams { initiator_recv_data_segment_length: 8192, ..NegotiatedParams::default() };
    let (dm, mut peer) = target_on_socket(&params).await;
    let nop = |itt| ControlPdu::new(Header::NopIn(NopIn { itt, ttt: RESERVED_TAG, ..NopIn::default() }), Bytes::from(vec![itt as u8; 10]));
    let read = |itt| DataInDesc {
        itt,
        lun: riser_scsi::lun::Lun::ZERO,
        offset: 0,
        data_sn: 0,
        collapse_status: Some(riser_datamover::CollapsedStatus {
            status: riser_scsi::sense::Status::GOOD,
            underflow: false,
            overflow: false,
            residual: 0,
            stat_sn: 7,
            exp_cmd_sn: 1,
            max_cmd_sn: 2,
        }),
    };
    // Outside a turn: nothing taken.
    match dm.try_send_control(nop(1)) {
        Attempt::WouldWait(p) => assert_eq!(p, nop(1), "the PDU comes back as it was"),
        Attempt::Done(r) => panic!("sent outside a turn: {r:?}"),
    }
    dm.hold_sends();
    // The framing noticed applies with the first PDU sent the waiting way.
    assert!(matches!(dm.try_send_control(nop(2)), Attempt::WouldWait(_)), "taken before the new framing applied");
    dm.send_control(nop(2)).await.unwrap();
    assert!(matches!(dm.try_send_control(nop(3)), Attempt::Done(Ok(()))));
    match dm.try_put_data(read(4), Bytes::from(vec![4u8; 4096])) {
        Attempt::Done(Ok(done)) => assert_eq!(done, PutDataDone { pdus: 1, status_sent: true }),
        other => panic!("a 4 KiB read was not taken at once: {other:?}"),
    }
    // Two Data-In PDUs' worth: the waiting call's.
    match dm.try_put_data(read(5), Bytes::from(vec![5u8; 8193])) {
        Attempt::WouldWait((desc, data)) => assert_eq!((desc, data.len()), (read(5), 8193)),
        other => panic!("data beyond one Data-In was taken: {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(arrived(&mut peer), 0, "something left before the release");
    assert!(matches!(dm.try_release_sends(), Attempt::Done(Ok(()))));
    let mut wire = Vec::new();
    for _ in 0..100 {
        let mut buf = [0u8; 65536];
        match peer.read(&mut buf) {
            Ok(n) => wire.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
        if pdus_in(&wire).len() == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let got: Vec<(u8, u32, usize)> = pdus_in(&wire).into_iter().map(|(h, len)| (h.opcode().0, h.itt(), len)).collect();
    let (nop_in, data_in) = (Header::NopIn(NopIn::default()).opcode().0, Header::DataIn(DataIn::default()).opcode().0);
    assert_eq!(got, vec![(nop_in, 2, 10), (nop_in, 3, 10), (data_in, 4, 4096)]);
    // The turn is over: sends wait again.
    assert!(matches!(dm.try_send_control(nop(6)), Attempt::WouldWait(_)));
}

/// An initiator's read command sent without a future: its read buffer is registered before it
/// can leave, and it leaves with the flusher; a write (its data may be solicited) is left to
/// the waiting call, with nothing registered.
#[tokio::test(flavor = "current_thread")]
async fn an_initiators_read_is_sent_without_waiting_and_a_write_is_left_to_the_waiting_call() {
    let (dm, mut target) = initiator_on_socket().await;
    // The first full-feature PDU applies the framing (sent the waiting way).
    dm.send_command(ScsiCommand { itt: 1, read: true, ..ScsiCommand::default() }, Bytes::new(), 0, None).await.unwrap();
    let read = ScsiCommand { itt: 2, read: true, expected_data_len: 4096, ..ScsiCommand::default() };
    assert!(matches!(dm.try_send_command(read, Bytes::new(), 4096, None), Attempt::Done(Ok(()))));
    assert_eq!(lock(&dm.shared.reads).get(&2).map(|t| t.buf.len()), Some(4096));
    let write = ScsiCommand { itt: 3, write: true, expected_data_len: 512, ..ScsiCommand::default() };
    match dm.try_send_command(write, Bytes::new(), 0, Some(Bytes::from(vec![3u8; 512]))) {
        Attempt::WouldWait(a) => assert_eq!((a.cmd, a.read_len, a.write.map(|w| w.len())), (write, 0, Some(512))),
        other => panic!("a write was sent without waiting: {other:?}"),
    }
    let mut n = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        n += arrived(&mut target);
        if n >= 2 * BHS_LEN {
            break;
        }
    }
    assert_eq!(n, 2 * BHS_LEN, "both commands leave with the flusher, the write not at all");
}

/// One PDU as the wire carries it (no digests).
fn wire_pdu(h: Header, data: &[u8]) -> Vec<u8> {
    let mut bhs = [0u8; BHS_LEN];
    h.emit(&mut bhs, 0, data.len() as u32);
    let mut v = bhs.to_vec();
    v.extend_from_slice(data);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

/// The next event that is not a control PDU the test does not look at, within 5 s.
async fn next_event_soon(dm: &PduDatamover) -> DmEvent {
    tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.expect("an event within 5 s")
}

fn data_in(itt: u32, data_sn: u32, buffer_offset: u32) -> DataIn {
    DataIn { itt, data_sn, buffer_offset, ttt: RESERVED_TAG, ..DataIn::default() }
}

fn good(d: DataIn) -> DataIn {
    DataIn { final_: true, status_present: true, status: riser_scsi::sense::Status::GOOD, ..d }
}

/// What the initiator's datamover makes of a target's answers to an 8 KiB read (itt 1) and a
/// 64 KiB write (itt 2, the first 8 KiB immediate): `None` when they are taken, else the
/// connection's error (RFC 7143 §11.7–11.8; at ErrorRecoveryLevel 0 the connection ends, as
/// Linux's initiator ends it on a DataSN, offset or R2TSN error).
async fn initiator_meets(answers: &[(Header, usize)]) -> Option<DmError> {
    use std::io::Write;
    let (dm, mut target) = initiator_on_socket().await;
    dm.send_command(ScsiCommand { itt: 1, read: true, expected_data_len: 8192, ..ScsiCommand::default() }, Bytes::new(), 8192, None)
        .await
        .unwrap();
    let write = ScsiCommand { itt: 2, write: true, expected_data_len: 65536, ..ScsiCommand::default() };
    dm.send_command(write, Bytes::new(), 0, Some(Bytes::from(vec![2u8; 65536]))).await.unwrap();
    target.set_nonblocking(false).unwrap();
    for (h, len) in answers {
        target.write_all(&wire_pdu(*h, &vec![5u8; *len])).unwrap();
    }
    // Then a NOP-In: reached only if everything before it was taken.
    let nop = NopIn { itt: 9, ttt: RESERVED_TAG, ..NopIn::default() };
    target.write_all(&wire_pdu(Header::NopIn(nop), &[])).unwrap();
    loop {
        match next_event_soon(&dm).await {
            DmEvent::Control(c) if matches!(c.header, Header::NopIn(_)) => return None,
            DmEvent::Control(_) => {}
            DmEvent::Terminated(Terminated::Error(e)) => return Some(e),
            other => panic!("unexpected event {other:?}"),
        }
    }
}

/// A target that keeps sending R2Ts while it reads none of the Data-Out they ask for: the
/// initiator answers them in order, and once `BACKLOG_DEFAULT` wait to be answered it reads
/// nothing more (the target waits, as TCP makes it) instead of queueing every R2T. When the
/// target reads again, the rest is read and answered and what followed arrives.
#[tokio::test]
async fn an_initiator_queues_no_more_r2ts_than_its_backlog_while_the_target_reads_nothing() {
    use riser_datamover::BACKLOG_DEFAULT;
    use std::io::{Read, Write};
    let (dm, mut target) = initiator_on_socket().await;
    let write = ScsiCommand { itt: 2, write: true, expected_data_len: 65536, ..ScsiCommand::default() };
    dm.send_command(write, Bytes::new(), 0, Some(Bytes::from(vec![2u8; 65536]))).await.unwrap();
    target.set_nonblocking(false).unwrap();
    // Each R2T asks for the 56 KiB not sent immediately: a few hundred fill both sockets' buffers.
    let sent = 4000u32;
    let r2ts: Vec<u8> = (0..sent)
        .flat_map(|sn| {
            wire_pdu(Header::R2t(R2t { itt: 2, ttt: 0x10, r2t_sn: sn, buffer_offset: 8192, desired_len: 57344, ..R2t::default() }), &[])
        })
        .chain(wire_pdu(Header::NopIn(NopIn { itt: 9, ttt: RESERVED_TAG, ..NopIn::default() }), &[]))
        .collect();
    let mut writer = target.try_clone().unwrap();
    let writing = std::thread::spawn(move || writer.write_all(&r2ts).unwrap());
    // The first event the initiator's layer gets is the NOP-In (the R2Ts are answered below it).
    let mut nop = Box::pin(async {
        let e = dm.next_event().await;
        assert!(matches!(&e, DmEvent::Control(c) if matches!(c.header, Header::NopIn(_))), "unexpected event {e:?}");
    });
    assert!(tokio::time::timeout(Duration::from_millis(500), nop.as_mut()).await.is_err(), "the NOP-In behind the R2Ts is not read");
    assert_eq!(dm.shared.r2t_backlog.queued(), BACKLOG_DEFAULT, "R2Ts waiting to be answered");
    // The target reads again: everything is answered, and the NOP-In arrives.
    let reading = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 20];
        let mut n = 0u64;
        while let Ok(k) = target.read(&mut buf) {
            if k == 0 {
                break;
            }
            n += k as u64;
        }
        n
    });
    tokio::time::timeout(Duration::from_secs(20), nop).await.expect("the NOP-In once the target reads");
    tokio::task::spawn_blocking(move || writing.join().unwrap()).await.unwrap();
    tokio::time::timeout(Duration::from_secs(20), async {
        while dm.shared.r2t_backlog.queued() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("every R2T taken");
    // Closed: the target reads to the end of the stream.
    dm.terminate();
    let read = tokio::task::spawn_blocking(move || reading.join().unwrap()).await.unwrap();
    assert!(read >= u64::from(sent) * 57344, "every R2T answered");
}

#[tokio::test]
async fn an_initiator_takes_only_data_in_and_r2ts_that_keep_the_rules() {
    let task = |itt, error| Some(DmError::Protocol(Violation::TaskData { itt, error }));
    let r2t =
        |r2t_sn, buffer_offset, desired_len| Header::R2t(R2t { itt: 2, ttt: 0x10, r2t_sn, buffer_offset, desired_len, ..R2t::default() });
    let response =
        |underflow, residual| Header::ScsiResponse(riser_iscsi::wire::ScsiResponse { itt: 1, underflow, residual, ..Default::default() });
    // In order, complete: taken.
    let fine = [(Header::DataIn(data_in(1, 0, 0)), 4096), (Header::DataIn(good(data_in(1, 1, 4096))), 4096), (r2t(0, 8192, 57344), 0)];
    assert_eq!(initiator_meets(&fine).await, None);
    // A DataSN skipped.
    let gap = [(Header::DataIn(data_in(1, 0, 0)), 4096), (Header::DataIn(data_in(1, 2, 4096)), 4096)];
    assert_eq!(initiator_meets(&gap).await, task(1, DataInError::SequenceNumber { expected: 1, got: 2 }));
    // Data-In going back.
    let back = [(Header::DataIn(data_in(1, 0, 4096)), 4096)];
    assert_eq!(initiator_meets(&back).await, task(1, DataInError::Offset { expected: 0, got: 4096 }));
    // Past the expected length.
    let past = [(Header::DataIn(data_in(1, 0, 0)), 4096), (Header::DataIn(data_in(1, 1, 4096)), 4100)];
    assert_eq!(initiator_meets(&past).await, task(1, DataInError::BeyondLength { end: 8196, len: 8192 }));
    // GOOD in the last Data-In with half the data and no residual.
    let short = [(Header::DataIn(good(data_in(1, 0, 0))), 4096)];
    assert_eq!(initiator_meets(&short).await, task(1, DataInError::Missing { got: 4096, due: 8192 }));
    // The same with the underflow said: taken.
    let under = [(Header::DataIn(DataIn { underflow: true, residual: 4096, ..good(data_in(1, 0, 0)) }), 4096)];
    assert_eq!(initiator_meets(&under).await, None);
    // A GOOD SCSI Response without any data; with its underflow said, taken.
    assert_eq!(initiator_meets(&[(response(false, 0), 0)]).await, task(1, DataInError::Missing { got: 0, due: 8192 }));
    assert_eq!(initiator_meets(&[(response(true, 8192), 0)]).await, None);
    // A response whose Response code is not "Command Completed at Target" has no status to
    // vouch for anything (RFC 7143 §11.4.3): the command fails, the connection goes on.
    let failed = Header::ScsiResponse(riser_iscsi::wire::ScsiResponse { itt: 1, response: 1, ..Default::default() });
    assert_eq!(initiator_meets(&[(failed, 0)]).await, None);
    // R2Ts: beyond the write, for nothing, out of order.
    assert_eq!(initiator_meets(&[(r2t(0, 8192, 65536), 0)]).await, task(2, DataInError::BeyondLength { end: 73728, len: 65536 }));
    assert_eq!(initiator_meets(&[(r2t(0, 8192, 0), 0)]).await, task(2, DataInError::EmptyR2t));
    assert_eq!(initiator_meets(&[(r2t(1, 8192, 4096), 0)]).await, task(2, DataInError::SequenceNumber { expected: 0, got: 1 }));
}

/// A read forgotten while one of its Data-In is being read (the caller took its data back: an
/// abort, a timeout) stays forgotten: the rest of the payload is read and dropped. The task
/// used to be taken out of the table for the read and put back after it, so a task forgotten
/// meanwhile came back and its buffer stayed until the connection ended.
#[tokio::test]
async fn a_read_forgotten_while_its_data_arrives_stays_forgotten() {
    use std::io::Write;
    let (dm, mut target) = initiator_on_socket().await;
    let cmd = ScsiCommand { itt: 1, read: true, expected_data_len: 8192, ..ScsiCommand::default() };
    dm.send_command(cmd, Bytes::new(), 8192, None).await.unwrap();
    target.set_nonblocking(false).unwrap();
    let pdu = wire_pdu(Header::DataIn(data_in(1, 0, 0)), &[5u8; 4096]);
    // The header and part of the payload: the receiver waits inside the read.
    target.write_all(&pdu[..BHS_LEN + 1000]).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let _ = dm.take_read_data(1);
    target.write_all(&pdu[BHS_LEN + 1000..]).unwrap();
    let nop = NopIn { itt: 9, ttt: RESERVED_TAG, ..NopIn::default() };
    target.write_all(&wire_pdu(Header::NopIn(nop), &[])).unwrap();
    let ev = next_event_soon(&dm).await;
    assert!(matches!(&ev, DmEvent::Control(c) if matches!(c.header, Header::NopIn(_))), "{ev:?}");
    assert!(lock(&dm.shared.reads).get(&1).is_none(), "the forgotten read came back");
    assert!(dm.take_read_data(1).is_none());
}

/// A read's buffer comes from the pool as it was (no memset per read): what no Data-In wrote
/// is zeroed when the buffer is handed out, so a short read never shows an earlier read's data.
#[tokio::test]
async fn a_short_read_shows_zeros_never_an_earlier_reads_data() {
    use std::io::Write;
    let (dm, mut target) = initiator_on_socket().await;
    target.set_nonblocking(false).unwrap();
    let nop = |itt| wire_pdu(Header::NopIn(NopIn { itt, ttt: RESERVED_TAG, ..NopIn::default() }), &[]);
    let until_nop = async |dm: &PduDatamover| loop {
        match next_event_soon(dm).await {
            DmEvent::Control(c) if matches!(c.header, Header::NopIn(_)) => return,
            DmEvent::Control(_) => {}
            other => panic!("unexpected event {other:?}"),
        }
    };
    // A whole read of 0xAA, its buffer given back to the pool.
    let cmd = |itt| ScsiCommand { itt, read: true, expected_data_len: 8192, ..ScsiCommand::default() };
    dm.send_command(cmd(1), Bytes::new(), 8192, None).await.unwrap();
    target.write_all(&wire_pdu(Header::DataIn(good(data_in(1, 0, 0))), &[0xAA; 8192])).unwrap();
    target.write_all(&nop(9)).unwrap();
    until_nop(&dm).await;
    let first = dm.take_read_data(1).unwrap();
    assert!(first.iter().all(|&b| b == 0xAA));
    let at = first.as_ptr();
    dm.shared.pool.give(first);
    // A read of half as much (underflow said): the same buffer, its other half zeros.
    dm.send_command(cmd(2), Bytes::new(), 8192, None).await.unwrap();
    let short = DataIn { underflow: true, residual: 4096, ..good(data_in(2, 0, 0)) };
    target.write_all(&wire_pdu(Header::DataIn(short), &[0x55; 4096])).unwrap();
    target.write_all(&nop(10)).unwrap();
    until_nop(&dm).await;
    let second = dm.take_read_data(2).unwrap();
    assert_eq!(second.as_ptr(), at, "the pool's buffer was reused");
    assert!(second[..4096].iter().all(|&b| b == 0x55));
    assert!(second[4096..].iter().all(|&b| b == 0), "an earlier read's data showed");
}
