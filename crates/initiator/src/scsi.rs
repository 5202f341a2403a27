//! The typed SCSI helpers of [`Session`]: each builds a CDB, runs it with
//! [`Session::command`] and decodes what it returns.

use crate::{Error, Session};
use bytes::Bytes;
use riser_scsi::cdb::{Cdb, CdbSize, Rw};
use riser_scsi::lun::Lun;

impl Session {
    /// Run a CDB value.
    pub async fn run(&self, lun: Lun, cdb: &Cdb, write: Option<Bytes>, read_len: u32) -> Result<Bytes, Error> {
        // Fixed-size CDBs (all but variable-length ones) are encoded on the stack.
        let mut fixed = [0u8; 16];
        let bytes = match cdb.emit(&mut fixed) {
            Ok(n) => std::borrow::Cow::Borrowed(&fixed[..n]),
            Err(_) => std::borrow::Cow::Owned(cdb.to_vec()),
        };
        self.command(lun, &bytes, write, read_len).await?.into_good()
    }

    /// TEST UNIT READY.
    pub async fn test_unit_ready(&self, lun: Lun) -> Result<(), Error> {
        self.run(lun, &Cdb::TestUnitReady { control: 0 }, None, 0).await.map(drop)
    }

    /// Standard INQUIRY data.
    pub async fn inquiry(&self, lun: Lun) -> Result<riser_scsi::inquiry::StandardInquiry, Error> {
        let d = self.run(lun, &Cdb::Inquiry { evpd: false, page_code: 0, alloc_len: 255, control: 0 }, None, 255).await?;
        riser_scsi::inquiry::StandardInquiry::parse(&d).map_err(|e| Error::Protocol(e.to_string()))
    }

    /// REPORT LUNS (sent to LUN 0, as hosts do): the LUNs the target shows this I_T nexus.
    pub async fn report_luns(&self) -> Result<Vec<Lun>, Error> {
        let alloc = 16 + 8 * 1024;
        let d = self.run(Lun::ZERO, &Cdb::ReportLuns { select: 0, alloc_len: alloc, control: 0 }, None, alloc).await?;
        riser_scsi::report::parse_report_luns(&d).map_err(|e| Error::Protocol(e.to_string()))
    }

    /// A VPD page's body.
    pub async fn vpd(&self, lun: Lun, page: u8) -> Result<Bytes, Error> {
        let d = self.run(lun, &Cdb::Inquiry { evpd: true, page_code: page, alloc_len: 4096, control: 0 }, None, 4096).await?;
        let (_, body) = riser_scsi::inquiry::parse_vpd(&d).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok(d.slice_ref(body))
    }

    /// READ CAPACITY (16): (number of blocks, block size).
    pub async fn read_capacity(&self, lun: Lun) -> Result<(u64, u32), Error> {
        let d = self.run(lun, &Cdb::ReadCapacity16 { lba: 0, alloc_len: 32, pmi: false, control: 0 }, None, 32).await?;
        let c = riser_scsi::capacity::Capacity16::parse(&d).map_err(|e| Error::Protocol(e.to_string()))?;
        Ok((c.last_lba + 1, c.block_len))
    }

    /// READ (16) of `blocks` blocks at `lba`.
    pub async fn read(&self, lun: Lun, lba: u64, blocks: u32, block_size: u32) -> Result<Bytes, Error> {
        let cdb = Cdb::Read(Rw { size: CdbSize::Sixteen, lba, blocks, ..Rw::default() });
        self.run(lun, &cdb, None, blocks * block_size).await
    }

    /// Hand back the data of a finished read once it is consumed: later reads reuse the memory
    /// (a large buffer from the allocator is a fresh mapping, page-faulted in per command).
    /// Ignored unless `data` is the only handle on its buffer.
    pub fn recycle(&self, data: Bytes) {
        if let Ok(buf) = data.try_into_mut() {
            self.dm().release_task_buffer(riser_datamover::TaskBuffer { data: buf });
        }
    }

    /// WRITE (16) of `data` (whole blocks) at `lba`.
    pub async fn write(&self, lun: Lun, lba: u64, data: Bytes, block_size: u32) -> Result<(), Error> {
        let cdb = Cdb::Write(Rw { size: CdbSize::Sixteen, lba, blocks: (data.len() / block_size as usize) as u32, ..Rw::default() });
        self.run(lun, &cdb, Some(data), 0).await.map(drop)
    }

    /// SYNCHRONIZE CACHE (16) of the whole LU.
    pub async fn sync(&self, lun: Lun) -> Result<(), Error> {
        self.run(lun, &Cdb::SynchronizeCache(Rw { size: CdbSize::Sixteen, ..Rw::default() }), None, 0).await.map(drop)
    }

    /// UNMAP one extent.
    pub async fn unmap(&self, lun: Lun, lba: u64, blocks: u32) -> Result<(), Error> {
        let list = riser_scsi::unmap::to_bytes(&[riser_scsi::unmap::UnmapDescriptor { lba, blocks }]);
        let cdb = Cdb::Unmap { anchor: false, group: 0, param_len: list.len() as u16, control: 0 };
        self.run(lun, &cdb, Some(list.into()), 0).await.map(drop)
    }
}
