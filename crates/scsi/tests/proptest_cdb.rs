//! Property tests for the SCSI codec: CDB values survive emit → parse; arbitrary bytes never
//! panic any parser and parse idempotently.

use proptest::prelude::*;
use riser_scsi::cdb::*;
use riser_scsi::sense::Sense;

fn rw() -> impl Strategy<Value = Rw> {
    prop_oneof![
        (0u64..0x20_0000, 0u32..256, any::<u8>()).prop_map(|(lba, blocks, control)| Rw {
            size: CdbSize::Six,
            lba,
            blocks,
            flags: 0,
            group: 0,
            control
        }),
        (any::<u32>(), any::<u16>(), any::<(u8, u8, u8)>()).prop_map(|(lba, b, (flags, group, control))| Rw {
            size: CdbSize::Ten,
            lba: lba.into(),
            blocks: b.into(),
            flags,
            group,
            control
        }),
        (any::<u32>(), any::<u32>(), any::<(u8, u8, u8)>()).prop_map(|(lba, blocks, (flags, group, control))| Rw {
            size: CdbSize::Twelve,
            lba: lba.into(),
            blocks,
            flags,
            group,
            control
        }),
        (any::<u64>(), any::<u32>(), any::<(u8, u8, u8)>()).prop_map(|(lba, blocks, (flags, group, control))| Rw {
            size: CdbSize::Sixteen,
            lba,
            blocks,
            flags,
            group,
            control
        }),
    ]
}

fn cdb() -> impl Strategy<Value = Cdb> {
    let ten_or_16 = || rw().prop_filter("10/16 only", |r| matches!(r.size, CdbSize::Ten | CdbSize::Sixteen));
    let not6 = || rw().prop_filter("no 6-byte form", |r| r.size != CdbSize::Six);
    prop_oneof![
        any::<u8>().prop_map(|control| Cdb::TestUnitReady { control }),
        any::<(bool, u8, u8)>().prop_map(|(desc, alloc_len, control)| Cdb::RequestSense { desc, alloc_len, control }),
        any::<(bool, u8, u16, u8)>()
            .prop_map(|(evpd, page_code, alloc_len, control)| { Cdb::Inquiry { evpd, page_code, alloc_len, control } }),
        any::<(u32, bool, u8)>().prop_map(|(lba, pmi, control)| Cdb::ReadCapacity10 { lba, pmi, control }),
        any::<(u64, u32, bool, u8)>().prop_map(|(lba, alloc_len, pmi, control)| { Cdb::ReadCapacity16 { lba, alloc_len, pmi, control } }),
        rw().prop_map(Cdb::Read),
        rw().prop_map(Cdb::Write),
        not6().prop_map(Cdb::WriteAndVerify),
        not6().prop_map(Cdb::Verify),
        ten_or_16().prop_map(Cdb::SynchronizeCache),
        ten_or_16().prop_map(Cdb::WriteSame),
        ten_or_16().prop_map(Cdb::PreFetch),
        any::<(u8, [u8; 5], u16, u8)>().prop_map(|(flags, reserved, param_len, control)| Cdb::Sanitize {
            flags,
            reserved,
            param_len,
            control
        }),
        any::<(u64, u16, u8, u8, u8)>().prop_map(|(lba, blocks, flags, group, control)| Cdb::WriteAtomic {
            lba,
            blocks,
            flags,
            group,
            control
        }),
        rw().prop_filter("16 only", |r| r.size == CdbSize::Sixteen).prop_map(Cdb::OrWrite),
        (any::<bool>(), any::<(u8, u32, u32, u8)>()).prop_map(|(twelve, (flags, index, alloc_len, control))| Cdb::ReadDefectData {
            twelve,
            flags,
            index: if twelve { index } else { 0 },
            alloc_len: if twelve { alloc_len } else { alloc_len & 0xffff },
            control,
        }),
        any::<(bool, u8, u16, u8)>().prop_map(|(anchor, group, param_len, control)| Cdb::Unmap { anchor, group, param_len, control }),
        any::<(u64, u8, u8, u8, u8)>()
            .prop_map(|(lba, blocks, flags, group, control)| { Cdb::CompareAndWrite { lba, blocks, flags, group, control } }),
        any::<(u64, u32, u8)>().prop_map(|(lba, alloc_len, control)| Cdb::GetLbaStatus { lba, alloc_len, control }),
        (any::<(bool, bool, bool)>(), 0u8..4, 0u8..64, any::<(u8, u16, u8)>()).prop_map(
            |((ten, dbd, llbaa), pc, page, (subpage, alloc_len, control))| {
                Cdb::ModeSense(ModeSense {
                    ten,
                    dbd,
                    llbaa: llbaa && ten,
                    pc,
                    page,
                    subpage,
                    alloc_len: if ten { alloc_len } else { alloc_len & 0xff },
                    control,
                })
            }
        ),
        any::<(bool, bool, bool, u16, u8)>().prop_map(|(ten, pf, sp, param_len, control)| {
            Cdb::ModeSelect(ModeSelect { ten, pf, sp, param_len: if ten { param_len } else { param_len & 0xff }, control })
        }),
        any::<(u8, u32, u8)>().prop_map(|(select, alloc_len, control)| Cdb::ReportLuns { select, alloc_len, control }),
        (any::<bool>(), 0u8..8, any::<(u8, u16, u32, u8)>()).prop_map(|(rctd, options, (opcode, service_action, alloc_len, control))| {
            Cdb::ReportSupportedOpcodes { rctd, options, opcode, service_action, alloc_len, control }
        }),
        (0u8..8, any::<(u32, u8)>()).prop_map(|(format, (alloc_len, control))| Cdb::ReportTargetPortGroups { format, alloc_len, control }),
        (any::<bool>(), 0u8..16, 0u8..16, any::<(bool, bool, bool, u8)>()).prop_map(
            |(immed, power_condition_modifier, power_condition, (no_flush, loej, start, control))| {
                Cdb::StartStopUnit { immed, power_condition_modifier, power_condition, no_flush, loej, start, control }
            }
        ),
        (0u8..4, any::<u8>()).prop_map(|(prevent, control)| Cdb::PreventAllowMediumRemoval { prevent, control }),
        any::<u8>().prop_map(|control| Cdb::Reserve6 { control }),
        any::<u8>().prop_map(|control| Cdb::Release6 { control }),
        any::<(bool, bool, u8, u16, u8)>().prop_map(|(third_party, longid, third_party_id, param_len, control)| Cdb::Reserve10 {
            third_party,
            longid,
            third_party_id,
            param_len,
            control
        }),
        any::<(bool, bool, u8, u16, u8)>().prop_map(|(third_party, longid, third_party_id, param_len, control)| Cdb::Release10 {
            third_party,
            longid,
            third_party_id,
            param_len,
            control
        }),
        (0u8..32, any::<(u16, u8)>())
            .prop_map(|(service_action, (alloc_len, control))| { Cdb::PersistentReserveIn { service_action, alloc_len, control } }),
        (0u8..32, 0u8..16, 0u8..16, any::<(u32, u8)>()).prop_map(|(service_action, scope, pr_type, (param_len, control))| {
            Cdb::PersistentReserveOut { service_action, scope, pr_type, param_len, control }
        }),
        (0u8..32, any::<(u32, u8)>()).prop_map(|(service_action, (param_len, control))| Cdb::ExtendedCopy {
            service_action,
            param_len,
            control
        }),
        (0u8..32, any::<(u8, u32, u8)>()).prop_map(|(service_action, (list_id, alloc_len, control))| {
            Cdb::ReceiveCopyResults { service_action, list_id, alloc_len, control }
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 3000, ..ProptestConfig::default() })]

    #[test]
    fn cdb_round_trip(c in cdb()) {
        let b = c.to_vec();
        prop_assert_eq!(b.len(), c.len());
        prop_assert_eq!(cdb_len(b[0]), Some(b.len()));
        prop_assert_eq!(Cdb::parse(&b).unwrap(), c);
    }

    #[test]
    fn cdb_parse_is_total_and_idempotent(bytes in prop::collection::vec(any::<u8>(), 0..20)) {
        if let Ok(c) = Cdb::parse(&bytes) {
            let again = Cdb::parse(&c.to_vec()).unwrap();
            prop_assert_eq!(again, c);
        }
    }

    #[test]
    fn sense_parse_is_total(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
        if let Ok(s) = Sense::parse(&bytes) {
            prop_assert_eq!(Sense::parse(&s.to_descriptor()).unwrap(), s.clone());
        }
    }

    #[test]
    fn payload_parsers_are_total(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        let _ = riser_scsi::inquiry::StandardInquiry::parse(&bytes);
        let _ = riser_scsi::inquiry::parse_vpd(&bytes).map(|(_, b)| riser_scsi::inquiry::parse_device_identification(b));
        let _ = riser_scsi::mode::parse_mode_parameters(false, &bytes);
        let _ = riser_scsi::mode::parse_mode_parameters(true, &bytes);
        let _ = riser_scsi::unmap::parse(&bytes);
        let _ = riser_scsi::report::parse_report_luns(&bytes);
        let _ = riser_scsi::report::parse_all_commands(&bytes);
        let _ = riser_scsi::capacity::parse_lba_status(&bytes);
        let _ = riser_scsi::pr::parse_read_keys(&bytes);
        let _ = riser_scsi::pr::parse_read_reservation(&bytes);
        let _ = riser_scsi::alua::TargetPortGroups::parse(&bytes);
        let limits = riser_scsi::copy::Limits { max_cscds: 2, max_segments: 2, max_list_len: 100, max_segment_bytes: 1 << 20 };
        let _ = riser_scsi::copy::ExtendedCopy::parse(&bytes, &limits);
        let _ = riser_scsi::copy::CopyStatus::parse(&bytes);
    }
}
