//! The initiator side of login.

use super::{Entropy, LOGIN_MAX_DATA, LoginOutcome, LoginPdu, LoginStatus, get, split_auth};
use crate::chap::{ChapAlgorithm, ChapCredentials};
use crate::keys::negotiate::{NegotiationError, Negotiator};
use crate::keys::{OperationalConfig, Role, SessionType, Transport};
use crate::text::{Reassembler, TextBuilder, TextError, decode_binary, encode_hex, parse_number, parse_pairs};
use crate::wire::{Header, Isid, LoginRequest, LoginResponse, Opcode, Stage};
use alloc::collections::VecDeque;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::time::Duration;

/// How the initiator authenticates.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum InitiatorAuth {
    /// No authentication (AuthMethod=None).
    #[default]
    None,
    /// CHAP; with `mutual` the target must prove itself with those credentials.
    Chap {
        /// Our CHAP_N and secret.
        credentials: ChapCredentials,
        /// Algorithms to offer, in preference order.
        algorithms: Vec<ChapAlgorithm>,
        /// The target's expected CHAP_N and secret for mutual CHAP.
        mutual: Option<ChapCredentials>,
    },
}

/// What the initiator's login needs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct InitiatorLoginConfig {
    /// InitiatorName.
    pub initiator_name: String,
    /// InitiatorAlias.
    pub initiator_alias: Option<String>,
    /// TargetName; `None` makes this a discovery session.
    pub target_name: Option<String>,
    /// ISID.
    pub isid: Isid,
    /// TSIH: 0 for a new session (or a reinstatement), the session's TSIH to add a connection.
    pub tsih: u16,
    /// CID.
    pub cid: u16,
    /// Authentication.
    pub auth: InitiatorAuth,
    /// Operational offers.
    pub operational: OperationalConfig,
    /// Transport.
    pub transport: Transport,
    /// The whole login must finish within this time.
    pub login_timeout: Duration,
    /// CmdSN of the login (the first command uses it too).
    pub cmd_sn: u32,
    /// ITT of the login PDUs.
    pub itt: u32,
    /// ExpStatSN to send first (0 for a new connection).
    pub exp_stat_sn: u32,
}

impl InitiatorLoginConfig {
    /// A normal-session login to `target` with default offers and no authentication.
    pub fn new(initiator_name: impl Into<String>, target_name: Option<String>, isid: Isid) -> Self {
        Self {
            initiator_name: initiator_name.into(),
            initiator_alias: None,
            target_name,
            isid,
            tsih: 0,
            cid: 0,
            auth: InitiatorAuth::None,
            operational: OperationalConfig::default(),
            transport: Transport::Tcp,
            login_timeout: Duration::from_secs(15),
            cmd_sn: 1,
            itt: 0,
            exp_stat_sn: 0,
        }
    }

    /// With this InitiatorAlias.
    #[must_use]
    pub fn initiator_alias(mut self, alias: impl Into<String>) -> Self {
        self.initiator_alias = Some(alias.into());
        self
    }

    /// Authenticate this way.
    #[must_use]
    pub fn auth(mut self, auth: InitiatorAuth) -> Self {
        self.auth = auth;
        self
    }

    /// Offer these operational values.
    #[must_use]
    pub fn operational(mut self, operational: OperationalConfig) -> Self {
        self.operational = operational;
        self
    }

    /// Log in over this transport.
    #[must_use]
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// Time the whole login may take.
    #[must_use]
    pub fn login_timeout(mut self, timeout: Duration) -> Self {
        self.login_timeout = timeout;
        self
    }

    /// Add a connection to the session with this TSIH, as connection `cid`.
    #[must_use]
    pub fn add_connection(mut self, tsih: u16, cid: u16) -> Self {
        self.tsih = tsih;
        self.cid = cid;
        self
    }
}

/// Why a login failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoginFailure {
    /// The target answered with a failure status.
    #[error("target refused the login: status {0}")]
    Status(LoginStatus),
    /// The target broke the protocol.
    #[error("login protocol error: {0}")]
    Protocol(LoginViolation),
    /// Authentication could not be completed (including the target failing mutual CHAP).
    #[error("authentication failed: {0}")]
    Authentication(AuthFailure),
    /// No answer in time.
    #[error("login timed out")]
    Timeout,
}

/// How the target broke the login protocol ([`LoginFailure::Protocol`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LoginViolation {
    /// The target answered a Login Request with a Reject PDU.
    #[error("target rejected a login PDU")]
    TargetRejected,
    /// A PDU other than a Login Response (or Reject) arrived during login.
    #[error("{0:?} PDU during login")]
    UnexpectedPdu(Opcode),
    /// The login took more request/response rounds than any sane negotiation needs.
    #[error("too many login rounds (more than {max})")]
    TooManyRounds {
        /// The limit.
        max: u32,
    },
    /// A Login Response with a VersionActive other than 0 (RFC 7143 §11.13.4).
    #[error("unsupported VersionActive {0}")]
    UnsupportedVersion(u8),
    /// A Login Response for another login task (ITT) or session (ISID).
    #[error("Login Response for ITT {itt:#x} / {isid:?}, expected ITT {expected_itt:#x} / {expected_isid:?}")]
    WrongTask {
        /// The response's ITT.
        itt: u32,
        /// The response's ISID.
        isid: Isid,
        /// Our login's ITT.
        expected_itt: u32,
        /// Our ISID.
        expected_isid: Isid,
    },
    /// The response's CSG is not the stage we are in.
    #[error("CSG {} of the response does not match ours ({})", got.0, expected.0)]
    StageMismatch {
        /// The response's CSG.
        got: Stage,
        /// Our current stage.
        expected: Stage,
    },
    /// The response transits to a stage that is not a later valid one.
    #[error("invalid NSG {} in response (CSG {})", nsg.0, csg.0)]
    InvalidNsg {
        /// The response's CSG.
        csg: Stage,
        /// The response's NSG.
        nsg: Stage,
    },
    /// The target answered (text, or T bit) while our text was still being sent in pieces.
    #[error("target answered before our text was complete")]
    AnsweredBeforeTextComplete,
    /// Malformed text (or text over the reassembly limit).
    #[error(transparent)]
    Text(TextError),
    /// A negotiation the target got wrong.
    #[error(transparent)]
    Negotiation(NegotiationError),
    /// Security keys in the operational stage.
    #[error("security keys outside the security stage")]
    SecurityKeysOutsideSecurityStage,
    /// The final response came while our offers were still unanswered.
    #[error("target completed login without answering our offers")]
    CompletedWithoutAnswers,
    /// The final response offered keys of its own, which we could no longer answer.
    #[error("target completed login while offering keys")]
    CompletedWhileOffering,
    /// A normal session's login ended without the target declaring TargetPortalGroupTag.
    #[error("TargetPortalGroupTag missing from a normal-session login")]
    MissingTargetPortalGroupTag,
    /// An iSER connection's login ended without RDMAExtensions=Yes.
    #[error("target did not accept RDMAExtensions=Yes on an iSER connection")]
    RdmaExtensionsRefused,
    /// The final Login Response carries TSIH 0.
    #[error("final Login Response without TSIH")]
    MissingTsih,
    /// Security keys where none belong (no authentication, or one-way CHAP after CHAP_R).
    #[error("unexpected security keys")]
    UnexpectedSecurityKeys,
    /// Security keys after authentication finished.
    #[error("security keys after authentication")]
    SecurityKeysAfterAuthentication,
}

/// Why authentication failed ([`LoginFailure::Authentication`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthFailure {
    /// We offered no authentication; the target demands this AuthMethod.
    #[error("target demands AuthMethod {0}")]
    MethodDemanded(String),
    /// We offered CHAP; the target answered this AuthMethod.
    #[error("target answered AuthMethod={0}")]
    MethodAnswered(String),
    /// The target set the T bit in the security stage before authentication was complete.
    #[error("target left the security stage before authentication finished")]
    LeftSecurityStageEarly,
    /// The target did not answer our AuthMethod offer.
    #[error("target did not answer AuthMethod")]
    NoAuthMethodAnswer,
    /// The target's CHAP challenge lacks CHAP_A, CHAP_I or CHAP_C.
    #[error("CHAP_A, CHAP_I and CHAP_C expected")]
    ChapKeysMissing,
    /// The target's CHAP_A is not one of the algorithms we offered.
    #[error("target chose CHAP_A={0}, an algorithm we did not offer")]
    AlgorithmNotOffered(String),
    /// CHAP_I is not a number from 0 to 255.
    #[error("bad CHAP_I {0:?}")]
    BadChapI(String),
    /// CHAP_C is not a binary value.
    #[error("malformed CHAP_C")]
    MalformedChapC,
    /// CHAP_C is empty or longer than 1024 bytes.
    #[error("unacceptable CHAP_C length {0}")]
    ChapCLength(usize),
    /// Mutual CHAP: the target did not answer our challenge (CHAP_N and CHAP_R).
    #[error("target did not answer our mutual CHAP challenge")]
    NoMutualAnswer,
    /// Mutual CHAP: the target's CHAP_R is not a binary value.
    #[error("malformed target CHAP_R")]
    MalformedTargetChapR,
    /// Mutual CHAP: the target's name or response is wrong.
    #[error("target failed mutual CHAP")]
    MutualChapFailed,
}

/// What the initiator login machine reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitiatorLoginEvent {
    /// Full feature phase reached.
    Complete(LoginOutcome),
    /// The target redirects to another address (status class 1).
    Redirect {
        /// TargetAddress values (`host:port,tpgt`).
        addresses: Vec<String>,
        /// Moved permanently rather than temporarily.
        permanent: bool,
    },
    /// The login failed; close the connection.
    Failed(LoginFailure),
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Auth {
    /// AuthMethod offered.
    Offered,
    /// CHAP_A sent.
    SentAlgorithms,
    /// CHAP_R sent; for mutual, our challenge is kept.
    SentResponse {
        mutual: Option<(ChapAlgorithm, u8, Vec<u8>)>,
    },
    Done,
}

/// The login state machine of one initiator connection.
#[derive(Debug)]
pub struct InitiatorLogin {
    config: InitiatorLoginConfig,
    entropy: Entropy,
    neg: Negotiator,
    auth: Auth,
    stage: Stage,
    done: bool,
    exp_stat_sn: u32,
    deadline: Duration,
    rx_text: Reassembler,
    /// Our text still to send in continuation PDUs (with the T/NSG of the last piece).
    tx_rest: Option<(Vec<u8>, bool, Stage)>,
    transmit: VecDeque<LoginPdu<LoginRequest>>,
    events: VecDeque<InitiatorLoginEvent>,
    rounds: u32,
    operational_sent: bool,
}

const MAX_ROUNDS: u32 = 64;

type Step = Result<(), LoginFailure>;

fn protocol(why: LoginViolation) -> LoginFailure {
    LoginFailure::Protocol(why)
}

fn auth_failed(why: AuthFailure) -> LoginFailure {
    LoginFailure::Authentication(why)
}

impl LoginPdu<LoginRequest> {
    /// Whether this request asks to enter the full feature phase (T bit, NSG 3): the
    /// datamover's full-feature resources must be allocated before it is sent (RFC 5047 §7,
    /// RFC 7145 §5.1), as the target may answer with the final Login Response at once.
    pub fn asks_for_full_feature(&self) -> bool {
        self.header.transit && self.header.nsg == Stage::FULL_FEATURE
    }
}

impl InitiatorLogin {
    /// Start a login at time `now`; the first Login Request is ready in `poll_transmit`.
    /// `entropy` seeds the mutual CHAP identifier and challenge: 32 bytes fresh from a
    /// cryptographic generator (the OS's) for every login.
    pub fn new(config: InitiatorLoginConfig, now: Duration, entropy: [u8; 32]) -> Self {
        let mut neg = Negotiator::new(Role::Initiator, config.transport, config.operational.clone(), config.tsih == 0);
        let session_type = if config.target_name.is_some() { SessionType::Normal } else { SessionType::Discovery };
        neg.set_session_type(session_type);
        let mut me = Self {
            entropy: Entropy::new(entropy),
            neg,
            auth: Auth::Offered,
            stage: Stage::SECURITY,
            done: false,
            exp_stat_sn: config.exp_stat_sn,
            deadline: now + config.login_timeout,
            rx_text: Reassembler::new(crate::text::DEFAULT_MAX_TEXT),
            tx_rest: None,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            rounds: 0,
            operational_sent: false,
            config,
        };
        let mut out = TextBuilder::new();
        me.neg.declare("InitiatorName", me.config.initiator_name.clone(), &mut out);
        if let Some(a) = me.config.initiator_alias.clone() {
            me.neg.declare("InitiatorAlias", a, &mut out);
        }
        me.neg.declare("SessionType", session_type.as_str().into(), &mut out);
        if let Some(t) = me.config.target_name.clone() {
            me.neg.declare("TargetName", t, &mut out);
        }
        match &me.config.auth {
            InitiatorAuth::None => {
                out.push("AuthMethod", "None");
                me.send(out.into_bytes(), true, Stage::OPERATIONAL);
            }
            InitiatorAuth::Chap { .. } => {
                out.push("AuthMethod", "CHAP");
                me.send(out.into_bytes(), false, Stage::SECURITY);
            }
        }
        me
    }

    /// Whether the login has ended.
    pub fn is_finished(&self) -> bool {
        self.done
    }

    /// Next Login Request to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<LoginPdu<LoginRequest>> {
        self.transmit.pop_front()
    }

    /// Next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<InitiatorLoginEvent> {
        self.events.pop_front()
    }

    /// When [`InitiatorLogin::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        (!self.done).then_some(self.deadline)
    }

    /// The login timer fired.
    pub fn handle_timeout(&mut self, now: Duration) {
        if !self.done && now >= self.deadline {
            self.finish(InitiatorLoginEvent::Failed(LoginFailure::Timeout));
        }
    }

    fn finish(&mut self, ev: InitiatorLoginEvent) {
        self.done = true;
        self.events.push_back(ev);
    }

    /// Queue `text` as one request (or a continuation sequence).
    fn send(&mut self, text: Vec<u8>, transit: bool, nsg: Stage) {
        if text.len() > LOGIN_MAX_DATA {
            let rest = text[LOGIN_MAX_DATA..].to_vec();
            self.push_request(text[..LOGIN_MAX_DATA].to_vec(), false, true, Stage::default());
            self.tx_rest = Some((rest, transit, nsg));
        } else {
            self.push_request(text, transit, false, nsg);
        }
    }

    fn push_request(&mut self, data: Vec<u8>, transit: bool, cont: bool, nsg: Stage) {
        let header = LoginRequest {
            transit,
            cont,
            csg: self.stage,
            nsg: if transit { nsg } else { Stage::default() },
            version_max: 0,
            version_min: 0,
            isid: self.config.isid,
            tsih: self.config.tsih,
            itt: self.config.itt,
            cid: self.config.cid,
            cmd_sn: self.config.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        self.transmit.push_back(LoginPdu { header, data });
    }

    /// A PDU arrived during login.
    pub fn handle_pdu(&mut self, now: Duration, header: &Header, data: &[u8]) {
        if self.done {
            return;
        }
        if now >= self.deadline {
            self.finish(InitiatorLoginEvent::Failed(LoginFailure::Timeout));
            return;
        }
        let result = match header {
            Header::LoginResponse(rsp) => self.step(rsp, data),
            Header::Reject(_) => Err(protocol(LoginViolation::TargetRejected)),
            other => Err(protocol(LoginViolation::UnexpectedPdu(other.opcode()))),
        };
        if let Err(e) = result {
            self.finish(InitiatorLoginEvent::Failed(e));
        }
    }

    fn step(&mut self, rsp: &LoginResponse, data: &[u8]) -> Step {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return Err(protocol(LoginViolation::TooManyRounds { max: MAX_ROUNDS }));
        }
        if rsp.version_active != 0 {
            return Err(protocol(LoginViolation::UnsupportedVersion(rsp.version_active)));
        }
        self.exp_stat_sn = rsp.stat_sn.wrapping_add(1);
        let status = LoginStatus { class: rsp.status_class, detail: rsp.status_detail };
        match status.class {
            0 => {}
            1 => {
                let text = self.rx_text.push(data, false).ok().flatten().unwrap_or_default();
                let pairs = parse_pairs(&text).unwrap_or_default();
                let addresses = pairs.iter().filter(|(k, _)| *k == "TargetAddress").map(|(_, v)| v.to_string()).collect();
                self.finish(InitiatorLoginEvent::Redirect { addresses, permanent: status == LoginStatus::TARGET_MOVED_PERMANENTLY });
                return Ok(());
            }
            _ => return Err(LoginFailure::Status(status)),
        }
        // (Checked after the status: tgt zeroes the ISID in failure responses.)
        if rsp.itt != self.config.itt || rsp.isid != self.config.isid {
            return Err(protocol(LoginViolation::WrongTask {
                itt: rsp.itt,
                isid: rsp.isid,
                expected_itt: self.config.itt,
                expected_isid: self.config.isid,
            }));
        }
        if rsp.csg != self.stage {
            return Err(protocol(LoginViolation::StageMismatch { got: rsp.csg, expected: self.stage }));
        }
        if rsp.transit && (rsp.nsg.0 <= rsp.csg.0 || rsp.nsg.0 == 2) {
            return Err(protocol(LoginViolation::InvalidNsg { csg: rsp.csg, nsg: rsp.nsg }));
        }

        // Our own continuation: the target acknowledged a piece, send the next.
        if let Some((rest, transit, nsg)) = self.tx_rest.take() {
            if !data.is_empty() || rsp.transit {
                return Err(protocol(LoginViolation::AnsweredBeforeTextComplete));
            }
            self.send(rest, transit, nsg);
            return Ok(());
        }

        let text = match self.rx_text.push(data, rsp.cont) {
            Ok(Some(t)) => t,
            Ok(None) => {
                // Ask for the rest of the target's text.
                self.push_request(Vec::new(), false, false, Stage::default());
                return Ok(());
            }
            Err(e) => return Err(protocol(LoginViolation::Text(e))),
        };
        let pairs = parse_pairs(&text).map_err(|e| protocol(LoginViolation::Text(e)))?;
        let (auth_keys, other) = split_auth(&pairs);
        let mut out = TextBuilder::new();
        self.neg.receive(&other, &mut out).map_err(|e| protocol(LoginViolation::Negotiation(e)))?;

        if self.stage == Stage::SECURITY {
            self.authenticate(&auth_keys, &mut out)?;
        } else if !auth_keys.is_empty() {
            return Err(protocol(LoginViolation::SecurityKeysOutsideSecurityStage));
        }

        if rsp.transit {
            if self.auth != Auth::Done {
                return Err(auth_failed(AuthFailure::LeftSecurityStageEarly));
            }
            self.stage = rsp.nsg;
            if self.stage == Stage::FULL_FEATURE {
                if self.neg.pending() {
                    return Err(protocol(LoginViolation::CompletedWithoutAnswers));
                }
                if !out.is_empty() {
                    return Err(protocol(LoginViolation::CompletedWhileOffering));
                }
                if self.neg.session_type() == SessionType::Normal && self.neg.peer_declared("TargetPortalGroupTag").is_none() {
                    return Err(protocol(LoginViolation::MissingTargetPortalGroupTag));
                }
                let outcome = LoginOutcome {
                    params: self.neg.params(),
                    isid: self.config.isid,
                    tsih: rsp.tsih,
                    cid: self.config.cid,
                    stat_sn: self.exp_stat_sn,
                    // Login PDUs consume no CmdSN: the first command carries the login's own
                    // (RFC 7143 §11.12.8), whatever ExpCmdSN the response reports. tgt's iSER
                    // login reports CmdSN + 1 (with MaxCmdSN = CmdSN) but its session expects
                    // CmdSN, and holds a command numbered CmdSN + 1 forever. (Linux ignores
                    // these fields too: it restarts its window from its own CmdSN.)
                    exp_cmd_sn: self.config.cmd_sn,
                    max_cmd_sn: rsp.max_cmd_sn,
                };
                if self.config.transport == Transport::Iser
                    && outcome.params.session_type == SessionType::Normal
                    && !outcome.params.rdma_extensions
                {
                    return Err(protocol(LoginViolation::RdmaExtensionsRefused));
                }
                if rsp.tsih == 0 {
                    return Err(protocol(LoginViolation::MissingTsih));
                }
                self.finish(InitiatorLoginEvent::Complete(outcome));
                return Ok(());
            }
        }

        // Decide the next request.
        if self.stage == Stage::SECURITY {
            // CHAP_R goes with T=1: nothing more is needed from our side (tgt refuses an
            // extra empty round).
            let transit = matches!(self.auth, Auth::Done | Auth::SentResponse { .. });
            self.send(out.into_bytes(), transit, Stage::OPERATIONAL);
        } else {
            if !self.operational_sent {
                self.operational_sent = true;
                self.neg.initiator_offers(&mut out);
            }
            self.send(out.into_bytes(), true, Stage::FULL_FEATURE);
        }
        Ok(())
    }

    fn authenticate(&mut self, keys: &[(&str, &str)], out: &mut TextBuilder) -> Step {
        let InitiatorAuth::Chap { credentials, algorithms, mutual } = self.config.auth.clone() else {
            match self.auth {
                Auth::Offered => match get(keys, "AuthMethod") {
                    Some("None") | None => self.auth = Auth::Done,
                    Some(other) => {
                        return Err(auth_failed(AuthFailure::MethodDemanded(other.into())));
                    }
                },
                _ => {
                    if !keys.is_empty() {
                        return Err(protocol(LoginViolation::UnexpectedSecurityKeys));
                    }
                }
            }
            return Ok(());
        };
        match self.auth.clone() {
            Auth::Offered => match get(keys, "AuthMethod") {
                Some("CHAP") => {
                    let list: Vec<String> = algorithms.iter().map(|a| a.code().to_string()).collect();
                    out.push("CHAP_A", &list.join(","));
                    self.auth = Auth::SentAlgorithms;
                }
                Some(other) => {
                    return Err(auth_failed(AuthFailure::MethodAnswered(other.into())));
                }
                None => return Err(auth_failed(AuthFailure::NoAuthMethodAnswer)),
            },
            Auth::SentAlgorithms => {
                let (Some(a), Some(i), Some(c)) = (get(keys, "CHAP_A"), get(keys, "CHAP_I"), get(keys, "CHAP_C")) else {
                    return Err(auth_failed(AuthFailure::ChapKeysMissing));
                };
                let alg = parse_number(a)
                    .ok()
                    .and_then(ChapAlgorithm::from_code)
                    .filter(|a| algorithms.contains(a))
                    .ok_or_else(|| auth_failed(AuthFailure::AlgorithmNotOffered(a.into())))?;
                let id = parse_number(i).ok().filter(|i| *i <= 255).ok_or_else(|| auth_failed(AuthFailure::BadChapI(i.into())))? as u8;
                let challenge = decode_binary(c).map_err(|_| auth_failed(AuthFailure::MalformedChapC))?;
                if challenge.is_empty() || challenge.len() > 1024 {
                    return Err(auth_failed(AuthFailure::ChapCLength(challenge.len())));
                }
                out.push("CHAP_N", &credentials.user);
                out.push("CHAP_R", &encode_hex(&alg.response(id, &credentials.secret, &challenge)));
                let mine = if mutual.is_some() {
                    let my_id = self.entropy.bytes(1)[0];
                    let mut my_c = self.entropy.bytes(alg.challenge_len());
                    if my_c == challenge {
                        my_c[0] ^= 0xff;
                    }
                    out.push("CHAP_I", &my_id.to_string());
                    out.push("CHAP_C", &encode_hex(&my_c));
                    Some((alg, my_id, my_c))
                } else {
                    None
                };
                self.auth = Auth::SentResponse { mutual: mine };
            }
            Auth::SentResponse { mutual: mine } => {
                if let (Some((alg, id, challenge)), Some(m)) = (mine, mutual) {
                    let (Some(n), Some(r)) = (get(keys, "CHAP_N"), get(keys, "CHAP_R")) else {
                        return Err(auth_failed(AuthFailure::NoMutualAnswer));
                    };
                    let r = decode_binary(r).map_err(|_| auth_failed(AuthFailure::MalformedTargetChapR))?;
                    if n != m.user || !alg.verify(id, &m.secret, &challenge, &r) {
                        return Err(auth_failed(AuthFailure::MutualChapFailed));
                    }
                } else if !keys.is_empty() {
                    return Err(protocol(LoginViolation::UnexpectedSecurityKeys));
                }
                self.auth = Auth::Done;
            }
            Auth::Done => {
                if !keys.is_empty() {
                    return Err(protocol(LoginViolation::SecurityKeysAfterAuthentication));
                }
            }
        }
        Ok(())
    }
}
