//! The configuration file (TOML) and what it resolves to.
//!
//! One file format serves `--config`, SIGHUP reloads and `config_save`: global settings and the
//! `[limits]` table; storage objects (`[[store]]`: a name, a backing spec as `--lun` takes it,
//! a UUID, a block size, options) apart from how they are exported; targets (`[[target]]`) with
//! their portal groups, LUNs (LUN number → store) and ACL entries (per initiator: its own CHAP
//! credentials, which LUNs it sees under which numbers).
//!
//! ALUA: each portal group's port is in an ALUA target port group (`port_group`). Two gateways
//! exporting one store (the same `uuid`, the same target name) each list the other's port groups
//! as `[[target.remote_port_group]]` (`port_group` and the peer's `relative_ports`), so each
//! reports every path's state in REPORT TARGET PORT GROUPS; a LUN's `optimized_port_group`
//! names its active/optimized group (default: the target's first portal group's), every other
//! group is active/non-optimized. A reload that changes it moves the optimized path (hosts get
//! ASYMMETRIC ACCESS STATE CHANGED). Without remote groups a target has one group, optimized. The command line's single-target form
//! (`target_name`, `lun`, `acl`, `chap`, ...) is accepted in the file too, as before, but not
//! beside `[[target]]` tables.
//!
//! [`ConfigFile`] is the text as written (every key optional, values not yet checked);
//! [`ConfigFile::resolve`] checks it and applies the defaults, giving [`Settings`] (what only a
//! restart changes) and the stores and targets ([`StoreSpec`], [`TargetSpec`]) a running service
//! is made to match.

use crate::cli;
use riser_iscsi::chap::ChapCredentials;
use riser_iscsi::keys::Transport;
use riser_target::lu::{AccessState, TargetPortGroup};
use riser_target::server::{DiscoveryScope, TargetConfig};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use uuid::Uuid;

/// The target name of the command line's single target when none is given.
pub const DEFAULT_TARGET_NAME: &str = "iqn.2026-11.io.riser:target0";

/// The data segment an iSER portal on the software RNIC receives (its TargetRecvDataSegmentLength)
/// unless `iser_param` sets `recv_dsl`: riser's FirstBurstLength, so that a write of up to
/// 256 KiB travels as immediate data in its command, one message, as over TCP, instead of an RDMA
/// Read round trip for what the receive cannot hold (measured here, one session at QD 8: 16 KiB
/// writes from 0.43× TCP's rate at 8 KiB to 0.79× at 64 KiB; 256 KiB writes from 0.68–0.80× at
/// 64 KiB to 1.01–1.08× at 256 KiB). The price is memory: each connection keeps `queue_depth + 16`
/// receives of this size posted (144 × 256 KiB = 36 MiB at the defaults), plain memory that is
/// resident once large writes have filled it (one connection's 256 KiB writes: ~50 MiB beyond the
/// LUN's, against ~25 MiB at 64 KiB). Portals on rdma-core keep 8 KiB, as LIO: there receive
/// memory is registered, that is pinned.
pub const SOFT_RNIC_RECV_DSL: u32 = 256 << 10;

/// The TCP portal when none is given.
pub const DEFAULT_PORTAL: &str = "127.0.0.1:3260";

/// A CHAP credential as the file writes it: `"USER:SECRET"` (or the user and the secret on two
/// lines), or a table `{ user = "...", secret = "..." }`.
#[derive(Clone, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum CredentialText {
    /// `USER:SECRET`, or two lines.
    Line(String),
    /// A table.
    Pair {
        /// CHAP_N.
        user: String,
        /// The secret.
        secret: String,
    },
}

/// No `Debug` output of secrets.
impl std::fmt::Debug for CredentialText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialText(<redacted>)")
    }
}

/// The `[limits]` table: what initiators can make the target hold, and how long things may take.
/// Every key is optional (default: `TargetConfig::default()`'s, and the software RNIC's). The
/// values stay TOML until [`Limits::resolve`] checks them, so that every error names its key.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct Limits {
    pub max_connections: Option<toml::Value>,
    pub queue_depth: Option<toml::Value>,
    pub max_immediate_commands: Option<toml::Value>,
    pub max_session_bytes: Option<toml::Value>,
    pub max_target_bytes: Option<toml::Value>,
    pub login_timeout: Option<toml::Value>,
    pub data_timeout: Option<toml::Value>,
    pub send_timeout: Option<toml::Value>,
    pub nop_interval: Option<toml::Value>,
    pub nop_timeout: Option<toml::Value>,
    pub iser_unsolicited_data: Option<toml::Value>,
    pub iser_threads: Option<toml::Value>,
    pub busy_poll_us: Option<toml::Value>,
    pub max_mpa_handshakes: Option<toml::Value>,
    pub logout_timeout: Option<toml::Value>,
    pub drain_timeout: Option<toml::Value>,
}

/// A `[[store]]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StoreTable {
    /// Its name (what LUNs name).
    pub name: String,
    /// `ram:SIZE`, `file:PATH[:SIZE]` or `blk:DEVICE`, as `--lun` takes it.
    pub backing: String,
    /// Its UUID (default: generated once: see [`StoreSpec::uuid`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<Uuid>,
    /// Logical block size (default: the file's `block_size`, else 512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Options of the backing.
    #[serde(default, skip_serializing_if = "StoreOptions::is_default")]
    pub options: StoreOptions,
}

/// Options of a store's backing.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct StoreOptions {
    /// File and block stores: deallocate on UNMAP (`true`: required, `false`: never; default:
    /// when the file system or device can).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thin: Option<bool>,
    /// RBD stores exported by several gateways (the store's targets list remote port groups):
    /// seconds the active/optimized gateway may go without answering the others before one of
    /// them fences it and takes the unit over (default 8; at least 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub takeover_secs: Option<u32>,
}

impl StoreOptions {
    fn is_default(&self) -> bool {
        *self == Self::default()
    }
}

/// A portal as a portal group lists it: `"ADDR:PORT"` (TCP) or a table with its transport.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum PortalText {
    /// A TCP portal.
    Tcp(String),
    /// A portal of either transport.
    Table {
        /// `ADDR:PORT`.
        address: String,
        /// `tcp` (default) or `iser`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        transport: Option<String>,
        /// iSER: `soft` or `rdma-core` (default: the file's `rdma_provider`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        rdma_provider: Option<String>,
    },
}

/// A `[[target.portal_group]]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortalGroupTable {
    /// TargetPortalGroupTag.
    pub tag: u16,
    /// Relative target port identifier (default: the tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative_port: Option<u16>,
    /// ALUA target port group (default: the tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_group: Option<u16>,
    /// Its portals.
    #[serde(default)]
    pub portals: Vec<PortalText>,
}

/// A `[[target.remote_port_group]]` table: an ALUA target port group of a peer gateway that
/// exports the same stores under the same target name, which this service reports but does not
/// serve.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemotePortGroupTable {
    /// Its target port group identifier (not one of the target's own portal groups').
    pub port_group: u16,
    /// The relative target port identifiers of its ports (the peer's portal groups'
    /// `relative_port`; 1 to 65535, none the target's own).
    pub relative_ports: Vec<u16>,
}

/// A `[[target.lun]]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct LunTable {
    /// The LUN number.
    pub lun: u16,
    /// The store behind it.
    pub store: String,
    /// The ALUA target port group through which the LUN is active/optimized (a portal group's
    /// `port_group` or a remote one's; default: the target's first portal group's). The others
    /// are active/non-optimized.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optimized_port_group: Option<u16>,
}

/// Which LUNs an initiator sees: a list (those, under their own numbers) or a table (its
/// number → the target's LUN; TOML keys are strings: `{ "0" = 4 }`).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum LunsText {
    /// The target's LUNs, under their own numbers.
    List(Vec<u16>),
    /// The initiator's number → the target's LUN.
    Map(BTreeMap<String, u16>),
}

impl LunsText {
    /// As a map (its LUN → the target's).
    pub fn to_map(&self) -> Result<BTreeMap<u16, u16>, String> {
        match self {
            Self::List(l) => Ok(l.iter().map(|&n| (n, n)).collect()),
            Self::Map(m) => {
                m.iter().map(|(k, &v)| Ok((k.parse::<u16>().map_err(|_| format!("LUN map key {k:?} is not a LUN number"))?, v))).collect()
            }
        }
    }

    /// From a map.
    pub fn from_map(m: &BTreeMap<u16, u16>) -> Self {
        if m.iter().all(|(a, b)| a == b) {
            Self::List(m.keys().copied().collect())
        } else {
            Self::Map(m.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        }
    }
}

/// A `[[target.acl]]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AclTable {
    /// The initiator's name.
    pub initiator: String,
    /// Its own CHAP credentials (inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<CredentialText>,
    /// Its own CHAP credentials, from a file (mode 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_file: Option<PathBuf>,
    /// What the target answers its mutual CHAP with (inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<CredentialText>,
    /// What the target answers its mutual CHAP with, from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap_file: Option<PathBuf>,
    /// The LUNs it sees (default: all, under their own numbers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub luns: Option<LunsText>,
}

/// A `[[target]]` table.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TargetTable {
    /// iSCSI name.
    pub name: String,
    /// TargetAlias.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Every initiator may log in (default: only when it has no `[[target.acl]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<bool>,
    /// CHAP for initiators without credentials of their own (inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<CredentialText>,
    /// CHAP for initiators without credentials of their own, from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_file: Option<PathBuf>,
    /// Mutual CHAP (inline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<CredentialText>,
    /// Mutual CHAP, from a file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap_file: Option<PathBuf>,
    /// Portal groups (default: group 1 with the file's `portal` and `iser_portal`).
    #[serde(default, rename = "portal_group", skip_serializing_if = "Vec::is_empty")]
    pub portal_groups: Vec<PortalGroupTable>,
    /// ALUA target port groups of a peer gateway (reported, not served).
    #[serde(default, rename = "remote_port_group", skip_serializing_if = "Vec::is_empty")]
    pub remote_port_groups: Vec<RemotePortGroupTable>,
    /// LUNs.
    #[serde(default, rename = "lun", skip_serializing_if = "Vec::is_empty")]
    pub luns: Vec<LunTable>,
    /// ACL entries.
    #[serde(default, rename = "acl", skip_serializing_if = "Vec::is_empty")]
    pub acl: Vec<AclTable>,
}

/// The configuration file as written: every key optional. Also what the command line makes
/// (the same keys), laid over the file by [`ConfigFile::overlay`].
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
#[allow(missing_docs)]
pub struct ConfigFile {
    /// TCP portals of targets without portal groups (`none`: no TCP portal).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub portal: Vec<String>,
    /// iSER portals of targets without portal groups.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iser_portal: Vec<String>,
    /// `soft` (the software iWARP RNIC, default) or `rdma-core`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_provider: Option<String>,
    /// rdma-core: `auto`, `windows`, `per-region`, `fixed-pool`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdma_keys: Option<String>,
    /// Operational keys offered in login, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub param: Vec<String>,
    /// iSER datamover settings, `KEY=VALUE`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub iser_param: Vec<String>,
    /// `permitted` (default) or `all`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_chap: Option<CredentialText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_chap_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_mutual_chap: Option<CredentialText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub discovery_mutual_chap_file: Option<PathBuf>,
    /// Pace SANITIZE to this many bytes per second (`64MiB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sanitize_rate: Option<String>,
    /// Default logical block size of stores (512).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    /// Where persistent state lives (reservations with APTPL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// The control socket's path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<PathBuf>,
    /// Where `GET /metrics` answers (`ADDR:PORT`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
    /// `text` (default) or `json`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log_format: Option<String>,
    #[serde(default, skip_serializing_if = "is_default_limits")]
    pub limits: Limits,
    // The command line's single target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lun: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub acl: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap: Option<CredentialText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chap_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap: Option<CredentialText>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mutual_chap_file: Option<PathBuf>,
    /// Storage objects.
    #[serde(default, rename = "store", skip_serializing_if = "Vec::is_empty")]
    pub stores: Vec<StoreTable>,
    /// Targets.
    #[serde(default, rename = "target", skip_serializing_if = "Vec::is_empty")]
    pub targets: Vec<TargetTable>,
}

fn is_default_limits(l: &Limits) -> bool {
    *l == Limits::default()
}

/// A CHAP credential and where it came from (a file is saved as its path, anything else inline).
#[derive(Clone)]
pub struct Credential {
    /// The credentials.
    pub creds: ChapCredentials,
    /// The file it was read from.
    pub file: Option<PathBuf>,
    /// The text it was given as, when not from a file (saved as it came).
    text: Option<CredentialText>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential").field("user", &self.creds.user).field("file", &self.file).finish_non_exhaustive()
    }
}

impl PartialEq for Credential {
    fn eq(&self, other: &Self) -> bool {
        self.creds == other.creds && self.file == other.file
    }
}

impl Credential {
    /// Credentials from `text` (`USER:SECRET`, or the user and the secret on two lines), named
    /// `source` in errors.
    pub fn from_text(source: &str, text: &str) -> Result<Self, String> {
        Ok(Self { creds: cli::parse_credentials(source, text)?, file: None, text: Some(CredentialText::Line(text.into())) })
    }

    /// Credentials from a user and a secret.
    pub fn from_pair(source: &str, user: &str, secret: &str) -> Result<Self, String> {
        let creds = ChapCredentials::new(user, secret.as_bytes().to_vec()).map_err(|e| format!("{source}: {e}"))?;
        Ok(Self { creds, file: None, text: Some(CredentialText::Pair { user: user.into(), secret: secret.into() }) })
    }

    /// Credentials from a file that only its owner may read.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = cli::read_secret_file(path)?;
        let creds = cli::parse_credentials(&path.display().to_string(), &text)?;
        Ok(Self { creds, file: Some(path.to_path_buf()), text: None })
    }

    /// How the file writes it: the path of its file, or inline as it was given.
    pub fn to_text(&self) -> (Option<CredentialText>, Option<PathBuf>) {
        (self.text.clone(), self.file.clone())
    }
}

/// One credential from its inline and file forms (relative files from `base`).
pub fn credential(key: &str, text: Option<&CredentialText>, file: Option<&Path>, base: &Path) -> Result<Option<Credential>, String> {
    match (text, file) {
        (Some(_), Some(_)) => Err(format!("{key} and {key}_file exclude each other")),
        (Some(CredentialText::Line(t)), None) => Credential::from_text(key, t).map(Some),
        (Some(CredentialText::Pair { user, secret }), None) => Credential::from_pair(key, user, secret).map(Some),
        (None, Some(f)) => Credential::from_file(&base.join(f)).map(Some),
        (None, None) => Ok(None),
    }
}

/// A portal of the running service: where, which transport, and for iSER which provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortalSpec {
    /// Address and transport.
    pub portal: riser_target::server::Portal,
    /// iSER: the RDMA provider.
    pub provider: cli::RdmaProvider,
}

impl PortalSpec {
    /// Parse `ADDR[:PORT]` of `transport` (an iSER portal's default port is its provider's).
    pub fn parse(text: &str, transport: Transport, provider: cli::RdmaProvider) -> Result<Self, String> {
        let port = if transport == Transport::Iser { provider.default_port() } else { 3260 };
        let spec = cli::with_default_port(text, port);
        let address: SocketAddr = spec.parse().map_err(|e| format!("portal {text:?}: {e}"))?;
        if address.port() == 0 {
            // Initiators are told a portal's port: it must be one they can reach.
            return Err(format!("portal {text:?}: port 0 (give the port to listen on)"));
        }
        Ok(Self { portal: riser_target::server::Portal::new(address, transport), provider })
    }

    /// As a portal group lists it.
    pub fn to_text(&self, default_provider: cli::RdmaProvider) -> PortalText {
        match self.portal.transport {
            Transport::Tcp => PortalText::Tcp(self.portal.address.to_string()),
            _ => PortalText::Table {
                address: self.portal.address.to_string(),
                transport: Some("iser".into()),
                rdma_provider: (self.provider != default_provider).then(|| self.provider.name().into()),
            },
        }
    }
}

/// A portal group of a target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortalGroupSpec {
    /// TargetPortalGroupTag.
    pub tag: u16,
    /// Relative target port identifier.
    pub relative_port: u16,
    /// ALUA target port group.
    pub port_group: u16,
    /// Portals.
    pub portals: Vec<PortalSpec>,
}

/// An ALUA target port group of a peer gateway.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemotePortGroupSpec {
    /// Target port group identifier.
    pub port_group: u16,
    /// Relative target port identifiers of its ports.
    pub relative_ports: Vec<u16>,
}

/// A storage object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreSpec {
    /// Name.
    pub name: String,
    /// Backing, as `--lun` takes it.
    pub backing: String,
    /// UUID: given, else derived or generated when the store is opened (see
    /// [`crate::store::open`]).
    pub uuid: Option<Uuid>,
    /// Logical block size.
    pub block_size: u32,
    /// Options.
    pub options: StoreOptions,
}

/// An ACL entry.
#[derive(Clone, Debug, PartialEq)]
pub struct AclSpec {
    /// Initiator name.
    pub initiator: String,
    /// Its own CHAP credentials.
    pub chap: Option<Credential>,
    /// Its own mutual CHAP credentials.
    pub mutual_chap: Option<Credential>,
    /// Its LUN map (its number → the target's), if it has one.
    pub luns: Option<BTreeMap<u16, u16>>,
}

/// A target.
#[derive(Clone, Debug, PartialEq)]
pub struct TargetSpec {
    /// iSCSI name.
    pub name: String,
    /// TargetAlias.
    pub alias: Option<String>,
    /// Every initiator may log in.
    pub open: bool,
    /// CHAP for initiators without their own.
    pub chap: Option<Credential>,
    /// Mutual CHAP.
    pub mutual_chap: Option<Credential>,
    /// Portal groups.
    pub portal_groups: Vec<PortalGroupSpec>,
    /// ALUA target port groups of a peer gateway.
    pub remote_port_groups: Vec<RemotePortGroupSpec>,
    /// LUN → store name.
    pub luns: BTreeMap<u16, String>,
    /// LUN → its active/optimized target port group, where the configuration names one.
    pub optimized: BTreeMap<u16, u16>,
    /// ACL entries.
    pub acl: Vec<AclSpec>,
}

/// What only a restart changes.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The target server's settings (limits, offered keys, discovery).
    pub target: TargetConfig,
    /// The software RNIC's settings.
    pub rnic: riser_iwarp::RnicConfig,
    /// iSER datamover settings (portals on rdma-core).
    pub iser: riser_iser::IserConfig,
    /// iSER datamover settings of portals on the software RNIC: as `iser`, but receiving
    /// segments of [`SOFT_RNIC_RECV_DSL`] unless `iser_param` sets `recv_dsl`.
    pub iser_soft: riser_iser::IserConfig,
    /// The default RDMA provider of iSER portals.
    pub rdma_provider: cli::RdmaProvider,
    /// rdma-core key mode.
    pub rdma_keys: Option<String>,
    /// The portals of targets without portal groups of their own.
    pub default_portals: Vec<PortalSpec>,
    /// SANITIZE pacing.
    pub sanitize_rate: Option<u64>,
    /// Where persistent state lives.
    pub state_dir: Option<PathBuf>,
    /// The control socket.
    pub control: Option<PathBuf>,
    /// Where metrics are served.
    pub metrics: Option<SocketAddr>,
    /// Log format.
    pub log_format: cli::LogFormat,
    /// How long a stop waits for initiators to log out and commands to end.
    pub drain_timeout: Duration,
}

/// What a configuration asks for: the settings, the stores and the targets.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The settings.
    pub settings: Settings,
    /// Stores, in the file's order.
    pub stores: Vec<StoreSpec>,
    /// Targets, in the file's order.
    pub targets: Vec<TargetSpec>,
}

/// The keys whose change needs a restart (reported by a reload that finds them changed).
pub const RESTART_KEYS: &[&str] = &[
    "limits.*",
    "param",
    "iser_param",
    "rdma_provider",
    "rdma_keys",
    "discovery_scope",
    "sanitize_rate",
    "state_dir",
    "control",
    "metrics",
    "log_format",
];

/// The largest `max_connections`: Linux's ceiling on a process's open files (`fs.nr_open`,
/// 1048576 by default); each connection holds one.
const MAX_CONNECTIONS: u64 = 1 << 20;

/// The largest `queue_depth`: far beyond what initiators use (open-iscsi allows `cmds_max` up to
/// 2048), and small enough that the iSER queue sizes derived from it fit in 32 bits.
const MAX_QUEUE_DEPTH: u64 = 1 << 16;

/// The largest `max_mpa_handshakes`: each handshake in progress is a thread of its own.
const MAX_MPA_HANDSHAKES: u64 = 1024;

/// The smallest `max_session_bytes`: the unit the target keeps a session's budget in.
const MIN_SESSION_BYTES: u64 = 64 << 10;

/// The longest timeout, in seconds: a day (longer is no timeout at all).
const MAX_SECONDS: f64 = 86_400.0;

/// The longest `busy_poll_us`: a second of polling each time a connection goes idle.
const MAX_BUSY_POLL_US: u64 = 1_000_000;

/// The most `iser_threads`: far more than a host has cores.
const MAX_ISER_THREADS: u64 = 1024;

/// Default of `limits.iser_threads`: one per CPU the process may run on.
pub fn default_iser_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Default of `limits.drain_timeout`.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What the `[limits]` table sets.
#[derive(Clone, Debug)]
pub struct Tuning {
    /// The target's configuration (before its nodes and discovery settings are filled in).
    pub target: TargetConfig,
    /// The software RNIC's, if the table names one of its keys.
    pub rnic: Option<riser_iwarp::RnicConfig>,
    /// `drain_timeout`.
    pub drain_timeout: Duration,
}

impl Limits {
    /// Check the table and apply it to the defaults.
    pub fn resolve(&self) -> Result<Tuning, String> {
        let mut t = TargetConfig::default();
        if let Some(v) = &self.max_connections {
            t.max_connections = integer("max_connections", v, 1, MAX_CONNECTIONS)? as usize;
        }
        if let Some(v) = &self.queue_depth {
            t.queue_depth = integer("queue_depth", v, 1, MAX_QUEUE_DEPTH)? as u32;
        }
        if let Some(v) = &self.max_immediate_commands {
            t.max_immediate_commands = integer("max_immediate_commands", v, 0, u64::from(u32::MAX))? as u32;
        }
        if let Some(v) = &self.max_session_bytes {
            t.max_session_bytes = session_bytes("max_session_bytes", v)?;
        }
        if let Some(v) = &self.max_target_bytes {
            t.max_target_bytes = session_bytes("max_target_bytes", v)?;
        }
        if let Some(v) = &self.login_timeout {
            t.login.login_timeout = seconds("login_timeout", v)?;
        }
        if let Some(v) = &self.data_timeout {
            t.data_timeout = seconds("data_timeout", v)?;
        }
        if let Some(v) = &self.send_timeout {
            t.send_timeout = seconds("send_timeout", v)?;
        }
        if let Some(v) = &self.nop_interval {
            let off = v.as_str() == Some("off") || v.as_integer() == Some(0) || v.as_float() == Some(0.0);
            t.nop_interval = if off { None } else { Some(seconds("nop_interval", v).map_err(|e| format!("{e}; 0 or \"off\": no pings"))?) };
        }
        if let Some(v) = &self.nop_timeout {
            t.nop_timeout = seconds("nop_timeout", v)?;
        }
        if let Some(v) = &self.iser_unsolicited_data {
            t.iser_unsolicited_data = v.as_bool().ok_or_else(|| format!("limits.iser_unsolicited_data = {v}: expected true or false"))?;
        }
        t.iser_threads = match &self.iser_threads {
            Some(v) => integer("iser_threads", v, 0, MAX_ISER_THREADS)? as usize,
            None => default_iser_threads(),
        };
        if let Some(v) = &self.logout_timeout {
            t.logout_timeout = seconds("logout_timeout", v)?;
        }
        if let Some(v) = &self.busy_poll_us {
            let us = integer("busy_poll_us", v, 0, MAX_BUSY_POLL_US)?;
            t.busy_poll = (us > 0).then(|| Duration::from_micros(us));
        }
        let drain_timeout = match &self.drain_timeout {
            Some(v) => seconds("drain_timeout", v)?,
            None => DEFAULT_DRAIN_TIMEOUT,
        };
        let mut rnic = match &self.max_mpa_handshakes {
            Some(v) => {
                let max_handshakes = integer("max_mpa_handshakes", v, 1, MAX_MPA_HANDSHAKES)? as usize;
                Some(riser_iwarp::RnicConfig::default().max_handshakes(max_handshakes))
            }
            None => None,
        };
        // Busy polling applies to the software RNIC's queue pairs as to TCP connections.
        if t.busy_poll.is_some() {
            rnic = Some(rnic.unwrap_or_default().busy_poll(t.busy_poll));
        }
        Ok(Tuning { target: t, rnic, drain_timeout })
    }
}

/// A `[limits]` integer from `min` to `max`.
fn integer(key: &str, v: &toml::Value, min: u64, max: u64) -> Result<u64, String> {
    match v.as_integer().and_then(|n| u64::try_from(n).ok()) {
        Some(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(format!("limits.{key} = {v}: expected an integer from {min} to {max}")),
    }
}

/// A `[limits]` duration: seconds, an integer or a float, from 1 ms to a day.
fn seconds(key: &str, v: &toml::Value) -> Result<Duration, String> {
    let s = match v {
        toml::Value::Integer(n) => *n as f64,
        toml::Value::Float(f) => *f,
        _ => f64::NAN,
    };
    if (0.001..=MAX_SECONDS).contains(&s) {
        Ok(Duration::from_secs_f64(s))
    } else {
        Err(format!("limits.{key} = {v}: expected seconds from 0.001 to {MAX_SECONDS} (such as 15 or 0.5)"))
    }
}

/// `max_session_bytes`, `max_target_bytes`: a size (`"256MiB"`, as `--lun ram:SIZE`) or a
/// number of bytes.
fn session_bytes(key: &str, v: &toml::Value) -> Result<u64, String> {
    let n = match v {
        toml::Value::String(s) => cli::parse_size(s).map_err(|e| format!("limits.{key}: {e}"))?,
        toml::Value::Integer(n) if *n >= 0 => *n as u64,
        _ => return Err(format!("limits.{key} = {v}: expected a size such as \"256MiB\" or a number of bytes")),
    };
    if n < MIN_SESSION_BYTES {
        return Err(format!("limits.{key} = {v}: must be at least 64KiB (the unit of the memory budgets)"));
    }
    Ok(n)
}

/// The text of a file naming `name` in errors: a parse error quotes no line of it (the line may
/// hold a secret).
pub fn parse(text: &str, name: &str) -> Result<ConfigFile, String> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        format!("{name}{}: {}", line.map(|l| format!(", line {l}")).unwrap_or_default(), e.message())
    })
}

/// The largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// Read a configuration file. One that holds a secret inline must be private (mode 600).
pub fn read(path: &Path) -> Result<ConfigFile, String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mut text = String::new();
    f.take(MAX_CONFIG_BYTES + 1).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        return Err(format!("{}: larger than {MAX_CONFIG_BYTES} bytes", path.display()));
    }
    let file = parse(&text, &path.display().to_string())?;
    if file.holds_a_secret() {
        cli::check_private(path, &meta)?;
    }
    Ok(file)
}

impl ConfigFile {
    /// Whether a secret is written in it (not only a file's path).
    pub fn holds_a_secret(&self) -> bool {
        [&self.chap, &self.mutual_chap, &self.discovery_chap, &self.discovery_mutual_chap].iter().any(|c| c.is_some())
            || self
                .targets
                .iter()
                .any(|t| t.chap.is_some() || t.mutual_chap.is_some() || t.acl.iter().any(|a| a.chap.is_some() || a.mutual_chap.is_some()))
    }

    /// `over` laid over this one: each key `over` sets (a list: non-empty) wins. The `[limits]`
    /// table, stores and targets are the file's alone.
    pub fn overlay(mut self, over: Self) -> Self {
        fn pick<T>(base: &mut Option<T>, over: Option<T>) {
            if over.is_some() {
                *base = over;
            }
        }
        fn list<T>(base: &mut Vec<T>, over: Vec<T>) {
            if !over.is_empty() {
                *base = over;
            }
        }
        list(&mut self.portal, over.portal);
        list(&mut self.iser_portal, over.iser_portal);
        pick(&mut self.rdma_provider, over.rdma_provider);
        pick(&mut self.rdma_keys, over.rdma_keys);
        list(&mut self.param, over.param);
        list(&mut self.iser_param, over.iser_param);
        pick(&mut self.discovery_scope, over.discovery_scope);
        // A credential given on the command line replaces the file's, whichever form either has.
        if over.discovery_chap.is_some() || over.discovery_chap_file.is_some() {
            (self.discovery_chap, self.discovery_chap_file) = (over.discovery_chap, over.discovery_chap_file);
        }
        if over.discovery_mutual_chap.is_some() || over.discovery_mutual_chap_file.is_some() {
            (self.discovery_mutual_chap, self.discovery_mutual_chap_file) = (over.discovery_mutual_chap, over.discovery_mutual_chap_file);
        }
        if over.chap.is_some() || over.chap_file.is_some() {
            (self.chap, self.chap_file) = (over.chap, over.chap_file);
        }
        if over.mutual_chap.is_some() || over.mutual_chap_file.is_some() {
            (self.mutual_chap, self.mutual_chap_file) = (over.mutual_chap, over.mutual_chap_file);
        }
        pick(&mut self.sanitize_rate, over.sanitize_rate);
        pick(&mut self.block_size, over.block_size);
        pick(&mut self.state_dir, over.state_dir);
        pick(&mut self.control, over.control);
        pick(&mut self.metrics, over.metrics);
        pick(&mut self.log_format, over.log_format);
        pick(&mut self.target_name, over.target_name);
        list(&mut self.lun, over.lun);
        list(&mut self.acl, over.acl);
        self
    }

    /// Whether the command line's single-target form is used (a key of it is set).
    fn single_target_keys(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        for (set, key) in [
            (self.target_name.is_some(), "target_name"),
            (!self.lun.is_empty(), "lun"),
            (!self.acl.is_empty(), "acl"),
            (self.chap.is_some() || self.chap_file.is_some(), "chap"),
            (self.mutual_chap.is_some() || self.mutual_chap_file.is_some(), "mutual_chap"),
        ] {
            if set {
                v.push(key);
            }
        }
        v
    }

    /// Check everything and apply the defaults. Relative paths (credential files) are taken
    /// from `base` (the file's directory).
    pub fn resolve(&self, base: &Path) -> Result<Resolved, String> {
        let tuning = self.limits.resolve()?;
        let mut target = tuning.target;
        for kv in &self.param {
            cli::set_operational(&mut target.login.operational, kv)?;
        }
        target.discovery_scope = match self.discovery_scope.as_deref() {
            None | Some("permitted") => DiscoveryScope::Permitted,
            Some("all") => DiscoveryScope::All,
            Some(other) => return Err(format!("discovery_scope {other:?}: permitted or all")),
        };
        let discovery_chap = credential("discovery_chap", self.discovery_chap.as_ref(), self.discovery_chap_file.as_deref(), base)?;
        let discovery_mutual =
            credential("discovery_mutual_chap", self.discovery_mutual_chap.as_ref(), self.discovery_mutual_chap_file.as_deref(), base)?;
        if discovery_mutual.is_some() && discovery_chap.is_none() {
            return Err("discovery mutual CHAP needs discovery CHAP (discovery_chap)".into());
        }
        target.login.discovery_chap = discovery_chap.map(|c| c.creds);
        target.login.discovery_mutual_chap = discovery_mutual.map(|c| c.creds);
        let mut iser = riser_iser::IserConfig::default();
        let mut iser_soft = iser.recv_dsl(SOFT_RNIC_RECV_DSL);
        for kv in &self.iser_param {
            cli::set_iser(&mut iser, kv)?;
            cli::set_iser(&mut iser_soft, kv)?;
        }
        let rdma_provider = cli::RdmaProvider::parse(self.rdma_provider.as_deref().unwrap_or("soft"))?;
        if self.rdma_keys.is_some() && rdma_provider != cli::RdmaProvider::RdmaCore {
            return Err("rdma_keys applies to rdma_provider = \"rdma-core\"".into());
        }
        if self.limits.max_mpa_handshakes.is_some() && rdma_provider != cli::RdmaProvider::Soft {
            return Err("limits.max_mpa_handshakes applies to rdma_provider = \"soft\"".into());
        }
        let mut default_portals = Vec::new();
        let tcp: Vec<&str> = if self.portal.is_empty() { vec![DEFAULT_PORTAL] } else { self.portal.iter().map(String::as_str).collect() };
        for p in tcp.into_iter().filter(|p| *p != "none") {
            default_portals.push(PortalSpec::parse(p, Transport::Tcp, rdma_provider)?);
        }
        for p in &self.iser_portal {
            default_portals.push(PortalSpec::parse(p, Transport::Iser, rdma_provider)?);
        }
        let metrics =
            self.metrics.as_deref().map(|m| m.parse::<SocketAddr>().map_err(|e| format!("metrics {m:?}: {e} (ADDR:PORT)"))).transpose()?;
        let settings = Settings {
            target,
            rnic: tuning.rnic.unwrap_or_default(),
            iser,
            iser_soft,
            rdma_provider,
            rdma_keys: self.rdma_keys.clone(),
            default_portals: default_portals.clone(),
            sanitize_rate: self.sanitize_rate.as_deref().map(cli::parse_size).transpose()?,
            state_dir: self.state_dir.as_ref().map(|d| base.join(d)),
            control: self.control.clone(),
            metrics,
            log_format: self.log_format.as_deref().map(cli::LogFormat::parse).transpose()?.unwrap_or_default(),
            drain_timeout: tuning.drain_timeout,
        };
        let block_size = self.block_size.unwrap_or(512);
        let mut stores = Vec::new();
        let mut targets = Vec::new();
        let default_group = PortalGroupSpec { tag: 1, relative_port: 1, port_group: 1, portals: default_portals };
        let single = self.single_target_keys();
        if !self.targets.is_empty() && !single.is_empty() {
            return Err(format!(
                "{} describe the single target of the command-line form; with [[target]] tables, describe every target there",
                single.join(", ")
            ));
        }
        if self.targets.is_empty() {
            // The command line's single target: its LUNs are stores `lun0`, `lun1`, ...
            let luns: Vec<&str> = if self.lun.is_empty() && self.stores.is_empty() {
                vec!["ram:1GiB"]
            } else {
                self.lun.iter().map(String::as_str).collect()
            };
            let mut map = BTreeMap::new();
            for (i, spec) in luns.iter().enumerate() {
                let name = format!("lun{i}");
                stores.push(StoreSpec {
                    name: name.clone(),
                    backing: (*spec).into(),
                    uuid: None,
                    block_size,
                    options: StoreOptions::default(),
                });
                map.insert(u16::try_from(i).map_err(|_| "too many LUNs")?, name);
            }
            let chap = credential("chap", self.chap.as_ref(), self.chap_file.as_deref(), base)?;
            let mutual_chap = credential("mutual_chap", self.mutual_chap.as_ref(), self.mutual_chap_file.as_deref(), base)?;
            targets.push(TargetSpec {
                name: self.target_name.clone().unwrap_or_else(|| DEFAULT_TARGET_NAME.into()),
                alias: None,
                open: self.acl.is_empty(),
                chap,
                mutual_chap,
                portal_groups: vec![default_group.clone()],
                remote_port_groups: Vec::new(),
                luns: map,
                optimized: BTreeMap::new(),
                acl: self.acl.iter().map(|i| AclSpec { initiator: i.clone(), chap: None, mutual_chap: None, luns: None }).collect(),
            });
        }
        for s in &self.stores {
            if stores.iter().any(|o: &StoreSpec| o.name == s.name) {
                return Err(format!("store {:?} is named twice", s.name));
            }
            stores.push(StoreSpec {
                name: s.name.clone(),
                backing: s.backing.clone(),
                uuid: s.uuid,
                block_size: s.block_size.unwrap_or(block_size),
                options: s.options.clone(),
            });
        }
        for t in &self.targets {
            targets.push(self.resolve_target(t, base, &default_group, rdma_provider)?);
        }
        for t in &targets {
            if t.mutual_chap.is_some() && t.chap.is_none() {
                return Err(format!("target {}: mutual CHAP needs CHAP", t.name));
            }
            for (lun, store) in &t.luns {
                if !stores.iter().any(|s| &s.name == store) {
                    return Err(format!("target {} LUN {lun}: no store named {store:?}", t.name));
                }
            }
        }
        // A store has one ALUA model, whichever LUNs export it.
        for s in &stores {
            let named: Vec<(String, u16, u16)> = targets
                .iter()
                .flat_map(|t| t.optimized.iter().filter(|(l, _)| t.luns.get(l) == Some(&s.name)).map(|(l, g)| (t.name.clone(), *l, *g)))
                .collect();
            if let Some((t, l, g)) = named.iter().find(|n| n.2 != named[0].2) {
                let (t0, l0, g0) = &named[0];
                return Err(format!(
                    "store {:?}: target {t0} LUN {l0} makes port group {g0} optimized, target {t} LUN {l} port group {g}",
                    s.name
                ));
            }
        }
        Ok(Resolved { settings, stores, targets })
    }

    fn resolve_target(
        &self,
        t: &TargetTable,
        base: &Path,
        default_group: &PortalGroupSpec,
        provider: cli::RdmaProvider,
    ) -> Result<TargetSpec, String> {
        let key = |k: &str| format!("target {}: {k}", t.name);
        let mut groups = Vec::new();
        for g in &t.portal_groups {
            if g.tag == 0 {
                return Err(key("portal_group tag 0 (tags are 1 to 65535)"));
            }
            let mut portals = Vec::new();
            for p in &g.portals {
                portals.push(match p {
                    PortalText::Tcp(a) => PortalSpec::parse(a, Transport::Tcp, provider)?,
                    PortalText::Table { address, transport, rdma_provider } => {
                        let tr = match transport.as_deref() {
                            None | Some("tcp") => Transport::Tcp,
                            Some("iser") => Transport::Iser,
                            Some(other) => return Err(key(&format!("portal transport {other:?}: tcp or iser"))),
                        };
                        let prov = rdma_provider.as_deref().map(cli::RdmaProvider::parse).transpose()?.unwrap_or(provider);
                        PortalSpec::parse(address, tr, prov)?
                    }
                });
            }
            groups.push(PortalGroupSpec {
                tag: g.tag,
                relative_port: g.relative_port.unwrap_or(g.tag),
                port_group: g.port_group.unwrap_or(g.tag),
                portals,
            });
        }
        if groups.is_empty() {
            groups.push(default_group.clone());
        }
        for (i, g) in groups.iter().enumerate() {
            if let Some(o) = groups[..i].iter().find(|o| o.relative_port == g.relative_port && o.port_group != g.port_group) {
                return Err(key(&format!(
                    "portal groups {} and {}: relative port {} in two ALUA port groups ({} and {})",
                    o.tag, g.tag, g.relative_port, o.port_group, g.port_group
                )));
            }
        }
        let mut remote: Vec<RemotePortGroupSpec> = Vec::new();
        for r in &t.remote_port_groups {
            let g = r.port_group;
            if groups.iter().any(|l| l.port_group == g) || remote.iter().any(|o| o.port_group == g) {
                return Err(key(&format!("remote_port_group {g}: the port group is the target's own or named twice")));
            }
            if r.relative_ports.is_empty() || r.relative_ports.len() > 255 {
                return Err(key(&format!("remote_port_group {g}: relative_ports: 1 to 255 ports")));
            }
            for &p in &r.relative_ports {
                let taken = groups.iter().any(|l| l.relative_port == p)
                    || remote.iter().any(|o| o.relative_ports.contains(&p))
                    || r.relative_ports.iter().filter(|&&q| q == p).count() > 1;
                if p == 0 || taken {
                    return Err(key(&format!(
                        "remote_port_group {g}: relative port {p} (1 to 65535, and not a port of the target's own or of another group)"
                    )));
                }
            }
            remote.push(RemotePortGroupSpec { port_group: g, relative_ports: r.relative_ports.clone() });
        }
        let mut luns = BTreeMap::new();
        let mut optimized = BTreeMap::new();
        for l in &t.luns {
            if luns.insert(l.lun, l.store.clone()).is_some() {
                return Err(key(&format!("LUN {} is mapped twice", l.lun)));
            }
            if let Some(g) = l.optimized_port_group {
                if !groups.iter().any(|o| o.port_group == g) && !remote.iter().any(|o| o.port_group == g) {
                    return Err(key(&format!(
                        "LUN {}: optimized_port_group {g} is neither a portal group's port_group nor a remote_port_group",
                        l.lun
                    )));
                }
                optimized.insert(l.lun, g);
            }
        }
        let mut acl = Vec::new();
        for a in &t.acl {
            let who = |k: &str| format!("target {} acl {}: {k}", t.name, a.initiator);
            let chap = credential(&who("chap"), a.chap.as_ref(), a.chap_file.as_deref(), base)?;
            let mutual_chap = credential(&who("mutual_chap"), a.mutual_chap.as_ref(), a.mutual_chap_file.as_deref(), base)?;
            if mutual_chap.is_some() && chap.is_none() {
                return Err(who("mutual CHAP needs CHAP"));
            }
            acl.push(AclSpec {
                initiator: a.initiator.clone(),
                chap,
                mutual_chap,
                luns: a.luns.as_ref().map(LunsText::to_map).transpose().map_err(|e| who(&e))?,
            });
        }
        Ok(TargetSpec {
            name: t.name.clone(),
            alias: t.alias.clone(),
            open: t.open.unwrap_or(t.acl.is_empty()),
            chap: credential(&key("chap"), t.chap.as_ref(), t.chap_file.as_deref(), base)?,
            mutual_chap: credential(&key("mutual_chap"), t.mutual_chap.as_ref(), t.mutual_chap_file.as_deref(), base)?,
            portal_groups: groups,
            remote_port_groups: remote,
            luns,
            optimized,
            acl,
        })
    }
}

/// The ALUA model of store `store` ([`riser_target::lu::LogicalUnit::set_port_groups`]): the
/// target port groups of every target that exports it — its portal groups' (a group's ports
/// are the relative ports of the portal groups in it) and its remote ones — the group a LUN
/// names `optimized_port_group` (else the first exporting target's first portal group's)
/// active/optimized, every other active/non-optimized. Empty when no target exports it.
pub fn port_groups_of(targets: &[TargetSpec], store: &str) -> Vec<TargetPortGroup> {
    let exporters: Vec<&TargetSpec> = targets.iter().filter(|t| t.luns.values().any(|s| s == store)).collect();
    let Some(first) = exporters.first() else { return Vec::new() };
    let mut ports: BTreeMap<u16, Vec<u16>> = BTreeMap::new();
    for t in &exporters {
        let local = t.portal_groups.iter().map(|g| (g.port_group, vec![g.relative_port]));
        let remote = t.remote_port_groups.iter().map(|r| (r.port_group, r.relative_ports.clone()));
        for (id, ps) in local.chain(remote) {
            let v = ports.entry(id).or_default();
            for p in ps {
                if !v.contains(&p) {
                    v.push(p);
                }
            }
        }
    }
    let named = exporters.iter().find_map(|t| t.optimized.iter().find(|(l, _)| t.luns.get(l).map(String::as_str) == Some(store)));
    let optimized = named.map(|(_, g)| *g).or_else(|| first.portal_groups.first().map(|g| g.port_group));
    ports
        .into_iter()
        .map(|(id, ps)| {
            let state = if Some(id) == optimized { AccessState::ActiveOptimized } else { AccessState::ActiveNonOptimized };
            TargetPortGroup::new(id, ps, state)
        })
        .collect()
}

impl TargetSpec {
    /// As a `[[target]]` table.
    pub fn to_table(&self, default_provider: cli::RdmaProvider) -> TargetTable {
        let (chap, chap_file) = self.chap.as_ref().map(Credential::to_text).unwrap_or_default();
        let (mutual_chap, mutual_chap_file) = self.mutual_chap.as_ref().map(Credential::to_text).unwrap_or_default();
        TargetTable {
            name: self.name.clone(),
            alias: self.alias.clone(),
            open: Some(self.open),
            chap,
            chap_file,
            mutual_chap,
            mutual_chap_file,
            portal_groups: self
                .portal_groups
                .iter()
                .map(|g| PortalGroupTable {
                    tag: g.tag,
                    relative_port: Some(g.relative_port),
                    port_group: Some(g.port_group),
                    portals: g.portals.iter().map(|p| p.to_text(default_provider)).collect(),
                })
                .collect(),
            remote_port_groups: self
                .remote_port_groups
                .iter()
                .map(|r| RemotePortGroupTable { port_group: r.port_group, relative_ports: r.relative_ports.clone() })
                .collect(),
            luns: self
                .luns
                .iter()
                .map(|(&lun, store)| LunTable { lun, store: store.clone(), optimized_port_group: self.optimized.get(&lun).copied() })
                .collect(),
            acl: self
                .acl
                .iter()
                .map(|a| {
                    let (chap, chap_file) = a.chap.as_ref().map(Credential::to_text).unwrap_or_default();
                    let (mutual_chap, mutual_chap_file) = a.mutual_chap.as_ref().map(Credential::to_text).unwrap_or_default();
                    AclTable {
                        initiator: a.initiator.clone(),
                        chap,
                        chap_file,
                        mutual_chap,
                        mutual_chap_file,
                        luns: a.luns.as_ref().map(LunsText::from_map),
                    }
                })
                .collect(),
        }
    }
}

impl StoreSpec {
    /// As a `[[store]]` table.
    pub fn to_table(&self) -> StoreTable {
        StoreTable {
            name: self.name.clone(),
            backing: self.backing.clone(),
            uuid: self.uuid,
            block_size: Some(self.block_size),
            options: self.options.clone(),
        }
    }
}

#[cfg(test)]
mod tests;
