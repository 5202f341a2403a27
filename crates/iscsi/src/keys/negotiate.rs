//! The generic negotiation engine: one resolver per [`Kind`], driven by the key table.
//!
//! A [`Negotiator`] lives for one login (or one Text negotiation). Feed it the peer's pairs with
//! [`Negotiator::receive`]; it appends its answers to a [`TextBuilder`] and remembers results.
//! Offers of its own go out with [`Negotiator::offer`] (or the role helpers); the answers come
//! back through `receive` and are checked against the offer. [`Negotiator::params`] gives the
//! typed outcome.

use super::{
    DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, KEYS, KeyDef, Kind, NegotiatedParams, OperationalConfig, Role, Sender, SessionType, Transport,
    lookup,
};
use crate::text::{TextBuilder, parse_number};
use alloc::collections::{BTreeMap, BTreeSet};
use alloc::string::{String, ToString};
use alloc::vec::Vec;

/// A negotiation the peer got wrong; it ends the login (initiator error 0x0200 when the target
/// sees it; the initiator drops the connection when it sees it).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NegotiationError {
    /// A key was offered or declared twice in one negotiation (RFC 7143 §6.2).
    #[error("key {0} sent more than once")]
    Duplicate(String),
    /// An answer to our offer that the key's rule does not allow.
    #[error("answer {key}={value} is not allowed for our offer")]
    BadResponse {
        /// Key.
        key: String,
        /// The answer.
        value: String,
    },
    /// A value that makes the login impossible (e.g. an unknown SessionType).
    #[error("invalid value {key}={value}")]
    InvalidValue {
        /// Key.
        key: String,
        /// Value.
        value: String,
    },
}

impl NegotiationError {
    /// The Login Response status a target sends for this error (RFC 7143 §6.2: initiator
    /// error).
    pub const fn login_status(&self) -> crate::login::LoginStatus {
        crate::login::LoginStatus::INITIATOR_ERROR
    }
}

const SPECIAL: [&str; 3] = ["NotUnderstood", "Irrelevant", "Reject"];

/// Keys the initiator offers in the operational stage of a normal session (as open-iscsi does).
const INITIATOR_OFFERS: &[&str] = &[
    "HeaderDigest",
    "DataDigest",
    "MaxConnections",
    "InitialR2T",
    "ImmediateData",
    "MaxBurstLength",
    "FirstBurstLength",
    "DefaultTime2Wait",
    "DefaultTime2Retain",
    "MaxOutstandingR2T",
    "DataPDUInOrder",
    "DataSequenceInOrder",
    "ErrorRecoveryLevel",
    "RDMAExtensions",
];

/// Negotiation state of one login or Text exchange.
#[derive(Clone, Debug)]
pub struct Negotiator {
    role: Role,
    transport: Transport,
    config: OperationalConfig,
    session_type: SessionType,
    leading: bool,
    results: BTreeMap<&'static str, String>,
    local_decl: BTreeMap<&'static str, String>,
    peer_decl: BTreeMap<&'static str, String>,
    offered: BTreeMap<&'static str, String>,
    /// Offers whose outcome they decide alone (Yes for an OR key, No for an AND key): the
    /// answer is optional (RFC 7143 §6.2.2; LIO omits it on iSER connections).
    offered_optional: BTreeMap<&'static str, String>,
    seen: BTreeSet<String>,
}

fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "Yes" => Some(true),
        "No" => Some(false),
        _ => None,
    }
}

fn in_range(def: &KeyDef, v: &str) -> Option<u64> {
    parse_number(v).ok().filter(|n| *n >= def.range.0 && *n <= def.range.1)
}

/// Resolve a peer's offer against our local value; `None` means answer `Reject`.
fn resolve(def: &KeyDef, offer: &str, local: &str) -> Option<String> {
    match def.kind {
        Kind::List(_) => {
            let ours: Vec<&str> = local.split(',').collect();
            offer.split(',').find(|v| ours.contains(v)).map(ToString::to_string)
        }
        Kind::NumMin | Kind::NumMax | Kind::NumMinOrZero => {
            let o = in_range(def, offer)?;
            let l = parse_number(local).ok()?;
            Some(
                match def.kind {
                    Kind::NumMin => o.min(l),
                    Kind::NumMax => o.max(l),
                    _ if o == 0 => l,
                    _ if l == 0 => o,
                    _ => o.min(l),
                }
                .to_string(),
            )
        }
        Kind::BoolAnd | Kind::BoolOr => {
            let o = parse_bool(offer)?;
            let l = parse_bool(local)?;
            let r = if def.kind == Kind::BoolAnd { o && l } else { o || l };
            Some(if r { "Yes" } else { "No" }.into())
        }
        _ => None,
    }
}

/// Check the peer's answer to our offer; returns the result value.
fn check_answer(def: &KeyDef, ours: &str, theirs: &str) -> Option<String> {
    if SPECIAL.contains(&theirs) {
        return Some(def.default.into());
    }
    match def.kind {
        Kind::List(_) => ours.split(',').any(|v| v == theirs).then(|| theirs.into()),
        Kind::NumMin | Kind::NumMax | Kind::NumMinOrZero => {
            let t = in_range(def, theirs)?;
            let o = parse_number(ours).ok()?;
            let ok = match def.kind {
                Kind::NumMin => t <= o,
                Kind::NumMax => t >= o,
                _ => o == 0 || (t != 0 && t <= o),
            };
            ok.then(|| t.to_string())
        }
        Kind::BoolAnd | Kind::BoolOr => {
            let t = parse_bool(theirs)?;
            let o = parse_bool(ours)?;
            // The result is fixed by our offer when it already decides the function.
            let r = if def.kind == Kind::BoolAnd { o && t } else { o || t };
            Some(if r { "Yes" } else { "No" }.into())
        }
        _ => None,
    }
}

impl Negotiator {
    /// A negotiation for `role` over `transport`; `leading` is false for a connection joining an
    /// existing session (leading-only keys are then irrelevant).
    pub fn new(role: Role, transport: Transport, config: OperationalConfig, leading: bool) -> Self {
        Self {
            role,
            transport,
            config,
            session_type: SessionType::Normal,
            leading,
            results: BTreeMap::new(),
            local_decl: BTreeMap::new(),
            peer_decl: BTreeMap::new(),
            offered: BTreeMap::new(),
            offered_optional: BTreeMap::new(),
            seen: BTreeSet::new(),
        }
    }

    /// The session type as declared so far.
    pub fn session_type(&self) -> SessionType {
        self.session_type
    }

    /// Set the session type (the initiator knows it up front).
    pub fn set_session_type(&mut self, t: SessionType) {
        self.session_type = t;
    }

    /// A value the peer declared (names, aliases, TargetPortalGroupTag…).
    pub fn peer_declared(&self, key: &str) -> Option<&str> {
        self.peer_decl.get(key).map(String::as_str)
    }

    /// Whether offers of ours still await an answer.
    pub fn pending(&self) -> bool {
        !self.offered.is_empty()
    }

    fn relevant(&self, def: &KeyDef) -> bool {
        if def.transport.is_some_and(|t| t != self.transport) && matches!(def.transport, Some(Transport::Iser)) {
            return false;
        }
        if self.session_type == SessionType::Discovery && !def.discovery {
            return false;
        }
        !def.leading_only || self.leading
    }

    /// Process the peer's (non-authentication) pairs, appending our answers to `out`.
    pub fn receive(&mut self, pairs: &[(&str, &str)], out: &mut TextBuilder) -> Result<(), NegotiationError> {
        // SessionType first: it decides what is relevant for the other keys of the same PDU.
        if let Some((_, v)) = pairs.iter().find(|(k, _)| *k == "SessionType") {
            self.session_type = match *v {
                "Normal" => SessionType::Normal,
                "Discovery" => SessionType::Discovery,
                _ => {
                    return Err(NegotiationError::InvalidValue { key: "SessionType".into(), value: (*v).into() });
                }
            };
        }
        for &(key, value) in pairs {
            if key != "TargetAddress" && !self.seen.insert(key.to_string()) {
                return Err(NegotiationError::Duplicate(key.into()));
            }
            let Some(def) = lookup(key) else {
                if !SPECIAL.contains(&value) {
                    out.push(key, "NotUnderstood");
                }
                continue;
            };
            if let Some(ours) = self.offered.remove(def.name).or_else(|| self.offered_optional.remove(def.name)) {
                let result = check_answer(def, &ours, value)
                    .ok_or_else(|| NegotiationError::BadResponse { key: key.into(), value: value.into() })?;
                self.results.insert(def.name, result);
                continue;
            }
            if SPECIAL.contains(&value) {
                continue;
            }
            self.answer(def, value, out)?;
        }
        Ok(())
    }

    fn answer(&mut self, def: &'static KeyDef, value: &str, out: &mut TextBuilder) -> Result<(), NegotiationError> {
        let wrong_sender = matches!((def.sender, self.role), (Sender::Initiator, Role::Initiator) | (Sender::Target, Role::Target));
        match def.kind {
            Kind::Declarative | Kind::DeclarativeNum => {
                if def.ffp_only {
                    out.push(def.name, "Irrelevant");
                } else if wrong_sender {
                    if self.role == Role::Target {
                        out.push(def.name, "Reject");
                    }
                } else if def.transport == Some(Transport::Iser) && self.transport == Transport::Tcp {
                    out.push(def.name, "Irrelevant");
                } else if def.kind == Kind::DeclarativeNum && in_range(def, value).is_none() {
                    out.push(def.name, "Reject");
                } else if def.name.ends_with("MarkInt") {
                    // Markers are always No, so their intervals are irrelevant.
                    out.push(def.name, "Irrelevant");
                } else {
                    self.peer_decl.insert(def.name, value.into());
                }
            }
            Kind::Auth => {
                out.push(def.name, "Irrelevant");
            }
            _ if !self.relevant(def) => {
                out.push(def.name, "Irrelevant");
            }
            _ => {
                let local = self.config.local_value(def.name, self.transport).unwrap_or_else(|| def.default.into());
                match resolve(def, value, &local) {
                    Some(r) => {
                        out.push(def.name, &r);
                        self.results.insert(def.name, r);
                    }
                    None => {
                        out.push(def.name, "Reject");
                    }
                }
            }
        }
        Ok(())
    }

    /// Offer `key=value` and expect an answer.
    pub fn offer(&mut self, key: &'static str, value: String, out: &mut TextBuilder) {
        out.push(key, &value);
        let decides_alone = lookup(key).is_some_and(|d| match d.kind {
            Kind::BoolOr => value == "Yes",
            Kind::BoolAnd => value == "No",
            _ => false,
        });
        if decides_alone {
            self.results.insert(key, value.clone());
            self.offered_optional.insert(key, value);
        } else {
            self.offered.insert(key, value);
        }
    }

    /// Declare `key=value` (no answer expected).
    pub fn declare(&mut self, key: &'static str, value: String, out: &mut TextBuilder) {
        out.push(key, &value);
        self.local_decl.insert(key, value);
    }

    fn recv_length_key(&self) -> Option<&'static str> {
        match (self.transport, self.session_type, self.role) {
            (Transport::Iser, SessionType::Normal, Role::Initiator) => Some("InitiatorRecvDataSegmentLength"),
            (Transport::Iser, SessionType::Normal, Role::Target) => Some("TargetRecvDataSegmentLength"),
            _ => Some("MaxRecvDataSegmentLength"),
        }
    }

    /// The initiator's operational offers and its receive-length declaration.
    pub fn initiator_offers(&mut self, out: &mut TextBuilder) {
        if self.session_type == SessionType::Normal {
            for name in INITIATOR_OFFERS {
                let Some(def) = lookup(name) else { continue };
                if def.transport.is_some_and(|t| t != self.transport) || !self.relevant(def) {
                    continue;
                }
                if *name == "RDMAExtensions" && self.transport != Transport::Iser {
                    continue;
                }
                if let Some(v) = self.config.local_value(name, self.transport) {
                    self.offer(def.name, v, out);
                }
            }
        } else if self.transport == Transport::Tcp {
            for name in ["HeaderDigest", "DataDigest"] {
                if let Some(v) = self.config.local_value(name, self.transport) {
                    self.offer(if name == "HeaderDigest" { "HeaderDigest" } else { "DataDigest" }, v, out);
                }
            }
        }
        if let Some(k) = self.recv_length_key() {
            self.declare(k, self.config.max_recv_data_segment_length.to_string(), out);
        }
        if self.transport == Transport::Iser && self.session_type == SessionType::Normal {
            // As open-iscsi: the initiator declares TargetRecvDataSegmentLength too (the RFC
            // 7145 default, what it assumes of the target until the target declares its own).
            // LIO proposes the key itself and holds the login in the operational stage (T=0,
            // forever) until the initiator has sent it.
            self.declare("TargetRecvDataSegmentLength", DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH.to_string(), out);
        }
    }

    /// The target's receive-length declaration (sent once, in the operational stage).
    pub fn target_declarations(&mut self, out: &mut TextBuilder) {
        if let Some(k) = self.recv_length_key()
            && !self.local_decl.contains_key(k)
        {
            self.declare(k, self.config.max_recv_data_segment_length.to_string(), out);
        }
    }

    /// Target side, before transiting to full feature phase: offer every relevant key the
    /// initiator did not negotiate whose default our limits do not allow. Returns whether
    /// anything was offered (the target must then wait for the answers).
    pub fn target_missing_offers(&mut self, out: &mut TextBuilder) -> bool {
        let mut any = false;
        for def in KEYS {
            let negotiable =
                matches!(def.kind, Kind::List(_) | Kind::NumMin | Kind::NumMax | Kind::NumMinOrZero | Kind::BoolAnd | Kind::BoolOr);
            if !negotiable
                || self.results.contains_key(def.name)
                || self.offered.contains_key(def.name)
                || def.transport.is_some_and(|t| t != self.transport)
                || !self.relevant(def)
            {
                continue;
            }
            let Some(local) = self.config.local_value(def.name, self.transport) else {
                continue;
            };
            if resolve(def, def.default, &local).as_deref() != Some(def.default) {
                self.offer(def.name, local, out);
                any = true;
            }
        }
        any
    }

    /// The typed outcome so far.
    pub fn params(&self) -> NegotiatedParams {
        let mut p = NegotiatedParams { transport: self.transport, session_type: self.session_type, ..NegotiatedParams::default() };
        for (k, v) in self.peer_decl.iter().chain(self.local_decl.iter()) {
            p.set(k, v);
        }
        for (k, v) in &self.results {
            p.set(k, v);
        }
        let decl = |map: &BTreeMap<&'static str, String>, k: &str| map.get(k).and_then(|v| parse_number(v).ok()).map(|n| n as u32);
        let (mine, theirs) = (&self.local_decl, &self.peer_decl);
        let (ini, tgt) = match self.role {
            Role::Initiator => (mine, theirs),
            Role::Target => (theirs, mine),
        };
        if self.transport == Transport::Iser && self.session_type == SessionType::Normal {
            let irdsl = "InitiatorRecvDataSegmentLength";
            let trdsl = "TargetRecvDataSegmentLength";
            p.initiator_recv_data_segment_length = decl(ini, irdsl).or(decl(tgt, irdsl)).unwrap_or(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH);
            p.target_recv_data_segment_length = decl(tgt, trdsl).or(decl(ini, trdsl)).unwrap_or(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH);
        } else {
            let k = "MaxRecvDataSegmentLength";
            p.initiator_recv_data_segment_length = decl(ini, k).unwrap_or(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH);
            p.target_recv_data_segment_length = decl(tgt, k).unwrap_or(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::parse_pairs;

    fn answer(n: &mut Negotiator, text: &[(&str, &str)]) -> Result<Vec<(String, String)>, NegotiationError> {
        let mut out = TextBuilder::new();
        n.receive(text, &mut out)?;
        let bytes = out.into_bytes();
        Ok(parse_pairs(&bytes).unwrap().into_iter().map(|(k, v)| (k.into(), v.into())).collect())
    }

    fn pairs(v: &[(String, String)]) -> Vec<(&str, &str)> {
        v.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect()
    }

    #[test]
    fn resolvers() {
        let mut t = Negotiator::new(Role::Target, Transport::Tcp, OperationalConfig::default(), true);
        let a = answer(
            &mut t,
            &[
                ("HeaderDigest", "CRC32C,None"),
                ("MaxBurstLength", "16776192"),
                ("DefaultTime2Wait", "0"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("MaxOutstandingR2T", "70000"),
                ("X-com.example.foo", "1"),
                ("MaxRecvDataSegmentLength", "65536"),
            ],
        )
        .unwrap();
        assert_eq!(
            pairs(&a),
            [
                ("HeaderDigest", "CRC32C"),
                ("MaxBurstLength", "1048576"),
                ("DefaultTime2Wait", "2"),
                ("InitialR2T", "No"),
                ("ImmediateData", "Yes"),
                ("MaxOutstandingR2T", "Reject"),
                ("X-com.example.foo", "NotUnderstood"),
            ]
        );
        let p = t.params();
        assert_eq!(p.initiator_recv_data_segment_length, 65536);
        assert_eq!(p.max_burst_length, 1_048_576);
        assert!(!p.initial_r2t);
        assert_eq!(p.max_outstanding_r2t, 1);
        assert_eq!(answer(&mut t, &[("InitialR2T", "Yes")]), Err(NegotiationError::Duplicate("InitialR2T".into())));
    }

    #[test]
    fn offers_and_answers() {
        let mut i = Negotiator::new(Role::Initiator, Transport::Tcp, OperationalConfig::default(), true);
        let mut out = TextBuilder::new();
        i.initiator_offers(&mut out);
        assert!(i.pending());
        let cfg =
            OperationalConfig { max_burst_length: 65536, first_burst_length: 8192, immediate_data: false, ..OperationalConfig::default() };
        let mut t = Negotiator::new(Role::Target, Transport::Tcp, cfg, true);
        let bytes = out.into_bytes();
        let offers = parse_pairs(&bytes).unwrap();
        let a = answer(&mut t, &offers).unwrap();
        assert!(answer(&mut i, &pairs(&a)).unwrap().is_empty());
        assert!(!i.pending());
        let (pi, pt) = (i.params(), t.params());
        assert_eq!(pi.max_burst_length, 65536);
        assert!(!pi.immediate_data);
        assert_eq!(pi.first_burst_length, 8192);
        assert_eq!(pi.max_burst_length, pt.max_burst_length);
        // An answer above our offer for a minimum key is a protocol error.
        let mut i2 = Negotiator::new(Role::Initiator, Transport::Tcp, OperationalConfig::default(), true);
        let mut o = TextBuilder::new();
        i2.offer("MaxBurstLength", "8192".into(), &mut o);
        assert!(matches!(answer(&mut i2, &[("MaxBurstLength", "9000")]), Err(NegotiationError::BadResponse { .. })));
    }

    #[test]
    fn offers_deciding_their_outcome_alone_need_no_answer() {
        let mut i = Negotiator::new(Role::Initiator, Transport::Iser, OperationalConfig::default(), true);
        let mut out = TextBuilder::new();
        i.offer("DataPDUInOrder", "Yes".into(), &mut out);
        i.offer("DataSequenceInOrder", "Yes".into(), &mut out);
        i.offer("ImmediateData", "No".into(), &mut out);
        i.offer("InitialR2T", "No".into(), &mut out);
        // LIO on iSER answers neither in-order key (OR, offered Yes), nor ImmediateData=No (AND).
        assert!(answer(&mut i, &[("InitialR2T", "Yes")]).unwrap().is_empty());
        assert!(!i.pending(), "the omitted answers are optional");
        let p = i.params();
        assert!(p.data_pdu_in_order && p.data_sequence_in_order && !p.immediate_data && p.initial_r2t);
        // An answer given anyway is checked and taken, not answered back.
        let mut i = Negotiator::new(Role::Initiator, Transport::Tcp, OperationalConfig::default(), true);
        let mut out = TextBuilder::new();
        i.offer("DataPDUInOrder", "Yes".into(), &mut out);
        assert!(answer(&mut i, &[("DataPDUInOrder", "Yes")]).unwrap().is_empty());
        assert!(answer(&mut i, &[("DataPDUInOrder", "No")]).is_err(), "a second answer");
    }

    #[test]
    fn iser_initiator_declares_both_receive_lengths_as_open_iscsi() {
        let mut i = Negotiator::new(Role::Initiator, Transport::Iser, OperationalConfig::default(), true);
        let mut out = TextBuilder::new();
        i.initiator_offers(&mut out);
        let bytes = out.into_bytes();
        let offers = parse_pairs(&bytes).unwrap();
        assert!(offers.contains(&("InitiatorRecvDataSegmentLength", "262144")), "{offers:?}");
        assert!(offers.contains(&("TargetRecvDataSegmentLength", "8192")), "LIO waits for it: {offers:?}");
        // The target's own declaration wins over the initiator's assumption.
        let mut t = Negotiator::new(Role::Target, Transport::Iser, OperationalConfig::default(), true);
        let a = answer(&mut t, &offers).unwrap();
        let mut d = TextBuilder::new();
        t.target_declarations(&mut d);
        let db = d.into_bytes();
        let mut reply = pairs(&a);
        reply.extend(parse_pairs(&db).unwrap());
        answer(&mut i, &reply).unwrap();
        assert_eq!(i.params().target_recv_data_segment_length, 262_144);
    }

    #[test]
    fn iser_and_discovery_relevance() {
        let mut t = Negotiator::new(Role::Target, Transport::Tcp, OperationalConfig::default(), true);
        let a = answer(
            &mut t,
            &[
                ("SessionType", "Discovery"),
                ("MaxBurstLength", "512"),
                ("RDMAExtensions", "Yes"),
                ("InitiatorRecvDataSegmentLength", "128"),
            ],
        )
        .unwrap();
        assert_eq!(
            pairs(&a),
            [("MaxBurstLength", "Irrelevant"), ("RDMAExtensions", "Irrelevant"), ("InitiatorRecvDataSegmentLength", "Irrelevant")]
        );
        let mut t = Negotiator::new(Role::Target, Transport::Iser, OperationalConfig::default(), true);
        let a = answer(&mut t, &[("RDMAExtensions", "Yes"), ("HeaderDigest", "CRC32C,None"), ("InitiatorRecvDataSegmentLength", "262144")])
            .unwrap();
        assert_eq!(pairs(&a), [("RDMAExtensions", "Yes"), ("HeaderDigest", "None")]);
        let mut out = TextBuilder::new();
        t.target_declarations(&mut out);
        assert_eq!(parse_pairs(out.as_bytes()).unwrap(), [("TargetRecvDataSegmentLength", "262144")]);
        let p = t.params();
        assert!(p.rdma_extensions);
        assert_eq!(p.initiator_recv_data_segment_length, 262_144);
    }

    #[test]
    fn target_offers_what_defaults_would_break() {
        let cfg = OperationalConfig { immediate_data: false, max_burst_length: 131_072, ..OperationalConfig::default() };
        let mut t = Negotiator::new(Role::Target, Transport::Tcp, cfg, true);
        let mut out = TextBuilder::new();
        assert!(t.target_missing_offers(&mut out));
        let offered = parse_pairs(out.as_bytes()).unwrap();
        assert!(offered.contains(&("ImmediateData", "No")));
        assert!(offered.contains(&("MaxBurstLength", "131072")));
        assert!(!offered.iter().any(|(k, _)| *k == "InitialR2T"));
    }
}
