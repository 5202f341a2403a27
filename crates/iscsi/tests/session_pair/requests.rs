//! Text, NOP, logout and rejects: pings, text continuation, logout, protocol errors,
//! malformed headers and unexpected answers.

use crate::harness::*;
use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::keys::{NegotiatedParams, SessionType};
use riser_iscsi::session::{CloseReason, InitiatorEvent, TargetEvent, TargetSessionConfig};
use riser_iscsi::wire::{
    AsyncEvent, BHS_LEN, DecodeError, Header, LoginRequest, NopOut, RESERVED_TAG, RejectReason, ScsiCommand, Snack, TextRequest,
    TmfFunction,
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

#[test]
fn a_requested_logout_is_an_async_message_that_takes_a_statsn_and_a_deadline() {
    let mut p = Pair::new(4);
    let t = p.command(LUN0, 512);
    p.t.request_logout(p.now, Duration::from_secs(5));
    assert!(p.t.logout_requested());
    p.pump();
    let Some(Header::AsyncMessage(a)) = p.t_sent.last() else { panic!("{:?}", p.t_sent) };
    assert_eq!((a.event, a.param3, a.itt, a.stat_sn), (AsyncEvent::REQUEST_LOGOUT, 5, RESERVED_TAG, 100));
    // The initiator hears it (the application decides) and takes the next StatSN after it.
    assert!(p.take_i_events().iter().any(|e| matches!(e, InitiatorEvent::Unexpected(Header::AsyncMessage(_)))));
    assert!(p.finish(t));
    assert_eq!(p.stat_sns(), vec![101]);
    // Asking again keeps the first deadline and sends nothing more.
    p.t.request_logout(Duration::from_secs(1), Duration::from_secs(60));
    assert!(p.t.poll_transmit().is_none());
    assert_eq!(p.t.poll_timeout(), Some(Duration::from_secs(5)));
    p.t.handle_timeout(Duration::from_millis(4999));
    assert!(!p.t.is_closed());
    p.t.handle_timeout(Duration::from_secs(5));
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::LogoutTimeout)));
}

#[test]
fn a_requested_logout_that_comes_in_time_ends_the_session_as_any_logout() {
    let mut p = Pair::new(4);
    p.t.request_logout(p.now, Duration::ZERO);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::AsyncMessage(a)) if a.param3 == 1), "at least a second");
    let itt = p.i.logout();
    p.pump();
    let Some(TargetEvent::Logout { req, .. }) = p.take_t_events().into_iter().find(|e| matches!(e, TargetEvent::Logout { .. })) else {
        panic!()
    };
    p.t.answer_logout(&req);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::LoggedOut { itt }));
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::Logout)]);
    assert_eq!(p.t.poll_timeout(), None);
}
