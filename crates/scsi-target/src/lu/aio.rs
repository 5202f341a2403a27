//! The medium data path over an asynchronous store ([`AsyncBackend`]): READ, WRITE (and WRITE
//! AND VERIFY), SYNCHRONIZE CACHE, UNMAP, WRITE SAME and COMPARE AND WRITE as futures, with the
//! same checks, sense and flush rules as the synchronous path in `rw`.

use super::{LogicalUnit, LuIdentity, Nexus, Outcome, Plan, R, bad_field, illegal};
use crate::aio::{AsyncBackend, BlockOn, Compared};
use bytes::Bytes;
use riser_scsi::cdb::{Cdb, Rw, rw_flags};
use riser_scsi::sense::{AscAscq, Sense, SenseKey};
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;

/// A command running on an asynchronous store.
pub type Running = Pin<Box<dyn Future<Output = Outcome> + Send + 'static>>;

/// Largest write the unit makes at once where it writes a pattern itself (WRITE SAME on a store
/// without it).
const FILL_CHUNK: u64 = 1 << 20;

/// The commands an asynchronous store's futures carry.
pub(super) fn on_data_path(c: &Cdb) -> bool {
    matches!(
        c,
        Cdb::Read(_)
            | Cdb::Write(_)
            | Cdb::WriteAndVerify(_)
            | Cdb::SynchronizeCache(_)
            | Cdb::Unmap { .. }
            | Cdb::WriteSame(_)
            | Cdb::CompareAndWrite { .. }
    )
}

impl LogicalUnit {
    /// A logical unit over an asynchronous store: READ, WRITE, SYNCHRONIZE CACHE, UNMAP, WRITE
    /// SAME and COMPARE AND WRITE run as the store's futures ([`Self::execute_async`]); the other
    /// commands run on the blocking pool, waiting there for each operation they make.
    ///
    /// The unit reports a write cache (WCE) only if the store has one
    /// ([`AsyncBackend::write_back`]); COMPARE AND WRITE only as far as the store does it
    /// atomically; ORWRITE (a read-modify-write the unit would make with its own locks) not on
    /// a store other processes write ([`AsyncBackend::shared`]).
    pub fn with_async(store: Arc<dyn AsyncBackend>, identity: LuIdentity) -> Self {
        let mut lu = Self::new(Arc::new(BlockOn(store.clone())), identity);
        lu.st().wce = store.write_back();
        lu.aio = Some(store);
        lu
    }

    /// Whether [`Self::execute_async`] runs `plan` (the unit has an asynchronous store and the
    /// command is one of its data path).
    pub fn runs_async(&self, plan: &Plan) -> bool {
        self.aio.is_some() && on_data_path(&plan.cdb)
    }

    /// Start a planned command on the unit's asynchronous store: the future of its outcome, or
    /// `None` when [`Self::runs_async`] says no (then [`Self::execute_into`] runs it). `data_out`
    /// is the command's write data (the store may keep a reference until its write completes);
    /// `read_buf` a buffer for read data, as in `execute_into`.
    ///
    /// The future is `'static` and may be spawned: the store's operation goes on when the future
    /// is dropped, so a server that must know when a command's effects are over awaits it to
    /// its end.
    pub fn execute_async(self: &Arc<Self>, plan: &Plan, data_out: Bytes, nexus: &Nexus, read_buf: Vec<u8>) -> Option<Running> {
        if !self.runs_async(plan) {
            return None;
        }
        let aio = self.aio.clone()?;
        if let Some(refused) = self.refusal(plan, nexus) {
            return Some(Box::pin(std::future::ready(refused)));
        }
        let (lu, cdb) = (self.clone(), plan.cdb.clone());
        Some(Box::pin(async move {
            match lu.run_async(&aio, &cdb, data_out, read_buf).await {
                Ok(o) => o,
                Err(s) => lu.check(s),
            }
        }))
    }

    /// The capacity of the store changed outside the unit (another gateway grew the image):
    /// every nexus that has seen the unit gets CAPACITY DATA HAS CHANGED.
    pub fn capacity_changed(&self) {
        self.unit_attention(AscAscq::CAPACITY_DATA_CHANGED, None);
    }

    /// Most blocks COMPARE AND WRITE takes on this unit (0: not offered).
    pub(super) fn compare_and_write_blocks(&self) -> u8 {
        self.aio.as_ref().map_or(1, |a| a.compare_and_write_blocks())
    }

    /// Whether the unit offers ORWRITE (not on a store other processes write: its
    /// read-modify-write is atomic only against this unit's own commands).
    pub(super) fn offers_or_write(&self) -> bool {
        self.aio.as_ref().is_none_or(|a| !a.shared())
    }

    /// Whether the write cache (WCE) may be changed: not on a store without one.
    pub(super) fn cache_changeable(&self) -> bool {
        self.aio.as_ref().is_none_or(|a| a.write_back())
    }

    pub(super) async fn run_async(&self, aio: &Arc<dyn AsyncBackend>, c: &Cdb, out: Bytes, buf: Vec<u8>) -> R {
        match c {
            Cdb::Read(r) => {
                let (off, len) = self.check_rw(r)?;
                let data = aio.read(off, len, buf).await.map_err(|_| self.io_error(true))?;
                if data.len() != len {
                    return Err(self.io_error(true));
                }
                Ok(Outcome::good(data))
            }
            Cdb::Write(r) => self.write_async(aio, r, out).await,
            Cdb::WriteAndVerify(r) => {
                // The medium is not read back: a WRITE.
                if r.protect() != 0 {
                    return Err(bad_field(1, Some(7)));
                }
                self.write_async(aio, &Rw { flags: r.flags & !0x06, ..*r }, out).await
            }
            Cdb::SynchronizeCache(r) => {
                self.range(r.lba, u64::from(r.blocks).min(u64::from(super::MAX_TRANSFER_BLOCKS)))?;
                self.flushed(aio.flush().await)?;
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::Unmap { .. } => self.unmap_async(aio, &out).await,
            Cdb::WriteSame(r) => self.write_same_async(aio, r, &out).await,
            Cdb::CompareAndWrite { lba, blocks, flags, .. } => self.compare_and_write_async(aio, *lba, *blocks, *flags, out).await,
            // `runs_async` admits only the commands above.
            _ => Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE)),
        }
    }

    /// GOOD once what a modifying command wrote is as durable as it must be: a store with a
    /// write cache is flushed for FUA or with WCE=0; a store without one has nothing to flush.
    async fn settle_async(&self, aio: &Arc<dyn AsyncBackend>, fua: bool) -> R {
        if aio.write_back() && (fua || !self.st().wce) {
            self.flushed(aio.flush().await)?;
        }
        Ok(Outcome::good(Bytes::new()))
    }

    async fn write_async(&self, aio: &Arc<dyn AsyncBackend>, r: &Rw, out: Bytes) -> R {
        let (off, len) = self.check_rw(r)?;
        self.write_protected()?;
        // Only the whole blocks received are written (RFC 7143 §11.4.5.1), as in `rw::write`.
        let bs = self.bs() as usize;
        let len = len.min(out.len() / bs * bs);
        // With WCE=0 every write is forced to the medium: the store does it as FUA.
        let fua = r.fua() || !self.st().wce;
        aio.write(off, out.slice(..len), fua).await.map_err(|_| self.io_error(false))?;
        Ok(Outcome::good(Bytes::new()))
    }

    /// Write `block` over `len` bytes at `off`: the store's WRITE SAME, or the unit's own writes
    /// of at most [`FILL_CHUNK`] each where the store has none.
    async fn fill(&self, aio: &Arc<dyn AsyncBackend>, off: u64, len: u64, block: Bytes) -> io::Result<()> {
        match aio.write_same(off, len, block.clone()).await {
            Err(e) if e.kind() == io::ErrorKind::Unsupported => {}
            other => return other,
        }
        let bs = block.len() as u64;
        let per_chunk = (FILL_CHUNK / bs).max(1);
        let chunk: Bytes = block.iter().copied().cycle().take((per_chunk.min(len / bs) * bs) as usize).collect::<Vec<u8>>().into();
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64);
            aio.write(off + done, chunk.slice(..n as usize), false).await?;
            done += n;
        }
        Ok(())
    }

    async fn write_same_async(&self, aio: &Arc<dyn AsyncBackend>, r: &Rw, out: &Bytes) -> R {
        let super::rw::SameWrite { off, len, dealloc, block } = self.check_write_same(r, out)?;
        let done = if dealloc {
            aio.unmap(off, len).await
        } else {
            let block = block.map_or_else(|| Bytes::from(vec![0; self.bs() as usize]), |b| out.slice_ref(b));
            self.fill(aio, off, len, block).await
        };
        done.map_err(|_| self.io_error(false))?;
        self.settle_async(aio, false).await
    }

    async fn unmap_async(&self, aio: &Arc<dyn AsyncBackend>, out: &[u8]) -> R {
        for (off, len) in self.check_unmap(out)? {
            // A store that cannot deallocate gets zeros (the blocks read as zeros afterwards either way).
            let done =
                if aio.thin() { aio.unmap(off, len).await } else { self.fill(aio, off, len, vec![0; self.bs() as usize].into()).await };
            done.map_err(|_| self.io_error(false))?;
        }
        self.settle_async(aio, false).await
    }

    async fn compare_and_write_async(&self, aio: &Arc<dyn AsyncBackend>, lba: u64, blocks: u8, flags: u8, out: Bytes) -> R {
        let max = aio.compare_and_write_blocks();
        if max == 0 {
            // Not offered (never emulated with a read and a write other writers could split).
            return Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE));
        }
        let Some((off, len)) = self.check_compare_and_write(lba, blocks, flags, &out, max)? else {
            return Ok(Outcome::good(Bytes::new()));
        };
        match aio.compare_and_write(off, out.slice(..len), out.slice(len..2 * len)).await {
            Ok(Compared::Written) => self.settle_async(aio, flags & rw_flags::FUA != 0).await,
            Ok(Compared::Mismatch(at)) => {
                let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
                s.information = Some(at);
                Err(s)
            }
            Err(_) => Err(self.io_error(false)),
        }
    }
}
