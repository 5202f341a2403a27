//! Third-party copy commands: EXTENDED COPY and RECEIVE COPY RESULTS (SPC-4 §6.4, §6.18).
//! Their parameter and result data are in [`crate::copy`].

use super::{Cdb, op};
use crate::be::{put_u32, u32_at};

/// Parse a command of this family from `b` (exactly the CDB's length); `None` when `opcode`
/// belongs to another family.
pub(super) fn parse(opcode: u8, b: &[u8]) -> Option<Cdb> {
    Some(match opcode {
        op::EXTENDED_COPY => Cdb::ExtendedCopy { service_action: b[1] & 0x1f, param_len: u32_at(b, 10), control: b[15] },
        op::RECEIVE_COPY_RESULTS => {
            Cdb::ReceiveCopyResults { service_action: b[1] & 0x1f, list_id: b[2], alloc_len: u32_at(b, 10), control: b[15] }
        }
        _ => return None,
    })
}

/// Encode a command of this family into `b` (exactly the CDB's length, zeroed, opcode set).
pub(super) fn emit(cdb: &Cdb, b: &mut [u8]) {
    match *cdb {
        Cdb::ExtendedCopy { service_action, param_len, control } => {
            b[1] = service_action & 0x1f;
            put_u32(b, 10, param_len);
            b[15] = control;
        }
        Cdb::ReceiveCopyResults { service_action, list_id, alloc_len, control } => {
            b[1] = service_action & 0x1f;
            b[2] = list_id;
            put_u32(b, 10, alloc_len);
            b[15] = control;
        }
        _ => unreachable!("not a third-party copy command: {cdb:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_data_out() {
        let x = [0x83, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 76, 0, 0];
        let c = Cdb::parse(&x).unwrap();
        assert_eq!(c, Cdb::ExtendedCopy { service_action: 0, param_len: 76, control: 0 });
        assert_eq!(c.data_out_len(512), Some(76));
        assert_eq!(c.to_vec(), x);
        let r = [0x84, 0x03, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0];
        let c = Cdb::parse(&r).unwrap();
        assert_eq!(c, Cdb::ReceiveCopyResults { service_action: 3, list_id: 7, alloc_len: 1024, control: 0 });
        assert_eq!(c.data_out_len(512), None);
        assert_eq!(c.to_vec(), r);
        assert!(Cdb::parse(&x[..15]).is_err(), "a short CDB is refused");
    }
}
