//! Thin provisioning of file-backed units, through the unit's commands: UNMAP and WRITE SAME
//! with UNMAP punch holes in the file, GET LBA STATUS reads the file's extents, and the
//! provisioning pages (Logical Block Provisioning, Block Limits, READ CAPACITY (16)) say what
//! the unit does.

use super::tests::{cdb16, run};
use super::*;
use crate::backend::{FileBackend, FileOptions, RamBackend};
use riser_scsi::capacity::{Capacity16, LbaStatusDescriptor, parse_lba_status};
use riser_scsi::cdb::op;
use riser_scsi::inquiry::{BlockLimits, LogicalBlockProvisioning, parse_vpd};
use riser_scsi::unmap::UnmapDescriptor;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The unit's block size; the files' units have [`BLOCKS`] of them (4 MiB).
const BS: u64 = 512;
const BLOCKS: u64 = 8192;

/// A scratch file in the temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let p = std::env::temp_dir().join(format!("riser-thin-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        Self(p)
    }
    /// Bytes the file system holds for the file.
    fn allocated(&self) -> u64 {
        std::fs::metadata(&self.0).unwrap().blocks() * 512
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Whether the file system holding `dir` is one known to punch holes (ext4, XFS, btrfs,
/// tmpfs): a file there must be thin.
fn known_to_punch(dir: &Path) -> bool {
    const MAGICS: [u64; 4] = [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994];
    rustix::fs::statfs(dir).ok().and_then(|s| u64::try_from(s.f_type).ok()).is_some_and(|t| MAGICS.contains(&t))
}

/// Run a command that must succeed; its data-in.
fn good(lu: &LogicalUnit, cdb: &[u8], out: &[u8]) -> Bytes {
    let o = run(lu, cdb, out);
    assert_eq!(o.status, Status::GOOD, "{cdb:02x?}: {:02x?}", o.sense);
    o.data
}

fn write(lu: &LogicalUnit, lba: u64, data: &[u8]) {
    good(lu, &cdb16(op::WRITE_16, 0, lba, (data.len() as u64 / BS) as u32), data);
}

fn read(lu: &LogicalUnit, lba: u64, blocks: u32) -> Bytes {
    good(lu, &cdb16(op::READ_16, 0, lba, blocks), &[])
}

fn sync(lu: &LogicalUnit) {
    good(lu, &[op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
}

fn unmap(lu: &LogicalUnit, lba: u64, blocks: u32) {
    let params = riser_scsi::unmap::to_bytes(&[UnmapDescriptor { lba, blocks }]);
    let mut cdb = [0u8; 10];
    cdb[0] = op::UNMAP;
    cdb[7..9].copy_from_slice(&(params.len() as u16).to_be_bytes());
    good(lu, &cdb, &params);
}

fn lba_status(lu: &LogicalUnit, lba: u64, alloc_len: u32) -> Vec<LbaStatusDescriptor> {
    let mut cdb = cdb16(op::SERVICE_ACTION_IN_16, op::SA_GET_LBA_STATUS, lba, alloc_len);
    cdb[1] = op::SA_GET_LBA_STATUS;
    parse_lba_status(&good(lu, &cdb, &[])).unwrap()
}

fn d(lba: u64, blocks: u32, status: u8) -> LbaStatusDescriptor {
    LbaStatusDescriptor { lba, blocks, status }
}

fn vpd(lu: &LogicalUnit, page: u8) -> Vec<u8> {
    let data = good(lu, &[op::INQUIRY, 1, page, 0x10, 0, 0], &[]);
    parse_vpd(&data).unwrap().1.to_vec()
}

/// The provisioning as the unit reports it: the Logical Block Provisioning page, the Block
/// Limits page and READ CAPACITY (16).
fn pages(lu: &LogicalUnit) -> (LogicalBlockProvisioning, BlockLimits, Capacity16) {
    let lbp = LogicalBlockProvisioning::parse(&vpd(lu, 0xb2)).unwrap();
    let limits = BlockLimits::parse(&vpd(lu, 0xb0)).unwrap();
    let cap = Capacity16::parse(&good(lu, &cdb16(op::SERVICE_ACTION_IN_16, op::SA_READ_CAPACITY_16, 0, 32), &[])).unwrap();
    (lbp, limits, cap)
}

/// Every page says "not thin": no UNMAP, no LBPME, no LBPRZ.
fn assert_not_thin(lu: &LogicalUnit) {
    let (lbp, limits, cap) = pages(lu);
    assert!(!lbp.lbpu && !lbp.lbpws && !lbp.lbpws10 && lbp.lbprz == 0 && lbp.provisioning_type == 0, "{lbp:?}");
    assert_eq!((limits.max_unmap_lba_count, limits.max_unmap_descriptor_count), (0, 0));
    assert!(!cap.lbpme && !cap.lbprz, "{cap:?}");
}

/// Every page says "thin": UNMAP and WRITE SAME with UNMAP, LBPME and LBPRZ.
fn assert_thin(lu: &LogicalUnit) {
    let (lbp, limits, cap) = pages(lu);
    assert!(lbp.lbpu && lbp.lbpws && lbp.lbpws10 && lbp.lbprz == 1 && lbp.provisioning_type == 2, "{lbp:?}");
    assert!(limits.max_unmap_lba_count > 0 && limits.max_unmap_descriptor_count > 0, "{limits:?}");
    assert!(cap.lbpme && cap.lbprz, "{cap:?}");
}

fn file_unit(s: &Scratch, options: FileOptions) -> (bool, LogicalUnit) {
    let b = FileBackend::open_with(&s.0, Some(BLOCKS * BS), BS as u32, options).unwrap();
    (b.thin(), LogicalUnit::new(Arc::new(b), LuIdentity::random()))
}

#[test]
fn unmap_punches_holes_in_a_thin_file_and_get_lba_status_reads_them() {
    let s = Scratch::new("punch");
    let (thin, lu) = file_unit(&s, FileOptions::default());
    let dir = std::env::temp_dir();
    if known_to_punch(&dir) {
        assert!(thin, "{}: its file system punches holes, so the unit is thin", dir.display());
    }
    if !thin {
        // A file system that cannot punch: the unit must not claim to be thin.
        assert_not_thin(&lu);
        return;
    }
    assert_thin(&lu);
    let fs_block = rustix::fs::statfs(dir.as_path()).unwrap().f_bsize as u64;
    let (_, limits, _) = pages(&lu);
    assert_eq!(u64::from(limits.optimal_unmap_granularity), (fs_block / BS).max(1), "a file system block");

    assert_eq!(lba_status(&lu, 0, 4096), [d(0, BLOCKS as u32, 1)], "a new file is one hole");
    let data = vec![0xa5; 4096 * BS as usize];
    write(&lu, 0, &data);
    sync(&lu);
    assert_eq!(lba_status(&lu, 0, 4096), [d(0, 4096, 0), d(4096, 4096, 1)]);
    let before = s.allocated();
    assert!(before >= 4096 * BS, "{before} bytes allocated");

    unmap(&lu, 512, 1024);
    let freed = before.saturating_sub(s.allocated());
    assert!(freed >= 1024 * BS - 2 * fs_block, "UNMAP of 512 KiB freed {freed} bytes");
    assert!(read(&lu, 512, 1024).iter().all(|&b| b == 0), "deallocated blocks read as zeros");
    assert_eq!(read(&lu, 511, 1), data[..BS as usize]);
    assert_eq!(read(&lu, 1536, 1), data[..BS as usize]);
    assert_eq!(lba_status(&lu, 0, 4096), [d(0, 512, 0), d(512, 1024, 1), d(1536, 2560, 0), d(4096, 4096, 1)]);
    assert_eq!(lba_status(&lu, 600, 4096)[0], d(600, 936, 1), "from the LBA asked for");
    // As many descriptors as the allocation length holds.
    assert_eq!(lba_status(&lu, 0, 8 + 16), [d(0, 512, 0)]);
    assert_eq!(lba_status(&lu, 0, 8 + 32), [d(0, 512, 0), d(512, 1024, 1)]);

    // WRITE SAME (16) with UNMAP deallocates too.
    let before = s.allocated();
    good(&lu, &cdb16(op::WRITE_SAME_16, rw_flags::UNMAP, 2048, 1024), &[0; BS as usize]);
    let freed = before.saturating_sub(s.allocated());
    assert!(freed >= 1024 * BS - 2 * fs_block, "WRITE SAME with UNMAP of 512 KiB freed {freed} bytes");
    assert_eq!(lba_status(&lu, 1536, 4096)[..2], [d(1536, 512, 0), d(2048, 1024, 1)]);

    // Less than a file system block: zeroed, but the block around it still holds data.
    if fs_block > BS {
        unmap(&lu, 3073, 1);
        assert!(read(&lu, 3073, 1).iter().all(|&b| b == 0));
        assert_eq!(read(&lu, 3074, 1), data[..BS as usize]);
        assert_eq!(lba_status(&lu, 3073, 4096)[0].status, 0, "a block in a file system block with data is mapped");
    }
}

#[test]
fn a_file_with_thin_provisioning_off_keeps_every_block() {
    let s = Scratch::new("thick");
    let (thin, lu) = file_unit(&s, FileOptions { thin: Some(false) });
    assert!(!thin);
    assert_not_thin(&lu);
    // Unwritten blocks of the sparse file are mapped as far as the unit says.
    assert_eq!(lba_status(&lu, 0, 4096), [d(0, BLOCKS as u32, 0)]);
    write(&lu, 0, &vec![0x3c; 4096 * BS as usize]);
    sync(&lu);
    let before = s.allocated();
    // UNMAP still runs (it writes zeros) but deallocates nothing.
    unmap(&lu, 512, 1024);
    sync(&lu);
    assert!(s.allocated() >= before, "{} bytes allocated, {before} before", s.allocated());
    assert!(read(&lu, 512, 1024).iter().all(|&b| b == 0));
    assert_eq!(lba_status(&lu, 0, 4096), [d(0, BLOCKS as u32, 0)]);
}

#[test]
fn thin_provisioning_required_is_had_or_refused() {
    let s = Scratch::new("required");
    let required = FileOptions::default().with_thin(Some(true));
    match FileBackend::open_with(&s.0, Some(BLOCKS * BS), BS as u32, required) {
        Ok(b) => assert!(b.thin()),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
            assert!(!known_to_punch(&std::env::temp_dir()), "refused where holes can be punched: {e}");
        }
    }
}

#[test]
fn a_ram_unit_reports_its_runs_in_several_descriptors() {
    let lu = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random());
    assert_thin(&lu);
    write(&lu, 10, &[1; 10 * BS as usize]);
    write(&lu, 100, &[1; 64 * BS as usize]);
    unmap(&lu, 120, 4);
    assert_eq!(
        lba_status(&lu, 0, 4096),
        [d(0, 10, 1), d(10, 10, 0), d(20, 80, 1), d(100, 20, 0), d(120, 4, 1), d(124, 40, 0), d(164, 1884, 1)]
    );
    assert_eq!(lba_status(&lu, 15, 8 + 16), [d(15, 5, 0)]);
}
