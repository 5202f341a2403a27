//! The initiator login state machine fed arbitrary Login Responses (and other PDUs): it must
//! never panic, and once it reports an outcome it reports nothing more.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials};
use riser_iscsi::login::{InitiatorAuth, InitiatorLogin, InitiatorLoginConfig};
use riser_iscsi::wire::{Isid, Pdu};
use std::time::Duration;

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, mut rest)) = data.split_first() else { return };
    let target = (ctl & 4 == 0).then(|| "iqn.2026-11.io.riser.test:capture".to_string());
    let mut cfg = InitiatorLoginConfig::new("iqn.2026-11.io.riser:fuzz", target, Isid([0x80, 0, 0, 0, 0, 1]));
    if ctl & 1 == 1 {
        let mutual = (ctl & 2 == 2).then(|| ChapCredentials::new("target", *b"anothersecret123").unwrap());
        cfg.auth = InitiatorAuth::Chap { credentials: ChapCredentials::new("user", *b"averysecretvalue").unwrap(), algorithms: ChapAlgorithm::ALL.to_vec(), mutual };
    }
    let mut i = InitiatorLogin::new(cfg, Duration::ZERO, [2; 32]);
    let mut events = 0;
    while let Ok((pdu, used)) = Pdu::parse(rest) {
        while i.poll_transmit().is_some() {}
        i.handle_pdu(Duration::from_secs(1), &pdu.header, pdu.data);
        while i.poll_event().is_some() {
            events += 1;
        }
        assert!(events <= 1, "more than one outcome");
        rest = &rest[used..];
    }
});
