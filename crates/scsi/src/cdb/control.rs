//! Device control and sharing: MODE SENSE/SELECT, START STOP UNIT, PREVENT ALLOW MEDIUM REMOVAL,
//! RESERVE/RELEASE (6/10) and PERSISTENT RESERVE IN/OUT.

use super::{Cdb, op};
use crate::be::{put_u16, put_u32, u16_at, u32_at};

/// MODE SENSE (6) or (10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeSense {
    /// MODE SENSE(10) rather than (6).
    pub ten: bool,
    /// Disable block descriptors.
    pub dbd: bool,
    /// Long LBA accepted (10 only).
    pub llbaa: bool,
    /// Page control: 0 current, 1 changeable, 2 default, 3 saved.
    pub pc: u8,
    /// Page code (6 bits).
    pub page: u8,
    /// Subpage code.
    pub subpage: u8,
    /// Allocation length.
    pub alloc_len: u16,
    /// CONTROL byte.
    pub control: u8,
}

/// MODE SELECT (6) or (10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeSelect {
    /// MODE SELECT(10) rather than (6).
    pub ten: bool,
    /// Page format.
    pub pf: bool,
    /// Save pages.
    pub sp: bool,
    /// Parameter list length.
    pub param_len: u16,
    /// CONTROL byte.
    pub control: u8,
}

/// Parse a command of this family from `b` (exactly the CDB's length); `None` when `opcode`
/// belongs to another family.
pub(super) fn parse(opcode: u8, b: &[u8]) -> Option<Cdb> {
    use op::*;
    Some(match opcode {
        MODE_SENSE_6 | MODE_SENSE_10 => {
            let ten = opcode == MODE_SENSE_10;
            Cdb::ModeSense(ModeSense {
                ten,
                dbd: b[1] & 0x08 != 0,
                llbaa: ten && b[1] & 0x10 != 0,
                pc: b[2] >> 6,
                page: b[2] & 0x3f,
                subpage: b[3],
                alloc_len: if ten { u16_at(b, 7) } else { u16::from(b[4]) },
                control: b[b.len() - 1],
            })
        }
        MODE_SELECT_6 | MODE_SELECT_10 => {
            let ten = opcode == MODE_SELECT_10;
            Cdb::ModeSelect(ModeSelect {
                ten,
                pf: b[1] & 0x10 != 0,
                sp: b[1] & 0x01 != 0,
                param_len: if ten { u16_at(b, 7) } else { u16::from(b[4]) },
                control: b[b.len() - 1],
            })
        }
        START_STOP_UNIT => Cdb::StartStopUnit {
            immed: b[1] & 1 != 0,
            power_condition_modifier: b[3] & 0x0f,
            power_condition: b[4] >> 4,
            no_flush: b[4] & 0x04 != 0,
            loej: b[4] & 0x02 != 0,
            start: b[4] & 0x01 != 0,
            control: b[5],
        },
        PREVENT_ALLOW_MEDIUM_REMOVAL => Cdb::PreventAllowMediumRemoval { prevent: b[4] & 3, control: b[5] },
        RESERVE_6 => Cdb::Reserve6 { control: b[5] },
        RELEASE_6 => Cdb::Release6 { control: b[5] },
        RESERVE_10 | RELEASE_10 => {
            let (third_party, longid, third_party_id, param_len, control) = (b[1] & 0x10 != 0, b[1] & 0x02 != 0, b[3], u16_at(b, 7), b[9]);
            if opcode == RESERVE_10 {
                Cdb::Reserve10 { third_party, longid, third_party_id, param_len, control }
            } else {
                Cdb::Release10 { third_party, longid, third_party_id, param_len, control }
            }
        }
        PERSISTENT_RESERVE_IN => Cdb::PersistentReserveIn { service_action: b[1] & 0x1f, alloc_len: u16_at(b, 7), control: b[9] },
        PERSISTENT_RESERVE_OUT => Cdb::PersistentReserveOut {
            service_action: b[1] & 0x1f,
            scope: b[2] >> 4,
            pr_type: b[2] & 0x0f,
            param_len: u32_at(b, 5),
            control: b[9],
        },
        _ => return None,
    })
}

/// Encode a command of this family into `b` (exactly the CDB's length, zeroed, opcode set).
pub(super) fn emit(cdb: &Cdb, b: &mut [u8]) {
    let last = b.len() - 1;
    match *cdb {
        Cdb::Reserve6 { control } | Cdb::Release6 { control } => b[5] = control,
        Cdb::ModeSense(m) => {
            b[1] = if m.dbd { 0x08 } else { 0 } | if m.llbaa && m.ten { 0x10 } else { 0 };
            b[2] = (m.pc << 6) | (m.page & 0x3f);
            b[3] = m.subpage;
            if m.ten {
                put_u16(b, 7, m.alloc_len)
            } else {
                b[4] = m.alloc_len as u8
            }
            b[last] = m.control;
        }
        Cdb::ModeSelect(m) => {
            b[1] = if m.pf { 0x10 } else { 0 } | u8::from(m.sp);
            if m.ten {
                put_u16(b, 7, m.param_len)
            } else {
                b[4] = m.param_len as u8
            }
            b[last] = m.control;
        }
        Cdb::StartStopUnit { immed, power_condition_modifier, power_condition, no_flush, loej, start, control } => {
            b[1] = u8::from(immed);
            b[3] = power_condition_modifier & 0x0f;
            b[4] = (power_condition << 4) | if no_flush { 4 } else { 0 } | if loej { 2 } else { 0 } | u8::from(start);
            b[5] = control;
        }
        Cdb::PreventAllowMediumRemoval { prevent, control } => {
            b[4] = prevent & 3;
            b[5] = control;
        }
        Cdb::Reserve10 { third_party, longid, third_party_id, param_len, control }
        | Cdb::Release10 { third_party, longid, third_party_id, param_len, control } => {
            b[1] = if third_party { 0x10 } else { 0 } | if longid { 0x02 } else { 0 };
            b[3] = third_party_id;
            put_u16(b, 7, param_len);
            b[9] = control;
        }
        Cdb::PersistentReserveIn { service_action, alloc_len, control } => {
            b[1] = service_action & 0x1f;
            put_u16(b, 7, alloc_len);
            b[9] = control;
        }
        Cdb::PersistentReserveOut { service_action, scope, pr_type, param_len, control } => {
            b[1] = service_action & 0x1f;
            b[2] = (scope << 4) | (pr_type & 0x0f);
            put_u32(b, 5, param_len);
            b[9] = control;
        }
        _ => unreachable!("not a device control command: {cdb:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pr_out_and_data_out_len() {
        let b = [0x5f, 0x01, 0x13, 0, 0, 0, 0, 0, 24, 0];
        let c = Cdb::parse(&b).unwrap();
        assert_eq!(c, Cdb::PersistentReserveOut { service_action: 1, scope: 1, pr_type: 3, param_len: 24, control: 0 });
        assert_eq!(c.data_out_len(512), Some(24));
        assert_eq!(c.to_vec(), b);
        let caw = Cdb::CompareAndWrite { lba: 0, blocks: 1, flags: 0, group: 0, control: 0 };
        assert_eq!(caw.data_out_len(512), Some(1024));
    }
}
