//! The example target's settings: the command line merged with the `--config` file and the
//! environment (CHAP credentials, from wherever they come), and the file's `[limits]` table
//! checked key by key.

use super::Args;
use riser::iscsi::chap::ChapCredentials;
use riser::target::server::TargetConfig;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The `--config` file. No `Debug`: it may hold secrets.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    portal: Vec<String>,
    #[serde(default)]
    iser_portal: Vec<String>,
    rdma_provider: Option<String>,
    rdma_keys: Option<String>,
    target_name: Option<String>,
    #[serde(default)]
    lun: Vec<String>,
    chap: Option<String>,
    chap_file: Option<PathBuf>,
    mutual_chap: Option<String>,
    mutual_chap_file: Option<PathBuf>,
    discovery_chap: Option<String>,
    discovery_chap_file: Option<PathBuf>,
    discovery_mutual_chap: Option<String>,
    discovery_mutual_chap_file: Option<PathBuf>,
    discovery_scope: Option<String>,
    #[serde(default)]
    acl: Vec<String>,
    block_size: Option<u32>,
    sanitize_rate: Option<String>,
    #[serde(default)]
    param: Vec<String>,
    #[serde(default)]
    limits: Limits,
}

/// The `[limits]` table of the `--config` file: what initiators can make the target hold. Every
/// key is optional (default: [`TargetConfig::default`]'s, and the software RNIC's). The values
/// stay TOML until [`Limits::resolve`] checks them, so that every error names its key.
#[derive(serde::Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Limits {
    /// Connections served at once over all portals, and so sessions (one connection each).
    max_connections: Option<toml::Value>,
    /// Commands a session holds at once (its CmdSN window).
    queue_depth: Option<toml::Value>,
    /// Immediate SCSI commands (outside the window) a session may have in flight; 0: none.
    max_immediate_commands: Option<toml::Value>,
    /// Bytes of command data a session may hold at once: a size (`"256MiB"`) or bytes.
    max_session_bytes: Option<toml::Value>,
    max_target_bytes: Option<toml::Value>,
    /// Seconds a connection has to complete its login.
    login_timeout: Option<toml::Value>,
    /// Seconds write data may take to arrive (over TCP also a PDU's data segment).
    data_timeout: Option<toml::Value>,
    /// Seconds a response or Data-In may wait for the transport to take it.
    send_timeout: Option<toml::Value>,
    /// Seconds without a PDU from the initiator before a NOP-In ping; `0` or `"off"`: no pings.
    nop_interval: Option<toml::Value>,
    /// Seconds a ping may go unanswered before the connection is dropped.
    nop_timeout: Option<toml::Value>,
    /// iSER: accept unsolicited Data-Out (true or false).
    iser_unsolicited_data: Option<toml::Value>,
    /// Software iWARP RNIC: MPA handshakes an iSER portal runs at once.
    max_mpa_handshakes: Option<toml::Value>,
}

/// What the `[limits]` table sets: the target's configuration (before its nodes and discovery
/// settings are filled in), and the software RNIC's if the table names one of its keys.
pub(super) struct Tuning {
    pub(super) target: TargetConfig,
    pub(super) rnic: Option<riser::iwarp::RnicConfig>,
}

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

impl Limits {
    /// Check the table and apply it to the defaults.
    fn resolve(&self) -> Result<Tuning, String> {
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
        let rnic = match &self.max_mpa_handshakes {
            Some(v) => {
                let max_handshakes = integer("max_mpa_handshakes", v, 1, MAX_MPA_HANDSHAKES)? as usize;
                Some(riser::iwarp::RnicConfig::default().max_handshakes(max_handshakes))
            }
            None => None,
        };
        Ok(Tuning { target: t, rnic })
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
        toml::Value::String(s) => riser::cli::parse_size(s).map_err(|e| format!("limits.{key}: {e}"))?,
        toml::Value::Integer(n) if *n >= 0 => *n as u64,
        _ => return Err(format!("limits.{key} = {v}: expected a size such as \"256MiB\" or a number of bytes")),
    };
    if n < MIN_SESSION_BYTES {
        return Err(format!("limits.{key} = {v}: must be at least 64KiB (the unit of the memory budgets)"));
    }
    Ok(n)
}

/// The CHAP settings, wherever they came from.
pub(super) struct Credentials {
    pub(super) chap: Option<ChapCredentials>,
    pub(super) mutual_chap: Option<ChapCredentials>,
    pub(super) discovery_chap: Option<ChapCredentials>,
    pub(super) discovery_mutual_chap: Option<ChapCredentials>,
}

/// Read the `--config` file. A parse error quotes no line of it (the line may hold a secret);
/// a file holding a secret must be private.
fn read_config(path: &Path) -> Result<FileConfig, String> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    let file = parse_config(&text, &path.display().to_string())?;
    if file.chap.is_some() || file.mutual_chap.is_some() || file.discovery_chap.is_some() || file.discovery_mutual_chap.is_some() {
        riser::cli::check_private(path, &meta)?;
    }
    Ok(file)
}

/// Parse the text of the `--config` file `name`.
fn parse_config(text: &str, name: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        format!("{name}{}: {}", line.map(|l| format!(", line {l}")).unwrap_or_default(), e.message())
    })
}

/// One credential: from the command line or the environment (see `riser::cli::chap_credentials`),
/// else from the config file, inline or in a file of its own (a relative path is taken from the
/// config file's directory).
fn credential(
    option: &str,
    value: Option<&str>,
    file: Option<&Path>,
    env: &str,
    config: (Option<&str>, Option<&Path>),
    config_path: Option<&Path>,
) -> Result<Option<ChapCredentials>, String> {
    if let Some(c) = riser::cli::chap_credentials(option, value, file, env)? {
        return Ok(Some(c));
    }
    let key = option.trim_start_matches("--").replace('-', "_");
    let name = config_path.map(|p| p.display().to_string()).unwrap_or_default();
    match config {
        (Some(_), Some(_)) => Err(format!("{name}: {key} and {key}_file exclude each other")),
        (Some(text), None) => riser::cli::parse_credentials(&format!("{name}: {key}"), text).map(Some),
        (None, Some(f)) => {
            let f = config_path.and_then(Path::parent).map_or_else(|| f.to_path_buf(), |dir| dir.join(f));
            riser::cli::parse_credentials(&f.display().to_string(), &riser::cli::read_secret_file(&f)?).map(Some)
        }
        (None, None) => Ok(None),
    }
}

impl Args {
    /// Fill what the command line left out from the config file, then the defaults; resolve
    /// the CHAP credentials and the limits.
    pub(super) fn merged(mut self) -> Result<(Self, Credentials, Tuning), String> {
        let file = match &self.config {
            Some(p) => read_config(p)?,
            None => FileConfig::default(),
        };
        let cfg = self.config.as_deref();
        let mut tuning = file.limits.resolve().map_err(|e| format!("{}: {e}", cfg.map(|p| p.display().to_string()).unwrap_or_default()))?;
        let creds = Credentials {
            chap: credential(
                "--chap",
                self.chap.as_deref(),
                self.chap_file.as_deref(),
                "RISER_CHAP",
                (file.chap.as_deref(), file.chap_file.as_deref()),
                cfg,
            )?,
            mutual_chap: credential(
                "--mutual-chap",
                self.mutual_chap.as_deref(),
                self.mutual_chap_file.as_deref(),
                "RISER_MUTUAL_CHAP",
                (file.mutual_chap.as_deref(), file.mutual_chap_file.as_deref()),
                cfg,
            )?,
            discovery_chap: credential(
                "--discovery-chap",
                None,
                self.discovery_chap_file.as_deref(),
                "RISER_DISCOVERY_CHAP",
                (file.discovery_chap.as_deref(), file.discovery_chap_file.as_deref()),
                cfg,
            )?,
            discovery_mutual_chap: credential(
                "--discovery-mutual-chap",
                None,
                self.discovery_mutual_chap_file.as_deref(),
                "RISER_DISCOVERY_MUTUAL_CHAP",
                (file.discovery_mutual_chap.as_deref(), file.discovery_mutual_chap_file.as_deref()),
                cfg,
            )?,
        };
        let or = |cli: Vec<String>, file: Vec<String>, default: &str| {
            if !cli.is_empty() {
                cli
            } else if !file.is_empty() {
                file
            } else {
                vec![default.to_string()]
            }
        };
        self.portal = or(self.portal, file.portal, "127.0.0.1:3260");
        self.lun = or(self.lun, file.lun, "ram:1GiB");
        if self.acl.is_empty() {
            self.acl = file.acl;
        }
        if self.iser_portal.is_empty() {
            self.iser_portal = file.iser_portal;
        }
        if self.param.is_empty() {
            self.param = file.param;
        }
        tuning.target.login.operational = operational(&tuning.target.login.operational, &self.param)?;
        self.rdma_provider = self.rdma_provider.or(file.rdma_provider).or(Some("soft".into()));
        self.rdma_keys = self.rdma_keys.or(file.rdma_keys);
        self.target_name = self.target_name.or(file.target_name).or(Some("iqn.2026-11.io.riser:target0".into()));
        self.block_size = self.block_size.or(file.block_size).or(Some(512));
        self.sanitize_rate = self.sanitize_rate.or(file.sanitize_rate);
        self.discovery_scope = self.discovery_scope.or(file.discovery_scope);
        Ok((self, creds, tuning))
    }
}

/// The operational keys the target offers in login: `base` with the `--param`s (or the config
/// file's `param` list) applied.
fn operational(base: &riser::iscsi::keys::OperationalConfig, params: &[String]) -> Result<riser::iscsi::keys::OperationalConfig, String> {
    let mut o = base.clone();
    for kv in params {
        riser::cli::set_operational(&mut o, kv)?;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The limits a config file's text sets.
    fn limits(text: &str) -> Result<Tuning, String> {
        parse_config(text, "target.toml")?.limits.resolve()
    }

    fn error(text: &str) -> String {
        match limits(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e,
        }
    }

    #[test]
    fn limits_table_sets_the_target_config() {
        let t = limits(
            r#"
            lun = ["ram:1MiB"]
            [limits]
            max_connections = 8
            queue_depth = 32
            max_immediate_commands = 0
            max_session_bytes = "64MiB"
            max_target_bytes = "1GiB"
            login_timeout = 5
            data_timeout = 2.5
            send_timeout = 60
            nop_interval = 3
            nop_timeout = 7
            iser_unsolicited_data = true
            max_mpa_handshakes = 4
            "#,
        )
        .unwrap();
        let c = &t.target;
        assert_eq!(c.max_connections, 8);
        assert_eq!(c.queue_depth, 32);
        assert_eq!(c.max_immediate_commands, 0);
        assert_eq!(c.max_session_bytes, 64 << 20);
        assert_eq!(c.max_target_bytes, 1 << 30);
        assert_eq!(c.login.login_timeout, Duration::from_secs(5));
        assert_eq!(c.data_timeout, Duration::from_millis(2500));
        assert_eq!(c.send_timeout, Duration::from_secs(60));
        assert_eq!(c.nop_interval, Some(Duration::from_secs(3)));
        assert_eq!(c.nop_timeout, Duration::from_secs(7));
        assert!(c.iser_unsolicited_data);
        assert_eq!(t.rnic.map(|r| r.max_handshakes), Some(4));
    }

    #[test]
    fn absent_keys_keep_the_defaults() {
        let d = TargetConfig::default();
        for text in ["", "[limits]\n"] {
            let t = limits(text).unwrap();
            let c = &t.target;
            assert_eq!(c.max_connections, d.max_connections);
            assert_eq!(c.queue_depth, d.queue_depth);
            assert_eq!(c.max_immediate_commands, d.max_immediate_commands);
            assert_eq!(c.max_session_bytes, d.max_session_bytes);
            assert_eq!(c.login.login_timeout, d.login.login_timeout);
            assert_eq!(c.data_timeout, d.data_timeout);
            assert_eq!(c.send_timeout, d.send_timeout);
            assert_eq!(c.nop_interval, d.nop_interval);
            assert_eq!(c.nop_timeout, d.nop_timeout);
            assert_eq!(c.iser_unsolicited_data, d.iser_unsolicited_data);
            assert!(t.rnic.is_none());
        }
    }

    #[test]
    fn sizes_as_bytes_and_pings_off() {
        let t = limits("[limits]\nmax_session_bytes = 1048576\nnop_interval = 0\n").unwrap();
        assert_eq!(t.target.max_session_bytes, 1 << 20);
        assert_eq!(t.target.nop_interval, None);
        assert_eq!(limits("[limits]\nnop_interval = \"off\"\n").unwrap().target.nop_interval, None);
        assert_eq!(limits("[limits]\nnop_interval = 0.0\n").unwrap().target.nop_interval, None);
        let t = limits("[limits]\nnop_interval = 0.25\nmax_session_bytes = \"64KiB\"\n").unwrap();
        assert_eq!(t.target.nop_interval, Some(Duration::from_millis(250)));
        assert_eq!(t.target.max_session_bytes, 64 << 10);
    }

    #[test]
    fn bad_values_name_their_key() {
        for (line, key) in [
            ("queue_depth = 0", "limits.queue_depth = 0"),
            ("queue_depth = 65537", "limits.queue_depth"),
            ("queue_depth = -1", "limits.queue_depth"),
            ("queue_depth = \"many\"", "limits.queue_depth"),
            ("max_connections = 0", "limits.max_connections = 0"),
            ("max_immediate_commands = 1.5", "limits.max_immediate_commands"),
            ("max_session_bytes = 0", "limits.max_session_bytes = 0"),
            ("max_session_bytes = \"32KiB\"", "limits.max_session_bytes"),
            ("max_target_bytes = \"1KiB\"", "limits.max_target_bytes"),
            ("max_session_bytes = \"1XB\"", "limits.max_session_bytes"),
            ("login_timeout = 0", "limits.login_timeout = 0"),
            ("data_timeout = -1", "limits.data_timeout"),
            ("send_timeout = \"30s\"", "limits.send_timeout"),
            ("send_timeout = 1e9", "limits.send_timeout"),
            ("send_timeout = nan", "limits.send_timeout"),
            ("nop_interval = \"never\"", "limits.nop_interval"),
            ("nop_timeout = 0", "limits.nop_timeout = 0"),
            ("iser_unsolicited_data = 1", "limits.iser_unsolicited_data"),
            ("max_mpa_handshakes = 0", "limits.max_mpa_handshakes = 0"),
            ("max_mpa_handshakes = 1025", "limits.max_mpa_handshakes"),
        ] {
            let e = error(&format!("[limits]\n{line}\n"));
            assert!(e.contains(key), "{line}: {e}");
        }
    }

    #[test]
    fn params_from_the_config_file_set_the_offered_keys() {
        let file = parse_config("param = [\"MaxRecvDataSegmentLength=512KiB\", \"InitialR2T=Yes\"]\n", "target.toml").unwrap();
        let o = operational(&TargetConfig::default().login.operational, &file.param).unwrap();
        assert_eq!(o.max_recv_data_segment_length, 512 << 10);
        assert!(o.initial_r2t);
        let e = operational(&o, &["MaxBurstLength=1".into()]).unwrap_err();
        assert!(e.contains("MaxBurstLength"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = error("portal = [\"127.0.0.1:3260\"]\n[limits]\nqueue_dept = 4\n");
        assert!(e.contains("queue_dept") && e.contains("target.toml, line 3"), "{e}");
        let e = error("[limit]\nqueue_depth = 4\n");
        assert!(e.contains("limit"), "{e}");
    }
}
