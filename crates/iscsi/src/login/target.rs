//! The target side of login.

use super::{Entropy, LOGIN_MAX_DATA, LoginOutcome, LoginPdu, LoginStatus, get, split_auth};
use crate::chap::{ChapAlgorithm, ChapCredentials, parse_algorithms};
use crate::keys::negotiate::Negotiator;
use crate::keys::{OperationalConfig, Role, SessionType, Transport};
use crate::text::{Reassembler, TextBuilder, decode_binary, encode_hex, parse_number, parse_pairs};
use crate::wire::{Header, Isid, LoginRequest, LoginResponse, Stage};
use alloc::collections::VecDeque;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::time::Duration;

/// An initiator a target node admits, with the CHAP credentials of its own, if any.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AclEntry {
    /// The initiator's iSCSI name (compared without regard to case).
    pub initiator: String,
    /// CHAP this initiator must pass (one-way); `None`: the node's [`TargetNode::chap`].
    pub chap: Option<ChapCredentials>,
    /// Credentials the target answers this initiator's mutual CHAP with (then required). Used
    /// only with this entry's own `chap`; without it the node's pair applies.
    pub mutual_chap: Option<ChapCredentials>,
}

impl AclEntry {
    /// Admit `initiator`, authenticated as the node says.
    pub fn new(initiator: impl Into<String>) -> Self {
        Self { initiator: initiator.into(), chap: None, mutual_chap: None }
    }

    /// This initiator's own CHAP credentials (`None`: the node's).
    #[must_use]
    pub fn chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.chap = credentials.into();
        self
    }

    /// Answer (and so require) this initiator's mutual CHAP with these credentials.
    #[must_use]
    pub fn mutual_chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.mutual_chap = credentials.into();
        self
    }

    /// Whether this entry names `initiator`.
    pub fn admits(&self, initiator: &str) -> bool {
        self.initiator.eq_ignore_ascii_case(initiator)
    }
}

/// A target node the portal serves.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TargetNode {
    /// iSCSI name (iqn./eui./naa.).
    pub name: String,
    /// TargetAlias, if any.
    pub alias: Option<String>,
    /// The initiators allowed to log in, each with its own CHAP credentials if it has some.
    pub acl: Vec<AclEntry>,
    /// Every initiator may log in, named in `acl` or not (those named there still use their own
    /// credentials). [`TargetNode::open`] makes an open node; naming an initiator with
    /// [`allow`](Self::allow) or [`acl_entry`](Self::acl_entry) closes it to the others.
    pub open: bool,
    /// CHAP the initiator must pass (one-way), if any: for initiators without credentials of
    /// their own in the ACL.
    pub chap: Option<ChapCredentials>,
    /// Credentials the target answers with when the initiator asks for mutual CHAP. When set,
    /// mutual CHAP is required.
    pub mutual_chap: Option<ChapCredentials>,
    /// TargetPortalGroupTag declared for this node on this portal (`None`: the portal's,
    /// [`TargetLoginConfig::portal_group_tag`]). Servers whose targets sit in different
    /// portal groups set it per connection.
    pub portal_group_tag: Option<u16>,
}

impl TargetNode {
    /// A node open to every initiator, without authentication.
    pub fn open(name: impl Into<String>) -> Self {
        Self { name: name.into(), alias: None, acl: Vec::new(), open: true, chap: None, mutual_chap: None, portal_group_tag: None }
    }

    /// With this TargetAlias.
    #[must_use]
    pub fn alias(mut self, alias: impl Into<String>) -> Self {
        self.alias = Some(alias.into());
        self
    }

    /// Admit this initiator name (once any is named, only the named ones may log in).
    #[must_use]
    pub fn allow(self, initiator: impl Into<String>) -> Self {
        self.acl_entry(AclEntry::new(initiator))
    }

    /// Admit an initiator as `entry` says (replacing an entry for the same name); the node
    /// admits only the initiators named from then on.
    #[must_use]
    pub fn acl_entry(mut self, entry: AclEntry) -> Self {
        self.acl.retain(|e| !e.admits(&entry.initiator));
        self.acl.push(entry);
        self.open = false;
        self
    }

    /// Require CHAP with these credentials (`None`: no authentication).
    #[must_use]
    pub fn chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.chap = credentials.into();
        self
    }

    /// Answer (and so require) mutual CHAP with these credentials.
    #[must_use]
    pub fn mutual_chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.mutual_chap = credentials.into();
        self
    }

    /// Whether `initiator` may log in: the node is open, or its ACL names it.
    pub fn admits(&self, initiator: &str) -> bool {
        self.open || self.acl.iter().any(|e| e.admits(initiator))
    }

    /// The CHAP credentials `initiator` must pass and the ones the target answers its mutual
    /// CHAP with: its ACL entry's own, else the node's.
    pub fn credentials_for(&self, initiator: &str) -> (Option<&ChapCredentials>, Option<&ChapCredentials>) {
        match self.acl.iter().find(|e| e.admits(initiator) && e.chap.is_some()) {
            Some(e) => (e.chap.as_ref(), e.mutual_chap.as_ref()),
            None => (self.chap.as_ref(), self.mutual_chap.as_ref()),
        }
    }
}

/// What a portal's login machine needs to know.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct TargetLoginConfig {
    /// The targets behind this portal.
    pub targets: Vec<TargetNode>,
    /// CHAP a discovery session must pass, if any (`None`: discovery is open, the default of LIO
    /// (`enforce_discovery_auth=0`) and of tgt (no account bound to discovery)). Independent
    /// of the targets' CHAP: a normal session authenticates with its target's credentials.
    pub discovery_chap: Option<ChapCredentials>,
    /// Credentials the target answers mutual CHAP with on discovery sessions; when set, mutual
    /// CHAP is required there (needs `discovery_chap`).
    pub discovery_mutual_chap: Option<ChapCredentials>,
    /// CHAP algorithms accepted, in the target's preference (the initiator's order decides).
    pub chap_algorithms: Vec<ChapAlgorithm>,
    /// TargetPortalGroupTag of this portal.
    pub portal_group_tag: u16,
    /// Operational limits offered to initiators.
    pub operational: OperationalConfig,
    /// Transport of the portal.
    pub transport: Transport,
    /// The whole login must finish within this time.
    pub login_timeout: Duration,
}

impl Default for TargetLoginConfig {
    fn default() -> Self {
        Self {
            targets: Vec::new(),
            discovery_chap: None,
            discovery_mutual_chap: None,
            chap_algorithms: ChapAlgorithm::ALL.to_vec(),
            portal_group_tag: 1,
            operational: OperationalConfig::default(),
            transport: Transport::Tcp,
            login_timeout: Duration::from_secs(15),
        }
    }
}

impl TargetLoginConfig {
    /// Add a target behind the portal.
    #[must_use]
    pub fn target(mut self, node: TargetNode) -> Self {
        self.targets.push(node);
        self
    }

    /// With these operational limits.
    #[must_use]
    pub fn operational(mut self, operational: OperationalConfig) -> Self {
        self.operational = operational;
        self
    }

    /// The portal's transport.
    #[must_use]
    pub fn transport(mut self, transport: Transport) -> Self {
        self.transport = transport;
        self
    }

    /// The portal's TargetPortalGroupTag.
    #[must_use]
    pub fn portal_group_tag(mut self, tag: u16) -> Self {
        self.portal_group_tag = tag;
        self
    }

    /// Time the whole login may take.
    #[must_use]
    pub fn login_timeout(mut self, timeout: Duration) -> Self {
        self.login_timeout = timeout;
        self
    }

    /// CHAP required on discovery sessions (`None`: discovery is open).
    #[must_use]
    pub fn discovery_chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.discovery_chap = credentials.into();
        self
    }

    /// Credentials for mutual CHAP on discovery sessions.
    #[must_use]
    pub fn discovery_mutual_chap(mut self, credentials: impl Into<Option<ChapCredentials>>) -> Self {
        self.discovery_mutual_chap = credentials.into();
        self
    }

    /// CHAP algorithms accepted.
    #[must_use]
    pub fn chap_algorithms(mut self, algorithms: Vec<ChapAlgorithm>) -> Self {
        self.chap_algorithms = algorithms;
        self
    }
}

/// Per-connection values the server supplies.
#[derive(Clone, Copy, Debug)]
pub struct TargetLoginParams {
    /// TSIH to give a new session (non-zero).
    pub new_tsih: u16,
    /// StatSN of the first Login Response.
    pub initial_stat_sn: u32,
    /// Command window to open: MaxCmdSN = ExpCmdSN + window - 1.
    pub cmd_window: u32,
    /// Randomness for CHAP identifiers and challenges: 32 bytes fresh from a cryptographic
    /// generator (the OS's) for every login, used for nothing else — in particular not for
    /// `initial_stat_sn`, which travels in clear. A guessable seed makes challenges guessable,
    /// and a recorded CHAP response replayable.
    pub entropy: [u8; 32],
}

/// What the target login machine reports.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetLoginEvent {
    /// The final Login Response has been queued; the connection enters full feature phase once
    /// it is sent (Enable_Datamover). A discovery session's outcome names no target
    /// (`params.target_name` is empty), whatever the initiator declared.
    Complete(LoginOutcome),
    /// The login failed; a Login Response with this status has been queued (unless the login
    /// timed out). Close the connection after sending it.
    Failed {
        /// Status sent.
        status: LoginStatus,
        /// Why, for logs (never contains secrets).
        reason: String,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Auth {
    /// AuthMethod not yet negotiated.
    Start,
    /// CHAP chosen; waiting for CHAP_A.
    WaitAlgorithm,
    /// Challenge sent.
    WaitResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Active,
    Done,
}

/// The login state machine of one target connection.
#[derive(Debug)]
pub struct TargetLogin {
    config: TargetLoginConfig,
    params: TargetLoginParams,
    entropy: Entropy,
    state: State,
    neg: Negotiator,
    auth: Auth,
    stage: Stage,
    first: Option<LoginRequest>,
    target: Option<usize>,
    stat_sn: u32,
    exp_cmd_sn: u32,
    deadline: Option<Duration>,
    rx_text: Reassembler,
    /// Response text still to send in continuation PDUs, and the header to use for the last.
    tx_rest: Option<(Vec<u8>, LoginResponse)>,
    transmit: VecDeque<LoginPdu<LoginResponse>>,
    events: VecDeque<TargetLoginEvent>,
    rounds: u32,
}

/// Most request/response rounds a login may take before it is refused.
const MAX_ROUNDS: u32 = 64;

struct Fail(LoginStatus, String);

fn fail<T>(status: LoginStatus, reason: impl Into<String>) -> Result<T, Fail> {
    Err(Fail(status, reason.into()))
}

impl TargetLogin {
    /// A machine for one new connection.
    pub fn new(config: TargetLoginConfig, params: TargetLoginParams) -> Self {
        let neg = Negotiator::new(Role::Target, config.transport, config.operational.clone(), true);
        Self {
            entropy: Entropy::new(params.entropy),
            neg,
            config,
            params,
            state: State::Active,
            auth: Auth::Start,
            stage: Stage::SECURITY,
            first: None,
            target: None,
            stat_sn: params.initial_stat_sn,
            exp_cmd_sn: 0,
            deadline: None,
            rx_text: Reassembler::new(crate::text::DEFAULT_MAX_TEXT),
            tx_rest: None,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            rounds: 0,
        }
    }

    /// Whether the login has ended (completed or failed).
    pub fn is_finished(&self) -> bool {
        self.state == State::Done
    }

    /// Next Login Response to send.
    #[must_use]
    pub fn poll_transmit(&mut self) -> Option<LoginPdu<LoginResponse>> {
        self.transmit.pop_front()
    }

    /// Next event.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<TargetLoginEvent> {
        self.events.pop_front()
    }

    /// When [`TargetLogin::handle_timeout`] must be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        (self.state == State::Active).then_some(self.deadline).flatten()
    }

    /// The login timer fired.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.state == State::Active && self.deadline.is_some_and(|d| now >= d) {
            self.state = State::Done;
            self.events.push_back(TargetLoginEvent::Failed { status: LoginStatus::TARGET_ERROR, reason: "login timed out".into() });
        }
    }

    /// A PDU arrived during login. Anything but a Login Request fails the login with
    /// 0x020B (invalid request during login).
    pub fn handle_pdu(&mut self, now: Duration, header: &Header, data: &[u8]) {
        if self.state != State::Active {
            return;
        }
        if self.deadline.is_none() {
            self.deadline = Some(now + self.config.login_timeout);
        }
        let Header::LoginRequest(req) = header else {
            let req = self.first.unwrap_or_default();
            self.fail(&req, LoginStatus::INVALID_DURING_LOGIN, alloc::format!("{:?} PDU during login", header.opcode()));
            return;
        };
        if let Err(Fail(status, reason)) = self.step(req, data) {
            self.fail(req, status, reason);
        }
    }

    fn fail(&mut self, req: &LoginRequest, status: LoginStatus, reason: String) {
        let rsp = LoginResponse {
            csg: self.stage,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            status_class: status.class,
            status_detail: status.detail,
            ..self.response_base(req)
        };
        self.transmit.push_back(LoginPdu { header: rsp, data: Vec::new() });
        self.state = State::Done;
        self.events.push_back(TargetLoginEvent::Failed { status, reason });
    }

    fn response_base(&mut self, req: &LoginRequest) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        LoginResponse {
            csg: self.stage,
            isid: req.isid,
            tsih: req.tsih,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.exp_cmd_sn.wrapping_add(self.params.cmd_window.max(1) - 1),
            ..LoginResponse::default()
        }
    }

    fn step(&mut self, req: &LoginRequest, data: &[u8]) -> Result<(), Fail> {
        self.rounds += 1;
        if self.rounds > MAX_ROUNDS {
            return fail(LoginStatus::INITIATOR_ERROR, "too many login rounds");
        }
        match &self.first {
            None => {
                if req.version_min > 0 {
                    return fail(LoginStatus::UNSUPPORTED_VERSION, "VersionMin above 0");
                }
                if req.csg == Stage::FULL_FEATURE || req.csg.0 == 2 {
                    return fail(LoginStatus::INITIATOR_ERROR, "login starts in an invalid stage");
                }
                if req.tsih != 0 {
                    // Adding a connection to an existing session (MC/S) is not offered.
                    return fail(LoginStatus::SESSION_DOES_NOT_EXIST, "TSIH of an existing session: connection add not supported");
                }
                self.first = Some(*req);
                self.exp_cmd_sn = req.cmd_sn;
                self.stage = req.csg;
            }
            Some(f) => {
                if f.isid != req.isid || f.tsih != req.tsih || f.cid != req.cid {
                    return fail(LoginStatus::INITIATOR_ERROR, "ISID, TSIH or CID changed during login");
                }
                if req.csg != self.stage {
                    return fail(LoginStatus::INITIATOR_ERROR, "CSG does not match the current stage");
                }
            }
        }
        if req.transit && (req.nsg.0 <= req.csg.0 || req.nsg.0 == 2) {
            return fail(LoginStatus::INITIATOR_ERROR, "invalid NSG");
        }

        // Continuation of the initiator's text: acknowledge with an empty response.
        let text = match self.rx_text.push(data, req.cont) {
            Ok(Some(t)) => t,
            Ok(None) => {
                let rsp = self.response_base(req);
                self.transmit.push_back(LoginPdu { header: rsp, data: Vec::new() });
                return Ok(());
            }
            Err(e) => return fail(LoginStatus::INITIATOR_ERROR, e.to_string()),
        };

        // The initiator fetching the rest of a long response of ours.
        if let Some((rest, last)) = self.tx_rest.take() {
            if !text.is_empty() {
                return fail(LoginStatus::INITIATOR_ERROR, "text sent while a response continuation was pending");
            }
            let fresh = self.response_base(req);
            self.send_text(req, rest, LoginResponse { stat_sn: fresh.stat_sn, ..last });
            return Ok(());
        }

        let pairs = parse_pairs(&text).map_err(|e| Fail(LoginStatus::INITIATOR_ERROR, e.to_string()))?;
        let (auth_keys, other) = split_auth(&pairs);
        let mut out = TextBuilder::new();
        let first_round = self.rounds == 1;
        self.neg.receive(&other, &mut out).map_err(|e| Fail(LoginStatus::INITIATOR_ERROR, e.to_string()))?;
        if first_round {
            self.admit(&mut out)?;
        }
        if self.stage == Stage::SECURITY {
            self.authenticate(&auth_keys, &mut out)?;
        } else if !auth_keys.is_empty() {
            return fail(LoginStatus::INITIATOR_ERROR, "security key outside the security stage");
        } else if self.auth != Auth::Done {
            // The initiator skipped the security stage.
            if self.auth_required() {
                return fail(LoginStatus::AUTHENTICATION_FAILURE, "authentication required but security stage skipped");
            }
            self.auth = Auth::Done;
        }
        if self.stage == Stage::OPERATIONAL {
            self.neg.target_declarations(&mut out);
        }

        // Transit.
        let mut rsp = self.response_base(req);
        if req.transit && self.auth == Auth::Done {
            let mut nsg = req.nsg;
            if nsg == Stage::FULL_FEATURE && (self.neg.pending() || self.neg.target_missing_offers(&mut out)) {
                // We still need answers: stay (or go to) the operational stage.
                nsg = Stage::OPERATIONAL;
            }
            if nsg != self.stage {
                rsp.transit = true;
                rsp.nsg = nsg;
            }
        }
        if rsp.transit && rsp.nsg == Stage::FULL_FEATURE {
            let p = self.neg.params();
            if self.config.transport == Transport::Iser && p.session_type == SessionType::Normal && !p.rdma_extensions {
                // RFC 7145 §5.1: an iSER connection cannot run iSCSI/TCP semantics.
                return fail(LoginStatus::MISSING_PARAMETER, "RDMAExtensions=Yes required on an iSER portal");
            }
            rsp.tsih = self.params.new_tsih.max(1);
        }
        self.send_text(req, out.into_bytes(), rsp);
        Ok(())
    }

    /// Queue `text` as one response, or as a continuation sequence if it exceeds the login
    /// data limit; the final header's T bit only goes on the last piece.
    fn send_text(&mut self, req: &LoginRequest, text: Vec<u8>, last: LoginResponse) {
        if text.len() > LOGIN_MAX_DATA {
            let rest = text[LOGIN_MAX_DATA..].to_vec();
            let piece = LoginResponse { cont: true, transit: false, nsg: Stage::default(), tsih: req.tsih, ..last };
            self.transmit.push_back(LoginPdu { header: piece, data: text[..LOGIN_MAX_DATA].to_vec() });
            // The rest goes out, with a fresh StatSN, when the initiator asks for it.
            self.tx_rest = Some((rest, last));
            return;
        }
        if last.transit {
            self.stage = last.nsg;
        }
        let done = last.transit && last.nsg == Stage::FULL_FEATURE;
        self.transmit.push_back(LoginPdu { header: last, data: text });
        if done {
            self.complete(&last);
        }
    }

    fn complete(&mut self, last: &LoginResponse) {
        self.state = State::Done;
        let first = self.first.unwrap_or_default();
        let mut params = self.neg.params();
        if params.session_type == SessionType::Discovery {
            // A discovery session is bound to no target even when the initiator declared a
            // TargetName (RFC 7143 §13.4 only requires it on normal sessions): an empty name
            // keeps a server from attaching the session to that target's I_T nexus.
            params.target_name.clear();
        }
        let outcome = LoginOutcome {
            params,
            isid: first.isid,
            tsih: last.tsih,
            cid: first.cid,
            stat_sn: self.stat_sn,
            exp_cmd_sn: last.exp_cmd_sn,
            max_cmd_sn: last.max_cmd_sn,
        };
        self.events.push_back(TargetLoginEvent::Complete(outcome));
    }

    /// First request: check names, find the target, apply the ACL, and declare the TPGT.
    fn admit(&mut self, out: &mut TextBuilder) -> Result<(), Fail> {
        let Some(initiator) = self.neg.peer_declared("InitiatorName").map(ToString::to_string) else {
            return fail(LoginStatus::MISSING_PARAMETER, "InitiatorName missing");
        };
        if !valid_iscsi_name(&initiator) {
            return fail(LoginStatus::INITIATOR_ERROR, "malformed InitiatorName");
        }
        match self.neg.session_type() {
            SessionType::Discovery => {}
            SessionType::Normal => {
                let Some(name) = self.neg.peer_declared("TargetName") else {
                    return fail(LoginStatus::MISSING_PARAMETER, "TargetName missing on a normal session");
                };
                let Some(idx) = self.config.targets.iter().position(|t| t.name.eq_ignore_ascii_case(name)) else {
                    return fail(LoginStatus::NOT_FOUND, "no such target");
                };
                let node = &self.config.targets[idx];
                if !node.admits(&initiator) {
                    return fail(LoginStatus::AUTHORIZATION_FAILURE, "initiator not in the target's ACL");
                }
                self.target = Some(idx);
                let tag = node.portal_group_tag.unwrap_or(self.config.portal_group_tag);
                if let Some(alias) = node.alias.clone() {
                    self.neg.declare("TargetAlias", alias, out);
                }
                self.neg.declare("TargetPortalGroupTag", tag.to_string(), out);
            }
        }
        Ok(())
    }

    fn credentials(&self) -> (Option<&ChapCredentials>, Option<&ChapCredentials>) {
        match self.target {
            Some(i) => self.config.targets[i].credentials_for(self.neg.peer_declared("InitiatorName").unwrap_or_default()),
            None => (self.config.discovery_chap.as_ref(), self.config.discovery_mutual_chap.as_ref()),
        }
    }

    fn auth_required(&self) -> bool {
        self.credentials().0.is_some()
    }

    fn authenticate(&mut self, keys: &[(&str, &str)], out: &mut TextBuilder) -> Result<(), Fail> {
        let (chap, mutual) = self.credentials();
        let (chap, mutual) = (chap.cloned(), mutual.cloned());
        match self.auth.clone() {
            Auth::Start => {
                let Some(methods) = get(keys, "AuthMethod") else {
                    if self.auth_required() {
                        return fail(LoginStatus::AUTHENTICATION_FAILURE, "authentication required, no AuthMethod offered");
                    }
                    if !keys.is_empty() {
                        return fail(LoginStatus::INITIATOR_ERROR, "CHAP keys before AuthMethod");
                    }
                    self.auth = Auth::Done;
                    return Ok(());
                };
                let offered: Vec<&str> = methods.split(',').collect();
                let choice = if chap.is_some() {
                    offered.contains(&"CHAP").then_some("CHAP")
                } else {
                    offered.iter().find(|m| **m == "None").copied()
                };
                match choice {
                    Some("CHAP") => {
                        out.push("AuthMethod", "CHAP");
                        self.auth = Auth::WaitAlgorithm;
                    }
                    Some(_) => {
                        out.push("AuthMethod", "None");
                        self.auth = Auth::Done;
                    }
                    None => {
                        return fail(LoginStatus::AUTHENTICATION_FAILURE, "no acceptable AuthMethod offered");
                    }
                }
            }
            Auth::WaitAlgorithm => {
                let Some(list) = get(keys, "CHAP_A") else {
                    return fail(LoginStatus::AUTHENTICATION_FAILURE, "CHAP_A expected");
                };
                let Some(alg) = parse_algorithms(list).into_iter().find(|a| self.config.chap_algorithms.contains(a)) else {
                    return fail(LoginStatus::AUTHENTICATION_FAILURE, "no acceptable CHAP algorithm");
                };
                let id = self.entropy.bytes(1)[0];
                let challenge = self.entropy.bytes(alg.challenge_len());
                out.push("CHAP_A", &alg.code().to_string());
                out.push("CHAP_I", &id.to_string());
                out.push("CHAP_C", &encode_hex(&challenge));
                self.auth = Auth::WaitResponse { alg, id, challenge };
            }
            Auth::WaitResponse { alg, id, challenge } => {
                let chap = chap.ok_or_else(|| Fail(LoginStatus::TARGET_ERROR, "CHAP credentials vanished".into()))?;
                let (Some(name), Some(resp)) = (get(keys, "CHAP_N"), get(keys, "CHAP_R")) else {
                    return fail(LoginStatus::AUTHENTICATION_FAILURE, "CHAP_N and CHAP_R expected");
                };
                let resp = decode_binary(resp).map_err(|_| Fail(LoginStatus::AUTHENTICATION_FAILURE, "malformed CHAP_R".into()))?;
                if name != chap.user || !alg.verify(id, &chap.secret, &challenge, &resp) {
                    return fail(LoginStatus::AUTHENTICATION_FAILURE, "CHAP response does not verify");
                }
                match (get(keys, "CHAP_I"), get(keys, "CHAP_C"), mutual) {
                    (Some(i), Some(c), Some(m)) => {
                        let i = parse_number(i)
                            .ok()
                            .filter(|i| *i <= 255)
                            .ok_or_else(|| Fail(LoginStatus::AUTHENTICATION_FAILURE, "bad CHAP_I".into()))?;
                        let c = decode_binary(c).map_err(|_| Fail(LoginStatus::AUTHENTICATION_FAILURE, "malformed CHAP_C".into()))?;
                        if c == challenge || c.is_empty() || c.len() > 1024 {
                            return fail(LoginStatus::AUTHENTICATION_FAILURE, "unacceptable mutual CHAP challenge");
                        }
                        out.push("CHAP_N", &m.user);
                        out.push("CHAP_R", &encode_hex(&alg.response(i as u8, &m.secret, &c)));
                    }
                    (None, None, None) => {}
                    (_, _, Some(_)) => {
                        return fail(LoginStatus::AUTHENTICATION_FAILURE, "mutual CHAP required");
                    }
                    (_, _, None) => {
                        return fail(LoginStatus::AUTHENTICATION_FAILURE, "mutual CHAP requested but not configured");
                    }
                }
                self.auth = Auth::Done;
            }
            Auth::Done => {
                if !keys.is_empty() {
                    return fail(LoginStatus::INITIATOR_ERROR, "security keys after authentication");
                }
            }
        }
        Ok(())
    }

    /// The ISID of the connection (known after the first request).
    pub fn isid(&self) -> Option<Isid> {
        self.first.map(|f| f.isid)
    }
}

/// A plausible iSCSI name (RFC 7143 §4.2.7): iqn., eui. or naa. form, ≤ 223 bytes, no spaces.
pub(crate) fn valid_iscsi_name(n: &str) -> bool {
    let lower = n.to_ascii_lowercase();
    (lower.starts_with("iqn.") || lower.starts_with("eui.") || lower.starts_with("naa."))
        && n.len() <= 223
        && n.len() > 4
        && !n.bytes().any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
}
