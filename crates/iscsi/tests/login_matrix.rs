//! The login harness: riser's initiator and target login machines connected in memory through
//! the real wire codec (every PDU is encoded to bytes and parsed again), over a matrix of offer
//! combinations; plus raw requests for what a well-behaved initiator never sends, and a replay
//! of libiscsi's captured login requests against the riser target.

use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials};
use riser_iscsi::keys::{Digest, NegotiatedParams, OperationalConfig, SessionType, Transport};
use riser_iscsi::login::*;
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::{Header, Isid, LoginRequest, LoginResponse, NopOut, Pdu, Stage};
use std::time::Duration;

const TARGET: &str = "iqn.2026-11.io.riser:target0";
const INITIATOR: &str = "iqn.2026-11.io.riser:initiator0";
const ISID: Isid = Isid([0x80, 0x12, 0x34, 0x56, 0x00, 0x01]);

fn creds(user: &str, secret: &str) -> ChapCredentials {
    ChapCredentials::new(user, secret.as_bytes().to_vec()).unwrap()
}

fn target_cfg() -> TargetLoginConfig {
    TargetLoginConfig { targets: vec![TargetNode::open(TARGET)], ..TargetLoginConfig::default() }
}

fn initiator_cfg() -> InitiatorLoginConfig {
    InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()), ISID)
}

fn chap(user: &str, secret: &str, algs: &[ChapAlgorithm], mutual: Option<ChapCredentials>) -> InitiatorAuth {
    InitiatorAuth::Chap { credentials: creds(user, secret), algorithms: algs.to_vec(), mutual }
}

fn params() -> TargetLoginParams {
    TargetLoginParams { new_tsih: 0x1234, initial_stat_sn: 1000, cmd_window: 32, entropy: [7; 32] }
}

/// Through the wire: encode, parse, check the bytes re-emit identically.
fn wire(header: Header, data: &[u8]) -> (Header, Vec<u8>) {
    let mut bytes = Vec::new();
    Pdu::new(header, &[][..], data).encode(&mut bytes);
    let (pdu, used) = Pdu::parse(&bytes).expect("our own PDU parses");
    assert_eq!(used, bytes.len());
    (pdu.header, pdu.data.to_vec())
}

#[derive(Debug)]
struct Run {
    initiator: Vec<InitiatorLoginEvent>,
    target: Vec<TargetLoginEvent>,
    /// Every PDU's text, in order: (from initiator?, pairs).
    transcript: Vec<(bool, Vec<(String, String)>)>,
}

impl Run {
    fn completed(&self) -> (NegotiatedParams, NegotiatedParams) {
        let i = match self.initiator.as_slice() {
            [InitiatorLoginEvent::Complete(o)] => o,
            other => panic!("initiator did not complete: {other:?}\n{:?}", self.target),
        };
        let t = match self.target.as_slice() {
            [TargetLoginEvent::Complete(o)] => o,
            other => panic!("target did not complete: {other:?}"),
        };
        assert_eq!(i.tsih, 0x1234);
        assert_eq!(t.tsih, 0x1234);
        assert_eq!(i.stat_sn, t.stat_sn, "ExpStatSN after login matches the target's next StatSN");
        assert_eq!((i.exp_cmd_sn, i.max_cmd_sn), (1, 32));
        // Both sides derive the same operational values.
        let (pi, pt) = (i.params.clone(), t.params.clone());
        assert_eq!(pi, pt, "initiator and target disagree");
        (pi, pt)
    }

    fn target_failed(&self) -> LoginStatus {
        match self.target.as_slice() {
            [TargetLoginEvent::Failed { status, .. }] => {
                assert_eq!(self.initiator, [InitiatorLoginEvent::Failed(LoginFailure::Status(*status))]);
                *status
            }
            other => panic!("target did not fail: {other:?}; initiator {:?}", self.initiator),
        }
    }

    fn initiator_failed(&self) -> LoginFailure {
        match self.initiator.as_slice() {
            [InitiatorLoginEvent::Failed(f)] => f.clone(),
            other => panic!("initiator did not fail: {other:?}"),
        }
    }

    fn sent(&self, by_initiator: bool, key: &str) -> Vec<String> {
        self.transcript
            .iter()
            .filter(|(i, _)| *i == by_initiator)
            .flat_map(|(_, p)| p.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()))
            .collect()
    }
}

fn run(icfg: InitiatorLoginConfig, tcfg: TargetLoginConfig) -> Run {
    let now = Duration::from_secs(100);
    let mut ini = InitiatorLogin::new(icfg, now, [3; 32]);
    let mut tgt = TargetLogin::new(tcfg, params());
    let mut r = Run { initiator: vec![], target: vec![], transcript: vec![] };
    for _ in 0..200 {
        let mut moved = false;
        while let Some(p) = ini.poll_transmit() {
            moved = true;
            r.transcript.push((true, pairs_of(&p.data)));
            let (h, d) = wire(Header::LoginRequest(p.header), &p.data);
            tgt.handle_pdu(now, &h, &d);
        }
        while let Some(p) = tgt.poll_transmit() {
            moved = true;
            r.transcript.push((false, pairs_of(&p.data)));
            let (h, d) = wire(Header::LoginResponse(p.header), &p.data);
            ini.handle_pdu(now, &h, &d);
        }
        r.initiator.extend(std::iter::from_fn(|| ini.poll_event()));
        r.target.extend(std::iter::from_fn(|| tgt.poll_event()));
        if !moved {
            break;
        }
    }
    r
}

fn pairs_of(data: &[u8]) -> Vec<(String, String)> {
    parse_pairs(data).map(|v| v.into_iter().map(|(k, v)| (k.into(), v.into())).collect()).unwrap_or_default()
}

// ---- negotiation without authentication --------------------------------------------------

#[test]
fn c01_defaults() {
    let r = run(initiator_cfg(), target_cfg());
    let (p, _) = r.completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::None));
    assert_eq!(p.session_type, SessionType::Normal);
    assert_eq!(p.target_name, TARGET);
    assert_eq!(p.initiator_name, INITIATOR);
    assert_eq!(p.target_portal_group_tag, Some(1));
    assert_eq!((p.initiator_recv_data_segment_length, p.target_recv_data_segment_length), (262_144, 262_144));
    assert_eq!((p.max_burst_length, p.first_burst_length, p.initial_r2t, p.immediate_data), (1_048_576, 262_144, false, true));
    // TargetPortalGroupTag is in the first response (Linux iscsid requires it).
    assert!(r.transcript[1].1.iter().any(|(k, v)| k == "TargetPortalGroupTag" && v == "1"));
}

#[test]
fn c02_both_digests_crc32c_preferred() {
    let mut i = initiator_cfg();
    i.operational.header_digest = vec![Digest::Crc32c, Digest::None];
    i.operational.data_digest = vec![Digest::Crc32c, Digest::None];
    let (p, _) = run(i, target_cfg()).completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::Crc32c, Digest::Crc32c));
}

#[test]
fn c03_digest_offer_target_cannot_do_is_rejected_to_none() {
    let mut i = initiator_cfg();
    i.operational.header_digest = vec![Digest::Crc32c];
    let mut t = target_cfg();
    t.operational.header_digest = vec![Digest::None];
    let r = run(i, t);
    assert_eq!(r.sent(false, "HeaderDigest"), ["Reject"]);
    assert_eq!(r.completed().0.header_digest, Digest::None);
}

#[test]
fn c04_target_requiring_digest_gets_it_from_a_list() {
    let mut t = target_cfg();
    t.operational.data_digest = vec![Digest::Crc32c];
    let (p, _) = run(initiator_cfg(), t).completed();
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::Crc32c));
}

#[test]
fn c05_target_limits_win() {
    let mut t = target_cfg();
    t.operational = OperationalConfig {
        max_burst_length: 65_536,
        first_burst_length: 8192,
        immediate_data: false,
        initial_r2t: true,
        max_recv_data_segment_length: 8192,
        ..OperationalConfig::default()
    };
    let (p, _) = run(initiator_cfg(), t).completed();
    assert_eq!((p.max_burst_length, p.first_burst_length, p.immediate_data, p.initial_r2t), (65_536, 8192, false, true));
    assert_eq!(p.target_recv_data_segment_length, 8192);
    assert_eq!(p.initiator_recv_data_segment_length, 262_144);
}

#[test]
fn c06_erl_minimum_and_time2wait_maximum() {
    let mut i = initiator_cfg();
    i.operational.error_recovery_level = 2;
    i.operational.default_time2wait = 0;
    i.operational.default_time2retain = 3600;
    let mut t = target_cfg();
    t.operational.default_time2wait = 5;
    let (p, _) = run(i, t).completed();
    assert_eq!((p.error_recovery_level, p.default_time2wait, p.default_time2retain), (0, 5, 20));
}

#[test]
fn c07_target_offers_keys_the_initiator_left_at_default() {
    // An initiator that offers nothing operational (like a minimal one); the target must offer
    // what its limits do not allow at the defaults, and the initiator answers.
    let mut i = initiator_cfg();
    i.operational =
        OperationalConfig { max_burst_length: 262_144, first_burst_length: 65_536, initial_r2t: true, ..OperationalConfig::default() };
    let mut t = target_cfg();
    t.operational.immediate_data = false;
    t.operational.max_burst_length = 131_072;
    let r = run(i, t);
    let (p, _) = r.completed();
    assert!(!p.immediate_data);
    assert_eq!(p.max_burst_length, 131_072);
}

#[test]
fn c08_discovery_session() {
    let mut i = initiator_cfg();
    i.target_name = None;
    let r = run(i, target_cfg());
    let (p, _) = r.completed();
    assert_eq!(p.session_type, SessionType::Discovery);
    assert_eq!(p.target_name, "");
    // Normal-session keys are not offered on discovery; no TPGT needed.
    assert!(r.sent(true, "MaxBurstLength").is_empty());
}

#[test]
fn c09_discovery_with_chap() {
    let mut i = initiator_cfg();
    i.target_name = None;
    i.auth = chap("disc", "discoverysecret", &[ChapAlgorithm::Md5], None);
    let mut t = target_cfg();
    t.discovery_chap = Some(creds("disc", "discoverysecret"));
    let r = run(i, t);
    r.completed();
    assert_eq!(r.sent(false, "AuthMethod"), ["CHAP"]);
}

#[test]
fn c09b_discovery_session_declaring_a_target_name_is_bound_to_no_target() {
    // An initiator may declare TargetName on a discovery session; the outcome must still name no
    // target, or a server would treat the session as that target's I_T nexus (here one the ACL
    // does not even admit).
    let mut t = target_cfg();
    t.targets[0].allowed_initiators = vec!["iqn.2026-11.io.riser:someone-else".into()];
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

// ---- CHAP ---------------------------------------------------------------------------------

fn chap_target(secret: &str, mutual: Option<ChapCredentials>) -> TargetLoginConfig {
    let mut t = target_cfg();
    t.targets[0].chap = Some(creds("alice", secret));
    t.targets[0].mutual_chap = mutual;
    t
}

fn chap_ok(alg: ChapAlgorithm) {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[alg], None);
    let r = run(i, chap_target("alicesecret123", None));
    r.completed();
    assert_eq!(r.sent(false, "CHAP_A"), [alg.code().to_string()]);
    // The challenge is at least the digest length, the response exactly the digest length.
    let c = &r.sent(false, "CHAP_C")[0];
    assert!(c.len() - 2 >= 2 * alg.digest_len());
    assert_eq!(r.sent(true, "CHAP_R")[0].len() - 2, 2 * alg.digest_len());
}

#[test]
fn c10_chap_md5() {
    chap_ok(ChapAlgorithm::Md5);
}
#[test]
fn c11_chap_sha1() {
    chap_ok(ChapAlgorithm::Sha1);
}
#[test]
fn c12_chap_sha256() {
    chap_ok(ChapAlgorithm::Sha256);
}
#[test]
fn c13_chap_sha3_256() {
    chap_ok(ChapAlgorithm::Sha3_256);
}

#[test]
fn c14_chap_algorithm_choice_follows_initiator_order() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &ChapAlgorithm::ALL, None);
    let mut t = chap_target("alicesecret123", None);
    t.chap_algorithms = vec![ChapAlgorithm::Md5, ChapAlgorithm::Sha256];
    let r = run(i, t);
    r.completed();
    assert_eq!(r.sent(true, "CHAP_A"), ["8,7,6,5"]);
    assert_eq!(r.sent(false, "CHAP_A"), ["7"]);
}

#[test]
fn c15_mutual_chap_md5() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("target0", "targetsecret12")));
    let r = run(i, chap_target("alicesecret123", Some(creds("target0", "targetsecret12"))));
    r.completed();
    assert_eq!(r.sent(false, "CHAP_N"), ["target0"]);
}

#[test]
fn c16_mutual_chap_sha3() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Sha3_256], Some(creds("target0", "targetsecret12")));
    run(i, chap_target("alicesecret123", Some(creds("target0", "targetsecret12")))).completed();
}

#[test]
fn c17_wrong_secret() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "not-the-secret", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c18_wrong_user() {
    let mut i = initiator_cfg();
    i.auth = chap("mallory", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c19_no_common_chap_algorithm() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    let mut t = chap_target("alicesecret123", None);
    t.chap_algorithms = vec![ChapAlgorithm::Sha256];
    assert_eq!(run(i, t).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c20_target_fails_mutual_chap() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("target0", "expectedsecret")));
    let r = run(i, chap_target("alicesecret123", Some(creds("target0", "othersecret123"))));
    assert!(matches!(r.initiator_failed(), LoginFailure::Authentication(_)));
}

#[test]
fn c21_target_requires_mutual() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(
        run(i, chap_target("alicesecret123", Some(creds("t", "targetsecret12")))).target_failed(),
        LoginStatus::AUTHENTICATION_FAILURE
    );
}

#[test]
fn c22_initiator_asks_mutual_target_has_none() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], Some(creds("t", "targetsecret12")));
    assert_eq!(run(i, chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c23_target_requires_chap_initiator_offers_none() {
    assert_eq!(run(initiator_cfg(), chap_target("alicesecret123", None)).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

#[test]
fn c24_initiator_requires_chap_target_has_none() {
    let mut i = initiator_cfg();
    i.auth = chap("alice", "alicesecret123", &[ChapAlgorithm::Md5], None);
    assert_eq!(run(i, target_cfg()).target_failed(), LoginStatus::AUTHENTICATION_FAILURE);
}

// ---- admission ----------------------------------------------------------------------------

#[test]
fn c25_target_not_found() {
    let mut i = initiator_cfg();
    i.target_name = Some("iqn.2026-11.io.riser:nope".into());
    assert_eq!(run(i, target_cfg()).target_failed(), LoginStatus::NOT_FOUND);
}

#[test]
fn c26_acl_refusal() {
    let mut t = target_cfg();
    t.targets[0].allowed_initiators = vec!["iqn.2026-11.io.riser:someone-else".into()];
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::AUTHORIZATION_FAILURE);
}

#[test]
fn c27_acl_admits_listed_initiator() {
    let mut t = target_cfg();
    t.targets[0].allowed_initiators = vec![INITIATOR.to_uppercase()];
    run(initiator_cfg(), t).completed();
}

// ---- iSER keys ----------------------------------------------------------------------------

#[test]
fn c28_iser_key_set() {
    let mut i = initiator_cfg();
    i.transport = Transport::Iser;
    i.operational.max_recv_data_segment_length = 512;
    let mut t = target_cfg();
    t.transport = Transport::Iser;
    t.operational.max_recv_data_segment_length = 8192;
    let r = run(i, t);
    let (p, _) = r.completed();
    assert!(p.rdma_extensions);
    assert_eq!((p.initiator_recv_data_segment_length, p.target_recv_data_segment_length), (512, 8192));
    assert_eq!((p.header_digest, p.data_digest), (Digest::None, Digest::None));
    // Digests and MaxRecvDataSegmentLength are not offered on iSER.
    for key in ["HeaderDigest", "DataDigest", "MaxRecvDataSegmentLength", "IFMarker"] {
        assert!(r.sent(true, key).is_empty() && r.sent(false, key).is_empty(), "{key} sent on iSER");
    }
    assert_eq!(r.sent(true, "RDMAExtensions"), ["Yes"]);
    assert_eq!(r.sent(false, "TargetRecvDataSegmentLength"), ["8192"]);
}

#[test]
fn c29_iser_initiator_against_tcp_portal() {
    let mut i = initiator_cfg();
    i.transport = Transport::Iser;
    let r = run(i, target_cfg());
    assert_eq!(r.sent(false, "RDMAExtensions"), ["No"]);
    assert!(matches!(r.initiator_failed(), LoginFailure::Protocol(_)));
}

#[test]
fn c30_tcp_initiator_against_iser_portal() {
    let mut t = target_cfg();
    t.transport = Transport::Iser;
    assert_eq!(run(initiator_cfg(), t).target_failed(), LoginStatus::MISSING_PARAMETER);
}

// ---- raw requests: what riser's initiator never sends -------------------------------------

struct Raw {
    tgt: TargetLogin,
    now: Duration,
}

impl Raw {
    fn new(cfg: TargetLoginConfig) -> Self {
        Self { tgt: TargetLogin::new(cfg, params()), now: Duration::from_secs(1) }
    }
    fn send(&mut self, req: LoginRequest, pairs: &[(&str, &str)]) -> (LoginResponse, Vec<(String, String)>) {
        let mut t = TextBuilder::new();
        for (k, v) in pairs {
            t.push(k, v);
        }
        self.send_bytes(Header::LoginRequest(req), t.as_bytes())
    }
    fn send_bytes(&mut self, h: Header, data: &[u8]) -> (LoginResponse, Vec<(String, String)>) {
        let (h, d) = wire(h, data);
        self.tgt.handle_pdu(self.now, &h, &d);
        let p = self.tgt.poll_transmit().expect("a response");
        assert!(self.tgt.poll_transmit().is_none());
        let (Header::LoginResponse(rsp), d) = wire(Header::LoginResponse(p.header), &p.data) else { unreachable!() };
        (rsp, pairs_of(&d))
    }
    fn status(&mut self) -> Option<LoginStatus> {
        match self.tgt.poll_event() {
            Some(TargetLoginEvent::Failed { status, .. }) => Some(status),
            Some(TargetLoginEvent::Complete(_)) => Some(LoginStatus::SUCCESS),
            Some(other) => panic!("unexpected event {other:?}"),
            None => None,
        }
    }
}

fn req(csg: Stage, nsg: Stage, transit: bool) -> LoginRequest {
    LoginRequest { transit, csg, nsg, isid: ISID, itt: 9, cmd_sn: 5, ..LoginRequest::default() }
}

const NAMES: [(&str, &str); 3] = [("InitiatorName", INITIATOR), ("SessionType", "Normal"), ("TargetName", TARGET)];

fn status_of(r: LoginResponse) -> LoginStatus {
    LoginStatus { class: r.status_class, detail: r.status_detail }
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

// ---- replay of a real initiator ------------------------------------------------------------

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
