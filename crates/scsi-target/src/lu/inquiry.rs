//! INQUIRY: the standard data and the VPD pages (serial number, device identification, block
//! limits, block device characteristics, logical block provisioning, third-party copy).

use super::{LogicalUnit, MAX_ATOMIC_BLOCKS, MAX_TRANSFER_BLOCKS, Nexus, bad_field};
use riser_scsi::inquiry::{self, BlockDeviceCharacteristics, BlockLimits, Designator, LogicalBlockProvisioning, StandardInquiry, vpd};
use riser_scsi::sense::Sense;

impl LogicalUnit {
    pub(super) fn inquiry(&self, evpd: bool, page: u8, nexus: &Nexus) -> Result<Vec<u8>, Sense> {
        let dev = inquiry::DEVICE_TYPE_DISK;
        if !evpd {
            if page != 0 {
                return Err(bad_field(2, None));
            }
            let mut s = StandardInquiry::disk("RISER", "RISER DISK", "0001");
            s.version_descriptors = vec![0x00c0, 0x0960, 0x0600, 0x04c0];
            // TPGS 01b: implicit ALUA only (REPORT TARGET PORT GROUPS, no SET TARGET PORT
            // GROUPS); MULTIP once the unit's target port groups hold two ports or more.
            s.byte5 |= 0x10;
            if self.st().alua.ports() > 1 {
                s.byte6 |= 0x10;
            }
            // 3PC: EXTENDED COPY (see `copy`).
            s.byte5 |= 0x08;
            return Ok(s.to_bytes());
        }
        let body = match page {
            vpd::SUPPORTED_PAGES => vec![0x00, 0x80, 0x83, riser_scsi::copy::VPD_THIRD_PARTY_COPY, 0xb0, 0xb1, 0xb2],
            vpd::UNIT_SERIAL_NUMBER => self.identity.serial().into_bytes(),
            // The unit's designators come from its identity alone (no IEEE company ID: the NAA
            // is locally assigned), so every gateway exporting one store presents one device;
            // the target port's (its relative port, its ALUA group) are the nexus's.
            vpd::DEVICE_IDENTIFICATION => inquiry::device_identification(&[
                Designator::naa_locally_assigned(self.identity.naa()),
                Designator::t10_vendor("RISER", &self.identity.serial()),
                Designator::relative_target_port(nexus.relative_port()),
                Designator::target_port_group(nexus.port_group()),
            ]),
            vpd::BLOCK_LIMITS => {
                let thin = self.backend.thin();
                BlockLimits {
                    max_compare_and_write_len: self.compare_and_write_blocks(),
                    optimal_transfer_granularity: 1,
                    max_transfer_len: MAX_TRANSFER_BLOCKS,
                    optimal_transfer_len: 2048,
                    max_unmap_lba_count: if thin { 1 << 20 } else { 0 },
                    max_unmap_descriptor_count: if thin { 256 } else { 0 },
                    optimal_unmap_granularity: if thin { self.backend.unmap_granularity().max(1) } else { 1 },
                    unmap_granularity_alignment: thin.then_some(0),
                    // No limit: WRITE SAME moves no data over the wire.
                    max_write_same_len: 0,
                    // Without WRITE ATOMIC every atomic field is zero (SBC-4 §6.6.4; libiscsi's
                    // WriteAtomic16.VPD checks it).
                    max_atomic_transfer_len: if self.backend.atomic_writes() { MAX_ATOMIC_BLOCKS } else { 0 },
                    atomic_alignment: u32::from(self.backend.atomic_writes()),
                    atomic_granularity: u32::from(self.backend.atomic_writes()),
                    ..BlockLimits::default()
                }
                .to_body()
                .to_vec()
            }
            vpd::BLOCK_DEVICE_CHARACTERISTICS => BlockDeviceCharacteristics { rotation_rate: 1, form_factor: 0 }.to_body().to_vec(),
            vpd::LOGICAL_BLOCK_PROVISIONING => {
                let thin = self.backend.thin();
                LogicalBlockProvisioning {
                    lbpu: thin,
                    lbpws: thin,
                    lbpws10: thin,
                    lbprz: u8::from(thin),
                    provisioning_type: if thin { 2 } else { 0 },
                    ..Default::default()
                }
                .to_body()
                .to_vec()
            }
            riser_scsi::copy::VPD_THIRD_PARTY_COPY => self.third_party_copy_vpd(),
            _ => return Err(bad_field(2, None)),
        };
        Ok(inquiry::vpd_page(dev, page, &body))
    }
}
