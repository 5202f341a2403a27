//! The target login state machine fed an arbitrary sequence of PDUs (parsed back to back from
//! the input, as from a TCP stream), with and without CHAP. It must never panic, must answer
//! every Login Request, and must stop answering once the login has ended.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iscsi::chap::ChapCredentials;
use riser_iscsi::login::{TargetLogin, TargetLoginConfig, TargetLoginParams, TargetNode};
use riser_iscsi::wire::{Header, Pdu};
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, mut rest)) = data.split_first() else { return };
    let mut node = TargetNode::open("iqn.2026-11.io.riser.test:capture");
    if ctl & 1 == 1 {
        node.chap = Some(ChapCredentials::new("user", *b"averysecretvalue").unwrap());
    }
    if ctl & 2 == 2 {
        node.mutual_chap = Some(ChapCredentials::new("target", *b"anothersecret123").unwrap());
    }
    let cfg = TargetLoginConfig::default().target(node);
    let mut t = TargetLogin::new(cfg, TargetLoginParams { new_tsih: 1, initial_stat_sn: 0, cmd_window: 8, entropy: [1; 32] });
    let mut now = Duration::ZERO;
    while let Ok((pdu, used)) = Pdu::parse(rest) {
        let finished = t.is_finished();
        t.handle_pdu(now, &pdu.header, pdu.data);
        let mut sent = 0;
        while let Some(p) = t.poll_transmit() {
            sent += 1;
            assert!(p.data.len() <= riser_iscsi::login::LOGIN_MAX_DATA);
            let mut out = Vec::new();
            Pdu::new(Header::LoginResponse(p.header), &[][..], &p.data[..]).encode(&mut out);
        }
        if finished {
            assert_eq!(sent, 0, "answered after the login ended");
        } else {
            assert!(sent >= 1, "a login PDU went unanswered");
        }
        while t.poll_event().is_some() {}
        now += Duration::from_millis(u64::from(ctl));
        t.handle_timeout(now);
        rest = &rest[used..];
    }
});
