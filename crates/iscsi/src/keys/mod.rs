//! The negotiation key table (RFC 7143 §13, RFC 7145 §6), local preferences, and the typed
//! result of a negotiation.
//!
//! One static table ([`KEYS`]) says for every key how it is negotiated ([`Kind`]), its scope,
//! who may send it, its default and its range. The generic engine in [`crate::keys::negotiate`]
//! resolves every key from that table — there is no per-key negotiation code.

pub mod negotiate;

use alloc::string::{String, ToString};
use alloc::vec::Vec;

/// Which side we are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The initiator.
    Initiator,
    /// The target.
    Target,
}

/// The datamover under the session; it decides which keys apply (RFC 7145 §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Transport {
    /// iSCSI over TCP: digests and MaxRecvDataSegmentLength apply; the iSER keys are irrelevant.
    #[default]
    Tcp,
    /// iSER: RDMAExtensions=Yes; no digests or markers; MaxRecvDataSegmentLength is replaced by
    /// InitiatorRecvDataSegmentLength / TargetRecvDataSegmentLength.
    Iser,
}

/// SessionType.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum SessionType {
    /// A normal (full feature) session with a target.
    #[default]
    Normal,
    /// A discovery session (SendTargets only).
    Discovery,
}

impl SessionType {
    /// The text value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Discovery => "Discovery",
        }
    }
}

/// How a key's value is arrived at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// List of values in preference order; the acceptor picks the first it supports.
    List(&'static [&'static str]),
    /// Numerical, result is the minimum.
    NumMin,
    /// Numerical, result is the maximum.
    NumMax,
    /// Numerical minimum where 0 means "no limit" (MaxOutstandingUnexpectedPDUs).
    NumMinOrZero,
    /// Boolean AND.
    BoolAnd,
    /// Boolean OR.
    BoolOr,
    /// Declarative: each side states its own value; no answer.
    Declarative,
    /// Declarative numeric value (range checked).
    DeclarativeNum,
    /// Security (authentication) key, handled by the login's authentication step.
    Auth,
}

/// Who may send a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender {
    /// Initiator only.
    Initiator,
    /// Target only.
    Target,
    /// Both.
    Both,
}

/// One key of the table.
#[derive(Clone, Copy, Debug)]
pub struct KeyDef {
    /// Name.
    pub name: &'static str,
    /// Negotiation kind.
    pub kind: Kind,
    /// Session-wide (true) or per connection.
    pub session: bool,
    /// Leading connection only (LO).
    pub leading_only: bool,
    /// Only in full feature phase Text negotiation (SendTargets).
    pub ffp_only: bool,
    /// Who may send it.
    pub sender: Sender,
    /// Default value.
    pub default: &'static str,
    /// Valid numeric range.
    pub range: (u64, u64),
    /// Restricted to one transport.
    pub transport: Option<Transport>,
    /// Relevant in discovery sessions.
    pub discovery: bool,
}

const R24: (u64, u64) = (512, (1 << 24) - 1);
const NONE: (u64, u64) = (0, 0);

// One row of the table; positional so the table reads as a table.
#[allow(clippy::too_many_arguments)]
const fn k(
    name: &'static str,
    kind: Kind,
    session: bool,
    lo: bool,
    sender: Sender,
    default: &'static str,
    range: (u64, u64),
    discovery: bool,
) -> KeyDef {
    KeyDef { name, kind, session, leading_only: lo, ffp_only: false, sender, default, range, transport: None, discovery }
}

const fn on(mut d: KeyDef, t: Transport) -> KeyDef {
    d.transport = Some(t);
    d
}

use Kind::*;
use Sender::{Both, Initiator as I, Target as T};

/// The key table: every RFC 7143 key and the iSER keys.
pub static KEYS: &[KeyDef] = &[
    k("AuthMethod", Auth, false, false, Both, "None", NONE, true),
    k("CHAP_A", Auth, false, false, Both, "", NONE, true),
    k("CHAP_I", Auth, false, false, Both, "", NONE, true),
    k("CHAP_C", Auth, false, false, Both, "", NONE, true),
    k("CHAP_N", Auth, false, false, Both, "", NONE, true),
    k("CHAP_R", Auth, false, false, Both, "", NONE, true),
    on(k("HeaderDigest", List(&["None", "CRC32C"]), false, false, Both, "None", NONE, true), Transport::Tcp),
    on(k("DataDigest", List(&["None", "CRC32C"]), false, false, Both, "None", NONE, true), Transport::Tcp),
    k("MaxConnections", NumMin, true, true, Both, "1", (1, 65535), false),
    KeyDef { ffp_only: true, ..k("SendTargets", Declarative, true, false, I, "", NONE, true) },
    k("TargetName", Declarative, true, false, Both, "", NONE, true),
    k("InitiatorName", Declarative, true, false, I, "", NONE, true),
    k("TargetAlias", Declarative, true, false, T, "", NONE, true),
    k("InitiatorAlias", Declarative, true, false, I, "", NONE, true),
    k("TargetAddress", Declarative, true, false, T, "", NONE, true),
    k("TargetPortalGroupTag", DeclarativeNum, true, false, T, "", (0, 65535), true),
    k("InitialR2T", BoolOr, true, true, Both, "Yes", NONE, false),
    k("ImmediateData", BoolAnd, true, true, Both, "Yes", NONE, false),
    on(k("MaxRecvDataSegmentLength", DeclarativeNum, false, false, Both, "8192", R24, true), Transport::Tcp),
    k("MaxBurstLength", NumMin, true, true, Both, "262144", R24, false),
    k("FirstBurstLength", NumMin, true, true, Both, "65536", R24, false),
    k("DefaultTime2Wait", NumMax, true, true, Both, "2", (0, 3600), true),
    k("DefaultTime2Retain", NumMin, true, true, Both, "20", (0, 3600), true),
    k("MaxOutstandingR2T", NumMin, true, true, Both, "1", (1, 65535), false),
    k("DataPDUInOrder", BoolOr, true, true, Both, "Yes", NONE, false),
    k("DataSequenceInOrder", BoolOr, true, true, Both, "Yes", NONE, false),
    k("ErrorRecoveryLevel", NumMin, true, true, Both, "0", (0, 2), true),
    k("SessionType", Declarative, true, true, I, "Normal", NONE, true),
    on(k("IFMarker", BoolAnd, false, false, Both, "No", NONE, true), Transport::Tcp),
    on(k("OFMarker", BoolAnd, false, false, Both, "No", NONE, true), Transport::Tcp),
    on(k("IFMarkInt", Declarative, false, false, Both, "", NONE, true), Transport::Tcp),
    on(k("OFMarkInt", Declarative, false, false, Both, "", NONE, true), Transport::Tcp),
    k("TaskReporting", List(&["RFC3720", "ResponseFence", "FastAbort"]), true, true, Both, "RFC3720", NONE, false),
    k("iSCSIProtocolLevel", NumMin, true, true, Both, "0", (0, 31), true),
    k("RDMAExtensions", BoolAnd, true, true, Both, "No", NONE, false),
    on(k("InitiatorRecvDataSegmentLength", DeclarativeNum, false, false, Both, "8192", R24, false), Transport::Iser),
    on(k("TargetRecvDataSegmentLength", DeclarativeNum, false, false, Both, "8192", R24, false), Transport::Iser),
    on(k("MaxOutstandingUnexpectedPDUs", NumMinOrZero, false, false, Both, "0", (0, u32::MAX as u64), false), Transport::Iser),
];

/// Look a key up by exact name.
pub fn lookup(name: &str) -> Option<&'static KeyDef> {
    KEYS.iter().find(|d| d.name == name)
}

/// A digest choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Digest {
    /// No digest.
    #[default]
    None,
    /// CRC32C.
    Crc32c,
}

impl Digest {
    /// The text value.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Crc32c => "CRC32C",
        }
    }
    fn parse(s: &str) -> Self {
        if s == "CRC32C" { Self::Crc32c } else { Self::None }
    }
}

/// What this side wants (or accepts) for each operational key. The initiator offers these; the
/// target uses them as its limits when answering.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct OperationalConfig {
    /// HeaderDigest values in preference order.
    pub header_digest: Vec<Digest>,
    /// DataDigest values in preference order.
    pub data_digest: Vec<Digest>,
    #[allow(missing_docs)]
    pub max_connections: u32,
    #[allow(missing_docs)]
    pub initial_r2t: bool,
    #[allow(missing_docs)]
    pub immediate_data: bool,
    /// What this side can receive per PDU (declared as MaxRecvDataSegmentLength on TCP, or as
    /// Initiator/TargetRecvDataSegmentLength on iSER).
    pub max_recv_data_segment_length: u32,
    #[allow(missing_docs)]
    pub max_burst_length: u32,
    #[allow(missing_docs)]
    pub first_burst_length: u32,
    #[allow(missing_docs)]
    pub default_time2wait: u32,
    #[allow(missing_docs)]
    pub default_time2retain: u32,
    #[allow(missing_docs)]
    pub max_outstanding_r2t: u32,
    #[allow(missing_docs)]
    pub data_pdu_in_order: bool,
    #[allow(missing_docs)]
    pub data_sequence_in_order: bool,
    #[allow(missing_docs)]
    pub error_recovery_level: u32,
    /// iSCSIProtocolLevel (RFC 7144): 1 for RFC 7143.
    pub protocol_level: u32,
    /// TaskReporting values in preference order.
    pub task_reporting: Vec<&'static str>,
    /// iSER: MaxOutstandingUnexpectedPDUs (0 = no limit).
    pub max_outstanding_unexpected_pdus: u32,
}

impl Default for OperationalConfig {
    /// The RFC 7143 defaults, but with a 256 KiB receive segment, 1 MiB bursts and unsolicited
    /// data allowed (InitialR2T=No) as modern peers use, both digests accepted (None preferred),
    /// iSCSIProtocolLevel 1.
    fn default() -> Self {
        Self {
            header_digest: alloc::vec![Digest::None, Digest::Crc32c],
            data_digest: alloc::vec![Digest::None, Digest::Crc32c],
            max_connections: 1,
            initial_r2t: false,
            immediate_data: true,
            max_recv_data_segment_length: 262_144,
            max_burst_length: 1_048_576,
            first_burst_length: 262_144,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            protocol_level: 1,
            task_reporting: alloc::vec!["RFC3720"],
            max_outstanding_unexpected_pdus: 0,
        }
    }
}

fn yes_no(b: bool) -> &'static str {
    if b { "Yes" } else { "No" }
}

impl OperationalConfig {
    /// InitialR2T: `true` forbids unsolicited Data-Out.
    #[must_use]
    pub fn initial_r2t(mut self, yes: bool) -> Self {
        self.initial_r2t = yes;
        self
    }

    /// ImmediateData.
    #[must_use]
    pub fn immediate_data(mut self, yes: bool) -> Self {
        self.immediate_data = yes;
        self
    }

    /// What this side receives per PDU.
    #[must_use]
    pub fn max_recv_data_segment_length(mut self, bytes: u32) -> Self {
        self.max_recv_data_segment_length = bytes;
        self
    }

    /// MaxBurstLength.
    #[must_use]
    pub fn max_burst_length(mut self, bytes: u32) -> Self {
        self.max_burst_length = bytes;
        self
    }

    /// FirstBurstLength.
    #[must_use]
    pub fn first_burst_length(mut self, bytes: u32) -> Self {
        self.first_burst_length = bytes;
        self
    }

    /// MaxOutstandingR2T.
    #[must_use]
    pub fn max_outstanding_r2t(mut self, n: u32) -> Self {
        self.max_outstanding_r2t = n;
        self
    }

    /// HeaderDigest values, in preference order.
    #[must_use]
    pub fn header_digest(mut self, digests: Vec<Digest>) -> Self {
        self.header_digest = digests;
        self
    }

    /// DataDigest values, in preference order.
    #[must_use]
    pub fn data_digest(mut self, digests: Vec<Digest>) -> Self {
        self.data_digest = digests;
        self
    }

    /// Our value for a negotiated (non-declarative) key under a transport, as text; `None` for
    /// keys we do not take part in.
    pub fn local_value(&self, key: &str, transport: Transport) -> Option<String> {
        let list = |v: &[Digest]| v.iter().map(|d| d.as_str()).collect::<Vec<_>>().join(",");
        Some(match key {
            "HeaderDigest" if transport == Transport::Iser => "None".into(),
            "DataDigest" if transport == Transport::Iser => "None".into(),
            "HeaderDigest" => list(&self.header_digest),
            "DataDigest" => list(&self.data_digest),
            "MaxConnections" => self.max_connections.to_string(),
            "InitialR2T" => yes_no(self.initial_r2t).into(),
            "ImmediateData" => yes_no(self.immediate_data).into(),
            "MaxBurstLength" => self.max_burst_length.to_string(),
            "FirstBurstLength" => self.first_burst_length.to_string(),
            "DefaultTime2Wait" => self.default_time2wait.to_string(),
            "DefaultTime2Retain" => self.default_time2retain.to_string(),
            "MaxOutstandingR2T" => self.max_outstanding_r2t.to_string(),
            "DataPDUInOrder" => yes_no(self.data_pdu_in_order).into(),
            "DataSequenceInOrder" => yes_no(self.data_sequence_in_order).into(),
            "ErrorRecoveryLevel" => self.error_recovery_level.to_string(),
            "IFMarker" | "OFMarker" => "No".into(),
            "TaskReporting" => self.task_reporting.join(","),
            "iSCSIProtocolLevel" => self.protocol_level.to_string(),
            "RDMAExtensions" => yes_no(transport == Transport::Iser).into(),
            "MaxOutstandingUnexpectedPDUs" => self.max_outstanding_unexpected_pdus.to_string(),
            _ => return None,
        })
    }
}

/// RFC 7143's default MaxRecvDataSegmentLength (§13.12), in force until declared otherwise, and
/// the login phase's segment limit.
pub const DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH: u32 = 8192;

/// The outcome of a login's negotiation, typed. Values not negotiated keep their defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NegotiatedParams {
    #[allow(missing_docs)]
    pub session_type: SessionType,
    #[allow(missing_docs)]
    pub transport: Transport,
    #[allow(missing_docs)]
    pub header_digest: Digest,
    #[allow(missing_docs)]
    pub data_digest: Digest,
    #[allow(missing_docs)]
    pub max_connections: u32,
    #[allow(missing_docs)]
    pub initial_r2t: bool,
    #[allow(missing_docs)]
    pub immediate_data: bool,
    /// Largest data segment the initiator accepts in one PDU (its MaxRecvDataSegmentLength on
    /// TCP, InitiatorRecvDataSegmentLength on iSER).
    pub initiator_recv_data_segment_length: u32,
    /// Largest data segment the target accepts in one PDU.
    pub target_recv_data_segment_length: u32,
    #[allow(missing_docs)]
    pub max_burst_length: u32,
    #[allow(missing_docs)]
    pub first_burst_length: u32,
    #[allow(missing_docs)]
    pub default_time2wait: u32,
    #[allow(missing_docs)]
    pub default_time2retain: u32,
    #[allow(missing_docs)]
    pub max_outstanding_r2t: u32,
    #[allow(missing_docs)]
    pub data_pdu_in_order: bool,
    #[allow(missing_docs)]
    pub data_sequence_in_order: bool,
    #[allow(missing_docs)]
    pub error_recovery_level: u32,
    #[allow(missing_docs)]
    pub task_reporting: String,
    #[allow(missing_docs)]
    pub protocol_level: u32,
    #[allow(missing_docs)]
    pub rdma_extensions: bool,
    /// 0 = no limit.
    pub max_outstanding_unexpected_pdus: u32,
    #[allow(missing_docs)]
    pub initiator_name: String,
    #[allow(missing_docs)]
    pub initiator_alias: Option<String>,
    /// Empty on discovery sessions.
    pub target_name: String,
    #[allow(missing_docs)]
    pub target_alias: Option<String>,
    #[allow(missing_docs)]
    pub target_portal_group_tag: Option<u16>,
}

impl Default for NegotiatedParams {
    fn default() -> Self {
        Self {
            session_type: SessionType::Normal,
            transport: Transport::Tcp,
            header_digest: Digest::None,
            data_digest: Digest::None,
            max_connections: 1,
            initial_r2t: true,
            immediate_data: true,
            initiator_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            target_recv_data_segment_length: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            max_burst_length: 262_144,
            first_burst_length: 65_536,
            default_time2wait: 2,
            default_time2retain: 20,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            task_reporting: "RFC3720".into(),
            protocol_level: 0,
            rdma_extensions: false,
            max_outstanding_unexpected_pdus: 0,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: String::new(),
            target_alias: None,
            target_portal_group_tag: None,
        }
    }
}

impl NegotiatedParams {
    /// The largest data segment this side may send in one PDU.
    pub fn max_send_data_segment_length(&self, role: Role) -> u32 {
        match role {
            Role::Initiator => self.target_recv_data_segment_length,
            Role::Target => self.initiator_recv_data_segment_length,
        }
    }

    pub(crate) fn set(&mut self, key: &str, value: &str) {
        let num = |v: &str| crate::text::parse_number(v).ok().map(|n| n.min(u64::from(u32::MAX)) as u32);
        let yes = |v: &str| v == "Yes";
        match key {
            "SessionType" => self.session_type = if value == "Discovery" { SessionType::Discovery } else { SessionType::Normal },
            "HeaderDigest" => self.header_digest = Digest::parse(value),
            "DataDigest" => self.data_digest = Digest::parse(value),
            "MaxConnections" => self.max_connections = num(value).unwrap_or(1),
            "InitialR2T" => self.initial_r2t = yes(value),
            "ImmediateData" => self.immediate_data = yes(value),
            "MaxBurstLength" => self.max_burst_length = num(value).unwrap_or(262_144),
            "FirstBurstLength" => self.first_burst_length = num(value).unwrap_or(65_536),
            "DefaultTime2Wait" => self.default_time2wait = num(value).unwrap_or(2),
            "DefaultTime2Retain" => self.default_time2retain = num(value).unwrap_or(20),
            "MaxOutstandingR2T" => self.max_outstanding_r2t = num(value).unwrap_or(1),
            "DataPDUInOrder" => self.data_pdu_in_order = yes(value),
            "DataSequenceInOrder" => self.data_sequence_in_order = yes(value),
            "ErrorRecoveryLevel" => self.error_recovery_level = num(value).unwrap_or(0),
            "TaskReporting" => self.task_reporting = value.into(),
            "iSCSIProtocolLevel" => self.protocol_level = num(value).unwrap_or(0),
            "RDMAExtensions" => self.rdma_extensions = yes(value),
            "MaxOutstandingUnexpectedPDUs" => self.max_outstanding_unexpected_pdus = num(value).unwrap_or(0),
            "InitiatorName" => self.initiator_name = value.into(),
            "InitiatorAlias" => self.initiator_alias = Some(value.into()),
            "TargetName" => self.target_name = value.into(),
            "TargetAlias" => self.target_alias = Some(value.into()),
            "TargetPortalGroupTag" => self.target_portal_group_tag = num(value).map(|n| n as u16),
            _ => {}
        }
    }
}
