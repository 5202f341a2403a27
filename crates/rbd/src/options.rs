//! How to connect to a cluster.

use std::path::PathBuf;

/// Connection settings for [`Cluster::connect`](crate::Cluster).
///
/// For serving LUNs, pass `("rbd_cache", "false")` in `options`: librbd's write-back cache
/// would acknowledge writes before they are on the OSDs and keep state a second gateway cannot
/// see, which breaks both FUA/SYNCHRONIZE CACHE semantics and multi-gateway failover.
/// [`ClusterOptions::for_lun_serving`] does that.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterOptions {
    /// The configuration file (`ceph.conf`). `None`: librados' default search (`$CEPH_CONF`,
    /// then `/etc/ceph/ceph.conf`, `~/.ceph/config`, `./ceph.conf`).
    pub conf: Option<PathBuf>,
    /// The client id without the `client.` prefix; `None` means `"admin"`.
    pub client_id: Option<String>,
    /// A keyring file; `None`: whatever the configuration says.
    pub keyring: Option<PathBuf>,
    /// Extra configuration keys set with `rados_conf_set` after the file is read, in order
    /// (e.g. `("rbd_cache", "false")`, `("client_mount_timeout", "5")`). They override the
    /// binding's defaults (`client_mount_timeout = 10`, `rados_mon_op_timeout = 30`).
    pub options: Vec<(String, String)>,
    /// Start librados' and librbd's own threads (messengers, completions, librbd's pool) under
    /// `SCHED_BATCH` (Linux; elsewhere nothing changes): woken by a request or a reply, they
    /// then wait for the running thread to yield instead of preempting it, and take the
    /// requests of its turn together. The program's own threads keep their policy. Measured
    /// behind an iSCSI gateway sharing a busy core with librbd: 1.0 context switch per 4 KiB
    /// read instead of 2.7, and 15–20 % more reads per second. Applies to the threads started by
    /// [`Cluster::connect`](crate::Cluster) and [`Image::open`](crate::Image) with these
    /// options; off by default ([`ClusterOptions::for_lun_serving`] turns it on).
    pub batch_threads: bool,
}

impl ClusterOptions {
    /// Settings for serving LUNs: the given configuration file (or the default search),
    /// `rbd_cache = false`, and librados' threads as batch threads
    /// ([`batch_threads`](Self::batch_threads)).
    pub fn for_lun_serving(conf: Option<PathBuf>) -> Self {
        Self { conf, options: vec![("rbd_cache".into(), "false".into())], batch_threads: true, ..Self::default() }
    }

    /// Adds one `rados_conf_set` key (builder style).
    pub fn with_option(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.options.push((key.into(), value.into()));
        self
    }

    /// The client id in effect (`"admin"` when unset).
    pub fn client_id(&self) -> &str {
        self.client_id.as_deref().unwrap_or("admin")
    }
}
