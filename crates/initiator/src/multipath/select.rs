//! The sans-IO core of multipath: which paths are up, in which target port group, in which
//! access state; which path the next command takes; and when a write that was in flight on a
//! failed path may be issued again elsewhere. It is fed events (a path logged in, a path
//! failed, REPORT TARGET PORT GROUPS began and answered) and does no I/O.

use crate::alua::{AccessState, TargetPortGroups};

/// What is known of the unit's access states.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Alua {
    /// Not read yet.
    Unknown,
    /// The target does not support REPORT TARGET PORT GROUPS: every path is taken as
    /// active/optimized (active/active).
    Unsupported,
    /// The last report, and the event clock at which the command that brought it was issued.
    Known { report: TargetPortGroups, issued_at: u64 },
}

/// One path as the selector sees it.
#[derive(Clone, Debug, Default)]
pub(super) struct PathState {
    /// Logged in and usable.
    pub(super) up: bool,
    /// Its target port group (VPD 0x83 designator type 5h), if the unit names one.
    pub(super) group: Option<u16>,
    /// Its relative target port identifier (VPD 0x83 designator type 4h), if named.
    pub(super) relative_port: Option<u16>,
    /// The connection generation it was last brought up on (logged in and found to reach the
    /// unit): a failure of a command sent on an older one is old news.
    pub(super) generation: u32,
    /// Commands in flight on it.
    pub(super) in_flight: usize,
    /// A task is bringing it back up.
    pub(super) reconnecting: bool,
}

/// A path failure as a command in flight on it saw it: what must happen before a write it
/// carried may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Failure {
    /// The failed path.
    pub(super) path: usize,
    /// The generation of the connection the command was sent on: a login on that path to a
    /// later generation (session reinstatement) ends its tasks at the target.
    pub(super) generation: u32,
    /// The event clock when the failure was seen: only a REPORT TARGET PORT GROUPS issued later
    /// tells who owns the unit since.
    pub(super) at: u64,
}

/// The preference class of a path: 0 active/optimized, 1 active/non-optimized (and logical
/// block dependent, and a port no report places), `None` not to be used for I/O.
fn class(state: Option<AccessState>) -> Option<u8> {
    match state {
        Some(AccessState::ActiveOptimized) => Some(0),
        Some(AccessState::ActiveNonOptimized | AccessState::LbaDependent) | None => Some(1),
        Some(_) => None,
    }
}

/// The selector.
#[derive(Debug)]
pub(super) struct Selector {
    pub(super) paths: Vec<PathState>,
    pub(super) alua: Alua,
    /// Round-robin cursor.
    next: usize,
    /// The event clock: goes up at every failure seen and every RTPG issued.
    clock: u64,
}

impl Selector {
    /// `n` paths, all down, access states unknown.
    pub(super) fn new(n: usize) -> Self {
        Self { paths: vec![PathState::default(); n], alua: Alua::Unknown, next: 0, clock: 0 }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The path logged in (again), on connection `generation`, and reaches the unit.
    pub(super) fn path_up(&mut self, path: usize, generation: u32, group: Option<u16>, relative_port: Option<u16>) {
        if let Some(p) = self.paths.get_mut(path) {
            p.up = true;
            p.generation = generation;
            p.group = group;
            p.relative_port = relative_port;
            p.reconnecting = false;
        }
    }

    /// A command sent on `path` over connection `generation` failed with it (the connection
    /// broke, or the command timed out). Marks the path down unless it has been brought up on a
    /// later connection since (then the failure is old news), and returns what a write it
    /// carried waits for.
    pub(super) fn path_failed(&mut self, path: usize, generation: u32) -> Failure {
        let at = self.tick();
        if let Some(p) = self.paths.get_mut(path)
            && generation >= p.generation
        {
            p.up = false;
        }
        Failure { path, generation, at }
    }

    /// Whether `path` is down with nobody bringing it back: if so, the caller is to start that
    /// now (the path is marked as being brought back).
    pub(super) fn claim_reconnect(&mut self, path: usize) -> bool {
        match self.paths.get_mut(path) {
            Some(p) if !p.up && !p.reconnecting => {
                p.reconnecting = true;
                true
            }
            _ => false,
        }
    }

    /// Bringing the path back was given up (it reaches another unit, or the handle closes).
    pub(super) fn reconnect_ended(&mut self, path: usize) {
        if let Some(p) = self.paths.get_mut(path) {
            p.reconnecting = false;
        }
    }

    /// The path is down (it could not log in, or it reaches another unit).
    pub(super) fn path_down(&mut self, path: usize) {
        if let Some(p) = self.paths.get_mut(path) {
            p.up = false;
        }
    }

    /// A REPORT TARGET PORT GROUPS is about to be issued: the ticket to hand back with its answer.
    pub(super) fn rtpg_issued(&mut self) -> u64 {
        self.tick()
    }

    /// The answer to the REPORT TARGET PORT GROUPS issued with `ticket`. An answer older than
    /// the one held is dropped (answers may come back out of order).
    pub(super) fn rtpg_answered(&mut self, ticket: u64, report: TargetPortGroups) {
        if let Alua::Known { issued_at, .. } = self.alua
            && issued_at > ticket
        {
            return;
        }
        self.alua = Alua::Known { report, issued_at: ticket };
    }

    /// The target refused REPORT TARGET PORT GROUPS: active/active.
    pub(super) fn rtpg_unsupported(&mut self) {
        self.alua = Alua::Unsupported;
    }

    /// The target port group of `path`: its own designator, or the report's group of its port.
    fn group_of(&self, path: usize) -> Option<u16> {
        let p = self.paths.get(path)?;
        p.group.or_else(|| match (&self.alua, p.relative_port) {
            (Alua::Known { report, .. }, Some(port)) => report.group_of_port(port),
            _ => None,
        })
    }

    /// The access state of `path` as last reported (`None`: not reported, or not known).
    pub(super) fn state_of(&self, path: usize) -> Option<AccessState> {
        match &self.alua {
            Alua::Known { report, .. } => report.state_of(self.group_of(path)?),
            Alua::Unsupported | Alua::Unknown => Some(AccessState::ActiveOptimized),
        }
    }

    /// The path for the next command: round robin among the active/optimized paths that are
    /// up, else among the active/non-optimized ones; `None` if no path may take I/O now.
    pub(super) fn pick(&mut self) -> Option<usize> {
        let n = self.paths.len();
        let classes: Vec<Option<u8>> = (0..n).map(|i| if self.paths[i].up { class(self.state_of(i)) } else { None }).collect();
        let best = classes.iter().flatten().min().copied()?;
        let start = self.next;
        let i = (0..n).map(|k| (start + k) % n).find(|&i| classes[i] == Some(best))?;
        self.next = (i + 1) % n;
        Some(i)
    }

    /// Whether any path is up.
    pub(super) fn any_up(&self) -> bool {
        self.paths.iter().any(|p| p.up)
    }

    /// Whether a write that was in flight on the failed path may be sent again:
    /// (a) that path has been brought up again on a later connection (its login, with the same
    ///     ISID, made the target reinstate the session, ending the old connection's tasks), or
    /// (b) a REPORT TARGET PORT GROUPS issued after the failure reports a path that is up in a
    ///     group other than the failed path's as active/optimized, and the failed path's group
    ///     as not active/optimized: that group's gateway took the unit over, and by contract
    ///     fenced the former owner first.
    pub(super) fn write_may_be_reissued(&self, f: &Failure) -> bool {
        if self.paths.get(f.path).is_some_and(|p| p.generation > f.generation) {
            return true;
        }
        let Alua::Known { report, issued_at } = &self.alua else { return false };
        if *issued_at <= f.at {
            return false;
        }
        let Some(failed_group) = self.group_of(f.path) else { return false };
        if report.state_of(failed_group) == Some(AccessState::ActiveOptimized) {
            return false;
        }
        (0..self.paths.len()).any(|i| {
            i != f.path
                && self.paths[i].up
                && self.group_of(i).is_some_and(|g| g != failed_group && report.state_of(g) == Some(AccessState::ActiveOptimized))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alua::PortGroupDescriptor;

    fn report(states: &[(u16, AccessState, &[u16])]) -> TargetPortGroups {
        TargetPortGroups {
            implicit_transition_time: Some(0),
            groups: states
                .iter()
                .map(|&(id, state, ports)| PortGroupDescriptor {
                    id,
                    state,
                    relative_ports: ports.to_vec(),
                    ..PortGroupDescriptor::default()
                })
                .collect(),
        }
    }

    fn picks(s: &mut Selector, n: usize) -> Vec<Option<usize>> {
        (0..n).map(|_| s.pick()).collect()
    }

    #[test]
    fn active_active_round_robins_over_the_paths_that_are_up() {
        let mut s = Selector::new(3);
        assert_eq!(s.pick(), None, "no path up");
        for i in 0..3 {
            s.path_up(i, 0, None, None);
        }
        s.rtpg_unsupported();
        assert_eq!(picks(&mut s, 6), [Some(0), Some(1), Some(2), Some(0), Some(1), Some(2)]);
        s.path_failed(1, 0);
        assert_eq!(picks(&mut s, 4), [Some(0), Some(2), Some(0), Some(2)]);
        s.path_up(1, 0, None, None);
        assert!(picks(&mut s, 3).contains(&Some(1)), "a path that comes back is used again");
    }

    #[test]
    fn optimized_paths_first_non_optimized_only_without_them() {
        let mut s = Selector::new(3);
        s.path_up(0, 0, Some(1), None);
        s.path_up(1, 0, Some(2), None);
        s.path_up(2, 0, Some(2), None);
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(1, AccessState::ActiveNonOptimized, &[]), (2, AccessState::ActiveOptimized, &[])]));
        assert_eq!(picks(&mut s, 4), [Some(1), Some(2), Some(1), Some(2)]);
        s.path_failed(1, 0);
        s.path_failed(2, 0);
        assert_eq!(picks(&mut s, 2), [Some(0), Some(0)], "non-optimized when no optimized path is up");
        s.path_up(2, 0, Some(2), None);
        assert_eq!(picks(&mut s, 2), [Some(2), Some(2)]);
        // Standby, unavailable, offline and transitioning groups take no I/O.
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(1, AccessState::Standby, &[]), (2, AccessState::Transitioning, &[])]));
        assert_eq!(s.pick(), None);
    }

    #[test]
    fn a_port_without_a_group_designator_is_placed_by_its_relative_port() {
        let mut s = Selector::new(2);
        s.path_up(0, 0, None, Some(10));
        s.path_up(1, 0, None, Some(20));
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(1, AccessState::ActiveOptimized, &[10]), (2, AccessState::Unavailable, &[20])]));
        assert_eq!(picks(&mut s, 3), [Some(0), Some(0), Some(0)]);
        assert_eq!(s.state_of(1), Some(AccessState::Unavailable));
    }

    #[test]
    fn an_older_report_does_not_replace_a_newer_one() {
        let mut s = Selector::new(1);
        s.path_up(0, 0, Some(1), None);
        let old = s.rtpg_issued();
        let new = s.rtpg_issued();
        s.rtpg_answered(new, report(&[(1, AccessState::ActiveOptimized, &[])]));
        s.rtpg_answered(old, report(&[(1, AccessState::Standby, &[])]));
        assert_eq!(s.state_of(0), Some(AccessState::ActiveOptimized));
    }

    #[test]
    fn writes_wait_for_a_login_again_on_the_failed_path_in_active_active() {
        let mut s = Selector::new(2);
        s.path_up(0, 3, None, None);
        s.path_up(1, 0, None, None);
        s.rtpg_unsupported();
        let f = s.path_failed(0, 3);
        assert!(!s.paths[0].up);
        assert!(!s.write_may_be_reissued(&f), "nothing says the failed path's tasks are over");
        assert!(s.claim_reconnect(0));
        assert!(!s.claim_reconnect(0), "one task brings a path back");
        assert!(!s.claim_reconnect(1), "path 1 is up");
        s.path_up(0, 4, None, None);
        assert!(s.write_may_be_reissued(&f), "a login again (reinstatement) ended them");
        assert!(!s.paths[0].reconnecting);
        // A command of an older connection failing after the path came back: the path stays up
        // and the write may go at once.
        let f = s.path_failed(0, 3);
        assert!(s.paths[0].up);
        assert!(s.write_may_be_reissued(&f));
        // One of the current connection: down again, and it waits.
        let f = s.path_failed(0, 4);
        assert!(!s.paths[0].up);
        assert!(!s.write_may_be_reissued(&f));
    }

    #[test]
    fn writes_may_go_once_a_fresh_report_shows_another_group_took_the_unit_over() {
        let mut s = Selector::new(3);
        s.path_up(0, 0, Some(1), None);
        s.path_up(1, 0, Some(2), None);
        s.path_up(2, 0, Some(1), None);
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(1, AccessState::ActiveOptimized, &[]), (2, AccessState::ActiveNonOptimized, &[])]));
        let f = s.path_failed(0, 0);
        // A report issued before the failure says nothing of what followed it.
        let stale = report(&[(1, AccessState::Unavailable, &[]), (2, AccessState::ActiveOptimized, &[])]);
        s.rtpg_answered(t, stale.clone());
        assert!(!s.write_may_be_reissued(&f), "a report issued before the failure");
        // Fresh, but the failed path's group is still optimized (its gateway still owns the
        // unit; path 2 of that group is up): no fencing is implied.
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(1, AccessState::ActiveOptimized, &[]), (2, AccessState::ActiveNonOptimized, &[])]));
        assert!(!s.write_may_be_reissued(&f));
        // Fresh, group 2 optimized but its only path is down.
        s.path_failed(1, 0);
        let t = s.rtpg_issued();
        s.rtpg_answered(t, stale.clone());
        assert!(!s.write_may_be_reissued(&f), "no surviving path in the optimized group");
        s.path_up(1, 0, Some(2), None);
        assert!(s.write_may_be_reissued(&f), "group 2 owns the unit now and fenced group 1");
        assert_eq!(s.pick(), Some(1));
    }

    #[test]
    fn a_failed_path_of_unknown_group_needs_its_login_again() {
        let mut s = Selector::new(2);
        s.path_up(0, 0, None, None);
        s.path_up(1, 0, Some(2), None);
        let f = s.path_failed(0, 0);
        let t = s.rtpg_issued();
        s.rtpg_answered(t, report(&[(2, AccessState::ActiveOptimized, &[])]));
        assert!(!s.write_may_be_reissued(&f));
        s.path_up(0, 1, None, None);
        assert!(s.write_may_be_reissued(&f));
    }
}
