//! Sense data (SPC-5 §4.4): fixed format (0x70/0x71) and descriptor format (0x72/0x73), with the
//! sense keys and additional sense codes a block target reports.

use crate::Error;
use crate::be::{need, put_u16, put_u32, put_u64, u32_at, u64_at};
use alloc::vec::Vec;
use core::fmt;

/// SCSI status byte (SAM-5 §5.3), open code space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Status(pub u8);

impl Status {
    /// GOOD.
    pub const GOOD: Self = Self(0x00);
    /// CHECK CONDITION (sense data follows).
    pub const CHECK_CONDITION: Self = Self(0x02);
    /// CONDITION MET.
    pub const CONDITION_MET: Self = Self(0x04);
    /// BUSY.
    pub const BUSY: Self = Self(0x08);
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: Self = Self(0x18);
    /// TASK SET FULL.
    pub const TASK_SET_FULL: Self = Self(0x28);
    /// ACA ACTIVE.
    pub const ACA_ACTIVE: Self = Self(0x30);
    /// TASK ABORTED.
    pub const TASK_ABORTED: Self = Self(0x40);
}

impl fmt::Debug for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match *self {
            Self::GOOD => "GOOD",
            Self::CHECK_CONDITION => "CHECK CONDITION",
            Self::CONDITION_MET => "CONDITION MET",
            Self::BUSY => "BUSY",
            Self::RESERVATION_CONFLICT => "RESERVATION CONFLICT",
            Self::TASK_SET_FULL => "TASK SET FULL",
            Self::ACA_ACTIVE => "ACA ACTIVE",
            Self::TASK_ABORTED => "TASK ABORTED",
            _ => return write!(f, "Status({:#04x})", self.0),
        };
        f.write_str(name)
    }
}

/// Sense key (4 bits), open code space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SenseKey(pub u8);

impl SenseKey {
    /// NO SENSE.
    pub const NO_SENSE: Self = Self(0x0);
    /// RECOVERED ERROR.
    pub const RECOVERED_ERROR: Self = Self(0x1);
    /// NOT READY.
    pub const NOT_READY: Self = Self(0x2);
    /// MEDIUM ERROR.
    pub const MEDIUM_ERROR: Self = Self(0x3);
    /// HARDWARE ERROR.
    pub const HARDWARE_ERROR: Self = Self(0x4);
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: Self = Self(0x5);
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: Self = Self(0x6);
    /// DATA PROTECT.
    pub const DATA_PROTECT: Self = Self(0x7);
    /// BLANK CHECK.
    pub const BLANK_CHECK: Self = Self(0x8);
    /// COPY ABORTED.
    pub const COPY_ABORTED: Self = Self(0xa);
    /// ABORTED COMMAND.
    pub const ABORTED_COMMAND: Self = Self(0xb);
    /// VOLUME OVERFLOW.
    pub const VOLUME_OVERFLOW: Self = Self(0xd);
    /// MISCOMPARE.
    pub const MISCOMPARE: Self = Self(0xe);
}

impl fmt::Debug for SenseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [&str; 16] = [
            "NO SENSE",
            "RECOVERED ERROR",
            "NOT READY",
            "MEDIUM ERROR",
            "HARDWARE ERROR",
            "ILLEGAL REQUEST",
            "UNIT ATTENTION",
            "DATA PROTECT",
            "BLANK CHECK",
            "VENDOR SPECIFIC",
            "COPY ABORTED",
            "ABORTED COMMAND",
            "RESERVED",
            "VOLUME OVERFLOW",
            "MISCOMPARE",
            "COMPLETED",
        ];
        f.write_str(NAMES[usize::from(self.0 & 0xf)])
    }
}

/// Additional sense code and qualifier, `ASC << 8 | ASCQ`; open code space.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct AscAscq(pub u16);

macro_rules! asc {
    ($($(#[$m:meta])* $name:ident = $asc:literal, $ascq:literal;)*) => {
        impl AscAscq {
            $($(#[$m])* pub const $name: Self = Self(($asc << 8) | $ascq);)*
            /// The name of a known code.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $(x if x == ($asc << 8) | $ascq => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

asc! {
    /// 00/00 NO ADDITIONAL SENSE INFORMATION.
    NO_ADDITIONAL_SENSE = 0x00, 0x00;
    /// 00/16 OPERATION IN PROGRESS.
    OPERATION_IN_PROGRESS = 0x00, 0x16;
    /// 04/00 LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE.
    LUN_NOT_READY = 0x04, 0x00;
    /// 04/02 LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED.
    LUN_NOT_READY_INIT_REQUIRED = 0x04, 0x02;
    /// 04/0A LOGICAL UNIT NOT ACCESSIBLE, ASYMMETRIC ACCESS STATE TRANSITION.
    LUN_NOT_ACCESSIBLE_TRANSITIONING = 0x04, 0x0a;
    /// 04/0B LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN STANDBY STATE.
    LUN_NOT_ACCESSIBLE_STANDBY = 0x04, 0x0b;
    /// 04/0C LOGICAL UNIT NOT ACCESSIBLE, TARGET PORT IN UNAVAILABLE STATE.
    LUN_NOT_ACCESSIBLE_UNAVAILABLE = 0x04, 0x0c;
    /// 04/1B LOGICAL UNIT NOT READY, SANITIZE IN PROGRESS.
    SANITIZE_IN_PROGRESS = 0x04, 0x1b;
    /// 0C/00 WRITE ERROR.
    WRITE_ERROR = 0x0c, 0x00;
    /// 0D/01 THIRD PARTY DEVICE FAILURE.
    THIRD_PARTY_DEVICE_FAILURE = 0x0d, 0x01;
    /// 0D/02 COPY TARGET DEVICE NOT REACHABLE.
    COPY_TARGET_DEVICE_NOT_REACHABLE = 0x0d, 0x02;
    /// 10/01 LOGICAL BLOCK GUARD CHECK FAILED.
    GUARD_CHECK_FAILED = 0x10, 0x01;
    /// 11/00 UNRECOVERED READ ERROR.
    UNRECOVERED_READ_ERROR = 0x11, 0x00;
    /// 1A/00 PARAMETER LIST LENGTH ERROR.
    PARAMETER_LIST_LENGTH_ERROR = 0x1a, 0x00;
    /// 1D/00 MISCOMPARE DURING VERIFY OPERATION.
    MISCOMPARE_DURING_VERIFY = 0x1d, 0x00;
    /// 20/00 INVALID COMMAND OPERATION CODE.
    INVALID_COMMAND_OPERATION_CODE = 0x20, 0x00;
    /// 21/00 LOGICAL BLOCK ADDRESS OUT OF RANGE.
    LBA_OUT_OF_RANGE = 0x21, 0x00;
    /// 24/00 INVALID FIELD IN CDB.
    INVALID_FIELD_IN_CDB = 0x24, 0x00;
    /// 25/00 LOGICAL UNIT NOT SUPPORTED.
    LOGICAL_UNIT_NOT_SUPPORTED = 0x25, 0x00;
    /// 26/00 INVALID FIELD IN PARAMETER LIST.
    INVALID_FIELD_IN_PARAMETER_LIST = 0x26, 0x00;
    /// 26/06 TOO MANY TARGET DESCRIPTORS.
    TOO_MANY_TARGET_DESCRIPTORS = 0x26, 0x06;
    /// 26/07 UNSUPPORTED TARGET DESCRIPTOR TYPE CODE.
    UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE = 0x26, 0x07;
    /// 26/08 TOO MANY SEGMENT DESCRIPTORS.
    TOO_MANY_SEGMENT_DESCRIPTORS = 0x26, 0x08;
    /// 26/09 UNSUPPORTED SEGMENT DESCRIPTOR TYPE CODE.
    UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE = 0x26, 0x09;
    /// 27/00 WRITE PROTECTED.
    WRITE_PROTECTED = 0x27, 0x00;
    /// 29/00 POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    POWER_ON_RESET = 0x29, 0x00;
    /// 29/07 I_T NEXUS LOSS OCCURRED.
    I_T_NEXUS_LOSS = 0x29, 0x07;
    /// 2A/01 MODE PARAMETERS CHANGED.
    MODE_PARAMETERS_CHANGED = 0x2a, 0x01;
    /// 2A/03 RESERVATIONS PREEMPTED.
    RESERVATIONS_PREEMPTED = 0x2a, 0x03;
    /// 2A/04 RESERVATIONS RELEASED.
    RESERVATIONS_RELEASED = 0x2a, 0x04;
    /// 2A/05 REGISTRATIONS PREEMPTED.
    REGISTRATIONS_PREEMPTED = 0x2a, 0x05;
    /// 2A/06 ASYMMETRIC ACCESS STATE CHANGED.
    ASYMMETRIC_ACCESS_STATE_CHANGED = 0x2a, 0x06;
    /// 2A/09 CAPACITY DATA HAS CHANGED.
    CAPACITY_DATA_CHANGED = 0x2a, 0x09;
    /// 2C/00 COMMAND SEQUENCE ERROR.
    COMMAND_SEQUENCE_ERROR = 0x2c, 0x00;
    /// 31/03 SANITIZE COMMAND FAILED.
    SANITIZE_COMMAND_FAILED = 0x31, 0x03;
    /// 39/00 SAVING PARAMETERS NOT SUPPORTED.
    SAVING_PARAMETERS_NOT_SUPPORTED = 0x39, 0x00;
    /// 3A/00 MEDIUM NOT PRESENT.
    MEDIUM_NOT_PRESENT = 0x3a, 0x00;
    /// 3F/0E REPORTED LUNS DATA HAS CHANGED.
    REPORTED_LUNS_DATA_CHANGED = 0x3f, 0x0e;
    /// 44/00 INTERNAL TARGET FAILURE.
    INTERNAL_TARGET_FAILURE = 0x44, 0x00;
    /// 47/00 SCSI PARITY ERROR (used for iSCSI digest errors).
    SCSI_PARITY_ERROR = 0x47, 0x00;
    /// 47/05 PROTOCOL SERVICE CRC ERROR.
    PROTOCOL_SERVICE_CRC_ERROR = 0x47, 0x05;
    /// 49/00 INVALID MESSAGE ERROR.
    INVALID_MESSAGE_ERROR = 0x49, 0x00;
    /// 4B/00 DATA PHASE ERROR.
    DATA_PHASE_ERROR = 0x4b, 0x00;
    /// 4E/00 OVERLAPPED COMMANDS ATTEMPTED.
    OVERLAPPED_COMMANDS_ATTEMPTED = 0x4e, 0x00;
    /// 55/03 INSUFFICIENT RESOURCES.
    INSUFFICIENT_RESOURCES = 0x55, 0x03;
    /// 55/04 INSUFFICIENT REGISTRATION RESOURCES.
    INSUFFICIENT_REGISTRATION_RESOURCES = 0x55, 0x04;
}

impl AscAscq {
    /// From the two bytes.
    pub const fn new(asc: u8, ascq: u8) -> Self {
        Self(((asc as u16) << 8) | ascq as u16)
    }
    /// Additional sense code.
    pub const fn asc(self) -> u8 {
        (self.0 >> 8) as u8
    }
    /// Additional sense code qualifier.
    pub const fn ascq(self) -> u8 {
        self.0 as u8
    }
}

impl fmt::Debug for AscAscq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02X}/{:02X}", self.asc(), self.ascq())?;
        if let Some(n) = self.name() {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

/// Sense-key specific field pointer for ILLEGAL REQUEST (SPC-5 §4.4.2.4.2).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FieldPointer {
    /// true: the error is in the CDB; false: in the parameter list.
    pub in_cdb: bool,
    /// Bit pointer (0-7) when valid.
    pub bit: Option<u8>,
    /// Byte offset of the field.
    pub byte: u16,
}

impl FieldPointer {
    fn to_bytes(self) -> [u8; 3] {
        let mut b0 = 0;
        if self.in_cdb {
            b0 |= 0x40;
        }
        if let Some(bit) = self.bit {
            b0 |= 0x08 | (bit & 7);
        }
        let [hi, lo] = self.byte.to_be_bytes();
        [b0, hi, lo]
    }
}

/// Decoded sense data, either format.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Sense {
    /// Deferred error (0x71/0x73) rather than current (0x70/0x72).
    pub deferred: bool,
    /// Sense key.
    pub key: SenseKey,
    /// ASC/ASCQ.
    pub asc: AscAscq,
    /// INFORMATION field (VALID bit in fixed format; Information descriptor in descriptor format).
    pub information: Option<u64>,
    /// COMMAND-SPECIFIC INFORMATION.
    pub command_specific: Option<u64>,
    /// Sense-key specific bytes (3 bytes; SKSV set).
    pub key_specific: Option<[u8; 3]>,
    /// Incorrect length indicator.
    pub ili: bool,
}

/// Length of fixed-format sense data as riser emits it.
pub const FIXED_SENSE_LEN: usize = 18;

impl Sense {
    /// Sense with a key and ASC/ASCQ only.
    pub const fn new(key: SenseKey, asc: AscAscq) -> Self {
        Self { deferred: false, key, asc, information: None, command_specific: None, key_specific: None, ili: false }
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN CDB with a field pointer to `byte` (and `bit`).
    pub fn invalid_field_in_cdb(byte: u16, bit: Option<u8>) -> Self {
        let mut s = Self::new(SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB);
        s.key_specific = Some(FieldPointer { in_cdb: true, bit, byte }.to_bytes());
        s
    }

    /// ILLEGAL REQUEST / INVALID FIELD IN PARAMETER LIST with a field pointer.
    pub fn invalid_field_in_parameter_list(byte: u16, bit: Option<u8>) -> Self {
        let mut s = Self::new(SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST);
        s.key_specific = Some(FieldPointer { in_cdb: false, bit, byte }.to_bytes());
        s
    }

    /// NOT READY with a progress indication (SPC-5 §4.4.2.4.4): `done` of `total` units.
    pub fn not_ready_in_progress(asc: AscAscq, done: u64, total: u64) -> Self {
        let mut s = Self::new(SenseKey::NOT_READY, asc);
        let fraction = if total == 0 { 0 } else { (u128::from(done.min(total)) * 65536 / u128::from(total)).min(65535) as u16 };
        let [hi, lo] = fraction.to_be_bytes();
        s.key_specific = Some([0, hi, lo]);
        s
    }

    /// The field pointer, if the sense-key specific bytes hold one (ILLEGAL REQUEST).
    pub fn field_pointer(&self) -> Option<FieldPointer> {
        let b = self.key_specific?;
        (self.key == SenseKey::ILLEGAL_REQUEST).then(|| FieldPointer {
            in_cdb: b[0] & 0x40 != 0,
            bit: (b[0] & 0x08 != 0).then_some(b[0] & 7),
            byte: u16::from_be_bytes([b[1], b[2]]),
        })
    }

    /// Fixed format (18 bytes). An INFORMATION value above 32 bits cannot be expressed here and
    /// is dropped (VALID clear); use descriptor format for it.
    pub fn to_fixed(&self) -> [u8; FIXED_SENSE_LEN] {
        let mut b = [0u8; FIXED_SENSE_LEN];
        b[0] = if self.deferred { 0x71 } else { 0x70 };
        if let Some(info) = self.information.filter(|&i| i <= u64::from(u32::MAX)) {
            b[0] |= 0x80;
            put_u32(&mut b, 3, info as u32);
        }
        b[2] = self.key.0 & 0x0f | if self.ili { 0x20 } else { 0 };
        b[7] = (FIXED_SENSE_LEN - 8) as u8;
        if let Some(csi) = self.command_specific {
            put_u32(&mut b, 8, csi as u32);
        }
        b[12] = self.asc.asc();
        b[13] = self.asc.ascq();
        if let Some(ks) = self.key_specific {
            b[15..18].copy_from_slice(&ks);
            b[15] |= 0x80;
        }
        b
    }

    /// Descriptor format: header plus Information, Command-specific and Sense-key specific
    /// descriptors as present.
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; 8];
        b[0] = if self.deferred { 0x73 } else { 0x72 };
        b[1] = self.key.0 & 0x0f;
        b[2] = self.asc.asc();
        b[3] = self.asc.ascq();
        if let Some(info) = self.information {
            let mut d = [0u8; 12];
            d[0] = 0x00;
            d[1] = 0x0a;
            d[2] = 0x80;
            put_u64(&mut d, 4, info);
            b.extend_from_slice(&d);
        }
        if let Some(csi) = self.command_specific {
            let mut d = [0u8; 12];
            d[0] = 0x01;
            d[1] = 0x0a;
            put_u64(&mut d, 4, csi);
            b.extend_from_slice(&d);
        }
        if let Some(ks) = self.key_specific {
            let mut d = [0u8; 8];
            d[0] = 0x02;
            d[1] = 0x06;
            d[4..7].copy_from_slice(&ks);
            d[4] |= 0x80;
            b.extend_from_slice(&d);
        }
        if self.ili {
            // Block commands descriptor (SBC-4 §4.18.4) carries ILI.
            b.extend_from_slice(&[0x05, 0x02, 0x00, 0x20]);
        }
        b[7] = (b.len() - 8) as u8;
        b
    }

    /// Parse sense data in either format. Unknown descriptors are skipped; the additional
    /// length is honoured only as far as the buffer goes (initiators often truncate).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("sense data", b, 1)?;
        let code = b[0] & 0x7f;
        match code {
            0x70 | 0x71 => {
                need("fixed sense data", b, 14)?;
                let valid = b[0] & 0x80 != 0;
                let ks = (b.len() >= 18 && b[15] & 0x80 != 0).then(|| {
                    let mut k = [b[15], b[16], b[17]];
                    k[0] &= 0x7f;
                    k
                });
                let csi = u32_at(b, 8);
                Ok(Self {
                    deferred: code == 0x71,
                    key: SenseKey(b[2] & 0x0f),
                    asc: AscAscq::new(b[12], b[13]),
                    information: valid.then(|| u64::from(u32_at(b, 3))),
                    command_specific: (csi != 0).then_some(u64::from(csi)),
                    key_specific: ks,
                    ili: b[2] & 0x20 != 0,
                })
            }
            0x72 | 0x73 => {
                need("descriptor sense data", b, 8)?;
                let mut s = Self::new(SenseKey(b[1] & 0x0f), AscAscq::new(b[2], b[3]));
                s.deferred = code == 0x73;
                let end = (8 + usize::from(b[7])).min(b.len());
                let mut at = 8;
                while at + 2 <= end {
                    let (ty, len) = (b[at], usize::from(b[at + 1]));
                    let d = &b[at..(at + 2 + len).min(end)];
                    match ty {
                        0x00 if d.len() >= 12 => s.information = Some(u64_at(d, 4)),
                        0x01 if d.len() >= 12 => s.command_specific = Some(u64_at(d, 4)),
                        0x02 if d.len() >= 7 && d[4] & 0x80 != 0 => s.key_specific = Some([d[4] & 0x7f, d[5], d[6]]),
                        0x05 if d.len() >= 4 => s.ili = d[3] & 0x20 != 0,
                        _ => {}
                    }
                    at += 2 + len;
                }
                Ok(s)
            }
            _ => Err(Error::InvalidField { what: "sense data", byte: 0, bit: Some(0) }),
        }
    }
}

/// Sense data as carried in an iSCSI SCSI Response data segment: 2-byte SenseLength + sense.
pub fn with_length_prefix(sense: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(sense.len() + 2);
    let mut len = [0u8; 2];
    put_u16(&mut len, 0, sense.len() as u16);
    v.extend_from_slice(&len);
    v.extend_from_slice(sense);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_invalid_field() {
        let s = Sense::invalid_field_in_cdb(2, Some(7));
        let b = s.to_fixed();
        assert_eq!(b, [0x70, 0, 0x05, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0xcf, 0, 2]);
        let p = Sense::parse(&b).unwrap();
        assert_eq!(p, s);
        assert_eq!(p.field_pointer(), Some(FieldPointer { in_cdb: true, bit: Some(7), byte: 2 }));
    }

    #[test]
    fn miscompare_with_information() {
        let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
        s.information = Some(513);
        let f = s.to_fixed();
        assert_eq!(f[0], 0xf0);
        assert_eq!(&f[3..7], &[0, 0, 2, 1]);
        assert_eq!(Sense::parse(&f).unwrap(), s);
        let d = s.to_descriptor();
        assert_eq!(&d[..8], &[0x72, 0x0e, 0x1d, 0, 0, 0, 0, 12]);
        assert_eq!(Sense::parse(&d).unwrap(), s);
    }

    #[test]
    fn descriptor_round_trip_all_fields() {
        let mut s = Sense::invalid_field_in_parameter_list(9, None);
        s.information = Some(u64::MAX - 3);
        s.command_specific = Some(7);
        s.ili = true;
        s.deferred = true;
        assert_eq!(Sense::parse(&s.to_descriptor()).unwrap(), s);
    }

    #[test]
    fn garbage_and_truncated() {
        assert!(Sense::parse(&[]).is_err());
        assert!(Sense::parse(&[0x70, 0, 5]).is_err());
        assert!(Sense::parse(&[0x12; 20]).is_err());
        // A descriptor length running past the end is clipped, not trusted.
        assert!(Sense::parse(&[0x72, 5, 0x24, 0, 0, 0, 0, 200, 0, 10, 0x80]).is_ok());
    }

    #[test]
    fn names() {
        assert_eq!(format!("{:?}", AscAscq::LBA_OUT_OF_RANGE), "21/00 LBA_OUT_OF_RANGE");
        assert_eq!(format!("{:?}", SenseKey::ILLEGAL_REQUEST), "ILLEGAL REQUEST");
        assert_eq!(format!("{:?}", Status(0x99)), "Status(0x99)");
    }
}
