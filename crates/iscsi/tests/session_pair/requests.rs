//! Text, NOP, logout and rejects: pings, text continuation, logout, protocol errors,
//! malformed headers and unexpected answers.

use crate::harness::*;
use bytes::Bytes;
use riser_iscsi::keys::{NegotiatedParams, SessionType};
use riser_iscsi::session::{CloseReason, InitiatorEvent, TargetEvent, TargetSessionConfig};
use riser_iscsi::wire::{
    BHS_LEN, DecodeError, Header, LoginRequest, NopOut, RESERVED_TAG, RejectReason, ScsiCommand, Snack, TextRequest, TmfFunction,
};

#[test]
fn a_ping_is_echoed_with_its_data() {
    let mut p = Pair::new(4);
    let itt = p.i.ping(Bytes::from_static(b"hello"));
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Pong { itt, data: Bytes::from_static(b"hello") }]);
}

#[test]
fn a_long_text_answer_comes_in_pieces_the_initiator_asks_for() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let itt = p.i.text(b"SendTargets=All\0".to_vec());
    p.pump();
    let Some(TargetEvent::Text { req, data }) = p.take_t_events().pop() else { panic!("a text request") };
    assert_eq!(&data[..], b"SendTargets=All\0");
    let answer: Vec<u8> = (0..2000u32).map(|i| b'a' + (i % 26) as u8).collect();
    p.t.answer_text(req, answer.clone());
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::TextDone { itt, text: answer }]);
    let pieces = p.t_sent.iter().filter(|h| matches!(h, Header::TextResponse(_))).count();
    assert_eq!(pieces, 4, "2000 bytes in pieces of 512");
}

#[test]
fn a_continuation_naming_an_unknown_ttt_is_rejected() {
    let mut p = Pair::new(4);
    let bad = TextRequest { immediate: true, final_: true, itt: 9, ttt: 1234, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(bad), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::INVALID_PDU_FIELD));
}

#[test]
fn a_new_text_request_abandons_an_answer_not_fetched() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let req = TextRequest { immediate: true, final_: true, itt: 3, ttt: RESERVED_TAG, ..TextRequest::default() };
    p.t.answer_text(req, vec![b'x'; 2000]);
    let Some(first) = p.t.poll_transmit() else { panic!() };
    let Header::TextResponse(r) = first.header else { panic!() };
    p.t.handle_pdu(p.now, &Header::TextRequest(TextRequest { itt: 4, ..req }), Bytes::new(), Bytes::new(), 0);
    let stale = TextRequest { itt: 3, ttt: r.ttt, ..req };
    p.t.handle_pdu(p.now, &Header::TextRequest(stale), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(j)) if j.reason == RejectReason::INVALID_PDU_FIELD));
}

#[test]
fn logout_aborts_what_is_left_and_closes_after_its_answer() {
    let mut p = Pair::new(4);
    let t = p.command(LUN0, 512);
    let itt = p.i.logout();
    p.pump();
    let ev = p.take_t_events();
    let Some(TargetEvent::Logout { req, aborted }) = ev.into_iter().find(|e| matches!(e, TargetEvent::Logout { .. })) else { panic!() };
    assert_eq!(aborted, vec![t]);
    p.t.answer_logout(&req);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::LoggedOut { itt }));
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::Logout)]);
}

#[test]
fn snack_and_login_in_full_feature_phase_are_protocol_errors() {
    let mut p = Pair::new(4);
    for h in [Header::Snack(Snack::default()), Header::LoginRequest(LoginRequest::default())] {
        p.t.handle_pdu(p.now, &h, Bytes::new(), Bytes::new(), 0);
        p.pump();
        assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::PROTOCOL_ERROR));
    }
}

#[test]
fn an_unknown_opcode_is_not_supported() {
    let mut p = Pair::new(4);
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x1f;
    p.t.handle_pdu(p.now, &Header::Unknown(raw), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::COMMAND_NOT_SUPPORTED));
}

#[test]
fn a_discovery_session_refuses_scsi_commands_and_task_management() {
    let params = NegotiatedParams { session_type: SessionType::Discovery, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    p.deliver_command(ScsiCommand { cmd_sn: 1, itt: 2, ..ScsiCommand::default() });
    p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    p.pump();
    let rejects = p.t_sent.iter().filter(|h| matches!(h, Header::Reject(r) if r.reason == RejectReason::COMMAND_NOT_SUPPORTED)).count();
    assert_eq!(rejects, 2);
    assert!(p.commands_seen().is_empty());
}

#[test]
fn a_reject_ends_the_task_it_names_at_the_initiator() {
    let mut p = Pair::new(4);
    let bad = TextRequest { immediate: true, final_: true, ttt: 77, ..TextRequest::default() };
    let itt = p.i.text(Vec::new());
    // Replace the text request with a continuation of nothing (rejected, naming our ITT).
    let _ = p.i.poll_transmit();
    p.t.handle_pdu(p.now, &Header::TextRequest(TextRequest { itt, ..bad }), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt, reason: RejectReason::INVALID_PDU_FIELD }]);
    assert!(!p.i.has_task(itt));
}

#[test]
fn a_malformed_header_is_rejected_or_closes_by_its_reaction() {
    let mut p = Pair::new(4);
    let mut bhs = [0u8; BHS_LEN];
    bhs[0] = 0x03;
    p.t.handle_malformed(p.now, bhs, DecodeError::InvalidField("login T and C both set"));
    p.pump();
    match p.t_sent.last() {
        Some(Header::Reject(r)) => assert_eq!(r.reason, RejectReason::INVALID_PDU_FIELD),
        other => panic!("{other:?}"),
    }
    assert!(!p.t.is_closed());
    p.t.handle_malformed(p.now, bhs, DecodeError::HeaderDigest);
    p.pump();
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::Malformed(DecodeError::HeaderDigest))]);
    p.t.handle_pdu(p.now, &Header::NopOut(NopOut { immediate: true, itt: 5, ..NopOut::default() }), Bytes::new(), Bytes::new(), 0);
    assert!(p.t.poll_transmit().is_none(), "nothing is answered once closed");
}

#[test]
fn an_unexpected_answer_is_reported_not_matched() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 512);
    let stray = riser_iscsi::wire::NopIn { itt, ttt: RESERVED_TAG, ..Default::default() };
    p.i.handle_pdu(&Header::NopIn(stray), Bytes::new());
    assert!(matches!(p.i.poll_event(), Some(InitiatorEvent::Unexpected(_))));
    assert!(p.i.has_task(itt), "the command is still waiting for its status");
}
