//! What the programs share (the target, the initiator, riserctl, scripts): sizes, portals, CHAP
//! credentials and the files that hold them, the operational and iSER settings as `KEY=VALUE`,
//! logging, and how a program ends on an error.

/// Parse a size with an optional binary suffix: `512`, `4KiB`, `256MiB`, `1GiB`, `2TiB`
/// (`K`/`KB`, `M`/`MB`, … mean the same binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("bad size {s:?}"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" | "kb" => 10,
        "m" | "mib" | "mb" => 20,
        "g" | "gib" | "gb" => 30,
        "t" | "tib" | "tb" => 40,
        _ => return Err(format!("bad size unit in {s:?}")),
    };
    n.checked_mul(1 << shift).ok_or_else(|| format!("size {s:?} too large"))
}

/// Which RDMA provider iSER runs on (the examples' `--rdma-provider`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RdmaProvider {
    /// riser's software iWARP RNIC (user space, over TCP; no RDMA device needed).
    Soft,
    /// rdma-core: an RDMA device of the machine (an RNIC, rxe or siw).
    RdmaCore,
}

impl RdmaProvider {
    /// Parse `soft` or `rdma-core`.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "soft" => Ok(Self::Soft),
            "rdma-core" => Ok(Self::RdmaCore),
            _ => Err(format!("unknown RDMA provider {s:?} (soft, rdma-core)")),
        }
    }

    /// Its name, as [`RdmaProvider::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Soft => "soft",
            Self::RdmaCore => "rdma-core",
        }
    }

    /// The port an iSER portal uses when none is given: 3260 on an RDMA device (as Linux;
    /// the connection manager's port space is apart from TCP's, except on iWARP), 3262 on
    /// the software RNIC (a TCP listen of its own beside the TCP portal's 3260).
    pub fn default_port(self) -> u16 {
        match self {
            Self::Soft => 3262,
            Self::RdmaCore => 3260,
        }
    }
}

/// Parse `--rdma-keys`: `auto`, `windows`, `per-region` or `fixed-pool`.
#[cfg(feature = "rdma-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma-core")))]
pub fn parse_key_mode(s: &str) -> Result<riser_verbs::rdma_core::KeyMode, String> {
    use riser_verbs::rdma_core::KeyMode;
    match s {
        "auto" => Ok(KeyMode::Auto),
        "windows" => Ok(KeyMode::MemoryWindows),
        "per-region" => Ok(KeyMode::PerRegion),
        "fixed-pool" => Ok(KeyMode::FixedPool),
        _ => Err(format!("unknown key mode {s:?} (auto, windows, per-region, fixed-pool)")),
    }
}

/// `HOST[:PORT]` with `default_port` when none is given (IPv6 literals in brackets).
pub fn with_default_port(host: &str, default_port: u16) -> String {
    if host.rsplit_once(':').is_some_and(|(h, p)| p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']'))) {
        host.to_string()
    } else {
        format!("{host}:{default_port}")
    }
}

/// Read a file that holds a secret, refusing it (as ssh refuses a private key) when its
/// group or other users have any access: then the secret is not secret on this machine. The
/// check is on the opened file, so the path cannot be swapped between check and read.
pub fn read_secret_file(path: &std::path::Path) -> Result<String, String> {
    use std::io::Read as _;
    let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    check_private(path, &meta)?;
    // A regular file, and a small one: a device or a pipe named by mistake must not hang or
    // exhaust the reader.
    if !meta.is_file() {
        return Err(format!("{}: not a regular file", path.display()));
    }
    let mut text = String::new();
    f.take(MAX_SECRET_FILE + 1).read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    if text.len() as u64 > MAX_SECRET_FILE {
        return Err(format!("{}: larger than {MAX_SECRET_FILE} bytes: not a credentials file", path.display()));
    }
    Ok(text)
}

/// The largest credentials file read.
pub const MAX_SECRET_FILE: u64 = 64 << 10;

/// Refuse a secret-holding file that its group or other users may access (mode & 077).
pub fn check_private(path: &std::path::Path, meta: &std::fs::Metadata) -> Result<(), String> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(format!(
                "{p}: permissions {mode:04o} are too open: a file holding a CHAP secret must not be accessible by \
                 group or other users (chmod 600 {p})",
                p = path.display()
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = (path, meta);
    Ok(())
}

/// Apply `KEY=VALUE` (the examples' `--param`) to the operational keys offered in login:
/// `MaxRecvDataSegmentLength`, `MaxBurstLength`, `FirstBurstLength` (a size, 512 bytes to
/// 16 MiB − 1 as RFC 7143 allows, e.g. `512KiB`), `ImmediateData`, `InitialR2T` (`Yes`/`No`).
pub fn set_operational(cfg: &mut riser_iscsi::keys::OperationalConfig, kv: &str) -> Result<(), String> {
    let (key, value) = kv.split_once('=').ok_or_else(|| format!("--param {kv:?}: expected KEY=VALUE"))?;
    let (key, value) = (key.trim(), value.trim());
    let size = || {
        parse_size(value)
            .ok()
            .filter(|n| (512..1 << 24).contains(n))
            .map(|n| n as u32)
            .ok_or_else(|| format!("--param {key}={value}: a size from 512 to 16777215 bytes"))
    };
    let yes_no = || match value {
        "Yes" | "yes" => Ok(true),
        "No" | "no" => Ok(false),
        _ => Err(format!("--param {key}={value}: Yes or No")),
    };
    match key {
        "MaxRecvDataSegmentLength" => cfg.max_recv_data_segment_length = size()?,
        "MaxBurstLength" => cfg.max_burst_length = size()?,
        "FirstBurstLength" => cfg.first_burst_length = size()?,
        "ImmediateData" => cfg.immediate_data = yes_no()?,
        "InitialR2T" => cfg.initial_r2t = yes_no()?,
        _ => {
            return Err(format!(
                "--param {key}: not a settable key (MaxRecvDataSegmentLength, MaxBurstLength, FirstBurstLength, ImmediateData, InitialR2T)"
            ));
        }
    }
    Ok(())
}

/// Apply `KEY=VALUE` (the examples' `--iser-param`) to an iSER datamover's settings:
/// `signal_every` (1 to 1024: at most that many routine requests in a row unsignaled; the
/// datamover lowers it to a quarter of the send queue), `send_depth` (send queue entries,
/// from two per posted receive plus 16 (272 by default) to 65536) and `recv_dsl` (the data
/// segment this side receives, 8 KiB to 1 MiB: every posted receive is this large) and
/// `read_data_in_flight` (a target's read data in RDMA Writes not yet completed, a size from
/// 2 MiB to 64 GiB: beyond it a read waits for room; the datamover raises it to twice what
/// unsignaled writes may hold, 2.125 MiB at the default `signal_every`).
pub fn set_iser(cfg: &mut riser_iser::IserConfig, kv: &str) -> Result<(), String> {
    let (key, value) = kv.split_once('=').ok_or_else(|| format!("--iser-param {kv:?}: expected KEY=VALUE"))?;
    let (key, value) = (key.trim(), value.trim());
    let number = |lo: u32, hi: u32| {
        value
            .parse::<u32>()
            .ok()
            .filter(|n| (lo..=hi).contains(n))
            .ok_or_else(|| format!("--iser-param {key}={value}: a number from {lo} to {hi}"))
    };
    match key {
        "signal_every" => cfg.signal_every = number(1, 1024)?,
        // Two per posted receive plus 16 at least: the datamover raises anything smaller.
        "send_depth" => cfg.send_depth = Some(number(cfg.recv_depth * 2 + 16, 65536)?),
        "recv_dsl" => cfg.recv_dsl = number(riser_iscsi::keys::DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, 1 << 20)?,
        "read_data_in_flight" => {
            cfg.read_data_in_flight = parse_size(value)
                .ok()
                .filter(|n| ((2 << 20)..=(64 << 30)).contains(n))
                .ok_or_else(|| format!("--iser-param {key}={value}: a size from 2MiB to 64GiB"))?;
        }
        _ => return Err(format!("--iser-param {key}: not a setting (signal_every, send_depth, recv_dsl, read_data_in_flight)")),
    }
    Ok(())
}

/// How the programs log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum LogFormat {
    /// One line of text per event (the default).
    #[default]
    Text,
    /// One JSON object per event and line (for journald, Loki and the like): `timestamp`,
    /// `level`, `fields` (with `message`) and `target`.
    Json,
}

impl LogFormat {
    /// Parse `text` or `json` (the programs' `--log-format`).
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            _ => Err(format!("unknown log format {s:?} (text, json)")),
        }
    }
}

/// Log with `tracing` to stderr (stdout is left to a program's results), as `RUST_LOG` says
/// or else at `default` (a filter such as `"warn"` or `"info,riser_iwarp=debug"`), without
/// the module path of each event. Once, at the start of `main`.
pub fn init_tracing(default: &str) {
    init_logging(default, LogFormat::Text);
}

/// As [`init_tracing`], in `format`.
pub fn init_logging(default: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| default.into());
    let fmt = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => fmt.with_target(false).init(),
        LogFormat::Json => fmt.json().init(),
    }
}

/// End an example program as its outcome says: on an error, `error: …` on stderr and exit
/// status 1.
pub fn exit_on_error(outcome: Result<(), impl core::fmt::Display>) {
    if let Err(e) = outcome {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Parse CHAP credentials text (the format of [`riser_iscsi::chap::ChapCredentials::parse`]),
/// naming `source` in the error, never the text.
pub fn parse_credentials(source: &str, text: &str) -> Result<riser_iscsi::chap::ChapCredentials, String> {
    riser_iscsi::chap::ChapCredentials::parse(text).map_err(|e| format!("{source}: {e}"))
}

/// One CHAP credential of an example program, from the first place it is given:
///
/// 1. `option` (`--chap USER:SECRET`): accepted, with a warning on stderr, since every user
///    of the machine can read a command line (`ps`, `/proc/PID/cmdline`);
/// 2. the file of `option`-file (`--chap-file PATH`, see [`read_secret_file`]);
/// 3. the environment variable `env` (readable only by the process's user and root).
///
/// `None` when none of them is given. Giving both 1 and 2 is an error.
pub fn chap_credentials(
    option: &str,
    value: Option<&str>,
    file: Option<&std::path::Path>,
    env: &str,
) -> Result<Option<riser_iscsi::chap::ChapCredentials>, String> {
    match (value, file) {
        (Some(_), Some(_)) => Err(format!("{option} and {option}-file exclude each other")),
        (Some(v), None) => {
            eprintln!(
                "warning: {option} puts the CHAP secret on the command line, where every user of this machine can read it \
                 (ps, /proc/PID/cmdline); use {option}-file or {env} instead"
            );
            parse_credentials(option, v).map(Some)
        }
        (None, Some(f)) => parse_credentials(&f.display().to_string(), &read_secret_file(f)?).map(Some),
        (None, None) => match std::env::var(env) {
            Ok(v) => parse_credentials(env, &v).map(Some),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(_)) => Err(format!("{env} is not valid UTF-8")),
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn params_set_the_offered_keys_and_refuse_the_rest() {
        let mut c = riser_iscsi::keys::OperationalConfig::default();
        for kv in
            ["MaxRecvDataSegmentLength=512KiB", "MaxBurstLength=524288", "FirstBurstLength = 64KiB", "ImmediateData=No", "InitialR2T=Yes"]
        {
            super::set_operational(&mut c, kv).unwrap();
        }
        assert_eq!((c.max_recv_data_segment_length, c.max_burst_length, c.first_burst_length), (512 << 10, 512 << 10, 64 << 10));
        assert!(!c.immediate_data && c.initial_r2t);
        for bad in ["MaxBurstLength=16MiB", "MaxBurstLength=100", "InitialR2T=maybe", "HeaderDigest=CRC32C", "MaxBurstLength"] {
            assert!(super::set_operational(&mut c, bad).is_err(), "{bad}");
        }
        assert_eq!(c.max_burst_length, 512 << 10, "a refused value changes nothing");
    }

    #[test]
    fn iser_params_set_the_datamover_and_refuse_the_rest() {
        let mut c = riser_iser::IserConfig::default();
        assert_eq!((c.signal_every, c.send_depth), (riser_iser::DEFAULT_SIGNAL_EVERY, None));
        super::set_iser(&mut c, "signal_every=1").unwrap();
        super::set_iser(&mut c, "send_depth = 512").unwrap();
        assert_eq!((c.signal_every, c.send_depth), (1, Some(512)));
        super::set_iser(&mut c, "recv_dsl=131072").unwrap();
        assert_eq!(c.recv_dsl, 128 << 10);
        assert_eq!(c.read_data_in_flight, riser_iser::DEFAULT_READ_DATA_IN_FLIGHT);
        super::set_iser(&mut c, "read_data_in_flight=16MiB").unwrap();
        assert_eq!(c.read_data_in_flight, 16 << 20);
        for bad in [
            "signal_every=0",
            "send_depth=271",
            "send_depth=lots",
            "recv_depth=4",
            "signal_every",
            "recv_dsl=4096",
            "recv_dsl=2097152",
            "read_data_in_flight=4KiB",
            "read_data_in_flight=1MiB",
            "read_data_in_flight=many",
        ] {
            assert!(super::set_iser(&mut c, bad).is_err(), "{bad}");
        }
        assert_eq!(
            (c.signal_every, c.send_depth, c.recv_dsl, c.read_data_in_flight),
            (1, Some(512), 128 << 10, 16 << 20),
            "a refused value changes nothing"
        );
    }

    #[cfg(unix)]
    #[test]
    fn secret_files_must_be_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = std::env::temp_dir().join(format!("riser-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chap");
        std::fs::write(&path, "# initiator CHAP\niqn.2026-11.io.riser:alice\nalicesecret12\n").unwrap();
        for mode in [0o644, 0o640, 0o604, 0o660, 0o606, 0o610] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = super::read_secret_file(&path).unwrap_err();
            assert!(e.contains("too open") && e.contains(&format!("{mode:04o}")) && e.contains("chmod 600"), "{e}");
            assert!(!e.contains("alicesecret12"), "{e}");
            let e = super::chap_credentials("--chap", None, Some(&path), "RISER_TEST_UNSET_VARIABLE").unwrap_err();
            assert!(e.contains("too open"), "{e}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let c = super::chap_credentials("--chap", None, Some(&path), "RISER_TEST_UNSET_VARIABLE").unwrap().unwrap();
            assert_eq!(c.user, "iqn.2026-11.io.riser:alice");
            assert_eq!(c.secret, riser_iscsi::chap::Secret::new(*b"alicesecret12"));
        }
        // A malformed file: the error names the file, not its content.
        std::fs::write(&path, "alicesecret12\n").unwrap();
        let e = super::chap_credentials("--chap", None, Some(&path), "RISER_TEST_UNSET_VARIABLE").unwrap_err();
        assert!(e.contains(&path.display().to_string()) && !e.contains("alicesecret12"), "{e}");
        assert!(super::read_secret_file(&dir.join("missing")).is_err());
        // Not a regular file, or too large: refused without reading it all.
        std::fs::create_dir(dir.join("d")).unwrap();
        std::fs::set_permissions(dir.join("d"), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(super::read_secret_file(&dir.join("d")).unwrap_err().contains("not a regular file"));
        std::fs::write(&path, vec![b'a'; 100_000]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(super::read_secret_file(&path).unwrap_err().contains("larger than"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn credentials_from_the_option_and_nowhere() {
        let c = super::chap_credentials("--chap", Some("bob:bobsecret1234"), None, "RISER_TEST_UNSET_VARIABLE").unwrap().unwrap();
        assert_eq!(c.user, "bob");
        assert_eq!(super::chap_credentials("--chap", None, None, "RISER_TEST_UNSET_VARIABLE"), Ok(None));
        let both = super::chap_credentials("--chap", Some("bob:bobsecret1234"), Some("/nonexistent".as_ref()), "X");
        assert!(both.unwrap_err().contains("exclude"));
    }

    #[test]
    fn default_ports() {
        assert_eq!(super::with_default_port("10.0.0.1", 3260), "10.0.0.1:3260");
        assert_eq!(super::with_default_port("10.0.0.1:3262", 3260), "10.0.0.1:3262");
        assert_eq!(super::with_default_port("[::1]:99", 3260), "[::1]:99");
        assert_eq!(super::with_default_port("[::1]", 3260), "[::1]:3260");
        assert_eq!(super::RdmaProvider::parse("rdma-core"), Ok(super::RdmaProvider::RdmaCore));
        assert!(super::RdmaProvider::parse("ib").is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(super::parse_size("4KiB"), Ok(4096));
        assert_eq!(super::parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(super::parse_size("512"), Ok(512));
        assert!(super::parse_size("1XB").is_err());
        assert!(super::parse_size("99999999999TiB").is_err());
    }
}
