//! Storage objects: a backing spec opened as a logical unit, with a stable identity.
//!
//! A store's UUID is the one its configuration gives; else, for a store that persists (a file,
//! a block device), one derived from what is unique and stable to that file or device — never
//! from its position in a list, so reordering the configuration changes no identity; else
//! (a RAM disk, which lives as long as the process) a fresh random one. `config_save` records
//! every UUID, so a saved configuration pins them.

use crate::config::{StoreOptions, StoreSpec};
use riser_target::backend::{BlockBackend, FileBackend, FileOptions, RamBackend};
use riser_target::lu::{LogicalUnit, LuIdentity};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uuid::Uuid;

/// The namespace of the UUIDs riser derives (version 5, RFC 9562 §5.5).
const NAMESPACE: Uuid = Uuid::from_u128(0x5c1c_0a4e_2f0b_4d6e_9b1e_7a3c_5d2f_8e01);

/// What a backing spec names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// `ram:SIZE`.
    Ram(u64),
    /// `file:PATH[:SIZE]` (created at SIZE if missing, grown to it if smaller).
    File(PathBuf, Option<u64>),
    /// `blk:DEVICE`.
    Block(PathBuf),
    /// `rbd:POOL/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH]`: a Ceph RBD image (builds with
    /// the feature `rbd`).
    Rbd(RbdSpec),
}

/// A Ceph RBD image and how to reach its cluster: `rbd:POOL[/NAMESPACE]/IMAGE` followed by
/// options `,conf=PATH` (the Ceph configuration; default: librados' search: `$CEPH_CONF`,
/// `/etc/ceph/ceph.conf`, ...), `,id=NAME` (the client id, default `admin`) and `,keyring=PATH`
/// (default: the configuration's). The keyring's secret stays in its file: never on a command
/// line, never in riser's own files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RbdSpec {
    /// The pool.
    pub pool: String,
    /// The RADOS namespace in the pool (empty: the default one).
    pub namespace: String,
    /// The image.
    pub image: String,
    /// The Ceph configuration file.
    pub conf: Option<PathBuf>,
    /// The client id (`client.ID`).
    pub id: Option<String>,
    /// The keyring file.
    pub keyring: Option<PathBuf>,
}

impl RbdSpec {
    fn parse(rest: &str) -> Result<Self, String> {
        let usage = "rbd:POOL[/NAMESPACE]/IMAGE[,conf=PATH][,id=NAME][,keyring=PATH]";
        let mut parts = rest.split(',');
        let path: Vec<&str> = parts.next().unwrap_or("").split('/').collect();
        let (pool, namespace, image) = match path[..] {
            [p, i] => (p, "", i),
            [p, n, i] => (p, n, i),
            _ => return Err(format!("backing rbd:{rest}: {usage}")),
        };
        // What librbd takes as names: no NUL, and nothing empty.
        if [pool, image].iter().any(|s| s.is_empty()) || rest.contains('\0') || image.contains('@') {
            return Err(format!("backing rbd:{rest}: {usage} (a pool and an image name; no snapshot)"));
        }
        let mut spec = Self { pool: pool.into(), namespace: namespace.into(), image: image.into(), conf: None, id: None, keyring: None };
        for opt in parts {
            match opt.split_once('=') {
                Some(("conf", v)) if !v.is_empty() => spec.conf = Some(v.into()),
                Some(("id", v)) if !v.is_empty() => spec.id = Some(v.into()),
                Some(("keyring", v)) if !v.is_empty() => spec.keyring = Some(v.into()),
                _ => return Err(format!("backing rbd:{rest}: option {opt:?} (conf=PATH, id=NAME or keyring=PATH)")),
            }
        }
        Ok(spec)
    }
}

impl std::fmt::Display for RbdSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rbd:{}/", self.pool)?;
        if !self.namespace.is_empty() {
            write!(f, "{}/", self.namespace)?;
        }
        f.write_str(&self.image)?;
        if let Some(c) = &self.conf {
            write!(f, ",conf={}", c.display())?;
        }
        if let Some(i) = &self.id {
            write!(f, ",id={i}")?;
        }
        if let Some(k) = &self.keyring {
            write!(f, ",keyring={}", k.display())?;
        }
        Ok(())
    }
}

impl Backing {
    /// Parse a backing spec, as `--lun` takes it.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let (kind, rest) =
            spec.split_once(':').ok_or_else(|| format!("backing {spec:?}: ram:SIZE, file:PATH[:SIZE], blk:DEVICE or rbd:POOL/IMAGE"))?;
        Ok(match kind {
            "ram" => Self::Ram(crate::cli::parse_size(rest)?),
            "file" => match rest.rsplit_once(':') {
                Some((p, s)) if crate::cli::parse_size(s).is_ok() => Self::File(p.into(), Some(crate::cli::parse_size(s)?)),
                _ => Self::File(rest.into(), None),
            },
            "blk" => Self::Block(rest.into()),
            "rbd" => Self::Rbd(RbdSpec::parse(rest)?),
            _ => return Err(format!("unknown backing kind {kind:?} (ram, file, blk, rbd)")),
        })
    }

    /// The spec with its size set to `size` (a block device's size is the device's).
    pub fn with_size(&self, size: u64) -> Self {
        match self {
            Self::Ram(_) => Self::Ram(size),
            Self::File(p, _) => Self::File(p.clone(), Some(size)),
            Self::Block(p) => Self::Block(p.clone()),
            Self::Rbd(r) => Self::Rbd(r.clone()),
        }
    }

    /// Whether `other` is the same backing but for its size.
    pub fn same_but_size(&self, other: &Self) -> bool {
        match (self, other) {
            (Self::Ram(_), Self::Ram(_)) => false,
            (Self::File(a, _), Self::File(b, _)) => a == b,
            (Self::Block(a), Self::Block(b)) => a == b,
            (Self::Rbd(a), Self::Rbd(b)) => a == b,
            _ => false,
        }
    }

    /// The size the spec asks for, if any.
    pub fn size(&self) -> Option<u64> {
        match self {
            Self::Ram(s) => Some(*s),
            Self::File(_, s) => *s,
            Self::Block(_) | Self::Rbd(_) => None,
        }
    }
}

impl std::fmt::Display for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ram(s) => write!(f, "ram:{}", size_text(*s)),
            Self::File(p, None) => write!(f, "file:{}", p.display()),
            Self::File(p, Some(s)) => write!(f, "file:{}:{}", p.display(), size_text(*s)),
            Self::Block(p) => write!(f, "blk:{}", p.display()),
            Self::Rbd(r) => r.fmt(f),
        }
    }
}

/// A size as `parse_size` reads it, in the largest binary unit that divides it.
fn size_text(n: u64) -> String {
    for (shift, unit) in [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// An opened store.
#[derive(Debug, Clone)]
pub struct Store {
    /// Its spec, the UUID filled in.
    pub spec: StoreSpec,
    /// The unit over it.
    pub lu: Arc<LogicalUnit>,
    /// Its coordination with other gateways of the same image (RBD stores).
    pub ha: Ha,
}

/// How a store exported by several gateways (an RBD image behind several riser processes) is
/// coordinated with the others (`riser_target::rbd::Gateway`, feature `rbd`): nothing for
/// other stores.
#[derive(Debug, Clone, Default)]
pub struct Ha {
    #[cfg(feature = "rbd")]
    rbd: Option<(Arc<riser_target::rbd::RbdStore>, std::time::Duration)>,
    #[cfg(feature = "rbd")]
    gateway: Arc<std::sync::Mutex<Option<riser_target::rbd::Gateway>>>,
}

impl Ha {
    /// Follow the unit's ALUA model `model` (already set on `lu`): with port groups not in
    /// `local` (another gateway's), coordinate with the other gateways as group `local`'s
    /// optimized one or its first; without, stop coordinating. A gateway already running
    /// keeps what the gateways agreed on (a takeover outlives a reload).
    pub fn sync(&self, lu: &Arc<LogicalUnit>, local: &[u16], model: &[riser_target::lu::TargetPortGroup]) -> Result<(), String> {
        #[cfg(feature = "rbd")]
        {
            use riser_target::lu::AccessState;
            use riser_target::rbd::{Gateway, GatewayConfig};
            let Some((store, takeover)) = &self.rbd else { return Ok(()) };
            let mut running = self.gateway.lock().unwrap_or_else(|e| e.into_inner());
            if local.is_empty() || model.iter().all(|g| local.contains(&g.id)) {
                *running = None;
                return Ok(());
            }
            let optimized = model.iter().find(|g| g.state == AccessState::ActiveOptimized).map(|g| g.id);
            let group = optimized.filter(|g| local.contains(g)).unwrap_or(local[0]);
            match &*running {
                Some(g) if g.status().group == group => g.reassert(),
                _ => {
                    *running = None;
                    let cfg = GatewayConfig::new(group).takeover_after(*takeover);
                    *running = Some(Gateway::start(store, lu, cfg).map_err(|e| format!("coordinating with the other gateways: {e}"))?);
                }
            }
        }
        #[cfg(not(feature = "rbd"))]
        let _ = (lu, local, model);
        Ok(())
    }
}

impl Store {
    /// The UUID.
    pub fn uuid(&self) -> Uuid {
        self.lu.identity().uuid()
    }

    /// Its size in bytes now.
    pub fn size(&self) -> u64 {
        let b = self.lu.backend();
        b.num_blocks() * u64::from(b.block_size())
    }
}

/// Open `spec`: its backend, its identity, its unit (SANITIZE paced to `sanitize_rate`; with a
/// `state_dir`, reservations with APTPL kept in `state_dir/pr/UUID`).
pub fn open(spec: &StoreSpec, sanitize_rate: Option<u64>, state_dir: Option<&Path>) -> Result<Store, String> {
    let name = &spec.name;
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err(format!("store name {name:?}: letters, digits, '-', '_' and '.' only"));
    }
    if !spec.block_size.is_power_of_two() || !(512..=65536).contains(&spec.block_size) {
        return Err(format!("store {name}: block size {} (a power of two from 512 to 65536)", spec.block_size));
    }
    let backing = Backing::parse(&spec.backing).map_err(|e| format!("store {name}: {e}"))?;
    let (backend, derived): (Arc<dyn BlockBackend>, Option<Uuid>) = match &backing {
        Backing::Ram(size) => {
            if spec.options.thin == Some(false) {
                return Err(format!("store {name}: a RAM store is always thin"));
            }
            // Larger than the machine's memory, the allocation would fail (and end the process).
            if let Some(total) = memory_total()
                && *size > total
            {
                return Err(format!("store {name}: {} is more than this machine's memory ({total} bytes)", spec.backing));
            }
            (Arc::new(RamBackend::new(*size, spec.block_size)), None)
        }
        Backing::File(path, size) => {
            let f = FileBackend::open_with(path, *size, spec.block_size, file_options(&spec.options))
                .map_err(|e| format!("store {name}: {}: {e}", path.display()))?;
            (Arc::new(f), if spec.uuid.is_none() { Some(derive_file_uuid(path).map_err(|e| format!("store {name}: {e}"))?) } else { None })
        }
        Backing::Block(path) => {
            let f = FileBackend::open_with(path, None, spec.block_size, file_options(&spec.options))
                .map_err(|e| format!("store {name}: {}: {e}", path.display()))?;
            (
                Arc::new(f),
                if spec.uuid.is_none() { Some(derive_device_uuid(path).map_err(|e| format!("store {name}: {e}"))?) } else { None },
            )
        }
        Backing::Rbd(r) => return open_rbd(spec, r, sanitize_rate, state_dir),
    };
    if backend.num_blocks() == 0 {
        return Err(format!("store {name}: {} holds no whole block of {} bytes", spec.backing, spec.block_size));
    }
    let uuid = spec.uuid.or(derived).unwrap_or_else(Uuid::new_v4);
    let mut lu = LogicalUnit::new(backend, LuIdentity::new(uuid)).with_sanitize_rate(sanitize_rate);
    if let Some(dir) = state_dir {
        let pr = dir.join("pr");
        std::fs::create_dir_all(&pr).map_err(|e| format!("{}: {e}", pr.display()))?;
        lu = lu.with_persistent_reservation_file(pr.join(uuid.hyphenated().to_string())).map_err(|e| format!("store {name}: {e}"))?;
    }
    let mut spec = spec.clone();
    spec.uuid = Some(uuid);
    Ok(Store { spec, lu: Arc::new(lu), ha: Ha::default() })
}

/// Open an RBD store: the image on its cluster (the process's connection to that cluster, made
/// at the first image), with the identity given or derived from the cluster and the image's
/// id, so every gateway exporting the image presents one device.
#[cfg(feature = "rbd")]
fn open_rbd(spec: &StoreSpec, r: &RbdSpec, sanitize_rate: Option<u64>, state_dir: Option<&Path>) -> Result<Store, String> {
    use riser_target::rbd::{ClusterSpec, RbdStore, connect};
    let name = &spec.name;
    let cluster = connect(&ClusterSpec { conf: r.conf.clone(), id: r.id.clone(), keyring: r.keyring.clone() })
        .map_err(|e| format!("store {name}: the Ceph cluster of {}: {e}", spec.backing))?;
    let store = RbdStore::open(&cluster, &r.pool, &r.namespace, &r.image, spec.block_size)
        .map_err(|e| format!("store {name}: {}: {e}", spec.backing))?;
    if riser_target::aio::AsyncBackend::num_blocks(&*store) == 0 {
        return Err(format!("store {name}: {} holds no whole block of {} bytes", spec.backing, spec.block_size));
    }
    let uuid = match spec.uuid {
        Some(u) => u,
        None => {
            let (fsid, image_id) =
                (cluster.fsid().map_err(|e| format!("store {name}: {e}"))?, store.image().id().map_err(|e| format!("store {name}: {e}"))?);
            Uuid::new_v5(&NAMESPACE, format!("rbd:{fsid}:{}:{}:{image_id}", r.pool, r.namespace).as_bytes())
        }
    };
    let mut lu = LogicalUnit::with_async(store.clone(), LuIdentity::new(uuid)).with_sanitize_rate(sanitize_rate);
    // Persistent reservations are this gateway's, as for any store (README: "riser as a Ceph
    // RBD gateway" says what that means with two).
    if let Some(dir) = state_dir {
        let pr = dir.join("pr");
        std::fs::create_dir_all(&pr).map_err(|e| format!("{}: {e}", pr.display()))?;
        lu = lu.with_persistent_reservation_file(pr.join(uuid.hyphenated().to_string())).map_err(|e| format!("store {name}: {e}"))?;
    }
    let lu = Arc::new(lu);
    store.report_to(&lu);
    let mut spec = spec.clone();
    spec.uuid = Some(uuid);
    let takeover = match spec.options.takeover_secs {
        Some(s) if s < 2 => return Err(format!("store {name}: takeover_secs = {s}: at least 2")),
        Some(s) => std::time::Duration::from_secs(u64::from(s)),
        None => std::time::Duration::from_secs(8),
    };
    Ok(Store { spec, lu, ha: Ha { rbd: Some((store, takeover)), ..Ha::default() } })
}

/// Open an RBD store (this build has no RBD support: the feature `rbd` brings it).
#[cfg(not(feature = "rbd"))]
fn open_rbd(spec: &StoreSpec, _: &RbdSpec, _: Option<u64>, _: Option<&Path>) -> Result<Store, String> {
    Err(format!("store {}: {}: this riser was built without Ceph RBD support (build it with the feature `rbd`)", spec.name, spec.backing))
}

/// The machine's memory (MemTotal of /proc/meminfo), if it can be read.
fn memory_total() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib: u64 = info.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib << 10)
}

fn file_options(o: &StoreOptions) -> FileOptions {
    let mut f = FileOptions::default();
    f.thin = o.thin;
    f
}

/// This machine's identity, for UUIDs derived from things only unique on one machine (an
/// inode number): `/etc/machine-id` (systemd's), else `/var/lib/dbus/machine-id`, else the host
/// name.
fn machine_id() -> String {
    for p in ["/etc/machine-id", "/var/lib/dbus/machine-id"] {
        if let Ok(s) = std::fs::read_to_string(p) {
            let s = s.trim();
            if !s.is_empty() {
                return s.to_string();
            }
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|s| s.trim().to_string()).unwrap_or_default()
}

/// A file's UUID when its configuration gives none: from the machine, the file system and inode
/// the file lives in, and the file's birth time — unique to that file, the same at every start,
/// whatever its place in the configuration (a copy of the file is another file).
pub fn derive_file_uuid(path: &Path) -> std::io::Result<Uuid> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(path)?;
    let born = m.created().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_nanos()).unwrap_or(0);
    Ok(Uuid::new_v5(&NAMESPACE, format!("file:{}:{}:{}:{born}", machine_id(), m.dev(), m.ino()).as_bytes()))
}

/// A block device's UUID when its configuration gives none: from the device's own world-wide
/// identifier (sysfs `wwid`, else its serial number) when it has one — so every machine that
/// sees a shared device derives the same — else from the machine and the device's path.
pub fn derive_device_uuid(path: &Path) -> std::io::Result<Uuid> {
    use std::os::unix::fs::MetadataExt as _;
    let rdev = std::fs::metadata(path)?.rdev();
    let (major, minor) = ((rdev >> 8) & 0xfff | ((rdev >> 32) & !0xfff), (rdev & 0xff) | ((rdev >> 12) & !0xff));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    for f in ["device/wwid", "wwid", "device/serial", "serial"] {
        if let Ok(id) = std::fs::read_to_string(sys.join(f)) {
            let id = id.trim();
            if !id.is_empty() {
                return Ok(Uuid::new_v5(&NAMESPACE, format!("blk-id:{id}").as_bytes()));
            }
        }
    }
    let canonical = std::fs::canonicalize(path)?;
    Ok(Uuid::new_v5(&NAMESPACE, format!("blk:{}:{}", machine_id(), canonical.display()).as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(name: &str, backing: &str) -> StoreSpec {
        StoreSpec { name: name.into(), backing: backing.into(), uuid: None, block_size: 512, options: StoreOptions::default() }
    }

    #[test]
    fn backing_specs_parse_and_print() {
        assert_eq!(Backing::parse("ram:64MiB"), Ok(Backing::Ram(64 << 20)));
        assert_eq!(Backing::parse("file:/var/tmp/a.img:10GiB"), Ok(Backing::File("/var/tmp/a.img".into(), Some(10 << 30))));
        assert_eq!(Backing::parse("file:/var/tmp/a:b.img"), Ok(Backing::File("/var/tmp/a:b.img".into(), None)));
        assert_eq!(Backing::parse("blk:/dev/sdb"), Ok(Backing::Block("/dev/sdb".into())));
        assert!(Backing::parse("nbd:x").is_err() && Backing::parse("ram").is_err());
        let b = Backing::parse("file:/x.img:1GiB").unwrap().with_size(3 << 29);
        assert_eq!(b.to_string(), "file:/x.img:1536MiB");
        assert_eq!(Backing::parse(&b.to_string()), Ok(b));
        assert_eq!(Backing::Ram(1000).to_string(), "ram:1000");
        let r = Backing::parse("rbd:rbd/lun0").unwrap();
        assert_eq!(
            r,
            Backing::Rbd(RbdSpec {
                pool: "rbd".into(),
                namespace: String::new(),
                image: "lun0".into(),
                conf: None,
                id: None,
                keyring: None
            })
        );
        let full = "rbd:pool/ns/img,conf=/etc/ceph/c.conf,id=riser,keyring=/etc/ceph/k";
        let r = Backing::parse(full).unwrap();
        assert!(matches!(&r, Backing::Rbd(s) if s.namespace == "ns" && s.id.as_deref() == Some("riser")));
        assert_eq!(r.to_string(), full);
        assert_eq!(r.size(), None);
        for bad in ["rbd:", "rbd:img", "rbd:a/b/c/d", "rbd:/img", "rbd:p/img@snap", "rbd:p/img,secret=x", "rbd:p/img,id="] {
            assert!(Backing::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn identities_are_given_derived_or_fresh_never_positional() {
        let dir = std::env::temp_dir().join(format!("riser-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a.img"), dir.join("b.img"));
        let file = |p: &Path| spec("s", &format!("file:{}:1MiB", p.display()));
        let first = open(&file(&a), None, None).unwrap();
        // The same file opened again (a restart, another place in the list): the same identity.
        assert_eq!(open(&file(&a), None, None).unwrap().uuid(), first.uuid());
        assert_eq!(first.uuid().get_version_num(), 5);
        // Another file, even a byte-identical copy: another identity.
        std::fs::copy(&a, &b).unwrap();
        assert_ne!(open(&file(&b), None, None).unwrap().uuid(), first.uuid());
        // Given: that one.
        let given = Uuid::parse_str("2b3c4d5e-6f70-4812-9a3b-4c5d6e7f8091").unwrap();
        let mut s = file(&a);
        s.uuid = Some(given);
        assert_eq!(open(&s, None, None).unwrap().uuid(), given);
        // RAM: fresh at each start.
        let r = spec("r", "ram:1MiB");
        assert_ne!(open(&r, None, None).unwrap().uuid(), open(&r, None, None).unwrap().uuid());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn bad_specs_are_named() {
        for (s, says) in
            [(spec("a b", "ram:1MiB"), "store name"), (spec("x", "ram:100"), "no whole block"), (spec("x", "tape:1"), "unknown backing")]
        {
            let e = open(&s, None, None).unwrap_err();
            assert!(e.contains(says), "{e}");
        }
        let mut odd = spec("x", "ram:1MiB");
        odd.block_size = 1000;
        assert!(open(&odd, None, None).unwrap_err().contains("block size"));
    }
}
