//! iSER header and CM private data: total parsers, stable round trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iser::header::{CmPrivateData, IserHeader};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = IserHeader::parse(data) {
        let b = h.emit();
        assert_eq!(IserHeader::parse(&b).expect("an emitted header parses"), h);
    }
    let p = CmPrivateData::parse(data);
    assert_eq!(CmPrivateData::parse(&p.emit()), p);
});
