//! Tests of persistent reservations kept through a restart (APTPL) in the unit's persistent
//! reservation file, through the task-facing entry points (`plan`, `execute`).

use super::tests::{run_as as run, sense_of};
use super::*;
use crate::backend::RamBackend;
use riser_scsi::pr::{PrOutParams, caps, in_sa, out_sa, parse_read_keys, parse_read_reservation, pr_type};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use uuid::Uuid;

/// A fresh directory under the system's temporary directory, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!("riser-pr-{name}-{}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed)));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Self(p)
    }
    fn file(&self) -> PathBuf {
        self.0.join("lun0.pr")
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0).or_else(|_| std::fs::remove_file(&self.0));
    }
}

const UUID: Uuid = Uuid::from_u128(0x6f1c2d3e_4a5b_4c6d_8e7f_0123456789ab);

/// A unit as the target builds it after each (re)start, over the same store and identity.
fn unit(file: Option<&Path>) -> LogicalUnit {
    let lu = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::new(UUID));
    match file {
        Some(f) => lu.with_persistent_reservation_file(f.to_path_buf()).unwrap(),
        None => lu,
    }
}

/// Two nexuses: two initiators, through two target ports.
fn a() -> Nexus {
    Nexus::new("iqn.2026-11.io.riser:a,i,0x800000000001", "iqn.2026-11.io.riser:t,t,0x0001", 1)
}
fn b() -> Nexus {
    Nexus::new("iqn.2026-11.io.riser:b,i,0x800000000002", "iqn.2026-11.io.riser:t,t,0x0002", 2)
}

/// PERSISTENT RESERVE OUT with the basic 24-byte parameter list.
fn pr_out(lu: &LogicalUnit, n: &Nexus, sa: u8, ty: u8, key: u64, sa_key: u64, aptpl: bool) -> Outcome {
    let cdb = [0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0];
    run(lu, &cdb, &PrOutParams { key, sa_key, aptpl, ..Default::default() }.to_bytes(), n)
}

fn pr_in(lu: &LogicalUnit, sa: u8) -> Vec<u8> {
    let o = run(lu, &[0x5e, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[], &a());
    assert_eq!(o.status, Status::GOOD, "{o:?}");
    o.data.to_vec()
}

fn keys(lu: &LogicalUnit) -> (u32, Vec<u64>) {
    parse_read_keys(&pr_in(lu, in_sa::READ_KEYS)).unwrap()
}

fn reservation(lu: &LogicalUnit) -> Option<riser_scsi::pr::Reservation> {
    parse_read_reservation(&pr_in(lu, in_sa::READ_RESERVATION)).unwrap().1
}

/// REPORT CAPABILITIES bytes 2 and 3.
fn capabilities(lu: &LogicalUnit) -> (u8, u8) {
    let d = pr_in(lu, in_sa::REPORT_CAPABILITIES);
    (d[2], d[3])
}

/// The relative target port of each READ FULL STATUS descriptor.
fn full_status_ports(lu: &LogicalUnit) -> Vec<u16> {
    let d = pr_in(lu, in_sa::READ_FULL_STATUS);
    let (mut at, mut ports) = (8, Vec::new());
    while at < d.len() {
        ports.push(u16::from_be_bytes([d[at + 18], d[at + 19]]));
        at += 24 + u32::from_be_bytes(d[at + 20..at + 24].try_into().unwrap()) as usize;
    }
    ports
}

const WRITE10: [u8; 10] = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

#[test]
fn aptpl_registrations_and_reservation_survive_a_restart() {
    let dir = TempDir::new("restart");
    let file = dir.file();
    let lu = unit(Some(&file));
    assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, true).status, Status::GOOD);
    assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER_AND_IGNORE_EXISTING_KEY, 0, 0, 0xbbbb, true).status, Status::GOOD);
    // APTPL is ignored on RESERVE: the 0 here does not turn persistence off.
    assert_eq!(pr_out(&lu, &a(), out_sa::RESERVE, pr_type::WRITE_EXCLUSIVE, 0xaaaa, 0, false).status, Status::GOOD);
    assert_eq!(capabilities(&lu).1 & caps::BYTE3_PTPL_A, caps::BYTE3_PTPL_A);
    assert_eq!(keys(&lu), (2, vec![0xaaaa, 0xbbbb]));
    let mode = std::fs::metadata(&file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the file holds the keys: owner only");
    drop(lu);

    let lu = unit(Some(&file));
    // The PR generation restarts at zero on a power on, whatever APTPL says (SPC-5 §6.16.2).
    assert_eq!(keys(&lu), (0, vec![0xaaaa, 0xbbbb]));
    let r = reservation(&lu).expect("the reservation survived");
    assert_eq!((r.key, r.pr_type), (0xaaaa, pr_type::WRITE_EXCLUSIVE));
    assert_eq!(full_status_ports(&lu), [1, 2], "each registration keeps its nexus");
    assert_eq!(capabilities(&lu), (caps::BYTE2_CRH | caps::BYTE2_PTPL_C, caps::BYTE3_TMV | caps::BYTE3_PTPL_A));
    // And it is enforced: WRITE EXCLUSIVE lets only the holder write, everyone read.
    assert_eq!(run(&lu, &WRITE10, &[0; 512], &b()).status, Status::RESERVATION_CONFLICT);
    assert_eq!(run(&lu, &READ10, &[], &b()).status, Status::GOOD);
    assert_eq!(run(&lu, &WRITE10, &[0; 512], &a()).status, Status::GOOD);
    // The holder is known by its nexus, not only its key: it may release.
    assert_eq!(pr_out(&lu, &a(), out_sa::RELEASE, pr_type::WRITE_EXCLUSIVE, 0xaaaa, 0, false).status, Status::GOOD);
    // Changes after the restart are kept too: B leaves.
    assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER, 0, 0xbbbb, 0, true).status, Status::GOOD);
    drop(lu);

    let lu = unit(Some(&file));
    assert_eq!(keys(&lu), (0, vec![0xaaaa]));
    assert_eq!(reservation(&lu), None);
    assert_eq!(run(&lu, &WRITE10, &[0; 512], &b()).status, Status::GOOD);
}

#[test]
fn report_capabilities_says_ptpl_capable_with_a_file_and_active_while_on() {
    // Without a file: CRH and TMV only, as ever.
    assert_eq!(capabilities(&unit(None)), (0x10, 0x80));
    let dir = TempDir::new("caps");
    let lu = unit(Some(&dir.file()));
    assert_eq!(capabilities(&lu), (0x11, 0x80), "PTPL_C (byte 2 bit 0), not yet PTPL_A");
    assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 1, true).status, Status::GOOD);
    assert_eq!(capabilities(&lu), (0x11, 0x81), "PTPL_A (byte 3 bit 0)");
    // The most recent valid APTPL value governs, whoever sends it.
    assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER, 0, 0, 2, false).status, Status::GOOD);
    assert_eq!(capabilities(&lu), (0x11, 0x80));
}

#[test]
fn register_with_aptpl_0_removes_the_file_and_a_restart_starts_empty() {
    let dir = TempDir::new("off");
    let file = dir.file();
    let lu = unit(Some(&file));
    assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, true).status, Status::GOOD);
    assert_eq!(pr_out(&lu, &a(), out_sa::RESERVE, pr_type::EXCLUSIVE_ACCESS, 0xaaaa, 0, false).status, Status::GOOD);
    assert!(file.exists());
    assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER_AND_IGNORE_EXISTING_KEY, 0, 0, 0xbbbb, false).status, Status::GOOD);
    assert!(!file.exists(), "APTPL off: the state lives in memory only");
    assert_eq!(std::fs::read_dir(&dir.0).unwrap().count(), 0, "no temporary file left behind");
    // In memory it is all still there.
    assert_eq!(keys(&lu), (2, vec![0xaaaa, 0xbbbb]));
    assert!(reservation(&lu).is_some());
    // Further changes do not bring the file back.
    assert_eq!(pr_out(&lu, &a(), out_sa::RELEASE, pr_type::EXCLUSIVE_ACCESS, 0xaaaa, 0, false).status, Status::GOOD);
    assert!(!file.exists());
    drop(lu);

    let lu = unit(Some(&file));
    assert_eq!(keys(&lu), (0, vec![]));
    assert_eq!(reservation(&lu), None);
    assert_eq!(capabilities(&lu), (0x11, 0x80));
}

/// The PERSISTENT RESERVE OUT failed as one that cannot keep its state: not GOOD, ILLEGAL
/// REQUEST / INSUFFICIENT REGISTRATION RESOURCES.
fn assert_not_kept(o: &Outcome) {
    let s = sense_of(o);
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES));
}

#[test]
fn a_state_that_cannot_be_written_is_refused_and_left_as_it_was() {
    // A file in a directory that does not exist (as root, permission bits would not stop us).
    let dir = TempDir::new("unwritable");
    let lu = unit(Some(&dir.0.join("missing").join("lun0.pr")));
    assert_not_kept(&pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, true));
    assert_eq!(keys(&lu), (0, vec![]), "nothing registered, the generation unmoved");
    assert_eq!(capabilities(&lu), (0x11, 0x80), "APTPL not active");

    // Persistence active, then the directory is replaced by a file.
    let file = dir.file();
    let lu = unit(Some(&file));
    assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, true).status, Status::GOOD);
    std::fs::remove_dir_all(&dir.0).unwrap();
    std::fs::write(&dir.0, b"in the way").unwrap();
    assert_not_kept(&pr_out(&lu, &b(), out_sa::REGISTER, 0, 0, 0xbbbb, true));
    assert_not_kept(&pr_out(&lu, &a(), out_sa::RESERVE, pr_type::WRITE_EXCLUSIVE, 0xaaaa, 0, false));
    assert_not_kept(&pr_out(&lu, &a(), out_sa::REGISTER, 0, 0xaaaa, 0xcccc, true));
    // Turning APTPL off cannot remove the file either: still on.
    assert_not_kept(&pr_out(&lu, &a(), out_sa::REGISTER, 0, 0xaaaa, 0xaaaa, false));
    assert_eq!(keys(&lu), (1, vec![0xaaaa]));
    assert_eq!(reservation(&lu), None);
    assert_eq!(capabilities(&lu), (0x11, 0x81));
    assert_eq!(run(&lu, &WRITE10, &[0; 512], &b()).status, Status::GOOD, "no reservation took hold");
    assert_eq!(full_status_ports(&lu), [1]);

    // The directory back: the same command now succeeds and is kept.
    std::fs::remove_file(&dir.0).unwrap();
    std::fs::create_dir(&dir.0).unwrap();
    assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER, 0, 0, 0xbbbb, true).status, Status::GOOD);
    drop(lu);
    assert_eq!(keys(&unit(Some(&file))), (0, vec![0xaaaa, 0xbbbb]));
}

#[test]
fn a_malformed_file_is_refused_with_its_path() {
    let dir = TempDir::new("malformed");
    let file = dir.file();
    let good = "riser-pr-state 1\naptpl 1\nregistration iqn.a,i,0x1 iqn.t,t,0x0001 1 0x000000000000aaaa\nend\n";
    std::fs::write(&file, good).unwrap();
    assert_eq!(keys(&unit(Some(&file))), (0, vec![0xaaaa]), "a hand-written file of the format loads");
    for bad in [
        "garbage\n",
        "",
        "riser-pr-state 9\naptpl 1\nend\n",
        // Cut short: the registration might be followed by others.
        "riser-pr-state 1\naptpl 1\nregistration iqn.a,i,0x1 iqn.t,t,0x0001 1 0x000000000000aaaa\n",
        "riser-pr-state 1\naptpl 1\nregistration iqn.a,i,0x1 iqn.t,t,0x0001 0x000000000000aaaa\nend\n",
    ] {
        std::fs::write(&file, bad).unwrap();
        let lu = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::new(UUID));
        let e = lu.with_persistent_reservation_file(file.clone()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData, "{bad:?}: {e}");
        assert!(e.to_string().contains(&*file.to_string_lossy()), "the error names the file: {e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), bad, "the file is left for an operator to look at");
    }
    std::fs::write(&file, [0xff, 0xfe]).unwrap();
    let lu = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::new(UUID));
    assert_eq!(lu.with_persistent_reservation_file(file).unwrap_err().kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn without_a_file_aptpl_is_refused() {
    let lu = unit(None);
    for sa in [out_sa::REGISTER, out_sa::REGISTER_AND_IGNORE_EXISTING_KEY] {
        let s = sense_of(&pr_out(&lu, &a(), sa, 0, 0, 0xaaaa, true));
        assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST));
    }
    assert_eq!(keys(&lu), (0, vec![]));
    assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, false).status, Status::GOOD);
    assert_eq!(keys(&lu), (1, vec![0xaaaa]));
}

#[test]
fn a_failed_service_action_changes_nothing() {
    // PREEMPT with an invalid type fails after it would have removed the victim's registration:
    // the work is done on a copy, so the victim stays registered and the generation unmoved.
    for file in [None, Some(TempDir::new("preempt"))] {
        let lu = unit(file.as_ref().map(|d| d.file()).as_deref());
        let aptpl = file.is_some();
        assert_eq!(pr_out(&lu, &a(), out_sa::REGISTER, 0, 0, 0xaaaa, aptpl).status, Status::GOOD);
        assert_eq!(pr_out(&lu, &b(), out_sa::REGISTER, 0, 0, 0xbbbb, aptpl).status, Status::GOOD);
        assert_eq!(pr_out(&lu, &b(), out_sa::RESERVE, pr_type::WRITE_EXCLUSIVE, 0xbbbb, 0, false).status, Status::GOOD);
        let s = sense_of(&pr_out(&lu, &a(), out_sa::PREEMPT, 0x0f, 0xaaaa, 0xbbbb, false));
        assert_eq!(s.asc, AscAscq::INVALID_FIELD_IN_CDB);
        assert_eq!(keys(&lu), (2, vec![0xaaaa, 0xbbbb]));
        assert_eq!(reservation(&lu).map(|r| r.key), Some(0xbbbb));
        if let Some(d) = &file {
            drop(lu);
            assert_eq!(keys(&unit(Some(&d.file()))).1, [0xaaaa, 0xbbbb]);
        }
    }
}

/// A unit keeps `MAX_REGISTRATIONS` registrations: one more (another I_T nexus) is refused with
/// INSUFFICIENT REGISTRATION RESOURCES and nothing changes; a registered nexus still changes its
/// key, and once one unregisters another may register.
#[test]
fn registrations_beyond_the_units_bound_are_refused() {
    let lu = unit(None);
    let nexus = |i: usize| Nexus::new(&format!("iqn.2026-11.io.riser:i{i},i,0x80000000{i:04x}"), "iqn.2026-11.io.riser:t,t,0x0001", 1);
    for i in 0..MAX_REGISTRATIONS {
        assert_eq!(pr_out(&lu, &nexus(i), out_sa::REGISTER, 0, 0, 1 + i as u64, false).status, Status::GOOD);
    }
    let over = MAX_REGISTRATIONS;
    let generation = keys(&lu).0;
    let s = sense_of(&pr_out(&lu, &nexus(over), out_sa::REGISTER_AND_IGNORE_EXISTING_KEY, 0, 0, 7, false));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INSUFFICIENT_REGISTRATION_RESOURCES));
    assert_eq!(keys(&lu).0, generation, "nothing changed");
    assert_eq!(lu.st().pr.registrations.len(), over);
    assert_eq!(pr_out(&lu, &nexus(0), out_sa::REGISTER, 0, 1, 99, false).status, Status::GOOD, "a new key for a registered nexus");
    assert_eq!(keys(&lu).0, generation.wrapping_add(1));
    assert_eq!(pr_out(&lu, &nexus(1), out_sa::REGISTER, 0, 2, 0, false).status, Status::GOOD, "unregistered");
    assert_eq!(pr_out(&lu, &nexus(over), out_sa::REGISTER, 0, 0, 7, false).status, Status::GOOD, "room again");
}
