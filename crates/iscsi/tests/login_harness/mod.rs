//! The login harness shared by `login_matrix.rs` and `login_raw.rs`: riser's initiator and
//! target login machines connected in memory through the real wire codec (every PDU is encoded to
//! bytes and parsed again), and [`Raw`], which feeds hand-written Login Requests to the target.

// Each test file uses its own part of the harness.
#![allow(dead_code)]

use riser_iscsi::chap::{ChapAlgorithm, ChapCredentials};
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::login::*;
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::{Header, Isid, LoginRequest, LoginResponse, Pdu, Stage};
use std::time::Duration;

pub(crate) const TARGET: &str = "iqn.2026-11.io.riser:target0";
pub(crate) const INITIATOR: &str = "iqn.2026-11.io.riser:initiator0";
pub(crate) const ISID: Isid = Isid([0x80, 0x12, 0x34, 0x56, 0x00, 0x01]);

pub(crate) fn creds(user: &str, secret: &str) -> ChapCredentials {
    ChapCredentials::new(user, secret.as_bytes().to_vec()).unwrap()
}

pub(crate) fn target_cfg() -> TargetLoginConfig {
    TargetLoginConfig::default().target(TargetNode::open(TARGET))
}

pub(crate) fn initiator_cfg() -> InitiatorLoginConfig {
    InitiatorLoginConfig::new(INITIATOR, Some(TARGET.into()), ISID)
}

pub(crate) fn chap(user: &str, secret: &str, algs: &[ChapAlgorithm], mutual: Option<ChapCredentials>) -> InitiatorAuth {
    InitiatorAuth::Chap { credentials: creds(user, secret), algorithms: algs.to_vec(), mutual }
}

pub(crate) fn params() -> TargetLoginParams {
    TargetLoginParams { new_tsih: 0x1234, initial_stat_sn: 1000, cmd_window: 32, entropy: [7; 32] }
}

/// Through the wire: encode, parse, check the bytes re-emit identically.
pub(crate) fn wire(header: Header, data: &[u8]) -> (Header, Vec<u8>) {
    let mut bytes = Vec::new();
    Pdu::new(header, &[][..], data).encode(&mut bytes);
    let (pdu, used) = Pdu::parse(&bytes).expect("our own PDU parses");
    assert_eq!(used, bytes.len());
    (pdu.header, pdu.data.to_vec())
}

#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) initiator: Vec<InitiatorLoginEvent>,
    pub(crate) target: Vec<TargetLoginEvent>,
    /// Every PDU's text, in order: (from initiator?, pairs).
    pub(crate) transcript: Vec<(bool, Vec<(String, String)>)>,
}

impl Run {
    pub(crate) fn completed(&self) -> (NegotiatedParams, NegotiatedParams) {
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

    pub(crate) fn target_failed(&self) -> LoginStatus {
        match self.target.as_slice() {
            [TargetLoginEvent::Failed { status, .. }] => {
                assert_eq!(self.initiator, [InitiatorLoginEvent::Failed(LoginFailure::Status(*status))]);
                *status
            }
            other => panic!("target did not fail: {other:?}; initiator {:?}", self.initiator),
        }
    }

    pub(crate) fn initiator_failed(&self) -> LoginFailure {
        match self.initiator.as_slice() {
            [InitiatorLoginEvent::Failed(f)] => f.clone(),
            other => panic!("initiator did not fail: {other:?}"),
        }
    }

    pub(crate) fn sent(&self, by_initiator: bool, key: &str) -> Vec<String> {
        self.transcript
            .iter()
            .filter(|(i, _)| *i == by_initiator)
            .flat_map(|(_, p)| p.iter().filter(|(k, _)| k == key).map(|(_, v)| v.clone()))
            .collect()
    }
}

pub(crate) fn run(icfg: InitiatorLoginConfig, tcfg: TargetLoginConfig) -> Run {
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

pub(crate) fn pairs_of(data: &[u8]) -> Vec<(String, String)> {
    parse_pairs(data).map(|v| v.into_iter().map(|(k, v)| (k.into(), v.into())).collect()).unwrap_or_default()
}

pub(crate) fn chap_target(secret: &str, mutual: Option<ChapCredentials>) -> TargetLoginConfig {
    let mut t = target_cfg();
    t.targets[0].chap = Some(creds("alice", secret));
    t.targets[0].mutual_chap = mutual;
    t
}

pub(crate) struct Raw {
    pub(crate) tgt: TargetLogin,
    pub(crate) now: Duration,
}

impl Raw {
    pub(crate) fn new(cfg: TargetLoginConfig) -> Self {
        Self { tgt: TargetLogin::new(cfg, params()), now: Duration::from_secs(1) }
    }
    pub(crate) fn send(&mut self, req: LoginRequest, pairs: &[(&str, &str)]) -> (LoginResponse, Vec<(String, String)>) {
        let mut t = TextBuilder::new();
        for (k, v) in pairs {
            t.push(k, v);
        }
        self.send_bytes(Header::LoginRequest(req), t.as_bytes())
    }
    pub(crate) fn send_bytes(&mut self, h: Header, data: &[u8]) -> (LoginResponse, Vec<(String, String)>) {
        let (h, d) = wire(h, data);
        self.tgt.handle_pdu(self.now, &h, &d);
        let p = self.tgt.poll_transmit().expect("a response");
        assert!(self.tgt.poll_transmit().is_none());
        let (Header::LoginResponse(rsp), d) = wire(Header::LoginResponse(p.header), &p.data) else { unreachable!() };
        (rsp, pairs_of(&d))
    }
    pub(crate) fn status(&mut self) -> Option<LoginStatus> {
        match self.tgt.poll_event() {
            Some(TargetLoginEvent::Failed { status, .. }) => Some(status),
            Some(TargetLoginEvent::Complete(_)) => Some(LoginStatus::SUCCESS),
            Some(other) => panic!("unexpected event {other:?}"),
            None => None,
        }
    }
}

pub(crate) fn req(csg: Stage, nsg: Stage, transit: bool) -> LoginRequest {
    LoginRequest { transit, csg, nsg, isid: ISID, itt: 9, cmd_sn: 5, ..LoginRequest::default() }
}

pub(crate) const NAMES: [(&str, &str); 3] = [("InitiatorName", INITIATOR), ("SessionType", "Normal"), ("TargetName", TARGET)];

pub(crate) fn status_of(r: LoginResponse) -> LoginStatus {
    LoginStatus { class: r.status_class, detail: r.status_detail }
}
