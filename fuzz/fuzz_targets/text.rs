//! Text codec, reassembly and the negotiation engine of both roles, fed arbitrary text.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iscsi::keys::negotiate::Negotiator;
use riser_iscsi::keys::{OperationalConfig, Role, Transport};
use riser_iscsi::text::{Reassembler, TextBuilder, decode_binary, parse_number, parse_pairs, split};

fuzz_target!(|data: &[u8]| {
    let Some((&ctl, text)) = data.split_first() else { return };
    // Reassemble in pieces of a size picked by the first byte.
    let mut r = Reassembler::new(16 * 1024);
    let mut whole = None;
    for (piece, cont) in split(text, usize::from(ctl).max(1)) {
        match r.push(piece, cont) {
            Ok(w) => whole = w,
            Err(_) => return,
        }
    }
    let whole = whole.unwrap_or_default();
    assert_eq!(whole, text);
    let Ok(pairs) = parse_pairs(&whole) else { return };
    for (_, v) in &pairs {
        let _ = parse_number(v);
        let _ = decode_binary(v);
    }
    let transport = if ctl & 1 == 0 { Transport::Tcp } else { Transport::Iser };
    for role in [Role::Initiator, Role::Target] {
        let mut n = Negotiator::new(role, transport, OperationalConfig::default(), ctl & 2 == 0);
        let mut out = TextBuilder::new();
        let mut offers = TextBuilder::new();
        if ctl & 4 != 0 {
            n.initiator_offers(&mut offers);
        }
        if n.receive(&pairs, &mut out).is_ok() {
            // Our answers are always well-formed text.
            parse_pairs(out.as_bytes()).expect("answers parse");
            let _ = n.target_missing_offers(&mut out);
        }
        let _ = n.params();
    }
});
