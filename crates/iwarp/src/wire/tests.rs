//! Unit tests of the wire formats: byte-exact frames against siw captures, round trips and
//! parsers fed arbitrary bytes.

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn siw_rping_client_request_is_24_bytes() {
    let f =
        MpaFrame { reply: false, flags: 0, rev: 2, ird_ord: Some(IrdOrd { ird: 1, ord: 1, ..IrdOrd::default() }), private_data: vec![] };
    let b = f.emit();
    assert_eq!(b, [MPA_REQ_KEY.as_slice(), &hex("1002 0004 0001 0001")].concat());
    assert_eq!(MpaFrame::parse(&b).unwrap(), MpaFrame { flags: MPA_FLAG_ENHANCED, ..f });
}

#[test]
fn reply_with_crc_p2p_and_private_data() {
    let io = IrdOrd { ird: 16, ord: 8, p2p: true, write_rtr: true, read_rtr: false };
    let f = MpaFrame { reply: true, flags: MPA_FLAG_CRC | MPA_FLAG_ENHANCED, rev: 2, ird_ord: Some(io), private_data: vec![1, 2, 3] };
    let b = f.emit();
    assert_eq!(&b[16..], &hex("5002 0007 8010 8008 010203"));
    assert_eq!(MpaFrame::parse(&b).unwrap(), f);
    assert!(MpaFrame::parse(&b).unwrap().crc());
}

#[test]
fn rev1_frames_have_no_ird_ord_block() {
    let f = MpaFrame { reply: false, flags: 0, rev: 1, ird_ord: None, private_data: b"hi".to_vec() };
    let b = f.emit();
    assert_eq!(&b[16..], &hex("0001 0002 6869"));
    assert_eq!(MpaFrame::parse(&b).unwrap(), f);
}

#[test]
fn bad_frames() {
    let mut b = MpaFrame { rev: 2, ..MpaFrame::default() }.emit();
    b[0] = b'X';
    assert_eq!(MpaFrame::parse(&b), Err(WireError::BadKey));
    let mut b = MpaFrame { rev: 2, ..MpaFrame::default() }.emit();
    b[17] = 3;
    assert_eq!(MpaFrame::parse(&b), Err(WireError::BadRevision(3)));
    let mut b = MpaFrame { rev: 2, ..MpaFrame::default() }.emit();
    b[18..20].copy_from_slice(&257u16.to_be_bytes());
    assert_eq!(MpaFrame::parse(&b), Err(WireError::PrivateDataTooLong(257)));
    let mut b = MpaFrame { rev: 2, ..MpaFrame::default() }.emit();
    b[16] = MPA_FLAG_ENHANCED;
    b[18..20].copy_from_slice(&2u16.to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    assert_eq!(MpaFrame::parse(&b), Err(WireError::MissingIrdOrd));
    assert!(matches!(MpaFrame::parse(&b[..10]), Err(WireError::Truncated { .. })));
}

/// Build a whole FPDU (length, ULPDU, pad, CRC).
fn fpdu(hdr: &Header, extra: &[u8]) -> Vec<u8> {
    let mut h = [0u8; 64];
    let n = hdr.emit(&mut h);
    let mut ulpdu = h[..n].to_vec();
    ulpdu.extend_from_slice(extra);
    let mut v = (ulpdu.len() as u16).to_be_bytes().to_vec();
    v.extend_from_slice(&ulpdu);
    v.resize(v.len() + fpdu_pad(ulpdu.len()), 0);
    let crc = fpdu_crc(&[&v]);
    v.extend_from_slice(&crc);
    v
}

#[test]
fn fpdu_vectors_from_the_siw_digest() {
    // Zero-length RDMA Write, STag 1, TO 0.
    let w = fpdu(&Header::Tagged { op: Opcode::Write, last: true, stag: 1, to: 0 }, &[]);
    assert_eq!(w, hex("000e c140 00000001 0000000000000000 ebd34c5f"));
    // Zero-length Send, MSN 1.
    let s = fpdu(&Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 1, mo: 0 }, &[]);
    assert_eq!(s, hex("0012 4143 00000000 00000000 00000001 00000000 587be8c4"));
    // 16 zero bytes, MSN 1 (rping's "go ahead").
    let g = fpdu(&Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 1, mo: 0 }, &[0; 16]);
    assert_eq!(&g[..20], &hex("0022 4143 00000000 00000000 00000001 00000000")[..]);
    assert_eq!(&g[g.len() - 4..], &hex("84609a12")[..]);
    assert_eq!(g.len() % 4, 0);
}

#[test]
fn control_words_match_siw() {
    let ctl = |h: Header| {
        let mut b = [0u8; 20];
        h.emit(&mut b);
        u16::from_be_bytes([b[0], b[1]])
    };
    let t = |op, last| Header::Tagged { op, last, stag: 0, to: 0 };
    let u = |op, last| Header::Untagged { op, last, inv_stag: 0, qn: 0, msn: 0, mo: 0 };
    assert_eq!(ctl(t(Opcode::Write, true)), 0xc140);
    assert_eq!(ctl(t(Opcode::Write, false)), 0x8140);
    assert_eq!(ctl(u(Opcode::ReadRequest, true)), 0x4141);
    assert_eq!(ctl(t(Opcode::ReadResponse, true)), 0xc142);
    assert_eq!(ctl(t(Opcode::ReadResponse, false)), 0x8142);
    assert_eq!(ctl(u(Opcode::Send, false)), 0x0143);
    assert_eq!(ctl(u(Opcode::SendInvalidate, true)), 0x4144);
    assert_eq!(ctl(u(Opcode::SendSe, true)), 0x4145);
    assert_eq!(ctl(u(Opcode::SendSeInvalidate, true)), 0x4146);
    assert_eq!(ctl(u(Opcode::Terminate, true)), 0x4147);
}

#[test]
fn read_request_is_48_bytes_on_the_wire() {
    let rr = ReadRequest { sink_stag: 0x1100, sink_to: 0x7f00_0000_1000, size: 64, src_stag: 0x2200, src_to: 0x5555_0000 };
    let f = fpdu(&Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: 1, msn: 1, mo: 0 }, &rr.emit());
    assert_eq!(&f[..2], &[0x00, 0x2e], "MPA length 46");
    assert_eq!(f.len(), 2 + 46 + 4, "no pad");
    assert_eq!(ReadRequest::parse(&f[20..48]).unwrap(), rr);
    assert_eq!(&f[20..48], &hex("00001100 00007f0000001000 00000040 00002200 0000000055550000")[..]);
}

#[test]
fn header_checks_give_the_rfc_terminate() {
    let mut b = [0u8; 20];
    Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 1, mo: 0 }.emit(&mut b);
    assert!(Header::parse(&b).is_ok());
    let mut v = b;
    v[0] &= !0x01; // DDP version 0
    assert!(matches!(Header::parse(&v), Err(WireError::Violation(Term::DDP_UNTAGGED_BAD_VERSION, _))));
    let mut v = b;
    v[1] = 0x03 | 0x80; // RDMAP version 2
    assert!(matches!(Header::parse(&v), Err(WireError::Violation(Term::RDMAP_BAD_VERSION, _))));
    let mut v = b;
    v[1] = 0x48; // opcode 8
    assert!(matches!(Header::parse(&v), Err(WireError::Violation(Term::RDMAP_BAD_OPCODE, _))));
    assert!(matches!(Header::parse(&b[..10]), Err(WireError::Truncated { .. })));
}

#[test]
fn terminate_both_layouts() {
    let t = TerminateMsg {
        term: Term::DDP_TAGGED_BOUNDS,
        segment_len: Some(64),
        ddp_header: true,
        rdmap_header: false,
        attached: vec![0, 64, 0xc1, 0x40],
    };
    let b = t.emit();
    assert_eq!(&b[..4], &[0x11, 0x01, 0xc0, 0x00]);
    assert_eq!(TerminateMsg::parse(&b).unwrap(), t);
    // siw on x86: nibbles swapped, M/D at 0x01/0x02.
    let siw = [0x11u8, 0x01, 0x03, 0x00, 0, 64, 0xc1, 0x40];
    let p = TerminateMsg::parse(&siw).unwrap();
    assert_eq!(p.term, Term::DDP_TAGGED_BOUNDS);
    assert_eq!(p.segment_len, Some(64));
    let siw_rdmap = [0x20u8, 0x07, 0x00, 0x00];
    assert_eq!(TerminateMsg::parse(&siw_rdmap).unwrap().term, Term { layer: 2, etype: 0, code: 7 });
}

proptest::proptest! {
    #[test]
    fn headers_round_trip(tagged: bool, op in 0u8..8, last: bool, a: u32, b: u32, c: u32, d: u32, to: u64) {
        let op = Opcode::from_u8(op).unwrap();
        let h = if op.tagged() {
            Header::Tagged { op, last, stag: a, to }
        } else {
            Header::Untagged { op, last, inv_stag: a, qn: b, msn: c, mo: d }
        };
        let _ = tagged;
        let mut buf = [0u8; 32];
        let n = h.emit(&mut buf);
        proptest::prop_assert_eq!(Header::parse(&buf[..n]).unwrap(), h);
    }

    #[test]
    fn mpa_frames_round_trip(reply: bool, crc: bool, enhanced: bool, ird in 0u16..0x4000, ord in 0u16..0x4000, p2p: bool, w: bool, r: bool,
                             pd in proptest::collection::vec(proptest::num::u8::ANY, 0..252)) {
        let f = MpaFrame {
            reply,
            flags: if crc { MPA_FLAG_CRC } else { 0 } | if enhanced { MPA_FLAG_ENHANCED } else { 0 },
            rev: if enhanced { 2 } else { 1 },
            ird_ord: enhanced.then_some(IrdOrd { ird, ord, p2p, write_rtr: w, read_rtr: r }),
            private_data: pd,
        };
        proptest::prop_assert_eq!(MpaFrame::parse(&f.emit()).unwrap(), f);
    }

    #[test]
    fn read_requests_round_trip(a: u32, b: u64, c: u32, d: u32, e: u64) {
        let rr = ReadRequest { sink_stag: a, sink_to: b, size: c, src_stag: d, src_to: e };
        proptest::prop_assert_eq!(ReadRequest::parse(&rr.emit()).unwrap(), rr);
    }

    #[test]
    fn parsers_never_panic(b in proptest::collection::vec(proptest::num::u8::ANY, 0..80)) {
        let _ = MpaFrame::parse(&b);
        let _ = Header::parse(&b);
        let _ = ReadRequest::parse(&b);
        let _ = TerminateMsg::parse(&b);
    }
}
