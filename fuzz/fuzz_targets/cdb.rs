//! CDB parser: total, and idempotent through emit.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_scsi::cdb::Cdb;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Cdb::parse(data) {
        let b = c.to_vec();
        assert_eq!(b.len(), c.len());
        assert_eq!(Cdb::parse(&b).expect("emitted CDB parses"), c);
        let _ = c.data_out_len(512);
    }
});
