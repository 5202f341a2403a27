//! Sense data and the SCSI payload parsers.
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_scsi::{capacity, inquiry, mode, pr, report, sense::Sense, unmap};

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = Sense::parse(data) {
        assert_eq!(Sense::parse(&s.to_descriptor()).expect("descriptor sense parses"), s);
        let f = Sense::parse(&s.to_fixed()).expect("fixed sense parses");
        assert_eq!((f.key, f.asc), (s.key, s.asc));
    }
    let _ = inquiry::StandardInquiry::parse(data).map(|i| inquiry::StandardInquiry::parse(&i.to_bytes()).expect("inquiry"));
    if let Ok((_, body)) = inquiry::parse_vpd(data) {
        let _ = inquiry::parse_device_identification(body);
        let _ = inquiry::BlockLimits::parse(body);
        let _ = inquiry::LogicalBlockProvisioning::parse(body);
    }
    let _ = mode::parse_mode_parameters(data.first().is_some_and(|b| b & 1 == 1), data);
    let _ = unmap::parse(data);
    let _ = report::parse_report_luns(data);
    let _ = report::parse_all_commands(data);
    let _ = report::parse_one_command(data);
    let _ = capacity::Capacity16::parse(data);
    let _ = capacity::parse_lba_status(data);
    let _ = pr::parse_read_keys(data);
    let _ = pr::parse_read_reservation(data);
    let _ = pr::PrOutParams::parse(data);
});
