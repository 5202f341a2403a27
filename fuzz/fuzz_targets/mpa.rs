//! MPA request/reply frames: the parser is total, and emit/parse is stable.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_iwarp::wire::MpaFrame;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = MpaFrame::parse(data) {
        let b = f.emit();
        let g = MpaFrame::parse(&b).expect("an emitted frame parses");
        assert_eq!(g.emit(), b);
        assert_eq!(g.private_data, f.private_data);
    }
});
