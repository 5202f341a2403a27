//! SNACK Request (RFC 7143 §11.16): the initiator asks again for Data-In, R2T or status, or
//! acknowledges data.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;

/// Byte offsets of the SNACK fields.
mod field {
    pub(super) use super::super::bhs::field::{EXP_STAT_SN, ITT, TTT};

    /// BegRun.
    pub(super) const BEG_RUN: usize = 40;
    /// RunLength.
    pub(super) const RUN_LENGTH: usize = 44;
}

/// Flags (byte 1), besides F.
mod flags {
    /// The SNACK type.
    pub(super) const TYPE: u8 = 0x0f;
}

/// SNACK Request (0x10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Snack {
    /// Type (4 bits): 0 Data/R2T, 1 Status, 2 DataACK, 3 R-Data.
    pub snack_type: u8,
    pub lun: Lun,
    pub itt: u32,
    /// Target Transfer Tag or SNACK Tag.
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

impl Snack {
    /// The fields of a SNACK Request BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            snack_type: h.flags() & flags::TYPE,
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
            beg_run: h.u32(field::BEG_RUN),
            run_length: h.u32(field::RUN_LENGTH),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::SNACK, false);
        h.set_flags(FINAL | (self.snack_type & flags::TYPE));
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
        h.set_u32(field::BEG_RUN, self.beg_run);
        h.set_u32(field::RUN_LENGTH, self.run_length);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    /// Data-In 4 and 5 of task 7 again.
    #[rustfmt::skip]
    const SNACK_DATA: [u8; BHS_LEN] = [
        0x10, 0x80, 0x00, 0x00, // 0x10, F | type 0 (Data/R2T)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00, // LUN 2
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x07, // ITT
        0xff, 0xff, 0xff, 0xff, // TTT
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x03, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x04, // BegRun
        0x00, 0x00, 0x00, 0x02, // RunLength
    ];

    /// A DataACK: everything before DataSN 9 arrived.
    #[rustfmt::skip]
    const SNACK_DATA_ACK: [u8; BHS_LEN] = [
        0x10, 0x82, 0x00, 0x00, // 0x10, F | type 2 (DataACK)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x08, // ITT
        0x00, 0x00, 0x00, 0x31, // TTT of the Data-In with the A bit
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x05, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x09, // BegRun
        0x00, 0x00, 0x00, 0x00, // RunLength
    ];

    #[test]
    fn snack_data() {
        let p = Snack::parse(&view(&SNACK_DATA)).unwrap();
        let lun = Lun::from_number(2).unwrap();
        assert_eq!(p, Snack { snack_type: 0, lun, itt: 7, ttt: u32::MAX, exp_stat_sn: 3, beg_run: 4, run_length: 2 });
        check(&SNACK_DATA, Header::Snack(p));
    }

    #[test]
    fn snack_data_ack() {
        let p = Snack::parse(&view(&SNACK_DATA_ACK)).unwrap();
        assert_eq!(p, Snack { snack_type: 2, lun: Lun::ZERO, itt: 8, ttt: 0x31, exp_stat_sn: 5, beg_run: 9, run_length: 0 });
        check(&SNACK_DATA_ACK, Header::Snack(p));
    }
}
