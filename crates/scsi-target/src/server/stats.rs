//! Statistics, always on: what each session did on each logical unit (commands by kind, bytes
//! read and written, errors by sense key, a latency histogram), and what the target saw at
//! login.
//!
//! Counting must not cost the data path: a command counts into its session's own counters for
//! its LUN (`LuCounters`, written by that session's commands only), and nothing is summed until
//! someone reads ([`super::Target::stats`]). When a session ends, its counters are folded into
//! the target's totals under the lock that readers take, so every total only grows.

use riser_iscsi::keys::Transport;
use riser_iscsi::wire::LoginStatus;
use riser_scsi::sense::Status;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::time::Duration;

/// What kind of command, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Op {
    /// READ (6/10/12/16).
    Read,
    /// WRITE (6/10/12/16), WRITE AND VERIFY, WRITE ATOMIC, ORWRITE.
    Write,
    /// WRITE SAME (10/16).
    WriteSame,
    /// UNMAP.
    Unmap,
    /// COMPARE AND WRITE.
    CompareAndWrite,
    /// SYNCHRONIZE CACHE (10/16).
    SyncCache,
    /// VERIFY (10/16).
    Verify,
    /// Everything else (INQUIRY, READ CAPACITY, MODE SENSE, reservations, ...).
    Other,
}

impl Op {
    /// Every kind, in the order of [`Op::index`].
    pub const ALL: [Self; 8] =
        [Self::Read, Self::Write, Self::WriteSame, Self::Unmap, Self::CompareAndWrite, Self::SyncCache, Self::Verify, Self::Other];

    /// The kind of a CDB, by its operation code.
    pub fn of(opcode: u8) -> Self {
        match opcode {
            0x08 | 0x28 | 0xa8 | 0x88 => Self::Read,
            0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0x8e | 0x9c | 0x8b => Self::Write,
            0x41 | 0x93 => Self::WriteSame,
            0x42 => Self::Unmap,
            0x89 => Self::CompareAndWrite,
            0x35 | 0x91 => Self::SyncCache,
            0x2f | 0x8f => Self::Verify,
            _ => Self::Other,
        }
    }

    /// Its name (the `op` label of the metrics).
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::WriteSame => "write_same",
            Self::Unmap => "unmap",
            Self::CompareAndWrite => "compare_and_write",
            Self::SyncCache => "sync_cache",
            Self::Verify => "verify",
            Self::Other => "other",
        }
    }

    /// Its place in [`Op::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// The upper bounds of the latency histogram's buckets, in microseconds (the last bucket,
/// beyond them, is +Inf).
pub const LATENCY_BOUNDS_US: [u64; 16] =
    [50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000, 2_500_000, 10_000_000];

/// Names of the error classes counted: the 16 sense keys of CHECK CONDITION, then the statuses
/// that end a command without sense (the `sense_key` label of the metrics).
pub const ERROR_NAMES: [&str; 20] = [
    "no_sense",
    "recovered_error",
    "not_ready",
    "medium_error",
    "hardware_error",
    "illegal_request",
    "unit_attention",
    "data_protect",
    "blank_check",
    "vendor_specific",
    "copy_aborted",
    "aborted_command",
    "reserved_c",
    "volume_overflow",
    "miscompare",
    "completed",
    "reservation_conflict",
    "busy",
    "task_set_full",
    "other_status",
];

/// The error class of a status (with its sense data, fixed or descriptor format), if it is
/// one: an index into [`ERROR_NAMES`].
fn error_class(status: Status, sense: Option<&[u8]>) -> Option<usize> {
    match status {
        Status::GOOD | Status::CONDITION_MET => None,
        Status::CHECK_CONDITION => {
            let key = match sense {
                Some(s) if s.first().is_some_and(|b| b & 0x7e == 0x72) => s.get(1).copied(),
                Some(s) => s.get(2).copied(),
                None => None,
            };
            Some(usize::from(key.unwrap_or(0) & 0x0f))
        }
        Status::RESERVATION_CONFLICT => Some(16),
        Status::BUSY => Some(17),
        Status::TASK_SET_FULL => Some(18),
        _ => Some(19),
    }
}

/// One session's counters for one logical unit. Written by that session's commands only.
#[derive(Debug, Default)]
pub(crate) struct LuCounters {
    commands: [AtomicU64; 8],
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    errors: [AtomicU64; 20],
    latency: [AtomicU64; 17],
    latency_sum_ns: AtomicU64,
}

impl LuCounters {
    /// A command ended with `status` after `took`.
    ///
    /// The command itself is counted last (Release) and a snapshot reads the command counts
    /// first (Acquire): whoever sees a command counted sees every count it made, its bytes
    /// included (counted before it ended).
    pub(crate) fn command(&self, op: Op, status: Status, sense: Option<&[u8]>, took: Duration) {
        if let Some(e) = error_class(status, sense) {
            self.errors[e].fetch_add(1, Relaxed);
        }
        // Whole microseconds without a 128-bit division.
        let us = took.as_secs().saturating_mul(1_000_000).saturating_add(u64::from(took.subsec_micros()));
        let bucket = LATENCY_BOUNDS_US.iter().position(|&b| us <= b).unwrap_or(LATENCY_BOUNDS_US.len());
        self.latency[bucket].fetch_add(1, Relaxed);
        let ns = took.as_secs().saturating_mul(1_000_000_000).saturating_add(u64::from(took.subsec_nanos()));
        self.latency_sum_ns.fetch_add(ns, Relaxed);
        self.commands[op.index()].fetch_add(1, Release);
    }

    /// `n` bytes went to the initiator.
    pub(crate) fn read(&self, n: u32) {
        self.read_bytes.fetch_add(u64::from(n), Relaxed);
    }

    /// `n` bytes of the initiator's were written to the store.
    pub(crate) fn written(&self, n: u32) {
        self.write_bytes.fetch_add(u64::from(n), Relaxed);
    }

    /// What they hold now.
    pub(crate) fn snapshot(&self) -> LunStats {
        let load = |a: &[AtomicU64]| a.iter().map(|c| c.load(Relaxed)).collect::<Vec<_>>();
        // First, and with Acquire: see `command`.
        let commands = self.commands.iter().map(|c| c.load(Acquire)).collect::<Vec<_>>();
        LunStats {
            commands: commands.try_into().unwrap_or_default(),
            read_bytes: self.read_bytes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            errors: load(&self.errors).try_into().unwrap_or_default(),
            latency_buckets: load(&self.latency).try_into().unwrap_or_default(),
            latency_sum: Duration::from_nanos(self.latency_sum_ns.load(Relaxed)),
        }
    }
}

/// What was done on one LUN (of one session, or summed over sessions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LunStats {
    /// Commands ended, by [`Op::index`].
    pub commands: [u64; 8],
    /// Bytes sent to initiators (read data).
    pub read_bytes: u64,
    /// Bytes written to the store.
    pub write_bytes: u64,
    /// Commands that ended in error, by class ([`ERROR_NAMES`]).
    pub errors: [u64; 20],
    /// Commands by latency, non-cumulative: bucket `i` counts those at most
    /// [`LATENCY_BOUNDS_US`]`[i]` µs and above the bound before; the last counts the rest.
    pub latency_buckets: [u64; 17],
    /// The sum of every command's latency.
    pub latency_sum: Duration,
}

impl LunStats {
    /// Commands ended, of every kind.
    pub fn total_commands(&self) -> u64 {
        self.commands.iter().sum()
    }

    /// Commands ended in error, of every class.
    pub fn total_errors(&self) -> u64 {
        self.errors.iter().sum()
    }

    /// Add `other` in.
    pub fn add(&mut self, other: &Self) {
        let sum = |a: &mut [u64], b: &[u64]| a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
        sum(&mut self.commands, &other.commands);
        sum(&mut self.errors, &other.errors);
        sum(&mut self.latency_buckets, &other.latency_buckets);
        self.read_bytes += other.read_bytes;
        self.write_bytes += other.write_bytes;
        self.latency_sum += other.latency_sum;
    }
}

/// Why a login failed, for counting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum LoginFailure {
    /// CHAP failed (wrong secret, user or algorithm, or no CHAP where it is required).
    Authentication,
    /// The target's ACL does not admit the initiator.
    Authorization,
    /// No such target (behind this portal).
    TargetNotFound,
    /// Anything else the initiator got wrong (missing or malformed keys, bad sequence).
    Protocol,
    /// The login did not finish within the login timeout.
    Timeout,
    /// The connection ended during login.
    Disconnected,
    /// The target had no resources for the connection (or no randomness for CHAP).
    Resources,
}

impl LoginFailure {
    /// Every reason, in the order of [`LoginFailure::index`].
    pub const ALL: [Self; 7] = [
        Self::Authentication,
        Self::Authorization,
        Self::TargetNotFound,
        Self::Protocol,
        Self::Timeout,
        Self::Disconnected,
        Self::Resources,
    ];

    /// The reason of a Login Response status.
    pub fn of(status: LoginStatus) -> Self {
        match status {
            LoginStatus::AUTHENTICATION_FAILURE => Self::Authentication,
            LoginStatus::AUTHORIZATION_FAILURE => Self::Authorization,
            LoginStatus::NOT_FOUND => Self::TargetNotFound,
            s if s.class == 3 => Self::Resources,
            _ => Self::Protocol,
        }
    }

    /// Its name (the `reason` label of the metrics).
    pub fn name(self) -> &'static str {
        match self {
            Self::Authentication => "authentication",
            Self::Authorization => "authorization",
            Self::TargetNotFound => "target_not_found",
            Self::Protocol => "protocol",
            Self::Timeout => "timeout",
            Self::Disconnected => "disconnected",
            Self::Resources => "resources",
        }
    }

    /// Its place in [`LoginFailure::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Target-wide counters (per event, not per command).
#[derive(Debug, Default)]
pub(crate) struct TargetCounters {
    pub(crate) login_failures: [AtomicU64; 7],
    pub(crate) logins: AtomicU64,
    /// Connections open now (in login or full feature phase), TCP and iSER.
    pub(crate) connections: [AtomicU64; 2],
}

impl TargetCounters {
    pub(crate) fn login_failed(&self, why: LoginFailure) {
        self.login_failures[why.index()].fetch_add(1, Relaxed);
    }
}

/// The index of a transport in [`TargetCounters::connections`].
pub(crate) fn transport_index(t: Transport) -> usize {
    usize::from(t == Transport::Iser)
}

/// A connection counted open until dropped.
pub(crate) struct ConnectionCount<'a>(&'a AtomicU64);

impl<'a> ConnectionCount<'a> {
    pub(crate) fn open(counters: &'a TargetCounters, t: Transport) -> Self {
        let c = &counters.connections[transport_index(t)];
        c.fetch_add(1, Relaxed);
        Self(c)
    }
}

impl Drop for ConnectionCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

/// Everything the target counts, summed at one moment ([`super::Target::stats`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Per LUN: (target name, the target's LUN number) → what its sessions did there, ended
    /// sessions included. A LUN that was removed keeps its line.
    pub luns: BTreeMap<(String, u16), LunStats>,
    /// Normal sessions now, per target name.
    pub sessions: BTreeMap<String, usize>,
    /// Discovery sessions now.
    pub discovery_sessions: usize,
    /// Connections now (in login or full feature phase) over TCP.
    pub tcp_connections: u64,
    /// Connections now over iSER.
    pub iser_connections: u64,
    /// Logins that completed.
    pub logins: u64,
    /// Logins that failed, by reason ([`LoginFailure::index`]).
    pub login_failures: [u64; 7],
    /// Bytes of command data the target holds now (write data collected, read data produced).
    pub data_bytes: u64,
    /// The bound on them (`TargetConfig::max_target_bytes`).
    pub data_limit_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classed_by_sense_key_in_both_formats() {
        let fixed = [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0];
        let desc = [0x72, 0x06, 0x29, 0, 0, 0, 0, 0];
        assert_eq!(error_class(Status::CHECK_CONDITION, Some(&fixed)), Some(5));
        assert_eq!(ERROR_NAMES[5], "illegal_request");
        assert_eq!(error_class(Status::CHECK_CONDITION, Some(&desc)), Some(6));
        assert_eq!(ERROR_NAMES[16], "reservation_conflict");
        assert_eq!(error_class(Status::RESERVATION_CONFLICT, None), Some(16));
        assert_eq!(error_class(Status::GOOD, None), None);
    }

    /// A reader that sees a command counted sees all of its counts (its error class, its
    /// latency, the bytes counted before it ended): a statistics request made once the
    /// initiator has its response must not find the command without its error.
    #[test]
    fn a_command_seen_counted_is_seen_whole() {
        let c = std::sync::Arc::new(LuCounters::default());
        let sense = [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x21, 0];
        const N: u64 = 300_000;
        let writer = {
            let c = c.clone();
            std::thread::spawn(move || {
                for _ in 0..N {
                    c.read(512);
                    c.command(Op::Read, Status::CHECK_CONDITION, Some(&sense), Duration::from_micros(5));
                }
            })
        };
        let mut torn = 0;
        loop {
            let s = c.snapshot();
            let n = s.total_commands();
            if s.total_errors() < n || s.latency_buckets.iter().sum::<u64>() < n || s.read_bytes < 512 * n {
                torn += 1;
            }
            if n == N {
                break;
            }
        }
        writer.join().unwrap();
        assert_eq!(torn, 0, "snapshots that saw commands without their other counts");
    }

    #[test]
    fn counters_sum_and_bucket_latency() {
        let c = LuCounters::default();
        c.command(Op::of(0x28), Status::GOOD, None, Duration::from_micros(40));
        c.command(Op::of(0x2a), Status::GOOD, None, Duration::from_micros(300));
        c.command(Op::of(0x2a), Status::BUSY, None, Duration::from_secs(20));
        c.read(4096);
        c.written(512);
        let s = c.snapshot();
        assert_eq!((s.commands[Op::Read.index()], s.commands[Op::Write.index()], s.total_commands()), (1, 2, 3));
        assert_eq!((s.read_bytes, s.write_bytes, s.total_errors()), (4096, 512, 1));
        assert_eq!((s.latency_buckets[0], s.latency_buckets[3], s.latency_buckets[16]), (1, 1, 1));
        let mut t = LunStats::default();
        t.add(&s);
        t.add(&s);
        assert_eq!((t.total_commands(), t.read_bytes), (6, 8192));
        assert_eq!(Op::ALL.iter().map(|o| o.index()).collect::<Vec<_>>(), (0..8).collect::<Vec<_>>());
        assert_eq!(LoginFailure::ALL.iter().map(|o| o.index()).collect::<Vec<_>>(), (0..7).collect::<Vec<_>>());
    }
}
