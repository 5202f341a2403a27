//! INQUIRY data (SPC-5 §6.7): the standard data and the VPD pages a block target serves.

use crate::Error;
use crate::be::{need, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use alloc::vec::Vec;

/// Peripheral device type: direct-access block device.
pub const DEVICE_TYPE_DISK: u8 = 0x00;
/// Byte 0 for a LUN that is not present (qualifier 011b, type 1Fh).
pub const NOT_PRESENT: u8 = 0x7f;

/// Copy `s` into a space-padded ASCII field.
pub fn ascii_field<const N: usize>(s: &str) -> [u8; N] {
    let mut f = [b' '; N];
    for (d, c) in f.iter_mut().zip(s.bytes()) {
        *d = if c.is_ascii_graphic() || c == b' ' { c } else { b'?' };
    }
    f
}

/// Standard INQUIRY data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StandardInquiry {
    /// Byte 0: peripheral qualifier (bits 7-5) and device type (bits 4-0).
    pub peripheral: u8,
    /// Removable medium.
    pub rmb: bool,
    /// VERSION (0x06 SPC-4, 0x07 SPC-5).
    pub version: u8,
    /// Byte 3 flags (NORMACA 0x20, HISUP 0x10) with response data format in bits 3-0.
    pub byte3: u8,
    /// Byte 5 (SCCS 0x80, ACC, TPGS bits 5-4, 3PC 0x08, PROTECT 0x01).
    pub byte5: u8,
    /// Byte 6 (ENCSERV 0x40, MULTIP 0x10…).
    pub byte6: u8,
    /// Byte 7 (CMDQUE 0x02).
    pub byte7: u8,
    /// T10 vendor identification.
    pub vendor: [u8; 8],
    /// Product identification.
    pub product: [u8; 16],
    /// Product revision level.
    pub revision: [u8; 4],
    /// Version descriptors (bytes 58..), at most 8.
    pub version_descriptors: Vec<u16>,
}

impl StandardInquiry {
    /// A direct-access block device with command queueing, SPC-4, HISUP, response format 2.
    pub fn disk(vendor: &str, product: &str, revision: &str) -> Self {
        Self {
            peripheral: DEVICE_TYPE_DISK,
            rmb: false,
            // SPC-4: what initiators (and libiscsi's conformance suite) accept.
            version: 0x06,
            byte3: 0x10 | 0x02,
            byte5: 0,
            byte6: 0,
            byte7: 0x02,
            vendor: ascii_field(vendor),
            product: ascii_field(product),
            revision: ascii_field(revision),
            version_descriptors: Vec::new(),
        }
    }

    /// Encode: 36 bytes, or 58 + 2 per version descriptor when there are any.
    pub fn to_bytes(&self) -> Vec<u8> {
        let len = if self.version_descriptors.is_empty() { 36 } else { 58 + 2 * self.version_descriptors.len().min(8) };
        let mut b = alloc::vec![0u8; len];
        b[0] = self.peripheral;
        b[1] = if self.rmb { 0x80 } else { 0 };
        b[2] = self.version;
        b[3] = self.byte3;
        b[4] = (len - 5) as u8;
        b[5] = self.byte5;
        b[6] = self.byte6;
        b[7] = self.byte7;
        b[8..16].copy_from_slice(&self.vendor);
        b[16..32].copy_from_slice(&self.product);
        b[32..36].copy_from_slice(&self.revision);
        for (i, d) in self.version_descriptors.iter().take(8).enumerate() {
            put_u16(&mut b, 58 + 2 * i, *d);
        }
        b
    }

    /// Parse (at least 36 bytes).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("standard INQUIRY data", b, 36)?;
        let end = (usize::from(b[4]) + 5).min(b.len());
        let mut version_descriptors = Vec::new();
        let mut at = 58;
        while at + 2 <= end && version_descriptors.len() < 8 {
            let d = u16_at(b, at);
            if d != 0 {
                version_descriptors.push(d);
            }
            at += 2;
        }
        let mut s = Self {
            peripheral: b[0],
            rmb: b[1] & 0x80 != 0,
            version: b[2],
            byte3: b[3],
            byte5: b[5],
            byte6: b[6],
            byte7: b[7],
            vendor: [0; 8],
            product: [0; 16],
            revision: [0; 4],
            version_descriptors,
        };
        s.vendor.copy_from_slice(&b[8..16]);
        s.product.copy_from_slice(&b[16..32]);
        s.revision.copy_from_slice(&b[32..36]);
        Ok(s)
    }
}

/// VPD page codes.
#[allow(missing_docs)]
pub mod vpd {
    pub const SUPPORTED_PAGES: u8 = 0x00;
    pub const UNIT_SERIAL_NUMBER: u8 = 0x80;
    pub const DEVICE_IDENTIFICATION: u8 = 0x83;
    pub const BLOCK_LIMITS: u8 = 0xb0;
    pub const BLOCK_DEVICE_CHARACTERISTICS: u8 = 0xb1;
    pub const LOGICAL_BLOCK_PROVISIONING: u8 = 0xb2;
}

/// Wrap a VPD page body with its 4-byte header.
pub fn vpd_page(peripheral: u8, page: u8, body: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(4 + body.len());
    b.extend_from_slice(&[peripheral, page, 0, 0]);
    put_u16(&mut b, 2, body.len() as u16);
    b.extend_from_slice(body);
    b
}

/// Split a VPD page into (page code, body), checking the header.
pub fn parse_vpd(b: &[u8]) -> Result<(u8, &[u8]), Error> {
    need("VPD page", b, 4)?;
    let len = usize::from(u16_at(b, 2));
    need("VPD page", b, 4 + len)?;
    Ok((b[1], &b[4..4 + len]))
}

/// Designator association (bits 5-4 of byte 1).
#[allow(missing_docs)]
pub mod association {
    pub const LOGICAL_UNIT: u8 = 0;
    pub const TARGET_PORT: u8 = 1;
    pub const TARGET_DEVICE: u8 = 2;
}

/// Designator types (bits 3-0 of byte 1).
#[allow(missing_docs)]
pub mod designator_type {
    pub const VENDOR_SPECIFIC: u8 = 0;
    pub const T10_VENDOR_ID: u8 = 1;
    pub const EUI64: u8 = 2;
    pub const NAA: u8 = 3;
    pub const RELATIVE_TARGET_PORT: u8 = 4;
    pub const TARGET_PORT_GROUP: u8 = 5;
    pub const SCSI_NAME_STRING: u8 = 8;
}

/// One designation descriptor of the Device Identification page (0x83).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Designator {
    /// Protocol identifier (5 = iSCSI), meaningful when `piv`.
    pub protocol: u8,
    /// Code set: 1 binary, 2 ASCII, 3 UTF-8.
    pub code_set: u8,
    /// Protocol identifier valid.
    pub piv: bool,
    /// Association.
    pub association: u8,
    /// Designator type.
    pub kind: u8,
    /// The designator bytes.
    pub value: Vec<u8>,
}

impl Designator {
    /// NAA IEEE Registered Extended (NAA 6): 16 bytes from a 24-bit OUI and a 100-bit
    /// vendor-specific value (here: 36 bits + 64 bits extension), association logical unit.
    pub fn naa_registered_extended(oui: u32, vendor_specific: u64, extension: u64) -> Self {
        let mut v = alloc::vec![0u8; 16];
        let hi = (6u64 << 60) | (u64::from(oui & 0xff_ffff) << 36) | (vendor_specific & 0xf_ffff_ffff);
        put_u64(&mut v, 0, hi);
        put_u64(&mut v, 8, extension);
        Self { protocol: 0, code_set: 1, piv: false, association: association::LOGICAL_UNIT, kind: designator_type::NAA, value: v }
    }

    /// NAA Locally Assigned (NAA 3, SPC-5 §7.7.6.6.3): 8 bytes, the NAA nibble then a 60-bit
    /// value the assigner keeps unique (no IEEE company ID), association logical unit.
    pub fn naa_locally_assigned(value: u64) -> Self {
        let mut v = alloc::vec![0u8; 8];
        put_u64(&mut v, 0, (3u64 << 60) | (value & 0x0fff_ffff_ffff_ffff));
        Self { protocol: 0, code_set: 1, piv: false, association: association::LOGICAL_UNIT, kind: designator_type::NAA, value: v }
    }

    /// Target port group designator (association target port): the ALUA target port group
    /// the port belongs to.
    pub fn target_port_group(group: u16) -> Self {
        let mut v = alloc::vec![0u8; 4];
        put_u16(&mut v, 2, group);
        Self {
            protocol: 0,
            code_set: 1,
            piv: false,
            association: association::TARGET_PORT,
            kind: designator_type::TARGET_PORT_GROUP,
            value: v,
        }
    }

    /// T10 vendor ID based designator: 8-byte vendor then an identifier (ASCII).
    pub fn t10_vendor(vendor: &str, id: &str) -> Self {
        let mut v = ascii_field::<8>(vendor).to_vec();
        v.extend(id.bytes());
        Self {
            protocol: 0,
            code_set: 2,
            piv: false,
            association: association::LOGICAL_UNIT,
            kind: designator_type::T10_VENDOR_ID,
            value: v,
        }
    }

    /// Relative target port identifier (association target port, iSCSI protocol).
    pub fn relative_target_port(port: u16) -> Self {
        let mut v = alloc::vec![0u8; 4];
        put_u16(&mut v, 2, port);
        Self {
            protocol: 5,
            code_set: 1,
            piv: true,
            association: association::TARGET_PORT,
            kind: designator_type::RELATIVE_TARGET_PORT,
            value: v,
        }
    }

    /// SCSI name string (UTF-8, NUL-terminated, padded to a multiple of 4).
    pub fn scsi_name(name: &str, association: u8) -> Self {
        let mut v: Vec<u8> = name.bytes().collect();
        v.push(0);
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
        Self { protocol: 5, code_set: 3, piv: true, association, kind: designator_type::SCSI_NAME_STRING, value: v }
    }

    fn emit(&self, out: &mut Vec<u8>) {
        out.push((self.protocol << 4) | (self.code_set & 0x0f));
        out.push(if self.piv { 0x80 } else { 0 } | ((self.association & 3) << 4) | (self.kind & 0x0f));
        out.push(0);
        out.push(self.value.len() as u8);
        out.extend_from_slice(&self.value);
    }
}

/// Device Identification VPD page body from designators.
pub fn device_identification(designators: &[Designator]) -> Vec<u8> {
    let mut body = Vec::new();
    for d in designators {
        d.emit(&mut body);
    }
    body
}

/// Parse a Device Identification page body into designators.
pub fn parse_device_identification(mut body: &[u8]) -> Result<Vec<Designator>, Error> {
    let mut out = Vec::new();
    while !body.is_empty() {
        need("designation descriptor", body, 4)?;
        let len = usize::from(body[3]);
        need("designation descriptor", body, 4 + len)?;
        out.push(Designator {
            protocol: body[0] >> 4,
            code_set: body[0] & 0x0f,
            piv: body[1] & 0x80 != 0,
            association: (body[1] >> 4) & 3,
            kind: body[1] & 0x0f,
            value: body[4..4 + len].to_vec(),
        });
        body = &body[4 + len..];
    }
    Ok(out)
}

/// Block Limits VPD page (0xB0), SBC-4 §6.6.4. Body is 0x3C bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct BlockLimits {
    pub wsnz: bool,
    pub max_compare_and_write_len: u8,
    pub optimal_transfer_granularity: u16,
    pub max_transfer_len: u32,
    pub optimal_transfer_len: u32,
    pub max_prefetch_len: u32,
    pub max_unmap_lba_count: u32,
    pub max_unmap_descriptor_count: u32,
    pub optimal_unmap_granularity: u32,
    /// UNMAP GRANULARITY ALIGNMENT with UGAVALID.
    pub unmap_granularity_alignment: Option<u32>,
    pub max_write_same_len: u64,
    /// MAXIMUM ATOMIC TRANSFER LENGTH (blocks; 0 = WRITE ATOMIC not supported).
    pub max_atomic_transfer_len: u32,
    /// ATOMIC ALIGNMENT (blocks).
    pub atomic_alignment: u32,
    /// ATOMIC TRANSFER LENGTH GRANULARITY (blocks).
    pub atomic_granularity: u32,
}

impl BlockLimits {
    /// Body length.
    pub const LEN: usize = 0x3c;

    /// Encode the page body.
    pub fn to_body(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[0] = u8::from(self.wsnz);
        b[1] = self.max_compare_and_write_len;
        put_u16(&mut b, 2, self.optimal_transfer_granularity);
        put_u32(&mut b, 4, self.max_transfer_len);
        put_u32(&mut b, 8, self.optimal_transfer_len);
        put_u32(&mut b, 12, self.max_prefetch_len);
        put_u32(&mut b, 16, self.max_unmap_lba_count);
        put_u32(&mut b, 20, self.max_unmap_descriptor_count);
        put_u32(&mut b, 24, self.optimal_unmap_granularity);
        if let Some(a) = self.unmap_granularity_alignment {
            put_u32(&mut b, 28, 0x8000_0000 | (a & 0x7fff_ffff));
        }
        put_u64(&mut b, 32, self.max_write_same_len);
        put_u32(&mut b, 40, self.max_atomic_transfer_len);
        put_u32(&mut b, 44, self.atomic_alignment);
        put_u32(&mut b, 48, self.atomic_granularity);
        b
    }

    /// Parse a page body.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("Block Limits VPD", b, 40)?;
        let uga = u32_at(b, 28);
        Ok(Self {
            wsnz: b[0] & 1 != 0,
            max_compare_and_write_len: b[1],
            optimal_transfer_granularity: u16_at(b, 2),
            max_transfer_len: u32_at(b, 4),
            optimal_transfer_len: u32_at(b, 8),
            max_prefetch_len: u32_at(b, 12),
            max_unmap_lba_count: u32_at(b, 16),
            max_unmap_descriptor_count: u32_at(b, 20),
            optimal_unmap_granularity: u32_at(b, 24),
            unmap_granularity_alignment: (uga & 0x8000_0000 != 0).then_some(uga & 0x7fff_ffff),
            max_write_same_len: u64_at(b, 32),
            max_atomic_transfer_len: if b.len() >= 44 { u32_at(b, 40) } else { 0 },
            atomic_alignment: if b.len() >= 48 { u32_at(b, 44) } else { 0 },
            atomic_granularity: if b.len() >= 52 { u32_at(b, 48) } else { 0 },
        })
    }
}

/// Block Device Characteristics VPD page (0xB1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct BlockDeviceCharacteristics {
    /// MEDIUM ROTATION RATE: 1 = non-rotating medium.
    pub rotation_rate: u16,
    /// NOMINAL FORM FACTOR (bits 3-0 of byte 3).
    pub form_factor: u8,
}

impl BlockDeviceCharacteristics {
    /// Body length.
    pub const LEN: usize = 0x3c;
    /// Encode the page body.
    pub fn to_body(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        put_u16(&mut b, 0, self.rotation_rate);
        b[3] = self.form_factor & 0x0f;
        b
    }
    /// Parse a page body.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("Block Device Characteristics VPD", b, 4)?;
        Ok(Self { rotation_rate: u16_at(b, 0), form_factor: b[3] & 0x0f })
    }
}

/// Logical Block Provisioning VPD page (0xB2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct LogicalBlockProvisioning {
    pub threshold_exponent: u8,
    /// UNMAP supported.
    pub lbpu: bool,
    /// WRITE SAME(16) with UNMAP supported.
    pub lbpws: bool,
    /// WRITE SAME(10) with UNMAP supported.
    pub lbpws10: bool,
    /// LBPRZ (3 bits): unmapped blocks read as zero when 1.
    pub lbprz: u8,
    pub anc_sup: bool,
    pub dp: bool,
    /// 0 not reported, 1 resource provisioned, 2 thin provisioned.
    pub provisioning_type: u8,
}

impl LogicalBlockProvisioning {
    /// Body length (no provisioning group descriptor).
    pub const LEN: usize = 4;
    /// Encode the page body.
    pub fn to_body(&self) -> [u8; Self::LEN] {
        [
            self.threshold_exponent,
            if self.lbpu { 0x80 } else { 0 }
                | if self.lbpws { 0x40 } else { 0 }
                | if self.lbpws10 { 0x20 } else { 0 }
                | ((self.lbprz & 7) << 2)
                | if self.anc_sup { 0x02 } else { 0 }
                | u8::from(self.dp),
            self.provisioning_type & 7,
            0,
        ]
    }
    /// Parse a page body.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("Logical Block Provisioning VPD", b, 3)?;
        Ok(Self {
            threshold_exponent: b[0],
            lbpu: b[1] & 0x80 != 0,
            lbpws: b[1] & 0x40 != 0,
            lbpws10: b[1] & 0x20 != 0,
            lbprz: (b[1] >> 2) & 7,
            anc_sup: b[1] & 0x02 != 0,
            dp: b[1] & 0x01 != 0,
            provisioning_type: b[2] & 7,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_inquiry_layout() {
        let s = StandardInquiry::disk("RISER", "RAM DISK", "0001");
        let b = s.to_bytes();
        assert_eq!(b.len(), 36);
        assert_eq!(&b[..8], &[0, 0, 6, 0x12, 31, 0, 0, 2]);
        assert_eq!(&b[8..16], b"RISER   ");
        assert_eq!(StandardInquiry::parse(&b).unwrap(), s);
        let mut v = s.clone();
        v.version_descriptors = alloc::vec![0x0960, 0x04c0];
        let b = v.to_bytes();
        assert_eq!(b.len(), 62);
        assert_eq!(StandardInquiry::parse(&b).unwrap(), v);
        assert!(StandardInquiry::parse(&b[..35]).is_err());
    }

    #[test]
    fn device_identification_round_trip() {
        let ds = alloc::vec![
            Designator::naa_registered_extended(0x001405, 0x1234, 0xdead_beef),
            Designator::t10_vendor("RISER", "serial1"),
            Designator::relative_target_port(1),
            Designator::scsi_name("iqn.2026-11.io.riser:t0", association::TARGET_DEVICE),
        ];
        let body = device_identification(&ds);
        assert_eq!(&body[..4], &[0x01, 0x03, 0, 16]);
        assert_eq!(body[4] >> 4, 6, "NAA 6");
        let page = vpd_page(0, vpd::DEVICE_IDENTIFICATION, &body);
        let (code, body2) = parse_vpd(&page).unwrap();
        assert_eq!(code, 0x83);
        assert_eq!(parse_device_identification(body2).unwrap(), ds);
        assert!(parse_device_identification(&[1, 3, 0, 16, 0]).is_err());
    }

    #[test]
    fn naa_locally_assigned_and_target_port_group_layout() {
        let d = Designator::naa_locally_assigned(0xffff_0123_4567_89ab);
        let body = device_identification(&[d.clone(), Designator::target_port_group(0x0102)]);
        // Binary, association LU, type NAA, 8 bytes; NAA 3 in the top nibble, 60 bits kept.
        assert_eq!(&body[..12], &[0x01, 0x03, 0, 8, 0x3f, 0xff, 0x01, 0x23, 0x45, 0x67, 0x89, 0xab]);
        // Association target port (01b), type 5, 4 bytes, the group in the last two.
        assert_eq!(&body[12..], &[0x01, 0x15, 0, 4, 0, 0, 0x01, 0x02]);
        assert_eq!(parse_device_identification(&body).unwrap()[0], d);
    }

    #[test]
    fn block_pages() {
        let bl = BlockLimits {
            max_compare_and_write_len: 1,
            max_transfer_len: 2048,
            max_unmap_lba_count: 8192,
            unmap_granularity_alignment: Some(0),
            max_write_same_len: 1 << 20,
            ..Default::default()
        };
        assert_eq!(BlockLimits::parse(&bl.to_body()).unwrap(), bl);
        let lbp = LogicalBlockProvisioning { lbpu: true, lbpws: true, lbpws10: true, lbprz: 1, provisioning_type: 2, ..Default::default() };
        assert_eq!(lbp.to_body(), [0, 0xe4, 2, 0]);
        assert_eq!(LogicalBlockProvisioning::parse(&lbp.to_body()).unwrap(), lbp);
        let bdc = BlockDeviceCharacteristics { rotation_rate: 1, form_factor: 0 };
        assert_eq!(BlockDeviceCharacteristics::parse(&bdc.to_body()).unwrap(), bdc);
    }
}
