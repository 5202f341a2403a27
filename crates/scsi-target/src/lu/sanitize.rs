//! SANITIZE (SBC-4 §5.30): the OVERWRITE worker thread, its progress, and the state it leaves
//! the LU in (which fences the medium while it runs or after it failed).

use super::{LogicalUnit, Outcome, R, State, bad_field};
use crate::backend::BlockBackend;
use bytes::Bytes;
use riser_scsi::sense::{AscAscq, Sense, SenseKey};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// A SANITIZE running in the background (SBC-4 §4.11). Until it ends the LU answers NOT READY,
/// SANITIZE IN PROGRESS; it survives task management and the loss of the session that started it.
#[derive(Debug)]
pub(super) struct SanitizeJob {
    total: u64,
    done: AtomicU64,
    ok: Mutex<Option<bool>>,
    ended: Condvar,
}

impl SanitizeJob {
    fn result(&self) -> Option<bool> {
        *self.ok.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn finish(&self, ok: bool) {
        *self.ok.lock().unwrap_or_else(|e| e.into_inner()) = Some(ok);
        self.ended.notify_all();
    }
    fn wait(&self) -> bool {
        let mut g = self.ok.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ok) = *g {
                return ok;
            }
            g = self.ended.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What a sanitize leaves the LU in.
pub(super) enum SanitizeState {
    Idle,
    Running { done: u64, total: u64 },
    Failed,
}

impl State {
    pub(super) fn sanitize_state(&mut self) -> SanitizeState {
        if let Some(job) = &self.sanitize {
            match job.result() {
                None => return SanitizeState::Running { done: job.done.load(Ordering::Relaxed), total: job.total },
                Some(ok) => {
                    self.sanitize_failed = !ok;
                    self.sanitize = None;
                }
            }
        }
        if self.sanitize_failed { SanitizeState::Failed } else { SanitizeState::Idle }
    }
}

/// The work of a SANITIZE OVERWRITE, done on its own thread.
struct Overwrite {
    backend: Arc<dyn BlockBackend>,
    pattern: Vec<u8>,
    passes: u8,
    invert: bool,
    rate: Option<u64>,
}

impl Overwrite {
    /// Write every pass over the whole medium, then flush; false on a backend error.
    fn run(&self, job: &SanitizeJob) -> bool {
        let bs = u64::from(self.backend.block_size());
        let total = self.backend.num_blocks() * bs;
        let chunk_len = ((1u64 << 20) / bs).max(1) * bs;
        let chunk: Vec<u8> = self.pattern.iter().copied().cycle().take(chunk_len as usize).collect();
        let inverted: Vec<u8> = chunk.iter().map(|b| !b).collect();
        let start = Instant::now();
        let mut written = 0u64;
        for pass in 0..self.passes {
            // With INVERT the pattern is inverted between consecutive passes (SBC-4 §5.30.3).
            let data = if self.invert && pass % 2 == 1 { &inverted } else { &chunk };
            let mut at = 0u64;
            while at < total {
                let n = (total - at).min(chunk_len) as usize;
                if self.backend.write(at, &data[..n]).is_err() {
                    return false;
                }
                at += n as u64;
                written += n as u64;
                job.done.store(written, Ordering::Relaxed);
                if let Some(rate) = self.rate {
                    let due = Duration::from_secs_f64(written as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
        self.backend.flush().is_ok()
    }
}

impl LogicalUnit {
    /// SANITIZE (SBC-4 §5.30): OVERWRITE with an initialization pattern. The overwrite runs on
    /// its own thread; with IMMED the status is GOOD once it has started, without it the status
    /// waits for the end (the caller's thread blocks: see [`LogicalUnit::may_block`]).
    pub(super) fn sanitize(&self, flags: u8, reserved: &[u8; 5], param_len: u16, out: &[u8]) -> R {
        const OVERWRITE: u8 = 0x01;
        const IMMED: u8 = 0x80;
        if flags & 0x40 != 0 {
            return Err(bad_field(1, Some(6)));
        }
        if reserved.iter().any(|&b| b != 0) {
            return Err(bad_field(2, None));
        }
        if flags & 0x1f != OVERWRITE {
            return Err(bad_field(1, Some(4)));
        }
        let p = usize::from(param_len);
        if p <= 4 || p >= self.bs() as usize + 5 || out.len() < p {
            return Err(bad_field(7, None));
        }
        let count = out[0] & 0x1f;
        let pattern_len = usize::from(u16::from_be_bytes([out[2], out[3]]));
        if count == 0 || pattern_len == 0 || pattern_len > self.bs() as usize || pattern_len > p - 4 {
            return Err(bad_field(7, None));
        }
        self.write_protected()?;
        let overwrite = Overwrite {
            backend: self.backend.clone(),
            pattern: out[4..4 + pattern_len].to_vec(),
            passes: count,
            invert: out[0] & 0x80 != 0,
            rate: self.sanitize_rate,
        };
        let job = Arc::new(SanitizeJob {
            total: self.blocks() * u64::from(self.bs()) * u64::from(count),
            done: AtomicU64::new(0),
            ok: Mutex::new(None),
            ended: Condvar::new(),
        });
        {
            let mut s = self.st();
            if let SanitizeState::Running { done, total } = s.sanitize_state() {
                // Two SANITIZE commands raced past the gate in plan().
                return Err(Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total));
            }
            s.sanitize = Some(job.clone());
            s.sanitize_failed = false;
        }
        let worker = job.clone();
        if let Err(e) = std::thread::Builder::new().name("riser-sanitize".into()).spawn(move || worker.finish(overwrite.run(&worker))) {
            tracing::error!("cannot start the sanitize thread: {e}");
            job.finish(false);
        }
        if flags & IMMED != 0 || job.wait() {
            Ok(Outcome::good(Bytes::new()))
        } else {
            Err(Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED))
        }
    }
}
