//! Unit tests of the PDU datamover: login-phase reads over a loopback link, and the placement
//! of Data-Out by its sequence.

use super::*;
use crate::loopback::{RawEnd, pair};
use riser_iscsi::wire::{DataOut, DecodeError, LoginRequest, NopOut, RESERVED_TAG, Stage};

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

/// A sending half that records the framing each PDU went out with.
struct RecordingTx(Arc<StdMutex<Vec<(u8, LinkParams)>>>, LinkParams);

impl LinkTx for RecordingTx {
    fn write_pdu<'a>(&'a mut self, header: &'a Header, _: &'a [u8], _: Bytes) -> BoxFuture<'a, Result<(), DmError>> {
        self.0.lock().unwrap().push((header.opcode().0, self.1));
        Box::pin(async { Ok(()) })
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
    let nop = riser_iscsi::wire::NopIn { itt: 1, ..Default::default() };
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

fn write_task(len: usize, unsolicited: u32) -> WriteTask {
    WriteTask {
        buf: BytesMut::zeroed(len),
        unsolicited,
        unsolicited_done: false,
        next_unsol_data_sn: 1,
        r2ts: vec![Solicited { ttt: 9, offset: 65_536, len: 8192, received: 0, next_data_sn: 0 }],
        notify: None,
        failed: None,
        reading: false,
    }
}

fn data_out(ttt: u32, offset: u32, data_sn: u32) -> DataOut {
    DataOut { ttt, buffer_offset: offset, data_sn, ..DataOut::default() }
}

#[test]
fn data_out_is_placed_only_where_its_sequence_says() {
    let t = write_task(131_072, 8192);
    let check = |d: DataOut, len| PduDatamover::check_data_out(&t, &d, len, 65_536);
    assert_eq!(check(data_out(RESERVED_TAG, 8192, 1), 8192), Ok(None));
    assert_eq!(check(data_out(RESERVED_TAG, 0, 1), 8192), Err(SequenceError::UnsolicitedOutOfOrder));
    assert_eq!(check(data_out(RESERVED_TAG, 8192, 2), 8192), Err(SequenceError::DataSn));
    assert_eq!(check(data_out(RESERVED_TAG, 8192, 1), 65_536), Err(SequenceError::BeyondFirstBurst));
    assert_eq!(check(data_out(9, 65_536, 0), 8192), Ok(Some(0)));
    assert_eq!(check(data_out(9, 65_536, 1), 8192), Err(SequenceError::DataSn));
    assert_eq!(check(data_out(9, 65_536, 0), 8193), Err(SequenceError::OutsideR2t));
    assert_eq!(check(data_out(9, 70_000, 0), 100), Err(SequenceError::OutsideR2t));
    assert_eq!(check(data_out(10, 65_536, 0), 8192), Err(SequenceError::UnknownTtt));
    let ended = WriteTask { unsolicited_done: true, ..write_task(131_072, 8192) };
    assert_eq!(
        PduDatamover::check_data_out(&ended, &data_out(RESERVED_TAG, 8192, 1), 512, 65_536),
        Err(SequenceError::UnsolicitedAfterEnd)
    );
}
