//! Reading the script: the input bytes, missing ones reading as zero; and the trace switch.

use riser_iscsi::wire::BHS_LEN;
use riser_scsi::lun::Lun;

/// `SESSION_PAIR_TRACE=1` prints each operation and each PDU delivered (to read a crash).
pub(crate) fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("SESSION_PAIR_TRACE").is_some())
}

pub(crate) struct Input<'a>(pub(crate) &'a [u8]);

impl Input<'_> {
    pub(crate) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    pub(crate) fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    pub(crate) fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    pub(crate) fn bhs(&mut self) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        let n = self.0.len().min(BHS_LEN);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
}

pub(crate) fn lun(n: u8) -> Lun {
    Lun::from_number(u16::from(n)).unwrap_or(Lun::ZERO)
}
