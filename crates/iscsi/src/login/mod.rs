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

// A wire field, defined with the Login PDUs in `wire`; documented here too, where it was first.
#[doc(inline)]
pub use crate::wire::LoginStatus;
pub use initiator::{AuthFailure, InitiatorAuth, InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent, LoginFailure, LoginViolation};
pub use target::{AclEntry, TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};

use crate::keys::{Kind, NegotiatedParams, lookup};
use crate::wire::Isid;
use alloc::vec::Vec;
use core::fmt;

/// Largest data segment in a Login PDU in either direction: the login-phase
/// MaxRecvDataSegmentLength default, and the size of iSER login receive buffers.
pub const LOGIN_MAX_DATA: usize = 8192;

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
