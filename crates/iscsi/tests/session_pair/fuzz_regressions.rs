//! Found by `fuzz/fuzz_targets/session_pair.rs`.

use crate::harness::*;
use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::keys::{NegotiatedParams, SessionType};
use riser_iscsi::session::{CloseReason, InitiatorEvent, Residual, TargetEvent, TargetSessionConfig, Transmit};
use riser_iscsi::wire::{Header, NopOut, RESERVED_TAG, RejectReason, TextRequest, TmfFunction, TmfResponse};
use riser_scsi::sense::Status;

#[test]
fn non_immediate_requests_that_hold_no_task_give_their_window_slot_back() {
    // A non-immediate NOP-Out, text request or task management request takes a CmdSN; it used
    // to keep its slot for ever, so `depth` of them closed the window for good.
    let mut p = Pair::new(2);
    let mut sn = 1;
    for round in 0..4u32 {
        let nop = Header::NopOut(NopOut { immediate: false, itt: 0x10 + round, ttt: RESERVED_TAG, cmd_sn: sn, ..NopOut::default() });
        let text = Header::TextRequest(TextRequest {
            final_: true,
            itt: 0x20 + round,
            ttt: RESERVED_TAG,
            cmd_sn: sn + 1,
            ..TextRequest::default()
        });
        let tmf = Header::TaskMgmtRequest(riser_iscsi::wire::TaskMgmtRequest {
            function: TmfFunction::CLEAR_ACA,
            itt: 0x30 + round,
            ref_task_tag: RESERVED_TAG,
            cmd_sn: sn + 2,
            ..Default::default()
        });
        for h in [nop, text, tmf] {
            p.t.handle_pdu(p.now, &h, Bytes::new(), Bytes::new(), 0);
        }
        sn += 3;
        assert_eq!(p.t.window(), (sn, sn + 1), "round {round}: ExpCmdSN past them, the window still 2 wide");
    }
    let answered =
        std::iter::from_fn(|| p.t.poll_event()).filter(|e| matches!(e, TargetEvent::Text { .. } | TargetEvent::TaskManagement { .. }));
    assert_eq!(answered.count(), 8, "none of them was dropped as outside the window");
}

#[test]
fn a_discovery_session_consumes_the_cmd_sn_of_a_refused_command_and_discards_it() {
    let params = NegotiatedParams { session_type: SessionType::Discovery, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(1), &params, 1, 1);
    let c = p.i.start_command(LUN0, &[0], 512, 0).unwrap();
    p.deliver_command(c);
    assert_eq!(p.take_t_events(), vec![TargetEvent::Discard { itt: c.itt }], "the datamover frees the command's buffers");
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt: c.itt, reason: RejectReason::COMMAND_NOT_SUPPORTED }]);
    assert_eq!(p.t.window(), (2, 2), "its CmdSN counts as received and its slot is free");
    assert_eq!((p.i.window().cmd_sn(), p.i.window().max_cmd_sn()), (2, 2), "the initiator may go on");
    // The text request that follows, non-immediate, is in the window (it used to be dropped).
    let text = TextRequest { final_: true, itt: 9, ttt: RESERVED_TAG, cmd_sn: 2, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(text), Bytes::new(), Bytes::new(), 0);
    assert!(matches!(p.t.poll_event(), Some(TargetEvent::Text { .. })));
}

#[test]
fn nothing_is_sent_once_the_session_closed() {
    let mut p = keepalive_pair();
    let a = p.command(LUN0, 512);
    let b = p.command(LUN0, 512);
    let tmf = p.i.task_management(TmfFunction::CLEAR_ACA, LUN0, 0);
    p.i.text(b"k=v\0".to_vec());
    p.pump();
    let Some(TargetEvent::Text { req, .. }) = p.t_events.iter().rev().find(|e| matches!(e, TargetEvent::Text { .. })).cloned() else {
        panic!("a text request")
    };
    // The ping goes unanswered: the connection is given up.
    p.t.handle_timeout(Duration::from_secs(5));
    assert!(matches!(p.t.poll_transmit(), Some(Transmit { header: Header::NopIn(_), .. })));
    p.t.handle_timeout(Duration::from_secs(15));
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Unresponsive)));
    let stat_sn = p.t.stat_sn();
    // The application finishes what it had in hand; none of it goes out.
    assert!(!p.t.finish_command(p.task(a), Status::GOOD, None, Residual::None, 0));
    assert_eq!(p.t.take_status(p.task(b)), None);
    p.t.complete_task_management(tmf);
    p.t.answer_text(req, b"x".to_vec());
    assert_eq!(p.t.poll_transmit(), None);
    assert_eq!(p.t.stat_sn(), stat_sn, "no StatSN taken");
    assert_eq!(p.t.tasks(), 0, "the tasks ended all the same");
}

#[test]
fn task_management_leaves_alone_a_command_sent_after_it() {
    // In order on one connection: ABORT TASK SET, then a command on the same LU. The target
    // handles the function before the command arrives, so the command runs to its status; the
    // initiator used to count it aborted when the function's answer came.
    let mut p = Pair::new(4);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    p.pump();
    let (_, aborted, _) = tmf_done(&mut p);
    assert!(aborted.is_empty());
    let later = p.command(LUN0, 512);
    p.t.complete_task_management(tmf);
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::COMPLETE }));
    assert!(!ev.contains(&InitiatorEvent::Aborted { itt: later }));
    assert!(p.finish(later));
    assert_eq!(
        p.take_i_events(),
        vec![InitiatorEvent::CommandDone { itt: later, status: Status::GOOD, sense: None, residual: Residual::None }]
    );
}
