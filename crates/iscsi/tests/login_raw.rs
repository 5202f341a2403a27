//! What riser's initiator never sends: hand-written Login Requests fed to the riser target (see
//! `login_harness::Raw`), the login timeout, a replay of libiscsi's captured login requests, and
//! riser's initiator against the quirks of tgt's login.

mod login_harness;

use login_harness::*;
use riser_iscsi::chap::ChapAlgorithm;
use riser_iscsi::keys::SessionType;
use riser_iscsi::keys::negotiate::NegotiationError;
use riser_iscsi::login::*;
use riser_iscsi::text::{TextBuilder, TextError, parse_pairs};
use riser_iscsi::wire::{Header, LoginRequest, LoginResponse, NopIn, NopOut, Opcode, Pdu, Reject, Stage};
use std::time::Duration;

// ---- raw requests: what riser's initiator never sends -------------------------------------

#[test]
fn c09b_discovery_session_declaring_a_target_name_is_bound_to_no_target() {
    // An initiator may declare TargetName on a discovery session; the outcome must still name no
    // target, or a server would treat the session as that target's I_T nexus (here one the ACL
    // does not even admit).
    let mut t = target_cfg();
    t.targets[0] = t.targets[0].clone().allow("iqn.2026-11.io.riser:someone-else");
    let mut raw = Raw::new(t);
    let (rsp, _) = raw.send(
        req(Stage::SECURITY, Stage::OPERATIONAL, true),
        &[("InitiatorName", INITIATOR), ("SessionType", "Discovery"), ("TargetName", TARGET), ("AuthMethod", "None")],
    );
    assert_eq!(status_of(rsp), LoginStatus::SUCCESS);
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &[]);
    assert!(rsp.transit && rsp.nsg == Stage::FULL_FEATURE);
    let Some(TargetLoginEvent::Complete(o)) = raw.tgt.poll_event() else { panic!("discovery login did not complete") };
    assert_eq!(o.params.session_type, SessionType::Discovery);
    assert_eq!(o.params.target_name, "");
}

#[test]
fn c31_missing_initiator_name() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::SECURITY, Stage::OPERATIONAL, true), &[("TargetName", TARGET), ("AuthMethod", "None")]);
    assert_eq!(status_of(rsp), LoginStatus::MISSING_PARAMETER);
    assert_eq!(raw.status(), Some(LoginStatus::MISSING_PARAMETER));
}

#[test]
fn c32_missing_target_name() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::SECURITY, Stage::OPERATIONAL, true), &[("InitiatorName", INITIATOR), ("AuthMethod", "None")]);
    assert_eq!(status_of(rsp), LoginStatus::MISSING_PARAMETER);
}

#[test]
fn c33_unknown_keys_not_understood_then_login_completes() {
    let mut raw = Raw::new(target_cfg());
    let mut p = NAMES.to_vec();
    p.extend([("AuthMethod", "None"), ("X-com.example.Foo", "1"), ("FancyKey", "Yes")]);
    let (rsp, a) = raw.send(req(Stage::SECURITY, Stage::OPERATIONAL, true), &p);
    assert_eq!(status_of(rsp), LoginStatus::SUCCESS);
    assert!(a.contains(&("X-com.example.Foo".into(), "NotUnderstood".into())));
    assert!(a.contains(&("FancyKey".into(), "NotUnderstood".into())));
    assert!(rsp.transit && rsp.nsg == Stage::OPERATIONAL);
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &[]);
    assert!(rsp.transit && rsp.nsg == Stage::FULL_FEATURE && rsp.tsih == 0x1234);
    assert_eq!(raw.status(), Some(LoginStatus::SUCCESS));
}

#[test]
fn c34_out_of_range_numbers_rejected() {
    let mut raw = Raw::new(target_cfg());
    let mut p = NAMES.to_vec();
    p.extend([("MaxBurstLength", "100"), ("ErrorRecoveryLevel", "7"), ("DefaultTime2Wait", "99999"), ("FirstBurstLength", "banana")]);
    let (rsp, a) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &p);
    assert_eq!(status_of(rsp), LoginStatus::SUCCESS);
    for k in ["MaxBurstLength", "ErrorRecoveryLevel", "DefaultTime2Wait", "FirstBurstLength"] {
        assert!(a.contains(&(k.into(), "Reject".into())), "{k}: {a:?}");
    }
    let Some(TargetLoginEvent::Complete(o)) = raw.tgt.poll_event() else { panic!() };
    assert_eq!((o.params.max_burst_length, o.params.error_recovery_level), (262_144, 0));
}

#[test]
fn c35_duplicate_key_fails_login() {
    let mut raw = Raw::new(target_cfg());
    let mut p = NAMES.to_vec();
    p.extend([("MaxBurstLength", "8192"), ("MaxBurstLength", "16384")]);
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &p);
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn c36_key_repeated_in_a_later_request_fails_login() {
    let mut raw = Raw::new(target_cfg());
    let mut p = NAMES.to_vec();
    p.push(("ImmediateData", "Yes"));
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, false), &p);
    assert_eq!(status_of(rsp), LoginStatus::SUCCESS);
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &[("ImmediateData", "No")]);
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn c37_unsupported_version() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(LoginRequest { version_min: 2, version_max: 2, ..req(Stage::SECURITY, Stage::OPERATIONAL, true) }, &NAMES);
    assert_eq!(status_of(rsp), LoginStatus::UNSUPPORTED_VERSION);
}

#[test]
fn c38_command_before_login_completes() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(
        req(Stage::SECURITY, Stage::OPERATIONAL, false),
        &[("InitiatorName", INITIATOR), ("TargetName", TARGET), ("AuthMethod", "None")],
    );
    assert_eq!(status_of(rsp), LoginStatus::SUCCESS);
    let (rsp, _) = raw.send_bytes(Header::NopOut(NopOut { immediate: true, itt: 1, ttt: u32::MAX, ..NopOut::default() }), &[]);
    assert_eq!(status_of(rsp), LoginStatus::INVALID_DURING_LOGIN);
}

#[test]
fn c39_connection_add_not_supported() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(LoginRequest { tsih: 7, ..req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true) }, &NAMES);
    assert_eq!(status_of(rsp), LoginStatus::SESSION_DOES_NOT_EXIST);
}

#[test]
fn c40_skipping_security_when_auth_required() {
    let mut raw = Raw::new(chap_target("alicesecret123", None));
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &NAMES);
    assert_eq!(status_of(rsp), LoginStatus::AUTHENTICATION_FAILURE);
    // Without required auth, starting in the operational stage is fine.
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &NAMES);
    assert!(rsp.transit && rsp.nsg == Stage::FULL_FEATURE);
}

#[test]
fn c41_bad_session_type_and_names() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &[("InitiatorName", INITIATOR), ("SessionType", "Bogus")]);
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, true), &[("InitiatorName", "not a name"), ("TargetName", TARGET)]);
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn c42_text_without_nul_and_invalid_nsg() {
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send_bytes(Header::LoginRequest(req(Stage::SECURITY, Stage::OPERATIONAL, true)), b"InitiatorName=iqn.x");
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
    let mut raw = Raw::new(target_cfg());
    let (rsp, _) = raw.send(req(Stage::OPERATIONAL, Stage::SECURITY, true), &NAMES);
    assert_eq!(status_of(rsp), LoginStatus::INITIATOR_ERROR);
}

#[test]
fn c43_continuation_in_both_directions() {
    // 700 unknown keys: the request text exceeds 8 KiB (initiator continuation) and so do the
    // NotUnderstood answers (target continuation).
    let mut raw = Raw::new(target_cfg());
    let mut t = TextBuilder::new();
    for (k, v) in NAMES {
        t.push(k, v);
    }
    for n in 0..700 {
        t.push(&format!("X-org.example.key{n:04}"), "some-value");
    }
    let text = t.into_bytes();
    assert!(text.len() > 2 * LOGIN_MAX_DATA);
    let chunks: Vec<_> = text.chunks(LOGIN_MAX_DATA).collect();
    for (n, c) in chunks.iter().enumerate() {
        let last = n + 1 == chunks.len();
        let r = LoginRequest { cont: !last, ..req(Stage::OPERATIONAL, Stage::FULL_FEATURE, last) };
        if last {
            let (h, d) = wire(Header::LoginRequest(r), c);
            raw.tgt.handle_pdu(raw.now, &h, &d);
        } else {
            let (rsp, d) = raw.send_bytes(Header::LoginRequest(r), c);
            assert!(d.is_empty() && !rsp.transit && !rsp.cont);
        }
    }
    // The answer comes in pieces (C=1), each fetched with an empty request; reassembled it
    // holds a NotUnderstood for every key.
    let mut text = Vec::new();
    let mut pieces = 0;
    let mut first = Some(raw.tgt.poll_transmit());
    loop {
        let p = match first.take() {
            Some(p) => p,
            None => {
                let (h, d) = wire(Header::LoginRequest(req(Stage::OPERATIONAL, Stage::FULL_FEATURE, false)), &[]);
                raw.tgt.handle_pdu(raw.now, &h, &d);
                raw.tgt.poll_transmit()
            }
        };
        let p = p.expect("a response piece");
        assert!(p.data.len() <= LOGIN_MAX_DATA);
        text.extend_from_slice(&p.data);
        pieces += 1;
        if !p.header.cont {
            assert!(p.header.transit && p.header.nsg == Stage::FULL_FEATURE);
            break;
        }
        assert!(!p.header.transit, "T and C never both set");
        assert!(pieces < 10);
    }
    assert!(pieces >= 3, "{pieces}");
    let answers = parse_pairs(&text).unwrap();
    assert_eq!(answers.iter().filter(|(_, v)| *v == "NotUnderstood").count(), 700);
    assert_eq!(raw.status(), Some(LoginStatus::SUCCESS));
}

#[test]
fn c44_login_timeout() {
    let mut tgt = TargetLogin::new(target_cfg(), params());
    let (h, d) = wire(
        Header::LoginRequest(req(Stage::SECURITY, Stage::OPERATIONAL, false)),
        b"InitiatorName=iqn.2026-11.x:y\0TargetName=iqn.2026-11.io.riser:target0\0AuthMethod=None\0",
    );
    tgt.handle_pdu(Duration::from_secs(10), &h, &d);
    let deadline = tgt.poll_timeout().unwrap();
    assert_eq!(deadline, Duration::from_secs(25));
    tgt.handle_timeout(Duration::from_secs(24));
    assert!(!tgt.is_finished());
    tgt.handle_timeout(deadline);
    assert!(tgt.is_finished());
    let mut ini = InitiatorLogin::new(initiator_cfg(), Duration::ZERO, [0; 32]);
    ini.handle_timeout(Duration::from_secs(15));
    assert_eq!(ini.poll_event(), Some(InitiatorLoginEvent::Failed(LoginFailure::Timeout)));
}

/// The initiator's login failure when the riser target's first Login Response is replaced by
/// what `mangle` makes of it (header and text).
fn initiator_fails_on(mangle: impl FnOnce(LoginResponse, Vec<u8>) -> (Header, Vec<u8>)) -> LoginFailure {
    let now = Duration::ZERO;
    let mut ini = InitiatorLogin::new(initiator_cfg(), now, [1; 32]);
    let mut tgt = TargetLogin::new(target_cfg(), params());
    let p = ini.poll_transmit().expect("the first Login Request");
    let (h, d) = wire(Header::LoginRequest(p.header), &p.data);
    tgt.handle_pdu(now, &h, &d);
    let rsp = tgt.poll_transmit().expect("the first Login Response");
    let (h, d) = mangle(rsp.header, rsp.data);
    let (h, d) = wire(h, &d);
    ini.handle_pdu(now, &h, &d);
    assert!(ini.is_finished());
    match ini.poll_event() {
        Some(InitiatorLoginEvent::Failed(f)) => f,
        other => panic!("the initiator did not fail: {other:?}"),
    }
}

#[test]
fn c48_initiator_names_the_rule_the_target_broke() {
    use LoginViolation as V;
    let version = initiator_fails_on(|r, d| {
        let r = LoginResponse { version_active: 1, ..r };
        (Header::LoginResponse(r), d)
    });
    assert_eq!(version, LoginFailure::Protocol(V::UnsupportedVersion(1)));
    assert_eq!(version.to_string(), "login protocol error: unsupported VersionActive 1");
    assert_eq!(
        initiator_fails_on(|r, d| (Header::LoginResponse(LoginResponse { itt: 7, ..r }), d)),
        LoginFailure::Protocol(V::WrongTask { itt: 7, isid: ISID, expected_itt: 0, expected_isid: ISID })
    );
    assert_eq!(
        initiator_fails_on(|r, d| (Header::LoginResponse(LoginResponse { csg: Stage::OPERATIONAL, nsg: Stage::FULL_FEATURE, ..r }), d)),
        LoginFailure::Protocol(V::StageMismatch { got: Stage::OPERATIONAL, expected: Stage::SECURITY })
    );
    assert_eq!(
        initiator_fails_on(|r, d| (Header::LoginResponse(LoginResponse { nsg: Stage(2), ..r }), d)),
        LoginFailure::Protocol(V::InvalidNsg { csg: Stage::SECURITY, nsg: Stage(2) })
    );
    assert_eq!(
        initiator_fails_on(|r, _| (Header::LoginResponse(r), b"AuthMethod=None".to_vec())),
        LoginFailure::Protocol(V::Text(TextError::MissingNul))
    );
    assert_eq!(
        initiator_fails_on(|r, _| (Header::LoginResponse(r), b"TargetAlias=a\0TargetAlias=b\0".to_vec())),
        LoginFailure::Protocol(V::Negotiation(NegotiationError::Duplicate("TargetAlias".into())))
    );
    assert_eq!(initiator_fails_on(|_, _| (Header::Reject(Reject::default()), vec![0; 48])), LoginFailure::Protocol(V::TargetRejected));
    assert_eq!(
        initiator_fails_on(|_, _| (Header::NopIn(NopIn::default()), vec![])),
        LoginFailure::Protocol(V::UnexpectedPdu(Opcode::NOP_IN))
    );
    let demanded = initiator_fails_on(|r, _| (Header::LoginResponse(LoginResponse { transit: false, ..r }), b"AuthMethod=CHAP\0".to_vec()));
    assert_eq!(demanded, LoginFailure::Authentication(AuthFailure::MethodDemanded("CHAP".into())));
    assert_eq!(demanded.to_string(), "authentication failed: target demands AuthMethod CHAP");
}

// ---- real peers: libiscsi's captured login, tgt's quirks ----------------------------------

#[test]
fn c45_libiscsi_captured_login_against_riser_target() {
    // libiscsi's iscsi-inq logging in to tgtd (testdata/captures/inquiry): feed its Login
    // Requests, unchanged, to the riser target configured with the same target name.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../testdata/captures/inquiry");
    let mut files: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    let mut t = target_cfg();
    t.targets = vec![TargetNode::open("iqn.2026-11.io.riser.test:capture")];
    let mut tgt = TargetLogin::new(t, params());
    let mut requests = 0;
    for f in files.iter().filter(|f| f.to_string_lossy().ends_with("-i-03.bin")) {
        let bytes = std::fs::read(f).unwrap();
        let (pdu, _) = Pdu::parse(&bytes).unwrap();
        tgt.handle_pdu(Duration::ZERO, &pdu.header, pdu.data);
        requests += 1;
        while tgt.poll_transmit().is_some() {}
    }
    assert!(requests >= 1);
    match tgt.poll_event() {
        Some(TargetLoginEvent::Complete(o)) => {
            assert_eq!(o.params.target_name, "iqn.2026-11.io.riser.test:capture");
            assert!(o.params.initiator_name.starts_with("iqn."));
        }
        other => panic!("libiscsi's login did not complete against riser: {other:?}"),
    }
}

#[test]
fn c46_chap_response_requests_transit_as_tgt_requires() {
    // tgt answers an extra empty security-stage round with 0x0200, so CHAP_R must go with T=1.
    let now = Duration::ZERO;
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    let mut ini = InitiatorLogin::new(i, now, [1; 32]);
    let mut tgt = TargetLogin::new(chap_target("alicesecret123", None), params());
    let mut saw_chap_r = false;
    for _ in 0..10 {
        while let Some(p) = ini.poll_transmit() {
            if p.data.windows(7).any(|w| w == b"CHAP_R=") {
                assert!(p.header.transit && p.header.nsg == Stage::OPERATIONAL, "{:?}", p.header);
                saw_chap_r = true;
            }
            let (h, d) = wire(Header::LoginRequest(p.header), &p.data);
            tgt.handle_pdu(now, &h, &d);
        }
        while let Some(p) = tgt.poll_transmit() {
            let (h, d) = wire(Header::LoginResponse(p.header), &p.data);
            ini.handle_pdu(now, &h, &d);
        }
    }
    assert!(saw_chap_r);
    assert!(matches!(ini.poll_event(), Some(InitiatorLoginEvent::Complete(_))));
}

#[test]
fn c47_first_command_carries_the_login_cmdsn_whatever_the_final_response_says() {
    // tgt's iSER login (usr/iscsi/iser_text.c, 1.0.85 to 1.0.97) answers every Login Request
    // with ExpCmdSN = CmdSN + 1 and MaxCmdSN = CmdSN, while its session expects the login's
    // CmdSN on the first command (as RFC 7143 §11.12.8 says: the first non-immediate command
    // carries the leading login's CmdSN). Taking the response's ExpCmdSN, a command is sent
    // with CmdSN + 1, which tgt queues forever waiting for CmdSN.
    let now = Duration::ZERO;
    let mut icfg = initiator_cfg();
    icfg.cmd_sn = 77;
    let mut ini = InitiatorLogin::new(icfg, now, [1; 32]);
    let mut tgt = TargetLogin::new(target_cfg(), params());
    let mut events = Vec::new();
    for _ in 0..10 {
        let mut cmd_sn = None;
        while let Some(p) = ini.poll_transmit() {
            cmd_sn = Some(p.header.cmd_sn);
            let (h, d) = wire(Header::LoginRequest(p.header), &p.data);
            tgt.handle_pdu(now, &h, &d);
        }
        while let Some(mut p) = tgt.poll_transmit() {
            let sn = cmd_sn.expect("a response answers a request");
            (p.header.exp_cmd_sn, p.header.max_cmd_sn) = (sn.wrapping_add(1), sn);
            let (h, d) = wire(Header::LoginResponse(p.header), &p.data);
            ini.handle_pdu(now, &h, &d);
        }
        events.extend(std::iter::from_fn(|| ini.poll_event()));
    }
    match events.as_slice() {
        [InitiatorLoginEvent::Complete(o)] => assert_eq!((o.exp_cmd_sn, o.max_cmd_sn), (77, 77)),
        other => panic!("login did not complete: {other:?}"),
    }
}
