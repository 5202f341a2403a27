//! The running service: a [`Target`], the stores it exports, the portals it listens on, and the
//! configuration they came from — changed one operation at a time (the control plane's
//! methods), or all at once to match a configuration file (start, SIGHUP).

use crate::cli::RdmaProvider;
use crate::config::{self, AclSpec, ConfigFile, Credential, PortalGroupSpec, PortalSpec, Resolved, Settings, StoreSpec, TargetSpec};
use crate::store::{self, Backing, Store};
use riser_iscsi::keys::Transport;
use riser_target::server::{AclEntry, ChangeError, Node, PortalGroup, Target, TargetNode};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tracing::{info, warn};

/// Why an operation was refused (the control plane's error codes come from its kind).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpError {
    /// Nothing of that name.
    #[error("{0}")]
    NotFound(String),
    /// Something of that name exists.
    #[error("{0}")]
    Exists(String),
    /// It is in use (a store a LUN maps).
    #[error("{0}")]
    InUse(String),
    /// A value is wrong.
    #[error("{0}")]
    Invalid(String),
    /// The system refused (a file, a socket).
    #[error("{0}")]
    System(String),
}

impl From<ChangeError> for OpError {
    fn from(e: ChangeError) -> Self {
        let m = e.to_string();
        match e {
            ChangeError::NoSuchTarget(_)
            | ChangeError::NoSuchLun { .. }
            | ChangeError::NoSuchAcl { .. }
            | ChangeError::NoSuchPortal { .. }
            | ChangeError::NoSuchSession(_) => Self::NotFound(m),
            ChangeError::TargetExists(_) | ChangeError::LunExists { .. } | ChangeError::PortalExists { .. } => Self::Exists(m),
            ChangeError::IdentityClash { .. } => Self::InUse(m),
            _ => Self::Invalid(m),
        }
    }
}

/// A listening portal: the task that accepts there (aborted when dropped).
#[derive(Debug)]
struct Listener(Option<tokio::task::JoinHandle<()>>);

impl Listener {
    /// Stop accepting, and wait until the task is gone and with it the listening socket: the
    /// address is free again when this returns (aborting alone frees it only once the runtime
    /// gets round to dropping the task).
    async fn close(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// What can change while the service runs.
#[derive(Debug, Default)]
struct State {
    /// The configuration's global keys as given (written back by `config_save`).
    file: ConfigFile,
    stores: Vec<Store>,
    targets: Vec<TargetSpec>,
    listeners: HashMap<PortalSpec, Listener>,
}

/// Where the configuration comes from (for a reload).
#[derive(Debug, Clone, Default)]
pub struct Source {
    /// The configuration file, if any.
    pub path: Option<PathBuf>,
    /// The command line's keys, laid over the file.
    pub overrides: ConfigFile,
}

impl Source {
    /// The file with the command line over it.
    pub fn read(&self) -> Result<ConfigFile, String> {
        let file = match &self.path {
            Some(p) => config::read(p)?,
            None => ConfigFile::default(),
        };
        Ok(file.overlay(self.overrides.clone()))
    }

    /// The directory relative paths in the file are taken from.
    pub fn base(&self) -> PathBuf {
        self.path.as_deref().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
    }
}

/// The running service.
#[derive(Debug)]
pub struct Service {
    target: Arc<Target>,
    settings: Settings,
    source: Source,
    state: tokio::sync::Mutex<State>,
}

impl Service {
    /// Read the configuration, open its stores, serve its targets and listen on their portals.
    /// Any error stops the start (nothing keeps listening).
    pub async fn start(source: Source) -> Result<Arc<Self>, String> {
        let file = source.read()?;
        let resolved = file.resolve(&source.base())?;
        let svc = Arc::new(Self {
            target: Target::new(resolved.settings.target.clone()),
            settings: resolved.settings.clone(),
            source,
            state: tokio::sync::Mutex::new(State::default()),
        });
        let errors = svc.apply(file, resolved).await;
        if !errors.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(svc)
    }

    /// The target.
    pub fn target(&self) -> &Arc<Target> {
        &self.target
    }

    /// The settings it started with.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// Where its configuration comes from.
    pub fn source(&self) -> &Source {
        &self.source
    }

    /// Read the configuration again and make the running service match it: stores, targets,
    /// LUNs, ACLs, portals and credentials change live; keys that need a restart are reported.
    /// Changes made through the control plane and not saved are undone. Returns what could not
    /// be applied (the rest is).
    pub async fn reload(&self) -> Result<Vec<String>, String> {
        let file = self.source.read()?;
        let resolved = file.resolve(&self.source.base())?;
        let mut notes = Vec::new();
        let changed = restart_keys_changed(&self.state.lock().await.file, &file);
        if !changed.is_empty() {
            notes.push(format!("changed keys that take effect at the next start: {}", changed.join(", ")));
        }
        notes.extend(self.apply(file, resolved).await);
        Ok(notes)
    }

    /// Make the running stores and targets those of `resolved`; the errors of what could not be.
    async fn apply(&self, file: ConfigFile, resolved: Resolved) -> Vec<String> {
        let mut st = self.state.lock().await;
        st.file = file;
        let mut errors = Vec::new();
        let mut note = |r: Result<(), OpError>| {
            if let Err(e) = r {
                warn!("configuration: {e}");
                errors.push(e.to_string());
            }
        };
        // 1. Targets that go, and LUNs that go or change store.
        let gone: Vec<String> = st
            .targets
            .iter()
            .filter(|t| !resolved.targets.iter().any(|n| n.name.eq_ignore_ascii_case(&t.name)))
            .map(|t| t.name.clone())
            .collect();
        for name in gone {
            note(self.target_remove_locked(&mut st, &name).await);
        }
        // Stores that change their backing (not only its size), UUID or block size are opened
        // afresh: their LUNs go first, and come back in step 4.
        let replaced: Vec<String> = st
            .stores
            .iter()
            .filter(|s| match resolved.stores.iter().find(|n| n.name == s.spec.name) {
                Some(n) => !same_store(&s.spec, n),
                None => true,
            })
            .map(|s| s.spec.name.clone())
            .collect();
        for t in resolved.targets.iter() {
            let Some(cur) = st.targets.iter().find(|c| c.name.eq_ignore_ascii_case(&t.name)).cloned() else { continue };
            for (lun, store) in &cur.luns {
                if t.luns.get(lun) != Some(store) || replaced.contains(store) {
                    note(self.lun_remove_locked(&mut st, &cur.name, *lun).await);
                }
            }
        }
        // 2. Stores that go or are replaced; sizes that grow.
        for name in &replaced {
            note(self.store_remove_locked(&mut st, name).await);
        }
        for s in &resolved.stores {
            let Some(cur) = st.stores.iter().find(|c| c.spec.name == s.name) else { continue };
            // A file or device of another size, or a RAM disk that grows (one that shrinks
            // was replaced above): resized in place.
            let ram_grows = |a: &Backing, b: &Backing| matches!((a, b), (Backing::Ram(x), Backing::Ram(y)) if y > x);
            if let (Ok(a), Ok(b)) = (Backing::parse(&cur.spec.backing), Backing::parse(&s.backing))
                && a != b
                && (a.same_but_size(&b) || ram_grows(&a, &b))
                && let Some(size) = b.size()
            {
                let name = s.name.clone();
                note(self.store_resize_locked(&mut st, &name, size).await.map(drop));
            }
        }
        // 3. Stores that come.
        for s in &resolved.stores {
            if !st.stores.iter().any(|c| c.spec.name == s.name) {
                note(self.store_add_locked(&mut st, s.clone()).await.map(drop));
            }
        }
        // 4. Targets that come, and the rest of the changes of those that stay.
        for t in &resolved.targets {
            match st.targets.iter().position(|c| c.name.eq_ignore_ascii_case(&t.name)) {
                None => note(self.target_add_spec_locked(&mut st, t.clone()).await),
                Some(i) => {
                    let cur = st.targets[i].clone();
                    note(self.target_update_locked(&mut st, &cur, t).await);
                }
            }
        }
        // 5. Each store's ALUA model: its target port groups, the optimized one per LUN.
        for e in Self::sync_alua(&st) {
            note(Err(e));
        }
        // 6. Listen where targets are reached, and nowhere else.
        note(self.sync_listeners(&mut st).await);
        errors
    }

    /// Give every store's unit the ALUA model its exporting targets make
    /// ([`crate::config::port_groups_of`]); a state it changes reaches the hosts as ASYMMETRIC
    /// ACCESS STATE CHANGED. The errors of the models a unit refused (it keeps its own).
    fn sync_alua(st: &State) -> Vec<OpError> {
        let mut errors = Vec::new();
        for s in &st.stores {
            let groups = config::port_groups_of(&st.targets, &s.spec.name);
            match s.lu.set_port_groups(groups.clone()) {
                Ok(true) => info!(store = %s.spec.name, groups = ?s.lu.port_groups(), "ALUA target port groups set"),
                Ok(false) => {}
                Err(e) => errors.push(OpError::Invalid(format!("store {}: ALUA: {e}", s.spec.name))),
            }
            // The groups this process serves the store through; any other is another gateway's.
            let local: Vec<u16> = st
                .targets
                .iter()
                .filter(|t| t.luns.values().any(|n| *n == s.spec.name))
                .flat_map(|t| t.portal_groups.iter().map(|g| g.port_group))
                .collect();
            if let Err(e) = s.ha.sync(&s.lu, &local, &groups) {
                errors.push(OpError::Invalid(format!("store {}: {e}", s.spec.name)));
            }
        }
        errors
    }

    /// [`sync_alua`](Self::sync_alua) after a change of the control plane: the change stands,
    /// a model a unit refused is logged.
    fn sync_alua_logged(st: &State) {
        for e in Self::sync_alua(st) {
            warn!("{e}");
        }
    }

    /// Make the node of `spec` (its stores must be open).
    fn node_of(st: &State, spec: &TargetSpec) -> Result<Node, OpError> {
        let mut t = TargetNode::open(spec.name.clone());
        t.open = spec.open;
        t.alias = spec.alias.clone();
        t.chap = spec.chap.as_ref().map(|c| c.creds.clone());
        t.mutual_chap = spec.mutual_chap.as_ref().map(|c| c.creds.clone());
        for a in &spec.acl {
            t = t.acl_entry(acl_entry(a));
        }
        t.open = spec.open;
        let mut node = Node::from(t);
        for (lun, store) in &spec.luns {
            let s =
                st.stores.iter().find(|s| &s.spec.name == store).ok_or_else(|| OpError::NotFound(format!("no store named {store:?}")))?;
            node = node.lun_at(*lun, s.lu.clone());
        }
        for a in &spec.acl {
            if let Some(map) = &a.luns {
                node = node.lun_map(&a.initiator, map.iter().map(|(k, v)| (*k, *v)));
            }
        }
        for g in &spec.portal_groups {
            let mut pg = PortalGroup::new(g.tag).relative_port(g.relative_port).port_group(g.port_group);
            for p in &g.portals {
                pg = pg.portal(p.portal);
            }
            node = node.portal_group(pg);
        }
        Ok(node)
    }

    // ---- stores -----------------------------------------------------------------------------

    /// Open a store (refused if its name or identity is taken).
    pub async fn store_add(&self, spec: StoreSpec) -> Result<Store, OpError> {
        let mut st = self.state.lock().await;
        self.store_add_locked(&mut st, spec).await
    }

    async fn store_add_locked(&self, st: &mut State, spec: StoreSpec) -> Result<Store, OpError> {
        if st.stores.iter().any(|s| s.spec.name == spec.name) {
            return Err(OpError::Exists(format!("a store named {} exists already", spec.name)));
        }
        if let Some(u) = spec.uuid
            && let Some(o) = st.stores.iter().find(|s| s.uuid() == u)
        {
            return Err(OpError::InUse(format!("store {} has UUID {u} already", o.spec.name)));
        }
        // Opening may create a file, or allocate a RAM disk: off the runtime's threads, which
        // serve sessions meanwhile.
        let (rate, dir, sp) = (self.settings.sanitize_rate, self.settings.state_dir.clone(), spec.clone());
        let s = blocking(move || store::open(&sp, rate, dir.as_deref())).await?.map_err(OpError::Invalid)?;
        let id = s.lu.identity();
        if let Some(o) = st.stores.iter().find(|o| o.uuid() == id.uuid() || o.lu.identity().naa() == id.naa()) {
            return Err(OpError::InUse(format!(
                "store {} has the identity of store {} (same UUID or NAA designator)",
                spec.name, o.spec.name
            )));
        }
        info!(store = %spec.name, backing = %spec.backing, uuid = %id, "store added");
        st.stores.push(s.clone());
        Ok(s)
    }

    /// Close a store no LUN maps (its data is flushed first).
    pub async fn store_remove(&self, name: &str) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        self.store_remove_locked(&mut st, name).await
    }

    async fn store_remove_locked(&self, st: &mut State, name: &str) -> Result<(), OpError> {
        let i = st.stores.iter().position(|s| s.spec.name == name).ok_or_else(|| OpError::NotFound(format!("no store named {name:?}")))?;
        let users: Vec<String> = st
            .targets
            .iter()
            .flat_map(|t| t.luns.iter().filter(|(_, s)| *s == name).map(move |(l, _)| format!("{} LUN {l}", t.name)))
            .collect();
        if !users.is_empty() {
            return Err(OpError::InUse(format!("store {name} is exported ({}): remove those LUNs first", users.join(", "))));
        }
        let s = st.stores.remove(i);
        let lu = s.lu.clone();
        if let Err(e) = blocking(move || lu.sync()).await? {
            warn!(store = %name, "flush before removal failed: {e}");
        }
        info!(store = %name, "store removed");
        Ok(())
    }

    /// Grow a store to `size` bytes: initiators that see it get CAPACITY DATA HAS CHANGED.
    /// Returns its size now.
    pub async fn store_resize(&self, name: &str, size: u64) -> Result<u64, OpError> {
        let mut st = self.state.lock().await;
        self.store_resize_locked(&mut st, name, size).await
    }

    async fn store_resize_locked(&self, st: &mut State, name: &str, size: u64) -> Result<u64, OpError> {
        let s = st.stores.iter_mut().find(|s| s.spec.name == name).ok_or_else(|| OpError::NotFound(format!("no store named {name:?}")))?;
        // Growing a RAM disk writes its new memory, a file's size goes to the file system: off
        // the runtime's threads.
        let lu = s.lu.clone();
        blocking(move || lu.resize(size)).await?.map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput | std::io::ErrorKind::Unsupported => OpError::Invalid(format!("store {name}: {e}")),
            _ => OpError::System(format!("store {name}: {e}")),
        })?;
        let now = s.size();
        if let Ok(b) = Backing::parse(&s.spec.backing) {
            s.spec.backing = b.with_size(now).to_string();
        }
        info!(store = %name, size = now, "store resized");
        Ok(now)
    }

    /// The stores.
    pub async fn stores(&self) -> Vec<Store> {
        self.state.lock().await.stores.clone()
    }

    // ---- targets ----------------------------------------------------------------------------

    /// Serve a new target without LUNs, closed to every initiator until ACL entries are added
    /// (or `open`), reached through the default portals as portal group 1.
    pub async fn target_add(&self, name: &str, alias: Option<String>, open: bool) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        let spec = TargetSpec {
            name: name.into(),
            alias,
            open,
            chap: None,
            mutual_chap: None,
            portal_groups: vec![PortalGroupSpec {
                tag: 1,
                relative_port: 1,
                port_group: 1,
                portals: self.settings.default_portals.clone(),
            }],
            remote_port_groups: Vec::new(),
            luns: BTreeMap::new(),
            optimized: BTreeMap::new(),
            acl: Vec::new(),
        };
        self.target_add_spec_locked(&mut st, spec).await?;
        self.sync_listeners(&mut st).await
    }

    async fn target_add_spec_locked(&self, st: &mut State, spec: TargetSpec) -> Result<(), OpError> {
        if st.targets.iter().any(|t| t.name.eq_ignore_ascii_case(&spec.name)) {
            return Err(OpError::Exists(format!("a target named {} exists already", spec.name)));
        }
        let node = Self::node_of(st, &spec)?;
        self.target.add_node(node).await?;
        st.targets.push(spec);
        Self::sync_alua_logged(st);
        Ok(())
    }

    /// Stop serving a target (its sessions end first).
    pub async fn target_remove(&self, name: &str) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        self.target_remove_locked(&mut st, name).await?;
        self.sync_listeners(&mut st).await
    }

    async fn target_remove_locked(&self, st: &mut State, name: &str) -> Result<(), OpError> {
        let i = target_index(st, name)?;
        self.target.remove_node(name).await?;
        st.targets.remove(i);
        Self::sync_alua_logged(st);
        Ok(())
    }

    /// Make a running target what `new` says, change by change.
    async fn target_update_locked(&self, st: &mut State, cur: &TargetSpec, new: &TargetSpec) -> Result<(), OpError> {
        let name = &cur.name;
        // ACL entries that go (their sessions end), then those that come or change.
        for a in &cur.acl {
            if !new.acl.iter().any(|n| n.initiator.eq_ignore_ascii_case(&a.initiator)) {
                self.target.remove_acl(name, &a.initiator).await?;
            }
        }
        // Alias, openness and the node's CHAP apply from the next login.
        if (cur.alias.clone(), cur.open, cur.chap.clone(), cur.mutual_chap.clone())
            != (new.alias.clone(), new.open, new.chap.clone(), new.mutual_chap.clone())
        {
            let (alias, open) = (new.alias.clone(), new.open);
            let (chap, mutual) = (new.chap.as_ref().map(|c| c.creds.clone()), new.mutual_chap.as_ref().map(|c| c.creds.clone()));
            self.target
                .update_node(name, move |n| {
                    n.target.alias = alias;
                    n.target.open = open;
                    n.target.chap = chap;
                    n.target.mutual_chap = mutual;
                    Ok(())
                })
                .await?;
        }
        // LUNs that come (those that went or changed store were removed before).
        for (lun, store) in &new.luns {
            let running = self.target.node(name).is_some_and(|n| n.luns.contains_key(lun));
            if !running {
                let s = st
                    .stores
                    .iter()
                    .find(|s| &s.spec.name == store)
                    .ok_or_else(|| OpError::NotFound(format!("no store named {store:?}")))?;
                self.target.add_lun(name, *lun, s.lu.clone()).await?;
            }
        }
        for a in &new.acl {
            if cur.acl.iter().find(|c| c.initiator.eq_ignore_ascii_case(&a.initiator)) != Some(a) {
                self.target.set_acl(name, acl_entry(a), a.luns.clone()).await?;
            }
        }
        // Portal groups: whole groups whose numbers change are replaced.
        if cur.portal_groups != new.portal_groups {
            let groups = new.portal_groups.clone();
            self.target
                .update_node(name, move |n| {
                    n.portal_groups = groups
                        .iter()
                        .map(|g| {
                            g.portals
                                .iter()
                                .fold(PortalGroup::new(g.tag).relative_port(g.relative_port).port_group(g.port_group), |pg, p| {
                                    pg.portal(p.portal)
                                })
                        })
                        .collect();
                    Ok(())
                })
                .await?;
        }
        let i = target_index(st, name)?;
        st.targets[i] = new.clone();
        Ok(())
    }

    /// The targets.
    pub async fn targets(&self) -> Vec<TargetSpec> {
        self.state.lock().await.targets.clone()
    }

    // ---- LUNs -------------------------------------------------------------------------------

    /// Export `store` as LUN `lun` of `target`.
    pub async fn lun_add(&self, target: &str, lun: u16, store: &str) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        let s = st.stores.iter().find(|s| s.spec.name == store).ok_or_else(|| OpError::NotFound(format!("no store named {store:?}")))?;
        let lu = s.lu.clone();
        let i = target_index(&st, target)?;
        self.target.add_lun(&st.targets[i].name.clone(), lun, lu).await?;
        st.targets[i].luns.insert(lun, store.into());
        Self::sync_alua_logged(&st);
        Ok(())
    }

    /// Unmap LUN `lun` of `target` (answers once no command runs there any more).
    pub async fn lun_remove(&self, target: &str, lun: u16) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        self.lun_remove_locked(&mut st, target, lun).await
    }

    async fn lun_remove_locked(&self, st: &mut State, target: &str, lun: u16) -> Result<(), OpError> {
        let i = target_index(st, target)?;
        self.target.remove_lun(target, lun).await?;
        let t = &mut st.targets[i];
        t.luns.remove(&lun);
        t.optimized.remove(&lun);
        for a in &mut t.acl {
            if let Some(m) = &mut a.luns {
                m.retain(|_, l| *l != lun);
            }
        }
        Self::sync_alua_logged(st);
        Ok(())
    }

    // ---- ACLs -------------------------------------------------------------------------------

    /// Admit an initiator to `target` (replacing its entry): its own CHAP credentials, and with
    /// `luns` only those LUNs under those numbers.
    pub async fn acl_add(&self, target: &str, acl: AclSpec) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        let i = target_index(&st, target)?;
        let name = st.targets[i].name.clone();
        self.target.set_acl(&name, acl_entry(&acl), acl.luns.clone()).await?;
        let t = &mut st.targets[i];
        t.acl.retain(|a| !a.initiator.eq_ignore_ascii_case(&acl.initiator));
        t.acl.push(acl);
        Ok(())
    }

    /// Remove an initiator's ACL entry (its sessions on the target end).
    pub async fn acl_remove(&self, target: &str, initiator: &str) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        let i = target_index(&st, target)?;
        self.target.remove_acl(target, initiator).await?;
        st.targets[i].acl.retain(|a| !a.initiator.eq_ignore_ascii_case(initiator));
        Ok(())
    }

    // ---- portals ----------------------------------------------------------------------------

    /// Reach `target` through a portal too (in portal group `group`, default the target's first),
    /// listening there if nobody does yet.
    pub async fn portal_add(
        &self,
        target: &str,
        address: &str,
        transport: Transport,
        provider: Option<RdmaProvider>,
        group: Option<u16>,
    ) -> Result<PortalSpec, OpError> {
        let mut st = self.state.lock().await;
        let spec = PortalSpec::parse(address, transport, provider.unwrap_or(self.settings.rdma_provider)).map_err(OpError::Invalid)?;
        let i = target_index(&st, target)?;
        let tag = group.unwrap_or_else(|| st.targets[i].portal_groups.first().map_or(1, |g| g.tag));
        self.listen(&mut st, spec)?;
        let name = st.targets[i].name.clone();
        if let Err(e) = self.target.add_portal(&name, tag, spec.portal).await {
            self.sync_listeners(&mut st).await?;
            return Err(e.into());
        }
        let t = &mut st.targets[i];
        match t.portal_groups.iter_mut().find(|g| g.tag == tag) {
            Some(g) => g.portals.push(spec),
            None => t.portal_groups.push(PortalGroupSpec { tag, relative_port: tag, port_group: tag, portals: vec![spec] }),
        }
        Self::sync_alua_logged(&st);
        Ok(spec)
    }

    /// Stop reaching `target` through a portal (stop listening there if no target is reached
    /// through it any more; sessions that came in through it go on).
    pub async fn portal_remove(&self, target: &str, address: &str, transport: Transport) -> Result<(), OpError> {
        let mut st = self.state.lock().await;
        let spec = PortalSpec::parse(address, transport, self.settings.rdma_provider).map_err(OpError::Invalid)?;
        let i = target_index(&st, target)?;
        self.target.remove_portal(&st.targets[i].name.clone(), spec.portal).await?;
        for g in &mut st.targets[i].portal_groups {
            g.portals.retain(|p| p.portal != spec.portal);
        }
        self.sync_listeners(&mut st).await
    }

    /// Listen on `spec` unless a listener there already accepts its connections (the same
    /// portal, or a wildcard one on its port and transport).
    fn listen(&self, st: &mut State, spec: PortalSpec) -> Result<(), OpError> {
        let covered = st
            .listeners
            .keys()
            .any(|l| l.portal.transport == spec.portal.transport && l.portal.accepts(spec.portal.address, spec.portal.transport));
        if covered {
            return Ok(());
        }
        let task = self.start_listener(spec)?;
        st.listeners.insert(spec, Listener(Some(task)));
        Ok(())
    }

    /// Listen on every portal a target is reached through, and stop listening elsewhere (the
    /// addresses given up are free when this returns).
    async fn sync_listeners(&self, st: &mut State) -> Result<(), OpError> {
        let mut wanted: Vec<PortalSpec> =
            st.targets.iter().flat_map(|t| t.portal_groups.iter().flat_map(|g| g.portals.iter().copied())).collect();
        // Wildcard portals first: a specific one on their port is then served by them.
        wanted.sort_by_key(|p| !p.portal.address.ip().is_unspecified());
        wanted.dedup();
        let unwanted: Vec<PortalSpec> = st
            .listeners
            .keys()
            .filter(|l| {
                !wanted.iter().any(|w| w.portal.transport == l.portal.transport && l.portal.accepts(w.portal.address, w.portal.transport))
            })
            .copied()
            .collect();
        for l in unwanted {
            if let Some(listener) = st.listeners.remove(&l) {
                listener.close().await;
                info!(portal = %l.portal.address, transport = ?l.portal.transport, "no longer listening");
            }
        }
        let mut errors = Vec::new();
        for w in wanted {
            if let Err(e) = self.listen(st, w) {
                errors.push(e.to_string());
            }
        }
        if errors.is_empty() { Ok(()) } else { Err(OpError::System(errors.join("; "))) }
    }

    /// Start accepting on a portal.
    fn start_listener(&self, spec: PortalSpec) -> Result<tokio::task::JoinHandle<()>, OpError> {
        let addr = spec.portal.address;
        let target = self.target.clone();
        match (spec.portal.transport, spec.provider) {
            (Transport::Tcp, _) => {
                let std = std::net::TcpListener::bind(addr).map_err(|e| OpError::System(format!("cannot listen on {addr}: {e}")))?;
                std.set_nonblocking(true).map_err(|e| OpError::System(e.to_string()))?;
                let l = tokio::net::TcpListener::from_std(std).map_err(|e| OpError::System(e.to_string()))?;
                info!(portal = %l.local_addr().unwrap_or(addr), "listening (TCP)");
                Ok(tokio::spawn(async move {
                    if let Err(e) = target.serve(l).await {
                        warn!(portal = %addr, "TCP portal ended: {e}");
                    }
                }))
            }
            (_, RdmaProvider::Soft) => {
                use riser_verbs::{Listener as _, Provider as _};
                let rnic = riser_iwarp::SoftRnic::new(self.settings.rnic.clone());
                let l = rnic.listen(addr).map_err(|e| OpError::System(format!("cannot listen on {addr} (iSER): {e}")))?;
                info!(portal = %l.local_addr().unwrap_or(addr), "listening (iSER, software iWARP RNIC)");
                let cfg = self.settings.iser_soft;
                Ok(tokio::spawn(async move {
                    if let Err(e) = target.serve_iser(rnic, l, cfg).await {
                        warn!(portal = %addr, "iSER portal ended: {e}");
                    }
                }))
            }
            (_, RdmaProvider::RdmaCore) => self.rdma_core_listener(addr, target),
        }
    }

    #[cfg(feature = "rdma-core")]
    fn rdma_core_listener(&self, addr: std::net::SocketAddr, target: Arc<Target>) -> Result<tokio::task::JoinHandle<()>, OpError> {
        use riser_verbs::rdma_core::{RdmaCore, RdmaCoreConfig};
        use riser_verbs::{Listener as _, Provider as _};
        let keys =
            self.settings.rdma_keys.as_deref().map(crate::cli::parse_key_mode).transpose().map_err(OpError::Invalid)?.unwrap_or_default();
        let rc = RdmaCoreConfig { keys, ..RdmaCoreConfig::default() };
        let dev = RdmaCore::for_address(addr.ip(), rc).map_err(|e| OpError::System(format!("iSER portal {addr}: {e}")))?;
        let l = dev.listen(addr).map_err(|e| OpError::System(format!("cannot listen on {addr} (iSER, {}): {e}", dev.name())))?;
        info!(portal = %l.local_addr().unwrap_or(addr), device = %dev.name(), keys = ?dev.key_mode(), "listening (iSER, rdma-core)");
        let cfg = self.settings.iser;
        Ok(tokio::spawn(async move {
            if let Err(e) = target.serve_iser(dev, l, cfg).await {
                warn!(portal = %addr, "iSER portal ended: {e}");
            }
        }))
    }

    #[cfg(not(feature = "rdma-core"))]
    fn rdma_core_listener(&self, addr: std::net::SocketAddr, _: Arc<Target>) -> Result<tokio::task::JoinHandle<()>, OpError> {
        Err(OpError::Invalid(format!(
            "iSER portal {addr}: this target was built without rdma-core support (build it with `--features rdma-core`)"
        )))
    }

    /// The portals listened on.
    pub async fn listening(&self) -> Vec<PortalSpec> {
        self.state.lock().await.listeners.keys().copied().collect()
    }

    // ---- whole-service operations -----------------------------------------------------------

    /// The running configuration, in the file format (`config_save`): the global keys as given,
    /// then every store (with its UUID) and target.
    pub async fn running_config(&self) -> ConfigFile {
        let st = self.state.lock().await;
        let mut f = st.file.clone();
        // The structured form replaces the command line's single-target keys.
        (f.target_name, f.lun, f.acl, f.chap, f.chap_file, f.mutual_chap, f.mutual_chap_file) =
            (None, Vec::new(), Vec::new(), None, None, None, None);
        f.stores = st.stores.iter().map(|s| s.spec.to_table()).collect();
        f.targets = st.targets.iter().map(|t| t.to_table(self.settings.rdma_provider)).collect();
        f
    }

    /// Write the running configuration to `path` (default: the configuration file it started
    /// with): mode 600, atomically (a temporary file renamed over it). Returns the path.
    pub async fn config_save(&self, path: Option<&Path>) -> Result<PathBuf, OpError> {
        let path = path
            .map(Path::to_path_buf)
            .or_else(|| self.source.path.clone())
            .ok_or_else(|| OpError::Invalid("no path given, and the target started without --config".into()))?;
        let text = toml::to_string_pretty(&self.running_config().await)
            .map_err(|e| OpError::System(format!("cannot write the configuration: {e}")))?;
        write_private_atomically(&path, text.as_bytes()).map_err(|e| OpError::System(format!("{}: {e}", path.display())))?;
        info!(path = %path.display(), "configuration saved");
        Ok(path)
    }

    /// Stop: stop accepting connections, ask initiators to log out and wait (up to
    /// `drain_timeout`) for them and their commands, then flush every store. Returns how many
    /// sessions had to be dropped.
    pub async fn shutdown(&self) -> usize {
        let mut st = self.state.lock().await;
        // Closed before the drain: no new connection comes in, and the addresses are free for
        // whatever starts next (a restarted service) once this returns.
        for (_, listener) in st.listeners.drain() {
            listener.close().await;
        }
        let dropped = self.target.drain(self.settings.drain_timeout).await;
        for s in &st.stores {
            let lu = s.lu.clone();
            match blocking(move || lu.sync()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => warn!(store = %s.spec.name, "flush at stop failed: {e}"),
                Err(e) => warn!(store = %s.spec.name, "flush at stop failed: {e}"),
            }
        }
        dropped
    }
}

/// The place of target `name` (without regard to case) among the running ones.
fn target_index(st: &State, name: &str) -> Result<usize, OpError> {
    st.targets.iter().position(|t| t.name.eq_ignore_ascii_case(name)).ok_or_else(|| OpError::NotFound(format!("no target named {name}")))
}

/// Run `f` on the blocking pool (file systems, large allocations), so the runtime's threads go
/// on serving sessions.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, OpError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| OpError::System(format!("a store operation failed: {e}")))
}

/// The library's ACL entry of a spec.
fn acl_entry(a: &AclSpec) -> AclEntry {
    AclEntry::new(a.initiator.clone())
        .chap(a.chap.as_ref().map(|c| c.creds.clone()))
        .mutual_chap(a.mutual_chap.as_ref().map(|c| c.creds.clone()))
}

/// Whether a running store is what `new` asks for (a grown size aside).
fn same_store(cur: &StoreSpec, new: &StoreSpec) -> bool {
    let backing = match (Backing::parse(&cur.backing), Backing::parse(&new.backing)) {
        (Ok(a), Ok(b)) => a == b || a.same_but_size(&b),
        _ => false,
    };
    // A RAM disk of another size is another RAM disk only if smaller: it grows.
    let ram_grows =
        matches!((Backing::parse(&cur.backing), Backing::parse(&new.backing)), (Ok(Backing::Ram(a)), Ok(Backing::Ram(b))) if b >= a);
    (backing || ram_grows) && (new.uuid.is_none() || new.uuid == cur.uuid) && new.block_size == cur.block_size && new.options == cur.options
}

/// The keys of `new` that differ from `old` and need a restart.
fn restart_keys_changed(old: &ConfigFile, new: &ConfigFile) -> Vec<&'static str> {
    let mut v = Vec::new();
    let mut check = |changed: bool, key: &'static str| {
        if changed {
            v.push(key);
        }
    };
    check(old.limits != new.limits, "limits");
    check(old.param != new.param, "param");
    check(old.iser_param != new.iser_param, "iser_param");
    check(old.rdma_provider != new.rdma_provider, "rdma_provider");
    check(old.rdma_keys != new.rdma_keys, "rdma_keys");
    check(old.discovery_scope != new.discovery_scope, "discovery_scope");
    check(
        (&old.discovery_chap, &old.discovery_chap_file, &old.discovery_mutual_chap, &old.discovery_mutual_chap_file)
            != (&new.discovery_chap, &new.discovery_chap_file, &new.discovery_mutual_chap, &new.discovery_mutual_chap_file),
        "discovery_chap",
    );
    check(old.sanitize_rate != new.sanitize_rate, "sanitize_rate");
    check(old.state_dir != new.state_dir, "state_dir");
    check(old.control != new.control, "control");
    check(old.metrics != new.metrics, "metrics");
    check(old.log_format != new.log_format, "log_format");
    check(old.block_size != new.block_size, "block_size");
    v
}

/// Write `bytes` to `path` so that no reader ever sees half of it and only the owner can read
/// it: a temporary file beside it (mode 600), synced, renamed over `path`, and the directory
/// synced.
pub fn write_private_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path.file_name().ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let tmp = dir.join(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    let write = || -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    };
    let r = write();
    if r.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    r
}

/// The credentials of the command line and the environment as configuration keys: `option`'s
/// value (`--chap`, with a warning), its file (`--chap-file`) or the environment variable
/// `env`.
pub fn credential_override(
    option: &str,
    value: Option<&str>,
    file: Option<&Path>,
    env: &str,
) -> Result<(Option<config::CredentialText>, Option<PathBuf>), String> {
    if let (None, Some(f)) = (value, file) {
        // Checked now (private, well formed), read again by the configuration.
        Credential::from_file(f)?;
        return Ok((None, Some(std::fs::canonicalize(f).unwrap_or_else(|_| f.to_path_buf()))));
    }
    if crate::cli::chap_credentials(option, value, file, env)?.is_none() {
        return Ok((None, None));
    }
    // Checked; kept as the text it came as: the option's, else the environment's.
    let text = match value {
        Some(v) => v.to_string(),
        None => std::env::var(env).map_err(|e| format!("{env}: {e}"))?,
    };
    Ok((Some(config::CredentialText::Line(text)), None))
}
