//! Property tests: every opcode's header value survives emit → parse, whole PDUs (with AHS and
//! data) survive encode → parse, arbitrary bytes never panic the parser, and text survives
//! encoding, random continuation splits and reassembly.

use proptest::prelude::*;
use riser_iscsi::text::{Reassembler, TextBuilder, parse_pairs, split};
use riser_iscsi::wire::*;
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

fn lun() -> impl Strategy<Value = Lun> {
    any::<[u8; 8]>().prop_map(Lun)
}

fn stage() -> impl Strategy<Value = Stage> {
    (0u8..4).prop_map(Stage)
}

fn tc() -> impl Strategy<Value = (bool, bool)> {
    prop_oneof![Just((false, false)), Just((true, false)), Just((false, true))]
}

prop_compose! {
    fn sns()(a in any::<u32>(), b in any::<u32>(), c in any::<u32>()) -> (u32, u32, u32) { (a, b, c) }
}

fn header() -> impl Strategy<Value = Header> {
    prop_oneof![
        (any::<bool>(), lun(), any::<u32>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(immediate, lun, itt, ttt, cmd_sn, exp_stat_sn)| Header::NopOut(NopOut { immediate, lun, itt, ttt, cmd_sn, exp_stat_sn })
        ),
        (any::<(bool, bool, bool, bool)>(), 0u8..8, lun(), any::<(u32, u32, u32, u32)>(), any::<[u8; 16]>()).prop_map(
            |((immediate, final_, read, write), attr, lun, (itt, expected_data_len, cmd_sn, exp_stat_sn), cdb)| {
                Header::ScsiCommand(ScsiCommand {
                    immediate,
                    final_,
                    read,
                    write,
                    attr,
                    lun,
                    itt,
                    expected_data_len,
                    cmd_sn,
                    exp_stat_sn,
                    cdb,
                })
            }
        ),
        (any::<bool>(), 0u8..128, lun(), any::<(u32, u32, u32, u32, u32, u32)>()).prop_map(
            |(immediate, f, lun, (itt, ref_task_tag, cmd_sn, exp_stat_sn, ref_cmd_sn, exp_data_sn))| {
                Header::TaskMgmtRequest(TaskMgmtRequest {
                    immediate,
                    function: TmfFunction(f),
                    lun,
                    itt,
                    ref_task_tag,
                    cmd_sn,
                    exp_stat_sn,
                    ref_cmd_sn,
                    exp_data_sn,
                })
            }
        ),
        (tc(), stage(), stage(), any::<(u8, u8)>(), any::<[u8; 6]>(), any::<u16>(), any::<(u32, u16, u32, u32)>()).prop_map(
            |((transit, cont), csg, nsg, (version_max, version_min), isid, tsih, (itt, cid, cmd_sn, exp_stat_sn))| {
                Header::LoginRequest(LoginRequest {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max,
                    version_min,
                    isid: Isid(isid),
                    tsih,
                    itt,
                    cid,
                    cmd_sn,
                    exp_stat_sn,
                })
            }
        ),
        (any::<(bool, bool, bool)>(), lun(), any::<(u32, u32, u32, u32)>()).prop_map(
            |((immediate, final_, cont), lun, (itt, ttt, cmd_sn, exp_stat_sn))| {
                Header::TextRequest(TextRequest { immediate, final_, cont, lun, itt, ttt, cmd_sn, exp_stat_sn })
            }
        ),
        (any::<bool>(), lun(), any::<(u32, u32, u32, u32, u32)>()).prop_map(
            |(final_, lun, (itt, ttt, exp_stat_sn, data_sn, buffer_offset))| Header::DataOut(DataOut {
                final_,
                lun,
                itt,
                ttt,
                exp_stat_sn,
                data_sn,
                buffer_offset
            })
        ),
        (any::<bool>(), 0u8..128, any::<(u32, u16, u32, u32)>()).prop_map(|(immediate, r, (itt, cid, cmd_sn, exp_stat_sn))| {
            Header::LogoutRequest(LogoutRequest { immediate, reason: LogoutReason(r), itt, cid, cmd_sn, exp_stat_sn })
        }),
        (0u8..16, lun(), any::<(u32, u32, u32, u32, u32)>()).prop_map(|(snack_type, lun, (itt, ttt, exp_stat_sn, beg_run, run_length))| {
            Header::Snack(Snack { snack_type, lun, itt, ttt, exp_stat_sn, beg_run, run_length })
        }),
        (lun(), any::<(u32, u32)>(), sns()).prop_map(|(lun, (itt, ttt), (stat_sn, exp_cmd_sn, max_cmd_sn))| Header::NopIn(NopIn {
            lun,
            itt,
            ttt,
            stat_sn,
            exp_cmd_sn,
            max_cmd_sn
        })),
        (any::<(bool, bool, bool, bool)>(), any::<(u8, u8)>(), any::<(u32, u32)>(), sns(), any::<(u32, u32, u32)>()).prop_map(
            |(
                (bidi_overflow, bidi_underflow, overflow, underflow),
                (response, status),
                (itt, snack_tag),
                (stat_sn, exp_cmd_sn, max_cmd_sn),
                (exp_data_sn, bidi_read_residual, residual),
            )| {
                Header::ScsiResponse(ScsiResponse {
                    bidi_overflow,
                    bidi_underflow,
                    overflow,
                    underflow,
                    response,
                    status: Status(status),
                    itt,
                    snack_tag,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    exp_data_sn,
                    bidi_read_residual,
                    residual,
                })
            }
        ),
        (any::<u8>(), any::<u32>(), sns()).prop_map(|(r, itt, (stat_sn, exp_cmd_sn, max_cmd_sn))| Header::TaskMgmtResponse(
            TaskMgmtResponse { response: TmfResponse(r), itt, stat_sn, exp_cmd_sn, max_cmd_sn }
        )),
        (tc(), stage(), stage(), any::<(u8, u8)>(), any::<[u8; 6]>(), any::<(u16, u32)>(), sns(), any::<(u8, u8)>()).prop_map(
            |(
                (transit, cont),
                csg,
                nsg,
                (version_max, version_active),
                isid,
                (tsih, itt),
                (stat_sn, exp_cmd_sn, max_cmd_sn),
                (status_class, status_detail),
            )| {
                Header::LoginResponse(LoginResponse {
                    transit,
                    cont,
                    csg,
                    nsg,
                    version_max,
                    version_active,
                    isid: Isid(isid),
                    tsih,
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    status_class,
                    status_detail,
                })
            }
        ),
        (any::<(bool, bool)>(), lun(), any::<(u32, u32)>(), sns()).prop_map(
            |((final_, cont), lun, (itt, ttt), (stat_sn, exp_cmd_sn, max_cmd_sn))| {
                Header::TextResponse(TextResponse { final_, cont, lun, itt, ttt, stat_sn, exp_cmd_sn, max_cmd_sn })
            }
        ),
        (any::<(bool, bool, bool, bool, bool)>(), any::<u8>(), lun(), any::<(u32, u32)>(), sns(), any::<(u32, u32, u32)>()).prop_map(
            |(
                (final_, ack, overflow, underflow, status_present),
                status,
                lun,
                (itt, ttt),
                (stat_sn, exp_cmd_sn, max_cmd_sn),
                (data_sn, buffer_offset, residual),
            )| {
                Header::DataIn(DataIn {
                    final_,
                    ack,
                    overflow,
                    underflow,
                    status_present,
                    status: Status(status),
                    lun,
                    itt,
                    ttt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    data_sn,
                    buffer_offset,
                    residual,
                })
            }
        ),
        (any::<u8>(), any::<u32>(), sns(), any::<(u16, u16)>()).prop_map(
            |(r, itt, (stat_sn, exp_cmd_sn, max_cmd_sn), (time2wait, time2retain))| {
                Header::LogoutResponse(LogoutResponse {
                    response: LogoutResponseCode(r),
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    time2wait,
                    time2retain,
                })
            }
        ),
        (lun(), any::<(u32, u32)>(), sns(), any::<(u32, u32, u32)>()).prop_map(
            |(lun, (itt, ttt), (stat_sn, exp_cmd_sn, max_cmd_sn), (r2t_sn, buffer_offset, desired_len))| Header::R2t(R2t {
                lun,
                itt,
                ttt,
                stat_sn,
                exp_cmd_sn,
                max_cmd_sn,
                r2t_sn,
                buffer_offset,
                desired_len
            })
        ),
        (lun(), any::<u32>(), sns(), any::<(u8, u8, u16, u16, u16)>()).prop_map(
            |(lun, itt, (stat_sn, exp_cmd_sn, max_cmd_sn), (e, vcode, param1, param2, param3))| {
                Header::AsyncMessage(AsyncMessage {
                    lun,
                    itt,
                    stat_sn,
                    exp_cmd_sn,
                    max_cmd_sn,
                    event: AsyncEvent(e),
                    vcode,
                    param1,
                    param2,
                    param3,
                })
            }
        ),
        (any::<u8>(), any::<u32>(), sns(), any::<u32>()).prop_map(|(r, itt, (stat_sn, exp_cmd_sn, max_cmd_sn), data_sn)| Header::Reject(
            Reject { reason: RejectReason(r), itt, stat_sn, exp_cmd_sn, max_cmd_sn, data_sn }
        )),
        (
            prop::sample::select(vec![0x07u8, 0x0f, 0x1c, 0x1d, 0x1e, 0x3c, 0x3d, 0x3e, 0x27, 0x30]),
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 47)
        )
            .prop_map(|(op, i, rest)| {
                let mut raw = [0u8; 48];
                raw[0] = op | if i { 0x40 } else { 0 };
                raw[1..].copy_from_slice(&rest);
                raw[4..8].fill(0);
                Header::Unknown(raw)
            }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn header_round_trip(h in header()) {
        let mut b = [0u8; BHS_LEN];
        h.emit(&mut b, 0, 0);
        let parsed = Header::parse(&Bhs::new_checked(&b[..]).unwrap()).unwrap();
        prop_assert_eq!(parsed, h);
        prop_assert_eq!(parsed.opcode(), Bhs::new_unchecked(&b[..]).opcode());
    }

    #[test]
    fn pdu_round_trip(h in header(), data in prop::collection::vec(any::<u8>(), 0..300), ext in prop::option::of(prop::collection::vec(any::<u8>(), 1..40)), bidi in prop::option::of(any::<u32>())) {
        let mut ahs = Vec::new();
        if let Some(e) = &ext { extended_cdb_ahs(&mut ahs, e); }
        if let Some(b) = bidi { bidi_read_length_ahs(&mut ahs, b); }
        let pdu = Pdu::new(h, ahs.clone(), data.clone());
        let mut bytes = Vec::new();
        pdu.encode(&mut bytes);
        prop_assert_eq!(bytes.len(), pdu.encoded_len());
        prop_assert_eq!(bytes.len() % 4, 0);
        let (p, used) = Pdu::parse(&bytes).unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(p.header, h);
        prop_assert_eq!(p.ahs, &ahs[..]);
        prop_assert_eq!(p.data, &data[..]);
        let mut again = Vec::new();
        p.encode(&mut again);
        prop_assert_eq!(again, bytes.clone());
        // The Bytes flavour hands out views of the same buffer.
        let shared = bytes::Bytes::from(bytes.clone());
        let (pb, _) = Pdu::parse_bytes(&shared).unwrap();
        prop_assert_eq!(&pb.data[..], &data[..]);
        if let (Header::ScsiCommand(c), Some(e)) = (h, &ext) {
            let mut full = c.cdb.to_vec();
            full.extend_from_slice(e);
            prop_assert_eq!(p.full_cdb().unwrap(), full);
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Ok((p, used)) = Pdu::parse(&bytes) {
            prop_assert!(used <= bytes.len());
            for a in p.ahs_iter() { let _ = a; }
            let _ = p.full_cdb();
        }
        let _ = Pdu::parse_limited(&bytes, 64, false);
    }

    #[test]
    fn truncation_is_an_error(h in header(), data in prop::collection::vec(any::<u8>(), 1..64), cut in 1usize..64) {
        let mut bytes = Vec::new();
        Pdu::new(h, Vec::new(), data).encode(&mut bytes);
        let cut = cut.min(bytes.len());
        let short = &bytes[..bytes.len() - cut];
        prop_assert!(Pdu::parse(short).is_err());
    }

    #[test]
    fn text_round_trip_with_random_splits(
        pairs in prop::collection::vec(("[A-Za-z][A-Za-z0-9.:_-]{0,30}", "[ -~]{0,60}"), 0..40),
        seg in 1usize..200,
    ) {
        let mut b = TextBuilder::new();
        for (k, v) in &pairs { b.push(k, v); }
        let text = b.into_bytes();
        let mut r = Reassembler::default();
        let mut whole = None;
        for (piece, cont) in split(&text, seg) {
            prop_assert!(piece.len() <= seg);
            whole = r.push(piece, cont).unwrap();
        }
        let whole = whole.unwrap();
        prop_assert_eq!(&whole, &text);
        let parsed = parse_pairs(&whole).unwrap();
        let expect: Vec<(&str, &str)> = pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        prop_assert_eq!(parsed, expect);
    }

    #[test]
    fn text_parser_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = parse_pairs(&bytes);
    }
}

#[test]
fn reserved_bits_ignored_on_parse_and_zero_on_emit() {
    // A NOP-Out whose reserved bytes (bytes 2-3, 32-47) and reserved flag bits are set.
    let mut b = [0u8; 48];
    b[0] = 0x40;
    b[1] = 0xff;
    b[2] = 0xaa;
    b[3] = 0x55;
    b[16..20].copy_from_slice(&7u32.to_be_bytes());
    b[32..48].fill(0xee);
    let h = Header::parse(&Bhs::new_checked(&b[..]).unwrap()).unwrap();
    assert_eq!(h, Header::NopOut(NopOut { immediate: true, itt: 7, ..NopOut::default() }));
    let mut out = [0u8; 48];
    h.emit(&mut out, 0, 0);
    assert_eq!(out[1], 0x80);
    assert_eq!(&out[2..4], &[0, 0]);
    assert!(out[32..].iter().all(|&x| x == 0));
}

#[test]
fn login_with_t_and_c_is_refused() {
    let mut b = [0u8; 48];
    b[0] = 0x43;
    b[1] = 0xc0;
    assert_eq!(Header::parse(&Bhs::new_checked(&b[..]).unwrap()), Err(DecodeError::InvalidField("login T and C both set")));
}

#[test]
fn oversized_data_segment_is_refused() {
    let mut b = vec![0u8; 48];
    b[5..8].copy_from_slice(&[0x01, 0x00, 0x01]);
    assert_eq!(Pdu::parse_limited(&b, 8192, true).unwrap_err(), DecodeError::DataSegmentTooLong { len: 65537, max: 8192 });
    assert!(matches!(Pdu::parse(&b), Err(DecodeError::Truncated { .. })));
}
