//! The end of a connection over the software RNIC: what the target sent before it ended the
//! connection — held responses released by the end itself, and the Logout Response — reaches
//! the initiator, in order, before the initiator learns of the end.

use bytes::Bytes;
use riser_datamover::{ControlPdu, Datamover, DmEvent};
use riser_iscsi::wire::{Header, LogoutResponse, RESERVED_TAG, ScsiResponse, TextResponse};
use riser_iwarp::SoftRnic;
use std::time::Duration;

mod common;
use common::pair;

/// A turn of the target's: responses held, then the logout answered and the connection ended,
/// without waiting for anything in between (`busy`: with a large message still leaving ahead of
/// them, so the held ones queue behind it). The initiator gets every response, then the Logout
/// Response, then the end.
async fn logout_after_held_responses(busy: bool, responses: u32) {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    if busy {
        let text = TextResponse { final_: true, itt: 2, ttt: RESERVED_TAG, ..TextResponse::default() };
        target.send_control(ControlPdu::new(Header::TextResponse(text), Bytes::from(vec![7u8; 8000]))).await.unwrap();
    }
    target.hold_sends();
    for itt in 0..responses {
        let r = ScsiResponse { itt: 100 + itt, stat_sn: itt, ..ScsiResponse::default() };
        target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
    }
    let logout = LogoutResponse { itt: 3, stat_sn: responses, ..LogoutResponse::default() };
    target.send_control(ControlPdu::new(Header::LogoutResponse(logout), Bytes::new())).await.unwrap();
    target.terminate();
    let mut got = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.expect("the connection ends") {
            DmEvent::Control(p) => got.push(p.header),
            DmEvent::Terminated(_) => break,
            other => panic!("unexpected {other:?}"),
        }
    }
    let mut want: Vec<Header> = Vec::new();
    if busy {
        want.push(Header::TextResponse(TextResponse { final_: true, itt: 2, ttt: RESERVED_TAG, ..TextResponse::default() }));
    }
    want.extend((0..responses).map(|itt| Header::ScsiResponse(ScsiResponse { itt: 100 + itt, stat_sn: itt, ..ScsiResponse::default() })));
    want.push(Header::LogoutResponse(logout));
    assert_eq!(got, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logout_response_after_held_responses_arrives_before_the_end() {
    for n in [0, 1, 15, 16, 17, 40] {
        for busy in [false, true] {
            logout_after_held_responses(busy, n).await;
        }
    }
}
