//! One complete login (initiator and target machines, every PDU through the codec) and one
//! operational negotiation round of the target.

use criterion::{Criterion, black_box, criterion_group, criterion_main};
use riser::iscsi::keys::negotiate::Negotiator;
use riser::iscsi::keys::{OperationalConfig, Role, Transport};
use riser::iscsi::login::*;
use riser::iscsi::text::{TextBuilder, parse_pairs};
use riser::iscsi::wire::{Header, Isid, Pdu};
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.io.riser:target0";

fn login() -> bool {
    let now = Duration::ZERO;
    let mut i = InitiatorLogin::new(
        InitiatorLoginConfig::new("iqn.2026-11.io.riser:bench", Some(TARGET.into()), Isid([0x80, 0, 0, 0, 0, 1])),
        now,
        [1; 32],
    );
    let mut t = TargetLogin::new(
        TargetLoginConfig::default().target(TargetNode::open(TARGET)),
        TargetLoginParams { new_tsih: 1, initial_stat_sn: 1, cmd_window: 64, entropy: [2; 32] },
    );
    let mut buf = Vec::new();
    for _ in 0..8 {
        while let Some(p) = i.poll_transmit() {
            buf.clear();
            Pdu::new(Header::LoginRequest(p.header), &[][..], &p.data[..]).encode(&mut buf);
            let (pdu, _) = Pdu::parse(&buf).unwrap();
            t.handle_pdu(now, &pdu.header, pdu.data);
        }
        while let Some(p) = t.poll_transmit() {
            buf.clear();
            Pdu::new(Header::LoginResponse(p.header), &[][..], &p.data[..]).encode(&mut buf);
            let (pdu, _) = Pdu::parse(&buf).unwrap();
            i.handle_pdu(now, &pdu.header, pdu.data);
        }
        if i.is_finished() {
            break;
        }
    }
    matches!(i.poll_event(), Some(InitiatorLoginEvent::Complete(_)))
}

fn bench(c: &mut Criterion) {
    assert!(login());
    c.bench_function("login/full", |b| b.iter(login));
    let mut offers = TextBuilder::new();
    Negotiator::new(Role::Initiator, Transport::Tcp, OperationalConfig::default(), true).initiator_offers(&mut offers);
    let text = offers.into_bytes();
    c.bench_function("login/negotiation_round", |b| {
        b.iter(|| {
            let pairs = parse_pairs(black_box(&text)).unwrap();
            let mut n = Negotiator::new(Role::Target, Transport::Tcp, OperationalConfig::default(), true);
            let mut out = TextBuilder::new();
            n.receive(&pairs, &mut out).unwrap();
            n.params()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
