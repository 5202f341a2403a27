//! Every PDU captured from libiscsi's tools talking to tgtd (testdata/captures, see capture.sh
//! there) parses and re-emits byte-identically; text segments parse as key=value lists.

use riser_iscsi::text::parse_pairs;
use riser_iscsi::wire::{Header, Opcode, Pdu};
use std::path::PathBuf;

fn capture_files() -> Vec<PathBuf> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../testdata/captures");
    let mut files = Vec::new();
    for dir in std::fs::read_dir(&root).expect("testdata/captures") {
        let dir = dir.unwrap().path();
        if dir.is_dir() {
            for f in std::fs::read_dir(&dir).unwrap() {
                let f = f.unwrap().path();
                if f.extension().is_some_and(|e| e == "bin") {
                    files.push(f);
                }
            }
        }
    }
    files.sort();
    files
}

#[test]
fn captured_pdus_round_trip_byte_identically() {
    let files = capture_files();
    assert!(files.len() >= 200, "expected the captured corpus, found {} files", files.len());
    let mut opcodes = std::collections::BTreeSet::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let (pdu, used) = Pdu::parse(&bytes).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        assert_eq!(used, bytes.len(), "{}", f.display());
        assert!(!matches!(pdu.header, Header::Unknown(_)), "{}", f.display());
        let mut out = Vec::new();
        pdu.encode(&mut out);
        assert_eq!(out, bytes, "{} did not re-emit identically: {:?}", f.display(), pdu.header);
        opcodes.insert(pdu.header.opcode().0);
        if matches!(pdu.header.opcode(), Opcode::LOGIN_REQUEST | Opcode::LOGIN_RESPONSE | Opcode::TEXT_REQUEST | Opcode::TEXT_RESPONSE) {
            parse_pairs(pdu.data).unwrap_or_else(|e| panic!("{}: text: {e}", f.display()));
        }
    }
    // Login, Text, SCSI Command/Response, Data-In/Out, R2T, TMF, Logout and NOP all occur.
    for op in [0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x31] {
        assert!(opcodes.contains(&op), "no captured PDU with opcode {op:#x}: {opcodes:x?}");
    }
}
