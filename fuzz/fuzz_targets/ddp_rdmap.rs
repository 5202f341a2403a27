//! DDP segment headers and RDMAP bodies (Read Request, Terminate): total parsers, stable
//! round trips.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iwarp::wire::{Header, ReadRequest, TerminateMsg};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::parse(data) {
        let mut b = [0u8; 32];
        let n = h.emit(&mut b);
        assert_eq!(Header::parse(&b[..n]).expect("an emitted header parses"), h);
    }
    if let Ok(r) = ReadRequest::parse(data) {
        assert_eq!(ReadRequest::parse(&r.emit()).expect("emitted"), r);
    }
    if let Ok(t) = TerminateMsg::parse(data) {
        let _ = TerminateMsg::parse(&t.emit()).expect("an emitted Terminate parses");
    }
});
