//! What one I_T nexus sees of its target: the LUN numbers it is shown and the unit behind each
//! ([`View`]), and the session's path to each unit ([`LunPath`]: its commands in flight there
//! and its counters).
//!
//! The target's configuration changes while sessions run. A change is published as a new
//! snapshot with a new generation number ([`super::Target`]); a session notices the generation
//! at its next PDU and rebuilds its view, so a command reads its LUN map without a lock any
//! other session takes. Removing a LUN must not answer while a command still runs there, nor
//! let one start afterwards: a command enters its path (`running` + 1) and only then checks the
//! generation; the remover publishes, then waits for every session's path to that unit to be
//! idle. One of the two sees the other (both steps are sequentially consistent), so a command
//! either ran before the answer or sees the new map and finds no LUN.

use super::stats::LuCounters;
use crate::lu::LogicalUnit;
use riser_scsi::lun::Lun;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};

/// A session's path to one logical unit, under one of its target's LUN numbers.
#[derive(Debug)]
pub(crate) struct LunPath {
    /// The target's LUN number (the counters' label; the nexus may see it under another).
    pub(crate) lun: u16,
    pub(crate) lu: Arc<LogicalUnit>,
    pub(crate) counters: LuCounters,
    /// Commands of the session running on the unit through this path.
    running: AtomicU32,
    /// Someone waits for `running` to reach 0.
    watched: AtomicBool,
    idle: tokio::sync::Notify,
}

impl LunPath {
    pub(crate) fn new(lun: u16, lu: Arc<LogicalUnit>) -> Self {
        Self {
            lun,
            lu,
            counters: LuCounters::default(),
            running: AtomicU32::new(0),
            watched: AtomicBool::new(false),
            idle: Default::default(),
        }
    }

    /// A command starts on the unit: it holds the path until the guard is dropped.
    pub(crate) fn enter(self: &Arc<Self>) -> PathGuard {
        self.running.fetch_add(1, SeqCst);
        PathGuard(self.clone())
    }

    fn leave(&self) {
        if self.running.fetch_sub(1, SeqCst) == 1 && self.watched.load(SeqCst) {
            self.idle.notify_waiters();
        }
    }

    /// Whether a command of the session runs here.
    pub(crate) fn busy(&self) -> bool {
        self.running.load(SeqCst) > 0
    }

    /// Wait until no command of the session runs here.
    pub(crate) async fn idle(&self) {
        self.watched.store(true, SeqCst);
        loop {
            let n = self.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.running.load(SeqCst) == 0 {
                return;
            }
            n.await;
        }
    }
}

/// A command's hold on its path (see [`LunPath::enter`]).
#[derive(Debug)]
pub(crate) struct PathGuard(Arc<LunPath>);

impl PathGuard {
    pub(crate) fn path(&self) -> &Arc<LunPath> {
        &self.0
    }
}

impl Drop for PathGuard {
    fn drop(&mut self) {
        self.0.leave();
    }
}

/// The LUNs an I_T nexus sees, as of one generation of the target's configuration.
#[derive(Debug, Default)]
pub(crate) struct View {
    pub(crate) generation: u64,
    /// By the number the nexus sees, ascending.
    entries: Vec<(u16, Arc<LunPath>)>,
}

impl View {
    /// The view of generation `generation`: the nexus's numbers and the target's LUN and unit
    /// behind each. A path of `old` to the same unit under the same target LUN is kept (with
    /// its counters and commands in flight).
    pub(crate) fn new(generation: u64, luns: impl IntoIterator<Item = (u16, u16, Arc<LogicalUnit>)>, old: &Self) -> Self {
        let mut entries: Vec<(u16, Arc<LunPath>)> = luns
            .into_iter()
            .map(|(seen, lun, lu)| {
                let kept = old.entries.iter().find(|(_, p)| p.lun == lun && Arc::ptr_eq(&p.lu, &lu)).map(|(_, p)| p.clone());
                (seen, kept.unwrap_or_else(|| Arc::new(LunPath::new(lun, lu))))
            })
            .collect();
        entries.sort_by_key(|(seen, _)| *seen);
        entries.dedup_by_key(|(seen, _)| *seen);
        Self { generation, entries }
    }

    /// The path behind LUN `lun` as the nexus sees it.
    pub(crate) fn find(&self, lun: Lun) -> Option<&Arc<LunPath>> {
        let n = lun.number()?;
        self.entries.binary_search_by_key(&n, |(seen, _)| *seen).ok().map(|i| &self.entries[i].1)
    }

    /// The LUNs, ascending.
    pub(crate) fn luns(&self) -> Vec<Lun> {
        self.entries.iter().filter_map(|(seen, _)| Lun::from_number(*seen)).collect()
    }

    /// Every path.
    pub(crate) fn paths(&self) -> impl Iterator<Item = &Arc<LunPath>> {
        self.entries.iter().map(|(_, p)| p)
    }

    /// Whether the nexus sees the same units under the same numbers in both.
    pub(crate) fn same_luns(&self, other: &Self) -> bool {
        self.entries.len() == other.entries.len()
            && self.entries.iter().zip(&other.entries).all(|((a, p), (b, q))| a == b && Arc::ptr_eq(&p.lu, &q.lu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RamBackend;
    use crate::lu::LuIdentity;

    fn unit() -> Arc<LogicalUnit> {
        Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()))
    }

    #[test]
    fn a_rebuilt_view_keeps_the_paths_of_units_it_keeps() {
        let (a, b) = (unit(), unit());
        let v1 = View::new(1, [(0, 0, a.clone()), (3, 1, b.clone())], &View::default());
        assert_eq!(v1.luns(), vec![Lun::from_number(0).unwrap(), Lun::from_number(3).unwrap()]);
        assert!(Arc::ptr_eq(&v1.find(Lun::from_number(3).unwrap()).unwrap().lu, &b));
        assert!(v1.find(Lun::from_number(1).unwrap()).is_none());
        let held = v1.find(Lun::ZERO).unwrap().enter();
        let v2 = View::new(2, [(0, 0, a.clone())], &v1);
        assert!(Arc::ptr_eq(v2.find(Lun::ZERO).unwrap(), held.path()), "same path: its commands in flight count");
        assert!(v2.find(Lun::ZERO).unwrap().busy());
        assert!(!v1.same_luns(&v2));
        assert!(v2.same_luns(&View::new(3, [(0, 0, a)], &v2)));
        drop(held);
        assert!(!v2.find(Lun::ZERO).unwrap().busy());
    }

    #[tokio::test]
    async fn idle_waits_for_the_last_command_to_leave() {
        let p = Arc::new(LunPath::new(0, unit()));
        p.idle().await;
        let g = p.enter();
        let waiter = tokio::spawn({
            let p = p.clone();
            async move { p.idle().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(g);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter).await.unwrap().unwrap();
    }
}
