//! Login (RFC 7143 §6.3, §11.12-11.13) as sans-IO state machines for both roles.
//!
//! [`TargetLogin`] answers Login Requests according to a [`TargetLoginConfig`] (which targets
//! exist, who may log in to them, CHAP secrets, operational limits); [`InitiatorLogin`] drives a
//! login to one target (or a discovery session). Both follow the crate's call contract:
//! feed inputs with `handle_*(now, …)`, then drain `poll_transmit`, `poll_event` and
//! `poll_timeout`. Every peer mistake ends in the RFC's reaction — a Login Response with a
//! failure status (target) or a failed login (initiator) — never a panic.

mod initiator;
mod target;

pub use initiator::{InitiatorAuth, InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginFailure};
pub use target::{TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};

use crate::keys::{Kind, NegotiatedParams, lookup};
use crate::wire::Isid;
use alloc::vec::Vec;
use core::fmt;

/// Largest data segment in a Login PDU in either direction: the login-phase
/// MaxRecvDataSegmentLength default, and the size of iSER login receive buffers.
pub const LOGIN_MAX_DATA: usize = 8192;

/// Login status class and detail (RFC 7143 §11.13.5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginStatus {
    /// Status-Class.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

macro_rules! statuses {
    ($($(#[$m:meta])* $name:ident = $c:literal, $d:literal;)*) => {
        impl LoginStatus {
            $($(#[$m])* pub const $name: Self = Self { class: $c, detail: $d };)*
            /// The constant's name, if known.
            pub const fn name(self) -> Option<&'static str> {
                match (self.class, self.detail) {
                    $(($c, $d) => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

statuses! {
    /// Login is proceeding OK.
    SUCCESS = 0, 0;
    /// Target moved temporarily (TargetAddress in the response).
    TARGET_MOVED_TEMPORARILY = 1, 1;
    /// Target moved permanently.
    TARGET_MOVED_PERMANENTLY = 1, 2;
    /// Miscellaneous initiator error.
    INITIATOR_ERROR = 2, 0;
    /// Authentication failed.
    AUTHENTICATION_FAILURE = 2, 1;
    /// Authorization failure (not allowed to access this target).
    AUTHORIZATION_FAILURE = 2, 2;
    /// Target not found.
    NOT_FOUND = 2, 3;
    /// Target removed.
    TARGET_REMOVED = 2, 4;
    /// Unsupported version.
    UNSUPPORTED_VERSION = 2, 5;
    /// Too many connections.
    TOO_MANY_CONNECTIONS = 2, 6;
    /// Missing parameter.
    MISSING_PARAMETER = 2, 7;
    /// Can't include in session.
    CANT_INCLUDE_IN_SESSION = 2, 8;
    /// Session type not supported.
    SESSION_TYPE_NOT_SUPPORTED = 2, 9;
    /// Session does not exist.
    SESSION_DOES_NOT_EXIST = 2, 10;
    /// Invalid request during login.
    INVALID_DURING_LOGIN = 2, 11;
    /// Target hardware or software error.
    TARGET_ERROR = 3, 0;
    /// Service unavailable.
    SERVICE_UNAVAILABLE = 3, 1;
    /// Out of resources.
    OUT_OF_RESOURCES = 3, 2;
}

impl fmt::Debug for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}{:02x}", self.class, self.detail)?;
        if let Some(n) = self.name() {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

impl fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// A login PDU to send: the header value and its data segment (text).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginPdu<H> {
    /// Login Request or Login Response.
    pub header: H,
    /// Text.
    pub data: Vec<u8>,
}

/// The result of a successful login, for the session layer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginOutcome {
    /// Negotiated operational parameters and names.
    pub params: NegotiatedParams,
    /// ISID.
    pub isid: Isid,
    /// TSIH of the session.
    pub tsih: u16,
    /// Connection ID.
    pub cid: u16,
    /// Target: the next StatSN to send. Initiator: the next StatSN expected (ExpStatSN).
    pub stat_sn: u32,
    /// ExpCmdSN after login: the login's CmdSN (login PDUs do not advance it), which the first
    /// command carries. On the initiator it is taken from the login itself, not from the
    /// target's final response (tgt's iSER login overstates it by one).
    pub exp_cmd_sn: u32,
    /// MaxCmdSN announced in the final response.
    pub max_cmd_sn: u32,
}

type Pairs<'a> = Vec<(&'a str, &'a str)>;

/// Split pairs into authentication keys and the rest.
fn split_auth<'a>(pairs: &[(&'a str, &'a str)]) -> (Pairs<'a>, Pairs<'a>) {
    pairs.iter().partition(|(k, _)| lookup(k).is_some_and(|d| d.kind == Kind::Auth))
}

fn get<'a>(pairs: &[(&'a str, &'a str)], key: &str) -> Option<&'a str> {
    pairs.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

/// Expand 32 bytes of caller entropy into any number of bytes (SHA-256 in counter mode), so
/// the machines need no random source of their own.
struct Entropy {
    seed: [u8; 32],
    counter: u64,
}

impl fmt::Debug for Entropy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Entropy(<redacted>)")
    }
}

impl Entropy {
    fn new(seed: [u8; 32]) -> Self {
        Self { seed, counter: 0 }
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        use sha2::Digest as _;
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let mut h = sha2::Sha256::new();
            h.update(self.seed);
            h.update(self.counter.to_be_bytes());
            self.counter += 1;
            out.extend_from_slice(&h.finalize());
        }
        out.truncate(n);
        out
    }
}
