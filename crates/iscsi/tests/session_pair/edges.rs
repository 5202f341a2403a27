//! More of the same, at the edges: write splits, window accounting of non-command requests,
//! scrambled completions, closed sessions.

use crate::harness::*;
use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::session::{CloseReason, InitiatorEvent, Residual, TargetEvent, TargetSessionConfig};
use riser_iscsi::wire::{BHS_LEN, DecodeError, Header, NopOut, RESERVED_TAG, RejectReason, ScsiCommand, Snack, TextRequest, TmfFunction};
use riser_scsi::sense::Status;

fn write_split_for(params: &NegotiatedParams, len: u32, imm: u32, final_: bool) -> riser_iscsi::session::WriteSplit {
    let mut p = Pair::with(TargetSessionConfig::new(4), params, 1, 1);
    let c = ScsiCommand { cmd_sn: 1, itt: 1, write: true, final_, expected_data_len: len, ..ScsiCommand::default() };
    p.t.handle_pdu(p.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), imm);
    match p.t.poll_event() {
        Some(TargetEvent::Command { split, .. }) => split,
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_initial_r2t_a_command_announcing_unsolicited_data_expects_none() {
    let params = NegotiatedParams { initial_r2t: true, ..Default::default() };
    let s = write_split_for(&params, 1 << 20, 8192, false);
    assert_eq!((s.immediate, s.unsolicited_end, s.solicited()), (8192, 8192, (1 << 20) - 8192));
}

#[test]
fn without_immediate_data_the_unsolicited_burst_is_all_data_out() {
    let params = NegotiatedParams { immediate_data: false, initial_r2t: false, first_burst_length: 16_384, ..Default::default() };
    let s = write_split_for(&params, 100_000, 0, false);
    assert_eq!((s.immediate, s.unsolicited_end), (0, 16_384));
}

#[test]
fn a_write_shorter_than_first_burst_is_all_unsolicited() {
    let params = NegotiatedParams { initial_r2t: false, ..Default::default() };
    let s = write_split_for(&params, 4096, 4096, true);
    assert_eq!((s.unsolicited_end, s.solicited()), (4096, 0));
}

#[test]
fn a_plan_with_nothing_to_solicit_still_takes_a_unique_tag() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 512).unwrap();
    p.deliver_command(c);
    let split = riser_iscsi::session::WriteSplit { immediate: 512, unsolicited_end: 512, len: 512 };
    let a = p.t.plan_write(&c, split, 512);
    let b = p.t.plan_write(&c, split, 512);
    assert_eq!((a.count(), a.nth(0)), (0, None));
    assert_ne!(a.first_ttt, b.first_ttt);
}

#[test]
fn a_non_immediate_nop_out_consumes_its_cmd_sn() {
    let mut p = Pair::new(4);
    let nop = NopOut { immediate: false, itt: 9, ttt: RESERVED_TAG, cmd_sn: 1, ..NopOut::default() };
    p.t.handle_pdu(p.now, &Header::NopOut(nop), Bytes::new(), Bytes::new(), 0);
    assert_eq!(p.t.window().0, 2);
    // The same CmdSN again is a duplicate: no second answer.
    p.t.handle_pdu(p.now, &Header::NopOut(nop), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert_eq!(p.t_sent.iter().filter(|h| matches!(h, Header::NopIn(_))).count(), 1);
}

#[test]
fn non_immediate_text_and_task_management_outside_the_window_are_ignored() {
    let mut p = Pair::new(2);
    let text = TextRequest { immediate: false, final_: true, itt: 3, ttt: RESERVED_TAG, cmd_sn: 50, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(text), Bytes::new(), Bytes::new(), 0);
    let tmf =
        riser_iscsi::wire::TaskMgmtRequest { immediate: false, function: TmfFunction::ABORT_TASK_SET, cmd_sn: 50, ..Default::default() };
    p.t.handle_pdu(p.now, &Header::TaskMgmtRequest(tmf), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(p.take_t_events().is_empty());
    assert!(p.t_sent.is_empty());
}

#[test]
fn a_non_immediate_logout_is_taken_even_outside_the_window() {
    let mut p = Pair::new(2);
    let l = riser_iscsi::wire::LogoutRequest { immediate: false, itt: 4, cmd_sn: 77, ..Default::default() };
    p.t.handle_pdu(p.now, &Header::LogoutRequest(l), Bytes::new(), Bytes::new(), 0);
    assert!(matches!(p.t.poll_event(), Some(TargetEvent::Logout { .. })));
}

#[test]
fn immediate_requests_leave_the_initiators_cmd_sn_where_it_was() {
    let mut p = Pair::new(4);
    let before = p.i.window().cmd_sn();
    p.i.ping(Bytes::new());
    p.i.text(Vec::new());
    p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    assert_eq!(p.i.window().cmd_sn(), before);
    p.pump();
    assert_eq!(p.t.window().0, before, "nor the target's ExpCmdSN");
}

#[test]
fn many_commands_finished_in_scrambled_order_keep_the_window_exact() {
    let mut p = Pair::new(16);
    let mut live: Vec<u32> = Vec::new();
    let mut seed = 0x9e37_79b9u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    for _ in 0..2000 {
        if p.i.window().is_open() && next() % 3 != 0 {
            live.push(p.command(lun((next() % 2) as u16), 512));
        } else if !live.is_empty() {
            let i = next() as usize % live.len();
            let itt = live.swap_remove(i);
            assert!(p.finish(itt));
        }
        let (exp, max) = p.t.window();
        assert_eq!(p.t.tasks(), live.len());
        assert_eq!(max.wrapping_sub(exp).wrapping_add(1) as usize + live.len(), 16, "window room + held = depth");
    }
    let sns = p.stat_sns();
    assert!(sns.windows(2).all(|w| w[1] == w[0].wrapping_add(1)), "StatSN consecutive");
}

#[test]
fn data_in_without_status_leaves_the_command_waiting() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 4096);
    let d = riser_iscsi::wire::DataIn { itt, stat_sn: 0, exp_cmd_sn: 2, max_cmd_sn: 4, ..Default::default() };
    p.i.handle_pdu(&Header::DataIn(d), Bytes::new());
    assert!(p.i.has_task(itt));
    let last = riser_iscsi::wire::DataIn { status_present: true, final_: true, underflow: true, residual: 100, stat_sn: 100, ..d };
    p.i.handle_pdu(&Header::DataIn(last), Bytes::new());
    assert_eq!(
        p.i.poll_event(),
        Some(InitiatorEvent::CommandDone { itt, status: Status::GOOD, sense: None, residual: Residual::Underflow(100) })
    );
    assert_eq!(p.i.window().exp_stat_sn(), 101);
}

#[test]
fn a_command_over_the_immediate_allowance_is_rejected_to_its_initiator() {
    let cfg = TargetSessionConfig::new(4).max_immediate_commands(0);
    let mut p = Pair::with(cfg, &NegotiatedParams::default(), 1, 1);
    let c = p.i.start_command(LUN0, &[0], 0, 0).unwrap();
    p.deliver_command(ScsiCommand { immediate: true, ..c });
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt: c.itt, reason: RejectReason::IMMEDIATE_COMMAND_REJECTED }]);
}

#[test]
fn abort_task_names_its_task_by_tag_whatever_the_lun() {
    let mut p = Pair::new(4);
    let t = p.command(lun(1), 512);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, lun(0), t);
    p.pump();
    let (_, aborted, _) = tmf_done(&mut p);
    assert_eq!(aborted, vec![t]);
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::Aborted { itt: t }));
}

#[test]
fn a_closed_session_ignores_everything_and_sets_no_timer() {
    let mut p = keepalive_pair();
    p.t.handle_malformed(p.now, [0; BHS_LEN], DecodeError::BadAhsLength);
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Malformed(DecodeError::BadAhsLength))));
    assert_eq!(p.t.poll_timeout(), None);
    p.t.handle_timeout(Duration::from_secs(100));
    p.t.handle_malformed(p.now, [0; BHS_LEN], DecodeError::InvalidField("x"));
    p.command(LUN0, 0);
    assert!(p.t.poll_event().is_none() && p.t.poll_transmit().is_none());
}

#[test]
fn two_pings_in_flight_get_their_own_answers() {
    let mut p = Pair::new(4);
    let a = p.i.ping(Bytes::from_static(b"a"));
    let b = p.i.ping(Bytes::from_static(b"bb"));
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::Pong { itt: a, data: Bytes::from_static(b"a") }));
    assert!(ev.contains(&InitiatorEvent::Pong { itt: b, data: Bytes::from_static(b"bb") }));
    assert_ne!(a, b);
}

#[test]
fn a_text_answer_of_exactly_one_segment_is_one_final_pdu() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let itt = p.i.text(Vec::new());
    p.pump();
    let Some(TargetEvent::Text { req, .. }) = p.take_t_events().pop() else { panic!() };
    p.t.answer_text(req, vec![b'k'; 512]);
    p.pump();
    assert!(matches!(p.t_sent[..], [Header::TextResponse(r)] if r.final_ && !r.cont && r.ttt == RESERVED_TAG));
    assert!(matches!(&p.take_i_events()[..], [InitiatorEvent::TextDone { itt: i, text }] if *i == itt && text.len() == 512));
}

#[test]
fn stat_sn_is_consumed_by_rejects_too() {
    let mut p = Pair::new(4);
    p.t.handle_pdu(p.now, &Header::Snack(Snack::default()), Bytes::new(), Bytes::new(), 0);
    let itt = p.command(LUN0, 0);
    p.finish(itt);
    assert_eq!(p.stat_sns(), vec![100, 101]);
}

/// A target that keeps continuing its text answer: the initiator gathers at most
/// `MAX_TEXT_ANSWER`, then the exchange ends (`TextTooLong`) and further pieces are unexpected
/// (nothing more is kept; it used to gather without end).
#[test]
fn a_text_answer_continued_beyond_the_limit_ends_the_exchange() {
    use riser_iscsi::session::MAX_TEXT_ANSWER;
    use riser_iscsi::wire::TextResponse;
    let mut p = Pair::new(4);
    let itt = p.i.text(Vec::new());
    while p.i.poll_transmit().is_some() {}
    let piece = Bytes::from(vec![b'k'; 1 << 20]);
    let events = |p: &mut Pair| core::iter::from_fn(|| p.i.poll_event()).filter(|e| *e != InitiatorEvent::WindowOpen).collect::<Vec<_>>();
    let more = Header::TextResponse(TextResponse { cont: true, itt, ttt: 5, ..TextResponse::default() });
    for _ in 0..MAX_TEXT_ANSWER >> 20 {
        p.i.handle_pdu(&more, piece.clone());
        assert!(events(&mut p).is_empty(), "within the limit: gathered, the next piece asked for");
    }
    p.i.handle_pdu(&more, piece.clone());
    assert_eq!(events(&mut p), vec![InitiatorEvent::TextTooLong { itt, limit: MAX_TEXT_ANSWER }]);
    p.i.handle_pdu(&more, piece);
    assert!(matches!(&events(&mut p)[..], [InitiatorEvent::Unexpected(_)]));
}
